#!/usr/bin/env bash
# Installs everything the tests need on a fresh machine and runs them. Usage: bash scripts/test.sh [pytest args]
# The tests run on two pytest-xdist workers unless the arguments say otherwise (-n 0: one process, -n N: N):
# tests/conftest.py keeps the Slurm cluster's tests on one worker, the local launches of the job script on one, each
# module's trainer launches on one.
# A test that skips fails the run unless tests/conftest.py's ALLOWED_SKIPS lists it (a GPU test on a CPU machine):
# run as root on Debian/Ubuntu, where everything below can be installed.
set -euo pipefail
cd "$(dirname "$0")/.."

# The system packages the tests use: the test Slurm cluster's (scripts/slurm-up.sh configures and starts it),
# git-lfs (the Hub sync's tests) and faketime (the watchdog's fault tests). Installed here, once, before any worker
# starts: two workers' fixtures installing at the same time fail on dpkg's lock (one test skipped, another failed).
# The fixtures still install what is missing when pytest runs without this script.
system_packages=(munge slurmctld slurmd slurm-client git-lfs faketime)
install_system_packages() {
    if ! command -v dpkg-query >/dev/null; then
        echo "test: no dpkg here: install ${system_packages[*]} yourself" >&2
        return
    fi
    local missing=() p
    for p in "${system_packages[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    ((${#missing[@]})) || return 0
    if [[ $(id -u) != 0 ]] || ! command -v apt-get >/dev/null; then
        echo "test: ${missing[*]} missing, not installable here (needs root and apt-get): the tests using them fail" >&2
        return
    fi
    echo "test: installing ${missing[*]}" >&2
    # A policy-rc.d that exits 101 keeps the packages from starting daemons with stock configs (as slurm-up.sh does).
    local policy=/usr/sbin/policy-rc.d log
    saved=""
    if [[ -e $policy ]]; then saved=$(mktemp); cp -p "$policy" "$saved"; fi
    restore_policy() {
        if [[ -n $saved ]]; then mv -f "$saved" /usr/sbin/policy-rc.d; else rm -f /usr/sbin/policy-rc.d; fi
    }
    trap restore_policy EXIT
    printf '#!/bin/sh\nexit 101\n' > "$policy"
    chmod 755 "$policy"
    log=$(mktemp -t bsops-test-apt.XXXXXX)
    local ok=1
    export DEBIAN_FRONTEND=noninteractive
    if ! apt-get install -y -q --no-install-recommends "${missing[@]}" >"$log" 2>&1; then
        apt-get update -q >>"$log" 2>&1 || true
        apt-get install -y -q --no-install-recommends "${missing[@]}" >>"$log" 2>&1 || ok=0
    fi
    restore_policy
    trap - EXIT
    ((ok)) || { echo "test: apt-get install ${missing[*]} failed; see $log" >&2; exit 1; }
    rm -f "$log"
}
install_system_packages
bash scripts/setup.sh
workers=(-n 2)
for arg in "$@"; do
    case "$arg" in
        -n | -n[0-9]* | --numprocesses | --numprocesses=* | no:xdist) workers=() ;;
    esac
done
exec .venv/bin/python -m pytest "${workers[@]}" "$@"
