#!/usr/bin/env bash
# The dashboard's browser tests (tests/gateway/test_dashboard.py) need Debian's chromium and
# chromium-driver. Idempotent: does nothing when both are on PATH.
set -euo pipefail

if command -v chromium >/dev/null && command -v chromedriver >/dev/null; then
  exit 0
fi
SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo -n"
export DEBIAN_FRONTEND=noninteractive
PACKAGES="chromium chromium-driver"
# shellcheck disable=SC2086  # a word list
$SUDO apt-get install -y -q --no-install-recommends $PACKAGES >/dev/null \
  || { $SUDO apt-get update -q >/dev/null \
       && $SUDO apt-get install -y -q --no-install-recommends $PACKAGES >/dev/null; }
command -v chromium >/dev/null && command -v chromedriver >/dev/null
