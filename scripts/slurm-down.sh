#!/usr/bin/env bash
# Stops the single-node Slurm that scripts/slurm-up.sh started: cancels its jobs, then stops
# slurmd, slurmctld and munged by their pid files under $BSOPS_SLURM_DIR (default /tmp/bsops-slurm).
# Usage: bash scripts/slurm-down.sh [--purge]   (--purge also deletes the directory: state, logs, key)
set -euo pipefail

dir=${BSOPS_SLURM_DIR:-/tmp/bsops-slurm}
export SLURM_CONF=$dir/etc/slurm.conf
purge=0
case "${1:-}" in
    "") ;;
    --purge) purge=1 ;;
    *) echo "slurm-down: error: unknown argument '$1'; the only option is --purge" >&2; exit 2 ;;
esac

say() { echo "slurm-down: $*" >&2; }

if [[ -f $SLURM_CONF && -f $dir/run/slurmctld.pid ]] && command -v squeue >/dev/null \
    && kill -0 "$(cat "$dir/run/slurmctld.pid")" 2>/dev/null; then
    # Cancel what is still queued so no slurmstepd outlives its daemons.
    jobs=$(timeout 10 squeue -h -o %A 2>/dev/null || true)
    if [[ -n $jobs ]]; then
        # shellcheck disable=SC2086
        timeout 10 scancel $jobs 2>/dev/null || true
        sleep 1
    fi
fi

stop() {  # stop NAME PIDFILE: TERM, wait up to 10 s, then KILL
    local name=$1 pidfile=$2 pid
    [[ -f $pidfile ]] || return 0
    pid=$(cat "$pidfile")
    if [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null; then
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 1 40); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.25
        done
        if kill -0 "$pid" 2>/dev/null; then
            say "$name ($pid) ignored TERM for 10 s; killing it"
            kill -9 "$pid" 2>/dev/null || true
        fi
    fi
    rm -f "$pidfile"
    say "stopped $name in $(( ($(date +%s%N) - t0) / 1000000 )) ms"
}
t0=$(date +%s%N)

stop slurmd "$dir/run/slurmd.pid"
stop slurmctld "$dir/run/slurmctld.pid"
stop munged "$dir/run/munged.pid"

if ((purge)); then
    case "$dir" in
        /|"") say "refusing to delete '$dir'"; exit 1 ;;
    esac
    rm -rf -- "$dir"
    say "stopped and removed $dir"
else
    say "stopped (state kept in $dir)"
fi
