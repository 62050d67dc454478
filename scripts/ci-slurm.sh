#!/usr/bin/env bash
# CI: Debian's Slurm (slurmctld, slurmd, the commands) and munge, for tests/gateway/test_slurm.py.
# The tests start their own cluster on loopback with a private munge socket: nothing here is
# configured or started, and the system's own Slurm and munge (if any) are left alone.
# Idempotent; a second run only checks.
set -euo pipefail

SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo -n"
export DEBIAN_FRONTEND=noninteractive
needed=0
for command in munged slurmctld slurmd sbatch squeue scancel sinfo; do
  command -v "$command" >/dev/null 2>&1 || needed=1
done
if [ "$needed" = 1 ]; then
  PACKAGES="slurm-wlm munge"
  # shellcheck disable=SC2086  # a word list
  $SUDO apt-get install -y -q --no-install-recommends $PACKAGES >/dev/null \
    || { $SUDO apt-get update -q >/dev/null \
         && $SUDO apt-get install -y -q --no-install-recommends $PACKAGES >/dev/null; }
fi
slurmctld -V
