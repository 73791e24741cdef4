#!/usr/bin/env bash
# The console's browser tests (tests/e2e/console/) drive a real Chromium through Playwright for
# Python, launched by executable path: Playwright's own browser download is never used (it needs
# the network at test time and a glibc it chooses). This installs Debian's `chromium` with
# apt-get when it is missing (as root, or through sudo) and prints its path on stdout; it prints
# nothing and exits 0 when it cannot (the tests then skip with a reason, and fail under CI=true).
# TURNSTILE_CHROMIUM, when set, names the executable and nothing is installed.
set -euo pipefail

find_chromium() {
  if [ -n "${TURNSTILE_CHROMIUM:-}" ] && [ -x "${TURNSTILE_CHROMIUM}" ]; then
    echo "${TURNSTILE_CHROMIUM}"
    return 0
  fi
  local name
  for name in chromium chromium-browser; do
    if command -v "$name" >/dev/null 2>&1; then
      command -v "$name"
      return 0
    fi
  done
  return 1
}

if find_chromium; then
  exit 0
fi

as_root=()
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    as_root=(sudo -n)
  else
    echo "ensure-chromium: chromium is missing and installing it needs root" >&2
    exit 0
  fi
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "ensure-chromium: chromium is missing and there is no apt-get to install it" >&2
  exit 0
fi

echo "ensure-chromium: installing Debian's chromium (apt-get)" >&2
export DEBIAN_FRONTEND=noninteractive
"${as_root[@]}" apt-get update -qq >&2
"${as_root[@]}" apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >&2
find_chromium || {
  echo "ensure-chromium: apt-get ran but no chromium is on PATH" >&2
  exit 0
}
