#!/usr/bin/env bash
# Makes the base images the Dockerfiles start from, where no image registry can be reached
# (docs/operations.md, "Building the images offline"): `debian:bookworm-slim` debootstrapped
# from the Debian mirror apt already uses, and `python:3.11-slim` built on it with a venv that
# gives `python` and `pip` as the official image does. An image already present is kept, so a
# second run costs nothing; FORCE=1 rebuilds both. Needs root (debootstrap) and a Docker engine.
set -euo pipefail
cd "$(dirname "$0")/.."

DEBIAN_IMAGE=debian:bookworm-slim
PYTHON_IMAGE=python:3.11-slim
SUITE=bookworm

# The first `URIs:` (deb822) or `deb` line of apt's own sources: the mirror known to answer here.
apt_mirror() {
  local uri
  uri=$(grep -hsE '^URIs:' /etc/apt/sources.list.d/*.sources | awk '{print $2}' | grep -m1 debian/ || true)
  [ -n "$uri" ] || uri=$(grep -hsE '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list \
    | awk '{print $2}' | grep -m1 debian/ || true)
  echo "${uri:-http://deb.debian.org/debian}"
}

present() { [ "${FORCE:-0}" != 1 ] && docker image inspect "$1" >/dev/null 2>&1; }

if present "$DEBIAN_IMAGE"; then
  echo "$DEBIAN_IMAGE: present, kept"
else
  MIRROR=${MIRROR:-$(apt_mirror)}
  ROOTFS=$(mktemp -d /tmp/flexgate-rootfs.XXXXXX)
  trap 'rm -rf "$ROOTFS"' EXIT
  echo "$DEBIAN_IMAGE: debootstrap $SUITE from $MIRROR"
  debootstrap --variant=minbase "$SUITE" "$ROOTFS" "$MIRROR" >/tmp/flexgate-debootstrap.log 2>&1 \
    || { tail -n 20 /tmp/flexgate-debootstrap.log >&2; exit 1; }
  # The same mirror inside the image, so `apt-get` in a Dockerfile reaches what the host reaches.
  echo "deb $MIRROR $SUITE main" >"$ROOTFS/etc/apt/sources.list"
  rm -rf "$ROOTFS"/var/cache/apt/archives/*.deb "$ROOTFS"/var/lib/apt/lists/*
  tar -C "$ROOTFS" -c . | docker import --change 'CMD ["bash"]' - "$DEBIAN_IMAGE" >/dev/null
  rm -rf "$ROOTFS"
  trap - EXIT
fi

if present "$PYTHON_IMAGE"; then
  echo "$PYTHON_IMAGE: present, kept"
else
  echo "$PYTHON_IMAGE: Debian's python3 with a venv on the PATH"
  docker build --quiet -t "$PYTHON_IMAGE" -f docker/python-base.Dockerfile docker >/dev/null
fi
