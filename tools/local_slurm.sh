#!/usr/bin/env bash
# A one-node SLURM cluster on this machine (root), for the tests and for trying slurm/*.sbatch.
#
#   tools/local_slurm.sh start DIR     # writes DIR/slurm.conf; starts munged, slurmctld, slurmd
#   SLURM_CONF=DIR/slurm.conf sbatch -n 2 slurm/cosmoflow.sbatch
#   tools/local_slurm.sh stop DIR      # stops what start started
#
# Needs the Debian packages slurm-wlm and munge. The node is this host (`hostname -s`) with
# its real CPU count; processes are tracked without cgroups (proctrack/linuxproc), so it
# also runs in containers.
set -euo pipefail
action=${1:?usage: local_slurm.sh start|stop DIR}
dir=$(realpath -m "${2:?usage: local_slurm.sh start|stop DIR}")
conf=$dir/slurm.conf

wait_for() {   # wait_for SECONDS COMMAND...: until COMMAND succeeds
    local deadline=$(( SECONDS + $1 )); shift
    until "$@" >/dev/null 2>&1; do
        (( SECONDS < deadline )) || return 1
        sleep 0.5
    done
}

start() {
    [[ $(id -u) == 0 ]] || { echo "local_slurm: must run as root" >&2; exit 1; }
    for bin in munged slurmctld slurmd sbatch; do
        command -v "$bin" >/dev/null || { echo "local_slurm: $bin not found (apt-get install slurm-wlm munge)" >&2; exit 1; }
    done
    mkdir -p "$dir"/{ctld,slurmd,log,run}
    local host; host=$(hostname -s)
    cat > "$conf" <<CONF
ClusterName=local
SlurmctldHost=$host
SlurmUser=root
AuthType=auth/munge
# A requeued job waits out its old credential's lifetime before it starts again (120 s by default);
# a started-early one can find that credential revoked and fail at launch. 10 s, and both schedulers
# every 5 s (60 and 30 s by default), keep the wait short.
AuthInfo=cred_expire=10
SchedulerParameters=bf_interval=5,sched_interval=5
# sbatch --wait polls its job after 2, 8, then every 32 s (its wait grows while under MinJobAge/2):
# with the default 300 a 12 s job returns at 42 s. 4 keeps the wait at 2 s; a finished job stays
# visible 4 s or more (slurmctld purges once a minute).
MinJobAge=4
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
ReturnToService=2
StateSaveLocation=$dir/ctld
SlurmdSpoolDir=$dir/slurmd
SlurmctldPidFile=$dir/run/slurmctld.pid
SlurmdPidFile=$dir/run/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
NodeName=$host CPUs=$(nproc) State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
    if ! pgrep -x munged >/dev/null; then
        mkdir -p /etc/munge /run/munge /var/lib/munge /var/log/munge
        [[ -s /etc/munge/munge.key ]] || dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
        chown -R munge:munge /etc/munge /run/munge /var/lib/munge /var/log/munge
        chmod 400 /etc/munge/munge.key
        runuser -u munge -- /usr/sbin/munged
        touch "$dir/run/munged.ours"
    fi
    wait_for 20 munge -n
    SLURM_CONF=$conf slurmctld -f "$conf"
    SLURM_CONF=$conf slurmd -f "$conf"
    if ! wait_for 60 bash -c "SLURM_CONF=$conf sinfo -h -o %t | grep -qx idle"; then
        echo "local_slurm: the node did not become idle; logs in $dir/log" >&2
        tail -5 "$dir"/log/*.log >&2 || true
        exit 1
    fi
    echo "local_slurm: cluster up; export SLURM_CONF=$conf"
}

stop() {
    local daemon pid
    for daemon in slurmd slurmctld; do
        if [[ -f $dir/run/$daemon.pid ]]; then
            pid=$(cat "$dir/run/$daemon.pid")
            kill "$pid" 2>/dev/null || true
            wait_for 30 bash -c "! kill -0 $pid" || kill -9 "$pid" 2>/dev/null || true
        fi
    done
    pkill -f "slurmstepd.*$dir" 2>/dev/null || true
    if [[ -f $dir/run/munged.ours ]]; then
        pkill -x munged 2>/dev/null || true
        rm -f "$dir/run/munged.ours"
    fi
    echo "local_slurm: stopped"
}

"$action"
