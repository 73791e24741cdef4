#!/usr/bin/env bash
# Create (or reuse) .venv and install the project into it, editable.
# Usage: scripts/venv.sh [EXTRAS]   e.g. scripts/venv.sh dev
# Reinstalls only when pyproject.toml changed since the last install.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
python="${PYTHON:-python3}"
if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
  echo "turnstile needs Python >= 3.11 (found: $("$python" --version 2>&1))" >&2
  exit 1
fi
[ -x .venv/bin/python ] || "$python" -m venv .venv
stamp=".venv/.installed-${extras:-base}"
want="$(sha256sum pyproject.toml | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  spec="."
  [ -n "$extras" ] && spec=".[$extras]"
  # the installer passes on what the build backend prints: setuptools' note that an editable install uses
  # a meta path finder is about ten lines of "BuildBackendWarning" that need no action. Kept in a
  # log, shown only when the install fails.
  log=".venv/install.log"
  echo "installing turnstile into .venv (the installer's output: $log)" >&2
  # uv resolves and installs the ~140 packages in seconds where pip takes a minute or more of
  # a 2-core box's CPU (measured: 5 s against 65-100 s on a fresh clone, the same versions); it
  # is one wheel, installed by pip first. Without it (no index reachable for it), pip does it all.
  # --compile-bytecode: uv leaves the .pyc files out (pip writes them), and where
  # PYTHONDONTWRITEBYTECODE is set (this project's CI machines) nothing writes them later: every
  # process then compiles each module it imports, about a second of CPU per node start (measured:
  # `turnstile serve` up in 3.5-4.1 s without them, 1.3 s with them).
  # Not for the dev extra: compiling all ~300 packages is 21 s of CPU (12 s of the 2-core box)
  # where the suite imports a fraction of them, and scripts/test.sh lets its processes write
  # the .pyc of what they import (it unsets PYTHONDONTWRITEBYTECODE), once each.
  compile=(--compile-bytecode)
  [ "$extras" = "dev" ] && compile=()
  if .venv/bin/python -m pip install --quiet uv >/dev/null 2>&1; then
    install=(.venv/bin/python -m uv pip install --python .venv/bin/python --quiet "${compile[@]}")
  else
    .venv/bin/python -m pip install --quiet --upgrade pip >/dev/null 2>&1 || true
    install=(.venv/bin/python -m pip install --quiet)
  fi
  if ! "${install[@]}" -e "$spec" >"$log" 2>&1; then
    cat "$log" >&2
    echo "installing turnstile into .venv failed (output above, and in $log)" >&2
    exit 1
  fi
  echo "$want" > "$stamp"
fi
