#!/usr/bin/env bash
# A real single-node SLURM cluster on this machine, with accounting, for tests and demos.
#
#   slurm/local_cluster.sh install   install the Debian packages only (start does it too when needed)
#   slurm/local_cluster.sh start     install (Debian packages) if needed, configure, start; idempotent
#   slurm/local_cluster.sh stop      cancel this cluster's jobs and stop its daemons
#   slurm/local_cluster.sh status    daemons, node state, queue; exit 0 only when usable
#
# Daemons are started by hand (no systemd): munged, mariadbd, slurmdbd, slurmctld, slurmd. The
# configuration is written to /etc/slurm (the client commands read it from there), state to
# /var/lib/atlas-slurm, logs to /var/log/atlas-slurm, pid files to /run/atlas-slurm. A config in
# /etc/slurm that this script did not write is never touched: start refuses instead.
# Needs root. Environment: ATLAS_SLURM_WAIT_S (bound on every wait, default 60).
set -euo pipefail

CLUSTER=atlas-local
PARTITION=debug
MARKER="# Written by slurm/local_cluster.sh (atlas local test cluster); rewritten on every start."
CONF_DIR=/etc/slurm
SLURM_CONF="$CONF_DIR/slurm.conf"
DBD_CONF="$CONF_DIR/slurmdbd.conf"
STATE=/var/lib/atlas-slurm
LOGS=/var/log/atlas-slurm
RUN=/run/atlas-slurm
MYSQL_SOCKET=/run/mysqld/mysqld.sock
MYSQL_PID=/run/mysqld/mysqld.pid   # written by mariadbd, which runs as mysql
DB_NAME=slurm_acct_db
DB_USER=slurm
DB_PASS=atlas-local-slurm
WAIT_S=${ATLAS_SLURM_WAIT_S:-60}
PACKAGES=(slurmctld slurmd slurm-client munge slurmdbd mariadb-server)

log() { echo "[local_cluster] $*"; }
die() { echo "[local_cluster] error: $*" >&2; exit 1; }

# The last lines of a log file, indented, on stderr (for error messages).
tail_log() { [ -f "$1" ] && { echo "  --- last lines of $1:" >&2; tail -n 15 "$1" | sed 's/^/  | /' >&2; } || true; }

# wait_for <what> <logfile> <pidfile:name or -> <command...>: retry the command until it succeeds,
# at most WAIT_S seconds; give up at once when the daemon named by the pid file has died.
wait_for() {
    local what=$1 logfile=$2 daemon=$3; shift 3
    local deadline=$((SECONDS + WAIT_S)) started=$SECONDS
    until "$@" >/dev/null 2>&1; do
        if [ "$daemon" != - ] && [ $((SECONDS - started)) -ge 5 ] && ! pid_alive "${daemon%%:*}" "${daemon##*:}"; then
            echo "[local_cluster] error: $what: ${daemon##*:} exited while starting" >&2
            tail_log "$logfile"
            exit 1
        fi
        if [ "$SECONDS" -ge "$deadline" ]; then
            echo "[local_cluster] error: $what not ready after ${WAIT_S}s (check: $*)" >&2
            tail_log "$logfile"
            exit 1
        fi
        sleep 0.5
    done
}

# pid_alive <pidfile> <process name>: the pid file names a live process with that name.
pid_alive() {
    local pidfile=$1 name=$2 pid
    [ -s "$pidfile" ] || return 1
    pid=$(cat "$pidfile" 2>/dev/null) || return 1
    [[ "$pid" =~ ^[0-9]+$ ]] || return 1
    [ -r "/proc/$pid/comm" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$name" ] || return 1
    # An exited daemon that nobody reaped (a zombie) is not running.
    [ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" != Z ]
}

# stop_pid <pidfile> <name>: SIGTERM that one process, wait (bounded), then SIGKILL it.
stop_pid() {
    local pidfile=$1 name=$2 pid deadline
    pid_alive "$pidfile" "$name" || { rm -f "$pidfile"; return 0; }
    pid=$(cat "$pidfile")
    kill -TERM "$pid" 2>/dev/null || true
    deadline=$((SECONDS + WAIT_S))
    while pid_alive "$pidfile" "$name" && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.2; done
    if pid_alive "$pidfile" "$name"; then
        log "$name (pid $pid) did not stop within ${WAIT_S}s; killing it"
        kill -KILL "$pid" 2>/dev/null || true
    fi
    rm -f "$pidfile"
}

need_root() { [ "$(id -u)" -eq 0 ] || die "run as root (it installs packages and starts system daemons)"; }

install_packages() {
    local missing=() p
    for p in "${PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    command -v apt-get >/dev/null || die "apt-get not found; install ${missing[*]} by hand"
    log "installing ${missing[*]} (apt-get)"
    # Packages must not start their services: this script starts the daemons itself.
    local policy=/usr/sbin/policy-rc.d created_policy=0
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\nexit 101\n' > "$policy"; chmod 755 "$policy"; created_policy=1
    fi
    local apt=(apt-get install -y -q --no-install-recommends -o Dpkg::Options::=--force-confold)
    if ! DEBIAN_FRONTEND=noninteractive "${apt[@]}" "${missing[@]}" > "$LOGS/apt.log" 2>&1; then
        log "install failed; refreshing the package lists and retrying"
        apt-get update -q >> "$LOGS/apt.log" 2>&1 || true
        if ! DEBIAN_FRONTEND=noninteractive "${apt[@]}" "${missing[@]}" >> "$LOGS/apt.log" 2>&1; then
            [ "$created_policy" -eq 1 ] && rm -f "$policy"
            tail_log "$LOGS/apt.log"
            die "could not install ${missing[*]}"
        fi
    fi
    [ "$created_policy" -eq 1 ] && rm -f "$policy"
    return 0
}

node_line() {
    # The node as slurmd detects it (CPUs, sockets, cores, memory), named after this host.
    local detected
    detected=$(slurmd -C | head -n 1) || die "slurmd -C failed"
    echo "$detected NodeAddr=127.0.0.1 State=UNKNOWN"
}

write_configs() {
    local node cpus mem defmem host tmp
    node=$(node_line)
    host=$(sed -n 's/^NodeName=\([^ ]*\).*/\1/p' <<< "$node")
    cpus=$(sed -n 's/.* CPUs=\([0-9]*\).*/\1/p' <<< "$node")
    mem=$(sed -n 's/.* RealMemory=\([0-9]*\).*/\1/p' <<< "$node")
    [ -n "$host" ] && [ -n "$cpus" ] && [ -n "$mem" ] || die "could not parse slurmd -C: $node"
    # Without a default memory per CPU every job asks for the whole node and jobs run one at a time.
    defmem=$((mem / cpus))
    mkdir -p "$CONF_DIR"
    if [ -f "$SLURM_CONF" ] && ! grep -qF "$MARKER" "$SLURM_CONF"; then
        die "$SLURM_CONF exists and was not written by this script; refusing to overwrite a real cluster's config"
    fi
    tmp=$(mktemp)
    cat > "$tmp" <<EOF
$MARKER
ClusterName=$CLUSTER
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# A requeued job waits for the job credential to expire before it can start again (default 120 s).
AuthInfo=cred_expire=10
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
ReturnToService=2
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/d
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd.pid
SlurmctldLogFile=$LOGS/slurmctld.log
SlurmdLogFile=$LOGS/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=10
MinJobAge=300
Waittime=0
SchedulerType=sched/backfill
# A requeued job may start once its credential expired; look for it every 5 s, not every 30 s.
SchedulerParameters=bf_interval=5
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=$defmem
# Accounting through slurmdbd: sacct sees finished, failed and requeued jobs (submitit relies on it).
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=30
JobCompType=jobcomp/none
$node
PartitionName=$PARTITION Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
    if ! cmp -s "$tmp" "$SLURM_CONF"; then
        if pid_alive "$RUN/slurmctld.pid" slurmctld || pid_alive "$RUN/slurmd.pid" slurmd; then
            log "configuration changed; restarting slurmctld and slurmd"
            stop_pid "$RUN/slurmd.pid" slurmd
            stop_pid "$RUN/slurmctld.pid" slurmctld
        fi
        install -m 644 "$tmp" "$SLURM_CONF"
    fi
    rm -f "$tmp"
    if [ -f "$DBD_CONF" ] && ! grep -qF "$MARKER" "$DBD_CONF"; then
        die "$DBD_CONF exists and was not written by this script; refusing to overwrite it"
    fi
    cat > "$tmp" <<EOF
$MARKER
AuthType=auth/munge
DbdHost=$host
DbdAddr=127.0.0.1
SlurmUser=root
PidFile=$RUN/slurmdbd.pid
LogFile=$LOGS/slurmdbd.log
DebugLevel=info
StorageType=accounting_storage/mysql
StorageHost=localhost
StoragePort=3306
StorageUser=$DB_USER
StoragePass=$DB_PASS
StorageLoc=$DB_NAME
EOF
    install -m 600 -o root -g root "$tmp" "$DBD_CONF"
    rm -f "$tmp"
}

start_munge() {
    if pid_alive /run/munge/munged.pid munged; then return 0; fi
    # munged runs as munge and needs its socket directory (/run/munge) owned by munge.
    install -d -o munge -g munge -m 755 /run/munge
    install -d -o munge -g munge -m 700 /var/log/munge /var/lib/munge
    if [ ! -s /etc/munge/munge.key ]; then
        log "creating /etc/munge/munge.key"
        dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
    fi
    chown munge:munge /etc/munge/munge.key; chmod 400 /etc/munge/munge.key
    runuser -u munge -- /usr/sbin/munged --pid-file=/run/munge/munged.pid \
        --log-file=/var/log/munge/munged.log || { tail_log /var/log/munge/munged.log; die "munged did not start"; }
    wait_for "munge" /var/log/munge/munged.log /run/munge/munged.pid:munged bash -c 'munge -n | unmunge'
}

mysql_ready() { mysqladmin --socket="$MYSQL_SOCKET" ping; }

start_mariadb() {
    if ! mysql_ready >/dev/null 2>&1; then
        install -d -o mysql -g mysql -m 755 /run/mysqld
        # mariadbd runs as mysql and must be able to write its log file.
        touch "$LOGS/mariadb.log"; chown mysql:mysql "$LOGS/mariadb.log"
        if [ ! -d /var/lib/mysql/mysql ]; then
            log "initialising the MariaDB data directory"
            mariadb-install-db --user=mysql --datadir=/var/lib/mysql > "$LOGS/mariadb-install.log" 2>&1 \
                || { tail_log "$LOGS/mariadb-install.log"; die "mariadb-install-db failed"; }
        fi
        setsid /usr/sbin/mariadbd --user=mysql --datadir=/var/lib/mysql --socket="$MYSQL_SOCKET" \
            --pid-file="$MYSQL_PID" --log-error="$LOGS/mariadb.log" --bind-address=127.0.0.1 \
            --port=3306 --innodb-lock-wait-timeout=900 < /dev/null > /dev/null 2>&1 &
        wait_for "mariadb" "$LOGS/mariadb.log" "$MYSQL_PID:mariadbd" mysql_ready
    fi
    mysql --socket="$MYSQL_SOCKET" -u root <<EOF || die "could not create the accounting database"
CREATE DATABASE IF NOT EXISTS $DB_NAME;
CREATE USER IF NOT EXISTS '$DB_USER'@'localhost' IDENTIFIED BY '$DB_PASS';
ALTER USER '$DB_USER'@'localhost' IDENTIFIED BY '$DB_PASS';
GRANT ALL ON $DB_NAME.* TO '$DB_USER'@'localhost';
FLUSH PRIVILEGES;
EOF
}

start_slurmdbd() {
    if ! pid_alive "$RUN/slurmdbd.pid" slurmdbd; then
        /usr/sbin/slurmdbd || { tail_log "$LOGS/slurmdbd.log"; die "slurmdbd did not start"; }
    fi
    wait_for "slurmdbd" "$LOGS/slurmdbd.log" "$RUN/slurmdbd.pid:slurmdbd" sacctmgr -n list cluster
    if ! sacctmgr -n -P list cluster format=cluster | grep -qx "$CLUSTER"; then
        sacctmgr -i add cluster "$CLUSTER" > /dev/null || die "sacctmgr could not add cluster $CLUSTER"
    fi
}

node_usable() { sinfo -h -n "$1" -o '%t' | grep -Eq '^(idle|mix|alloc)'; }

start_slurm() {
    local host
    host=$(sed -n 's/^SlurmctldHost=\([^(]*\).*/\1/p' "$SLURM_CONF")
    if ! pid_alive "$RUN/slurmctld.pid" slurmctld; then
        /usr/sbin/slurmctld || { tail_log "$LOGS/slurmctld.log"; die "slurmctld did not start"; }
    fi
    wait_for "slurmctld" "$LOGS/slurmctld.log" "$RUN/slurmctld.pid:slurmctld" scontrol ping
    if ! pid_alive "$RUN/slurmd.pid" slurmd; then
        /usr/sbin/slurmd || { tail_log "$LOGS/slurmd.log"; die "slurmd did not start"; }
    fi
    # A node left down or drained by an earlier run is put back in service.
    if sinfo -h -n "$host" -o '%t' | grep -Eq 'down|drain|fail'; then
        scontrol update nodename="$host" state=resume >/dev/null 2>&1 || true
    fi
    wait_for "node $host" "$LOGS/slurmd.log" "$RUN/slurmd.pid:slurmd" node_usable "$host"
    wait_for "accounting (sacct)" "$LOGS/slurmctld.log" - sacct -n -X -S now-1minutes
}

cmd_start() {
    need_root
    mkdir -p "$STATE/ctld" "$STATE/d" "$LOGS" "$RUN"
    local t0=$SECONDS
    install_packages
    write_configs
    start_munge
    start_mariadb
    start_slurmdbd
    start_slurm
    log "cluster $CLUSTER up in $((SECONDS - t0))s: partition $PARTITION, $(sinfo -h -o '%D node(s), %c CPUs, %m MB, %t')"
}

cmd_stop() {
    need_root
    if [ -f "$SLURM_CONF" ] && grep -qF "$MARKER" "$SLURM_CONF" && scontrol ping >/dev/null 2>&1; then
        local jobs
        jobs=$(squeue -h -o '%A' 2>/dev/null | sort -u | tr '\n' ' ')
        if [ -n "${jobs// /}" ]; then
            log "cancelling jobs: $jobs"
            # shellcheck disable=SC2086
            scancel $jobs 2>/dev/null || true
            local deadline=$((SECONDS + WAIT_S))
            while [ -n "$(squeue -h -o '%A' 2>/dev/null)" ] && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.5; done
        fi
    fi
    stop_pid "$RUN/slurmd.pid" slurmd
    stop_pid "$RUN/slurmctld.pid" slurmctld
    stop_pid "$RUN/slurmdbd.pid" slurmdbd
    stop_pid "$MYSQL_PID" mariadbd
    stop_pid /run/munge/munged.pid munged
    log "stopped"
}

cmd_status() {
    local ok=0 d
    for d in "/run/munge/munged.pid munged" "$MYSQL_PID mariadbd" "$RUN/slurmdbd.pid slurmdbd" \
             "$RUN/slurmctld.pid slurmctld" "$RUN/slurmd.pid slurmd"; do
        set -- $d
        if pid_alive "$1" "$2"; then echo "$2: running (pid $(cat "$1"))"; else echo "$2: stopped"; ok=1; fi
    done
    if [ "$ok" -eq 0 ]; then
        sinfo || ok=1
        squeue || ok=1
    fi
    return "$ok"
}

cmd_install() {
    need_root
    mkdir -p "$LOGS"
    install_packages
    log "packages installed: ${PACKAGES[*]}"
}

case "${1:-}" in
    install) cmd_install ;;
    start) cmd_start ;;
    stop) cmd_stop ;;
    status) cmd_status ;;
    *) echo "usage: $0 install|start|stop|status" >&2; exit 2 ;;
esac
