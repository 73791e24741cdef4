#!/usr/bin/env bash
# Make sure the PostgreSQL the tests use is reachable: start the local cluster if it is
# installed and stopped, and create the test database if it is missing.
# Prints the DSN on success. Exits 1 only under CI=true (where skipping PostgreSQL tests is a
# failure); elsewhere it warns and the PostgreSQL tests skip with the reason.
set -uo pipefail
host="${PGHOST_TEST:-127.0.0.1}"
port="${PGPORT_TEST:-5432}"
db="${PGDATABASE_TEST:-test}"
user="${PGUSER_TEST:-postgres}"
dsn="postgresql://${user}@${host}:${port}/${db}"

fail() {
  echo "ensure-postgres: $*" >&2
  if [ "${CI:-}" = "true" ]; then
    echo "ensure-postgres: CI=true requires PostgreSQL tests to run; failing" >&2
    exit 1
  fi
  echo "ensure-postgres: PostgreSQL tests will be skipped" >&2
  exit 0
}

ready() { pg_isready -q -h "$host" -p "$port" 2>/dev/null; }

if ! command -v pg_isready >/dev/null 2>&1; then
  fail "PostgreSQL client tools are not installed"
fi
if ! ready && command -v pg_ctlcluster >/dev/null 2>&1 && [ -d /etc/postgresql ]; then
  for version in $(ls /etc/postgresql); do
    echo "ensure-postgres: starting cluster $version/main" >&2
    pg_ctlcluster --skip-systemctl-redirect "$version" main start >&2 || true
  done
  for _ in $(seq 1 30); do ready && break; sleep 0.5; done
fi
ready || fail "no PostgreSQL answering on $host:$port"
if ! psql -h "$host" -p "$port" -U "$user" -d postgres -tAc \
    "select 1 from pg_database where datname = '$db'" 2>/dev/null | grep -q 1; then
  echo "ensure-postgres: creating database $db" >&2
  createdb -h "$host" -p "$port" -U "$user" "$db" || fail "could not create database $db"
fi
# The several-node tests hold about 45 connections each (fifteen a node), and two of them can
# meet under xdist: a local cluster with the default 100 refused them ("too many clients"). On
# the local Debian cluster this raises max_connections to 300 once (a restart); on any other
# server the tests marked pg_nodes take turns instead (tests/conftest.py).
want=300
have="$(psql -h "$host" -p "$port" -U "$user" -d "$db" -tAc "show max_connections" 2>/dev/null)"
if [ -n "$have" ] && [ "$have" -lt "$want" ] && [ "$host" = "127.0.0.1" ] \
    && command -v pg_ctlcluster >/dev/null 2>&1 && [ -d /etc/postgresql ]; then
  echo "ensure-postgres: max_connections $have -> $want (restarting the local cluster)" >&2
  if psql -h "$host" -p "$port" -U "$user" -d "$db" -qtAc \
      "alter system set max_connections = $want" >&2; then
    for version in $(ls /etc/postgresql); do
      pg_ctlcluster --skip-systemctl-redirect "$version" main restart >&2 || true
    done
    for _ in $(seq 1 30); do ready && break; sleep 0.5; done
    ready || fail "PostgreSQL did not come back after the restart"
  fi
fi
echo "$dsn"
