#!/usr/bin/env bash
# README's second command (and what CI runs): install Turnstile with its dev extra into .venv,
# make sure PostgreSQL is there, lint, check the import contracts, and run the whole test suite.
# Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/venv.sh dev
dsn="$(bash scripts/ensure-postgres.sh)"
if [ -n "$dsn" ]; then
  export TURNSTILE_TEST_PG_DSN="${TURNSTILE_TEST_PG_DSN:-$dsn}"
fi
.venv/bin/ruff check .
.venv/bin/ruff format --check .
bash scripts/lint-imports.sh
exec .venv/bin/python -m pytest "$@"
