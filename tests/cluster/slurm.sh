#!/usr/bin/env bash
# A real single-host SLURM cluster for tests, without systemd.
#
#   slurm.sh install   apt-get install Debian's slurmctld slurmd slurm-client munge slurmdbd mariadb-server (skipped
#                      when already installed)
#   slurm.sh start     munged, mariadbd, slurmdbd (job accounting), slurmctld and two emulated nodes n1, n2
#                      (`slurmd -N`), each with 4 CPUs (more than the host may have, so jobs queue less) and two
#                      fake GPUs (Gres=gpu:fake:2, backed by device files);
#                      registers cluster, account and user with sacctmgr; waits until both nodes are idle
#   slurm.sh stop      cancels every job, then stops the daemons by the PIDs recorded at start
#   slurm.sh status    prints the daemons and `sinfo`
#
# Every command is idempotent. Must run as root (CI and the test machine do). Everything the daemons write lives under
# $DM_SLURM_STATE (default /var/tmp/deltamatch-slurm); the configuration goes to /etc/slurm because every SLURM client
# (sbatch, sacct, srun inside jobs, the Snakemake plugin) looks there. Names a profile must match: cluster `deltamatch`,
# partition `main`, account `deltamatch`.
set -euo pipefail

STATE=${DM_SLURM_STATE:-/var/tmp/deltamatch-slurm}
CLUSTER=deltamatch
PARTITION=main
ACCOUNT=deltamatch
NODES=(n1 n2)
NODE_CPUS=4
NODE_MEM_MB=16000
GPUS_PER_NODE=2
DB_SOCKET=/run/mysqld/mysqld.sock
PACKAGES=(slurmctld slurmd slurm-client munge slurmdbd mariadb-server)

log() { echo "[slurm.sh] $*" >&2; }
die() { log "error: $*"; exit 1; }

require_root() { [[ $(id -u) == 0 ]] || die "must run as root"; }

# --- process bookkeeping: every daemon runs in the foreground under setsid, so $! is its PID -----------------------
pidfile() { echo "$STATE/run/$1.pid"; }

alive() {  # alive NAME: the recorded PID exists and still runs the program we started
    local f pid
    f=$(pidfile "$1")
    [[ -s $f ]] || return 1
    pid=$(<"$f")
    [[ -d /proc/$pid && $(readlink "/proc/$pid/exe" 2>/dev/null) == "$(<"$STATE/run/$1.exe")" ]]
}

launch() {  # launch NAME EXE ARGS...: start a daemon in its own session, detached from our stdio
    local name=$1 exe=$2; shift 2
    if alive "$name"; then return 0; fi
    setsid "$exe" "$@" >>"$STATE/log/$name.out" 2>&1 </dev/null &
    echo $! >"$(pidfile "$name")"
    readlink -f "$exe" >"$STATE/run/$name.exe"  # /proc/PID/exe shows the target of symlinks (slurmctld-wlm)
}

wait_for() {  # wait_for SECONDS DESCRIPTION COMMAND...: poll until COMMAND succeeds
    local limit=$1 what=$2; shift 2
    local deadline=$((SECONDS + limit))
    until "$@" >/dev/null 2>&1; do
        ((SECONDS < deadline)) || die "timed out after ${limit}s waiting for $what (logs: $STATE/log)"
        sleep 0.2
    done
}

terminate() {  # terminate NAME...: SIGTERM to all at once, then SIGKILL after 10 s, by recorded PID only
    local name pids=() pid
    for name in "$@"; do
        if alive "$name"; then pids+=("$(<"$(pidfile "$name")")"); fi
        rm -f "$(pidfile "$name")"
    done
    ((${#pids[@]})) || return 0
    kill -TERM "${pids[@]}" 2>/dev/null || true
    local running
    for _ in $(seq 100); do
        running=0
        for pid in "${pids[@]}"; do [[ -d /proc/$pid ]] && running=1; done
        ((running)) || return 0
        sleep 0.1
    done
    for pid in "${pids[@]}"; do
        [[ -d /proc/$pid ]] && { log "PID $pid ignored SIGTERM; killing"; kill -KILL "$pid" 2>/dev/null || true; }
    done
}

# --- install ----------------------------------------------------------------------------------------------------------
cmd_install() {
    require_root
    local missing=()
    for p in "${PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
    done
    if ((${#missing[@]} == 0)); then log "already installed"; return 0; fi
    log "installing ${missing[*]}"
    # No init system here: a policy-rc.d that answers 101 stops the packages' postinst from starting services.
    local policy=/usr/sbin/policy-rc.d own_policy=0
    if [[ ! -e $policy ]]; then printf '#!/bin/sh\nexit 101\n' >"$policy"; chmod +x "$policy"; own_policy=1; fi
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >/dev/null
    apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
    ((own_policy)) && rm -f "$policy"
    log "installed"
}

# --- configuration ------------------------------------------------------------------------------------------------
write_configs() {
    local host; host=$(hostname -s)
    mkdir -p /etc/slurm "$STATE"/{log,run,ctld,dev} "${NODES[@]/#/$STATE/spool/}"
    local gres_lines="" node_lines="" port=6821
    for n in "${NODES[@]}"; do
        for ((g = 0; g < GPUS_PER_NODE; g++)); do
            # Fake GPUs: slurmd only needs the files to exist; character devices (like /dev/null) when allowed.
            [[ -e $STATE/dev/$n-gpu$g ]] || mknod "$STATE/dev/$n-gpu$g" c 1 3 2>/dev/null || touch "$STATE/dev/$n-gpu$g"
        done
        gres_lines+="NodeName=$n Name=gpu Type=fake File=$STATE/dev/$n-gpu[0-$((GPUS_PER_NODE - 1))]"$'\n'
        # Both slurmd run on this host, so each needs its own port.
        node_lines+="NodeName=$n NodeHostname=$host NodeAddr=127.0.0.1 Port=$port CPUs=$NODE_CPUS"
        node_lines+=" RealMemory=$NODE_MEM_MB Gres=gpu:fake:$GPUS_PER_NODE State=UNKNOWN"$'\n'
        port=$((port + 1))
    done
    # Written to a temporary name and renamed: clients running right now must never read a half-written file.
    cat >/etc/slurm/slurm.conf.tmp <<EOF
# Written by tests/cluster/slurm.sh: a test cluster of emulated nodes on one host.
ClusterName=$CLUSTER
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/spool/%n
SlurmctldPidFile=$STATE/run/slurmctld.daemon.pid
SlurmdPidFile=$STATE/run/slurmd-%n.daemon.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd-%n.log
SlurmctldPort=6817
# No cgroups without systemd: track processes through /proc, no task binding.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
GresTypes=gpu
# Declared CPUs/memory may exceed what this host has: the nodes are emulated.
SlurmdParameters=config_overrides
ReturnToService=2
MpiDefault=none
# Short waits keep the preemption tests fast: SIGTERM -> SIGKILL after 5 s.
KillWait=5
MinJobAge=300
InactiveLimit=0
Waittime=0
MailProg=/bin/true
# Job accounting through slurmdbd (what sacct and the Snakemake SLURM plugin read).
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStorageEnforce=associations
AccountingStorageTRES=gres/gpu
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=10
JobCompType=jobcomp/none
# The Snakemake plugin names rule and wildcards in the job comment; keep it in accounting (sacct -o Comment).
AccountingStoreFlags=job_comment
$node_lines
PartitionName=$PARTITION Nodes=$(IFS=,; echo "${NODES[*]}") Default=YES MaxTime=INFINITE State=UP
EOF
    printf 'AutoDetect=off\n%s' "$gres_lines" >/etc/slurm/gres.conf.tmp
    cat >/etc/slurm/slurmdbd.conf.tmp <<EOF
# Written by tests/cluster/slurm.sh.
AuthType=auth/munge
DbdHost=localhost
DbdAddr=127.0.0.1
SlurmUser=root
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=slurm
StoragePass=slurm
StorageLoc=slurm_acct_db
LogFile=$STATE/log/slurmdbd.log
PidFile=$STATE/run/slurmdbd.daemon.pid
EOF
    chmod 600 /etc/slurm/slurmdbd.conf.tmp
    for f in slurm gres slurmdbd; do mv -f "/etc/slurm/$f.conf.tmp" "/etc/slurm/$f.conf"; done
}

# --- start --------------------------------------------------------------------------------------------------------
start_munge() {
    install -d -o munge -g munge -m 0755 /run/munge
    install -d -o munge -g munge -m 0700 /var/lib/munge /var/log/munge
    [[ -s /etc/munge/munge.key ]] || { mungekey --create --keyfile=/etc/munge/munge.key; chown munge:munge /etc/munge/munge.key; }
    # setpriv execs (no fork), so the recorded PID is munged's own.
    launch munged /usr/bin/setpriv --reuid=munge --regid=munge --init-groups /usr/sbin/munged -F
    readlink -f /usr/sbin/munged >"$STATE/run/munged.exe"
    wait_for 15 munged munge -n
}

start_mariadb() {
    install -d -o mysql -g mysql /run/mysqld
    [[ -d /var/lib/mysql/mysql ]] || mariadb-install-db --user=mysql --datadir=/var/lib/mysql >/dev/null
    launch mariadbd /usr/sbin/mariadbd --user=mysql --skip-networking --socket=$DB_SOCKET \
        --pid-file=/run/mysqld/mariadbd.pid --log-error="$STATE/log/mariadbd.log"
    wait_for 30 mariadbd mariadb --socket=$DB_SOCKET -e "SELECT 1"
    mariadb --socket=$DB_SOCKET -e "CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY 'slurm';
        GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';"
}

sacctmgr_has() { [[ -n $(sacctmgr -n -P show "$@" </dev/null 2>/dev/null) ]]; }

register_accounting() {
    sacctmgr_has cluster "$CLUSTER" format=cluster || sacctmgr -i add cluster "$CLUSTER" >/dev/null
    sacctmgr_has account "$ACCOUNT" format=account || \
        sacctmgr -i add account "$ACCOUNT" cluster="$CLUSTER" description="deltamatch tests" >/dev/null
    local users=(root) u
    [[ -n ${SUDO_USER:-} && $SUDO_USER != root ]] && users+=("$SUDO_USER")
    for u in "${users[@]}"; do
        sacctmgr_has assoc user="$u" account="$ACCOUNT" format=user || \
            sacctmgr -i add user "$u" account="$ACCOUNT" defaultaccount="$ACCOUNT" cluster="$CLUSTER" >/dev/null
    done
}

nodes_idle() {
    local states
    states=$(sinfo -h -N -p "$PARTITION" -o '%t' | sort -u | tr '\n' ' ')
    [[ $states =~ ^(idle|mix|alloc|\ )+$ ]]
}

cmd_start() {
    require_root
    command -v slurmctld >/dev/null || die "SLURM is not installed: run '$0 install' first"
    write_configs
    start_munge
    start_mariadb
    launch slurmdbd /usr/sbin/slurmdbd -D
    wait_for 30 slurmdbd sacctmgr -n show cluster
    register_accounting  # before slurmctld, which registers itself with slurmdbd under ClusterName
    launch slurmctld /usr/sbin/slurmctld -D
    wait_for 30 slurmctld scontrol ping
    for n in "${NODES[@]}"; do launch "slurmd-$n" /usr/sbin/slurmd -D -N "$n"; done
    # Nodes drained by an earlier unclean stop come back here.
    scontrol update nodename="$(IFS=,; echo "${NODES[*]}")" state=resume >/dev/null 2>&1 || true
    wait_for 60 "nodes ${NODES[*]} to become idle" nodes_idle
    log "cluster $CLUSTER up: $(sinfo -h -o '%P %D %t %G' | tr '\n' ' ')"
}

# --- stop ---------------------------------------------------------------------------------------------------------
cmd_stop() {
    require_root
    [[ -d $STATE/run ]] || return 0
    if alive slurmctld; then
        # Jobs' slurmstepd outlive slurmd; cancel them while the controller can still reach them.
        local jobs; jobs=$(squeue -h -o %i 2>/dev/null || true)
        if [[ -n $jobs ]]; then
            # shellcheck disable=SC2086
            scancel $jobs 2>/dev/null || true
            local deadline=$((SECONDS + 20))
            while [[ -n $(squeue -h -o %i 2>/dev/null) ]] && ((SECONDS < deadline)); do sleep 0.3; done
        fi
    fi
    terminate "${NODES[@]/#/slurmd-}" slurmctld
    terminate slurmdbd
    terminate mariadbd munged
    log "stopped"
}

cmd_status() {
    for name in munged mariadbd slurmdbd slurmctld "${NODES[@]/#/slurmd-}"; do
        if alive "$name"; then echo "$name running (pid $(<"$(pidfile "$name")"))"; else echo "$name stopped"; fi
    done
    if alive slurmctld; then sinfo; fi
}

exec </dev/null  # nothing here reads stdin; sacctmgr would otherwise wait on prompts
case "${1:-}" in
    install) cmd_install ;;
    start) cmd_start ;;
    stop) cmd_stop ;;
    restart) cmd_stop; cmd_start ;;
    status) cmd_status ;;
    *) echo "usage: $0 {install|start|stop|restart|status}" >&2; exit 2 ;;
esac
