#!/usr/bin/env bash
# README's second command (and what CI runs): install Turnstile with its dev extra into .venv,
# make sure PostgreSQL and Chromium are there, lint, check the import contracts and the types, and
# run the whole test suite.
# Extra arguments go to pytest (after the workers' options, so -n 0 there wins too).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/venv.sh dev
dsn="$(bash scripts/ensure-postgres.sh)"
if [ -n "$dsn" ]; then
  export TURNSTILE_TEST_PG_DSN="${TURNSTILE_TEST_PG_DSN:-$dsn}"
fi
# the console's browser tests drive Debian's chromium (installed here when missing)
chromium="$(bash scripts/ensure-chromium.sh)"
if [ -n "$chromium" ]; then
  export TURNSTILE_CHROMIUM="${TURNSTILE_CHROMIUM:-$chromium}"
fi
# The suite starts hundreds of Python processes (nodes, the CLI, the crash harness): each one
# compiles every module it imports that has no .pyc. PYTHONDONTWRITEBYTECODE (set on this
# project's CI machines) keeps them from ever being written, so the checkout's own modules are
# compiled once here, and the suite's processes may write what changes after (__pycache__ is
# ignored by git). Measured: importing the CLI 2.3 s -> 1.0 s, a node's start 3.5-4.1 s -> 1.3 s.
unset PYTHONDONTWRITEBYTECODE
# (a file that does not compile is left to ruff and pytest, which say where)
.venv/bin/python -m compileall -q -j 0 turnstile actors runtime tools protocol client bench tests >/dev/null || true
.venv/bin/ruff check .
.venv/bin/ruff format --check .
bash scripts/lint-imports.sh
# mypy beside the tests: on a fresh clone (no .mypy_cache) it is ~30 s of one core (measured on
# a quiet box: CI 520 s with it before the tests, 514 s beside them); its verdict comes after
typecheck_out="$(mktemp)"
bash scripts/typecheck.sh >"$typecheck_out" 2>&1 &
typecheck_pid=$!
# three workers, each module sent whole to whichever is free, in collection order, which puts the
# longest modules first (tests/conftest.py, LONGEST_FIRST): with each test sent to whichever was
# free (worksteal), the longest modules started last and ran on their own at the end (most tests
# wait on real processes, sockets and PostgreSQL, so 3 workers on 2 cores finish in about half
# the serial time); TURNSTILE_TEST_WORKERS=0
# runs the suite in this one process. Two several-node PostgreSQL tests at once took a server
# with 100 connections past its limit: ensure-postgres.sh raises the local cluster's to 300, and
# on a server it cannot change those tests take turns (marker pg_nodes, tests/conftest.py).
# how fast the box is before and after (bench/boxspeed.py): this project's machines are virtual,
# and the same suite took 297 s and 577 s of pytest on one afternoon with nothing else running
.venv/bin/python -m bench.boxspeed || true
tests=0
.venv/bin/python -m pytest -n "${TURNSTILE_TEST_WORKERS:-3}" --dist loadfile --no-loadscope-reorder "$@" || tests=$?
.venv/bin/python -m bench.boxspeed || true
typecheck=0
wait "$typecheck_pid" || typecheck=$?
cat "$typecheck_out"
rm -f "$typecheck_out"
[ "$typecheck" -eq 0 ] || echo "typecheck failed (exit $typecheck)" >&2
[ "$tests" -eq 0 ] || exit "$tests"
exit "$typecheck"
