#!/usr/bin/env bash
# A single-node SLURM cluster on this machine for the tests: munge + slurmctld + slurmd
# on localhost, no accounting database. Usage: cluster.sh start|stop DIR
# `start` writes DIR/slurm.conf and prints it; point clients at it with SLURM_CONF.
set -euo pipefail
action=$1
dir=$(readlink -f "$2")
conf=$dir/slurm.conf

system_conf=/etc/slurm/slurm.conf
marker="# attnflow test cluster"

stop() {
    for pidfile in "$dir"/slurmd.pid "$dir"/slurmctld.pid; do
        if [ -f "$pidfile" ]; then
            kill "$(cat "$pidfile")" 2>/dev/null || true
        fi
    done
    sleep 1
    rm -f "$dir"/slurmd.pid "$dir"/slurmctld.pid
    if [ -f "$system_conf" ] && head -1 "$system_conf" | grep -qF "$marker"; then
        rm -f "$system_conf"
    fi
}

case $action in
start)
    mkdir -p "$dir"/state "$dir"/spool
    host=$(hostname -s)
    cpus=$(nproc)
    mem=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 - 1024 ))
    cat > "$conf" <<CONF
$marker
ClusterName=attnflow
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
SlurmctldPort=6917
SlurmdPort=6918
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
ReturnToService=2
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MinJobAge=300
NodeName=$host CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
CONF
    # munged refuses to run as root without --force; a key comes with Debian's package.
    if ! pgrep -x munged >/dev/null; then
        mkdir -p /run/munge && chown munge:munge /run/munge 2>/dev/null || true
        if [ ! -s /etc/munge/munge.key ]; then
            mungekey --create --force 2>/dev/null || create-munge-key -f
        fi
        su -s /bin/sh munge -c munged 2>/dev/null || munged --force
    fi
    stop
    # Inside a job, Snakemake's jobstep executor drops SLURM_* variables before
    # calling srun, so srun must find the config at the default path. Install it
    # there only when no other SLURM config is in place (never overwrite one).
    if [ -f "$system_conf" ] && ! head -1 "$system_conf" | grep -qF "$marker"; then
        echo "$system_conf exists and is not ours: not touching it" >&2
        exit 3
    fi
    mkdir -p "$(dirname "$system_conf")" && cp "$conf" "$system_conf"
    SLURM_CONF=$conf slurmctld -c -f "$conf"
    SLURM_CONF=$conf slurmd -c -f "$conf"
    for _ in $(seq 60); do
        if SLURM_CONF=$conf sinfo -h -o %T 2>/dev/null | grep -qE '^idle'; then
            echo "$conf"
            exit 0
        fi
        sleep 1
    done
    echo "SLURM did not come up; logs in $dir" >&2
    tail -20 "$dir"/slurmctld.log "$dir"/slurmd.log >&2 || true
    exit 1
    ;;
stop)
    stop
    ;;
*)
    echo "usage: $0 start|stop DIR" >&2
    exit 2
    ;;
esac
