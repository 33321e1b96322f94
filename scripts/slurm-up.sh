#!/usr/bin/env bash
# Installs (Debian packages) and starts a real Slurm on this one machine as root: munged, slurmctld and
# one slurmd per node (two nodes by default, both on this host, so multi-node jobs run here too),
# with config, state, spool and logs under $BSOPS_SLURM_DIR (default /tmp/bsops-slurm).
# Idempotent: when the cluster already answers, it only prints the environment to use.
# Usage: bash scripts/slurm-up.sh    then: export SLURM_CONF=$BSOPS_SLURM_DIR/etc/slurm.conf
# Settings are the ones known to work without systemd or cgroups.
set -euo pipefail

dir=${BSOPS_SLURM_DIR:-/tmp/bsops-slurm}
cpus=${BSOPS_SLURM_CPUS:-8}  # per node
num_nodes=${BSOPS_SLURM_NODES:-2}
partition=${BSOPS_SLURM_PARTITION:-bsops}
conf=$dir/etc/slurm.conf
socket=$dir/munge/munge.socket
export SLURM_CONF=$conf

say() { echo "slurm-up: $*" >&2; }
die() { echo "slurm-up: error: $*" >&2; exit 1; }

print_env() {
    echo "export SLURM_CONF=$conf"
}

cluster_state() {
    # One line per node state; empty when the controller does not answer.
    timeout 10 sinfo -h -o %T 2>/dev/null | sort -u | tr '\n' ' ' || true
}

alive() { [[ -f $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

host=$(hostname -s)
nodes=()
for ((i = 1; i <= num_nodes; i++)); do nodes+=("${host}n$i"); done
node_list=$(IFS=,; echo "${nodes[*]}")
all_slurmd_alive() {
    local node
    for node in "${nodes[@]}"; do alive "$dir/run/slurmd-$node.pid" || return 1; done
}

conf_text() {
    cat <<EOF
# Slurm on one machine for bigscience-ops tests; written by scripts/slurm-up.sh.
ClusterName=bsops
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$socket
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/slurmd-%n
SlurmctldPidFile=$dir/run/slurmctld.pid
SlurmdPidFile=$dir/run/slurmd-%n.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$dir/log/jobcomp.txt
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1,sched_interval=2
SlurmdParameters=config_overrides
ScronParameters=enable
ReturnToService=2
MinJobAge=300
# Slurm's default: scancel and the time limit leave a job's processes this long between SIGTERM and SIGKILL.
KillWait=30
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
# Every node is this host: one slurmd each (slurmd -N NAME), on ports of their own.
$(for ((i = 0; i < num_nodes; i++)); do
    echo "NodeName=${nodes[i]} NodeHostname=$host NodeAddr=127.0.0.1 Port=$((17001 + i)) CPUs=$cpus State=UNKNOWN"
done)
PartitionName=$partition Nodes=$node_list Default=YES MaxTime=INFINITE State=UP
# A partition that is always down: jobs sent there pend with reason PartitionDown.
PartitionName=$partition-down Nodes=$node_list Default=NO MaxTime=INFINITE State=DOWN
EOF
}

# Already up with this very config: our three daemons are alive and the node is usable. A config that
# differs (an older slurm-up.sh wrote it) restarts the daemons with this one below. (Checking the pid
# files first avoids sinfo's retries against a controller that is not there.)
if [[ -f $conf && $(conf_text) == "$(cat "$conf")" ]] && command -v sinfo >/dev/null && alive "$dir/run/munged.pid" \
    && alive "$dir/run/slurmctld.pid" && all_slurmd_alive \
    && [[ $(cluster_state) =~ (idle|mixed|allocated) ]]; then
    print_env
    exit 0
fi

[[ $(id -u) == 0 ]] || die "must run as root to install packages and start munged/slurmctld/slurmd (uid is $(id -u))"

# --- install -----------------------------------------------------------------------------------
packages=(munge slurmctld slurmd slurm-client)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
    say "installing ${missing[*]}"
    # A policy-rc.d that exits 101 keeps the packages from starting daemons with stock configs.
    policy=/usr/sbin/policy-rc.d
    saved_policy=""
    if [[ -e $policy ]]; then saved_policy=$(mktemp); cp -p "$policy" "$saved_policy"; fi
    restore_policy() {
        if [[ -n $saved_policy ]]; then mv -f "$saved_policy" "$policy"; else rm -f "$policy"; fi
    }
    trap restore_policy EXIT
    printf '#!/bin/sh\nexit 101\n' > "$policy"
    chmod 755 "$policy"
    export DEBIAN_FRONTEND=noninteractive
    mkdir -p "$dir/log"
    aptlog=$dir/log/apt.log
    if ! apt-get install -y -q --no-install-recommends "${missing[@]}" >"$aptlog" 2>&1; then
        say "apt-get install failed; refreshing package lists and retrying"
        apt-get update -q >>"$aptlog" 2>&1 || true
        apt-get install -y -q --no-install-recommends "${missing[@]}" >>"$aptlog" 2>&1 \
            || die "apt-get install ${missing[*]} failed; see $aptlog"
    fi
    restore_policy
    trap - EXIT
fi

# --- configure ---------------------------------------------------------------------------------
# Stop whatever a previous, half-started run left behind (only our own pid files).
# A pid file can outlive its daemon (a reboot, a new machine): kill only a process of that name.
for pidfile in "$dir"/run/slurmd*.pid "$dir"/run/slurmctld.pid "$dir"/run/munged.pid; do
    if [[ -f $pidfile ]]; then
        pid=$(cat "$pidfile")
        daemon=$(basename "$pidfile" .pid)
        daemon=${daemon%%-*}
        if [[ $pid =~ ^[0-9]+$ && $(cat "/proc/$pid/comm" 2>/dev/null) == "$daemon" ]]; then
            kill "$pid" 2>/dev/null || true
        fi
        rm -f "$pidfile"
    fi
done
sleep 0.2

mkdir -p "$dir"/{etc,state,spool,log,run,munge}
chmod 700 "$dir/munge"
key=$dir/munge/munge.key
if [[ ! -s $key ]]; then
    head -c 1024 /dev/urandom > "$key"
fi
chmod 400 "$key"

conf_text > "$conf"

# --- start -------------------------------------------------------------------------------------
started=$(date +%s%N)
munged --key-file="$key" --socket="$socket" --pid-file="$dir/run/munged.pid" \
    --log-file="$dir/log/munged.log" --seed-file="$dir/munge/munge.seed" --force \
    || die "munged did not start; see $dir/log/munged.log"
slurmctld -f "$conf" || die "slurmctld did not start; see $dir/log/slurmctld.log"
for node in "${nodes[@]}"; do
    slurmd -f "$conf" -N "$node" || die "slurmd for $node did not start; see $dir/log/slurmd-$node.log"
done

for _ in $(seq 1 120); do
    state=$(cluster_state)
    if [[ $state =~ (idle|mixed|allocated) && ! $state =~ (down|drain|unknown|future) ]]; then
        say "up in $(( ($(date +%s%N) - started) / 1000000 )) ms (node state: ${state% })"
        print_env
        exit 0
    fi
    # A node that was down in saved state is brought back explicitly.
    if [[ $state =~ (down|drain) ]]; then
        scontrol update NodeName="$node_list" State=RESUME >/dev/null 2>&1 || true
    fi
    sleep 0.25
done
die "the nodes did not become idle within 30 s (sinfo says '${state:-nothing}'); see $dir/log/slurmctld.log and $dir/log/slurmd-*.log"
