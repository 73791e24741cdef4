#!/usr/bin/env bash
# Check the import contracts in pyproject.toml ([tool.importlinter]) with import-linter.
# The repository keeps runtime/, tools/, actors/, protocol/ and client/ side by side while they
# install as turnstile.runtime, turnstile.tools, turnstile.actors …; import-linter analyses a package by
# walking its folder, so this lays the source out as installed in a temporary directory first.
# Every .py file is analysed, whether or not any test imports it.
set -euo pipefail
cd "$(dirname "$0")/.."
repo="$(pwd)"
view="$(mktemp -d)"
trap 'rm -rf "$view"' EXIT
mkdir -p "$view/turnstile"
cp turnstile/__init__.py "$view/turnstile/"
for layer in runtime tools actors protocol client; do
  cp -r "$layer" "$view/turnstile/$layer"
done
cd "$view"
PYTHONPATH="$view" "$repo/.venv/bin/lint-imports" "$repo/pyproject.toml"
