#!/usr/bin/env bash
# README's first command: install Turnstile into .venv and run a node on the embedded SQLite
# store. Extra arguments go to `turnstile serve` (try --help).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/venv.sh
exec .venv/bin/turnstile serve "$@"
