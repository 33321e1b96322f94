#!/usr/bin/env bash
# Stops the Slurm that scripts/slurm-up.sh started: cancels its jobs, then stops
# the slurmds, slurmctld and munged by their pid files under $BSOPS_SLURM_DIR (default /tmp/bsops-slurm).
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

t0=$(date +%s%N)
stop() {  # stop NAME=PIDFILE...: TERM them all at once, wait up to 10 s, then KILL what is left
    local spec name pidfile pid
    local -A pids=()
    for spec in "$@"; do
        name=${spec%%=*} pidfile=${spec#*=}
        [[ -f $pidfile ]] || continue
        pid=$(cat "$pidfile")
        # Only a process of the daemon's name: the pid may have been reused since.
        if [[ -n $pid && $(cat "/proc/$pid/comm" 2>/dev/null) == "${name%%-*}" ]]; then
            kill "$pid" 2>/dev/null || true
            pids[$name]=$pid
        fi
        rm -f "$pidfile"
    done
    for _ in $(seq 1 100); do
        local alive=0
        for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
        ((alive)) || break
        sleep 0.1
    done
    for name in "${!pids[@]}"; do
        if kill -0 "${pids[$name]}" 2>/dev/null; then
            say "$name (${pids[$name]}) ignored TERM for 10 s; killing it"
            kill -9 "${pids[$name]}" 2>/dev/null || true
        fi
    done
}

specs=()
for pidfile in "$dir"/run/slurmd*.pid; do [[ -e $pidfile ]] && specs+=("$(basename "$pidfile" .pid)=$pidfile"); done
stop "${specs[@]}" slurmctld="$dir/run/slurmctld.pid"
stop munged="$dir/run/munged.pid"
say "daemons stopped in $(( ($(date +%s%N) - t0) / 1000000 )) ms"

if ((purge)); then
    case "$dir" in
        /|"") say "refusing to delete '$dir'"; exit 1 ;;
    esac
    rm -rf -- "$dir"
    say "stopped and removed $dir"
else
    say "stopped (state kept in $dir)"
fi
