#!/usr/bin/env bash
# Install Debian's chromium (used by the index.html browser test) when it is missing.
# Needs root and apt; without them it says so, and the browser test fails with that reason.
set -euo pipefail
if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "install_chromium: installing Debian's chromium for the browser test"
  apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
else
  echo "install_chromium: chromium not found and cannot install it (need root + apt-get)" >&2
fi
