#!/usr/bin/env bash
# Type-check the package with mypy ([tool.mypy] in pyproject.toml), as CI does.
# The repository keeps runtime/, tools/, actors/, protocol/ and client/ side by side while they
# install as turnstile.runtime, turnstile.tools, turnstile.actors …, and mypy finds modules by folder (it
# cannot follow the editable install's import hook). So this lays the package out as installed,
# with symbolic links under .mypy_cache/layout/ (a fixed place, so mypy's cache stays valid from
# one run to the next), checks it there, and prints the paths as they are in the repository.
# Extra arguments go to mypy.
set -euo pipefail
cd "$(dirname "$0")/.."
repo="$(pwd)"
view="$repo/.mypy_cache/layout"
rm -rf "$view"
mkdir -p "$view/turnstile"
ln -s "$repo/turnstile/__init__.py" "$view/turnstile/__init__.py"
for layer in runtime tools actors protocol client; do
  ln -s "$repo/$layer" "$view/turnstile/$layer"
done
cd "$view"
status=0
"$repo/.venv/bin/mypy" --config-file "$repo/pyproject.toml" --cache-dir "$repo/.mypy_cache" \
  "$@" turnstile > "$view.out" 2>&1 || status=$?
sed -E 's#^turnstile/(runtime|tools|actors|protocol|client)/#\1/#' "$view.out"
exit "$status"
