#!/usr/bin/env bash
# Installs what the NATS and Prometheus tests start themselves (docs/nats.md): Debian's
# `nats-server` (with JetStream) and `prometheus`. Already installed: nothing to do.
set -euo pipefail

SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo -n"
export DEBIAN_FRONTEND=noninteractive
have() { command -v "$1" >/dev/null 2>&1 || [ -x "/usr/sbin/$1" ] || [ -x "/usr/bin/$1" ]; }

MISSING=""
have nats-server || MISSING="$MISSING nats-server"
have prometheus || MISSING="$MISSING prometheus"
if [ -n "$MISSING" ]; then
  # shellcheck disable=SC2086  # a word list
  $SUDO apt-get install -y -q --no-install-recommends $MISSING >/dev/null \
    || { $SUDO apt-get update -q >/dev/null \
         && $SUDO apt-get install -y -q --no-install-recommends $MISSING >/dev/null; }
fi
# The Debian package starts a Prometheus service on :9090 where an init system runs; the tests
# start their own on a free port and need nothing of it.
have nats-server && have prometheus
