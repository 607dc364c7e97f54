#!/usr/bin/env bash
# A real single-node Slurm on this machine (slurmctld + slurmd, munge for auth), for
# tests/deploy/test_slurm.py and .ci/run. Idempotent: a running, idle-or-busy node is left as it is.
#
#   scripts/slurm_single_node.sh          # configure, start, wait until `sinfo` shows the node up
#   scripts/slurm_single_node.sh stop     # stop the daemons this script started (by pid file)
#
# Needs root and Debian's `slurm-wlm` + `munge` (`apt-get install -y slurm-wlm munge`); no systemd,
# no cgroups (and no cgroup.conf): processes are tracked by proctrack/linuxproc, nothing is
# confined (task/none).
# State, spool and logs live under $SLURM_STATE (default /var/spool/polar-slurm).
set -euo pipefail

STATE=${SLURM_STATE:-/var/spool/polar-slurm}
CONF=/etc/slurm/slurm.conf
HOST=$(hostname -s)

stop() {  # and wait until they are gone, so a restart can bind their ports again
  for pidfile in "$STATE/slurmd.pid" "$STATE/slurmctld.pid"; do
    if [ -s "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
      pid=$(cat "$pidfile")
      kill "$pid"
      for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    fi
  done
}

if [ "${1:-start}" = stop ]; then
  stop
  exit 0
fi

if [ "$(id -u)" != 0 ]; then
  echo "slurm_single_node.sh: needs root (it starts munged, slurmctld and slurmd)" >&2
  exit 2
fi
for tool in munged slurmctld slurmd sinfo; do
  command -v "$tool" >/dev/null || { echo "slurm_single_node.sh: $tool missing: apt-get install -y slurm-wlm munge" >&2; exit 2; }
done

# --- munge: a key and its directories owned by the munge user, then munged as that user.
install -d -o munge -g munge -m 0700 /etc/munge /var/lib/munge /var/log/munge
install -d -o munge -g munge -m 0755 /run/munge
if [ ! -s /etc/munge/munge.key ]; then
  dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
fi
chown munge:munge /etc/munge/munge.key
chmod 0400 /etc/munge/munge.key
if ! munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; then
  rm -f /run/munge/munged.pid
  runuser -u munge -- munged
  for _ in $(seq 50); do munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.1; done
fi

# --- slurm.conf for this host: one node (this machine), one partition whose jobs share its cores
# (the polar_mq roles are long-running services, more of them than cores).
mkdir -p "$STATE/ctld" "$STATE/d" /etc/slurm
CPUS=$(nproc)
MEM=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 - 256 ))
cat > "$CONF.new" <<EOF
# Written by polar_mq scripts/slurm_single_node.sh: a single-node cluster on $HOST.
ClusterName=polar
SlurmctldHost=$HOST
AuthType=auth/munge
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
SlurmctldPort=6817
SlurmdPort=6818
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/d
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
SlurmctldLogFile=$STATE/slurmctld.log
SlurmdLogFile=$STATE/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/backfill
# Jobs that wait on another job's start (sbatch --dependency=after) start within seconds.
SchedulerParameters=sched_interval=2,bf_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MinJobAge=600
KillWait=10
MpiDefault=none
NodeName=$HOST CPUs=$CPUS RealMemory=$MEM State=UNKNOWN
PartitionName=polar Nodes=$HOST Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:8
EOF
changed=0
if ! cmp -s "$CONF.new" "$CONF"; then mv "$CONF.new" "$CONF"; changed=1; else rm -f "$CONF.new"; fi

running() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
if [ $changed = 1 ]; then stop; fi
fail() { echo "slurm_single_node.sh: $1 did not start:" >&2; tail -5 "$STATE/$1.log" >&2; exit 1; }
running "$STATE/slurmctld.pid" || slurmctld || fail slurmctld
running "$STATE/slurmd.pid" || slurmd || fail slurmd

# --- wait until the node is up (idle, mixed or allocated: a re-run finds it busy with jobs).
for _ in $(seq 120); do
  state=$(sinfo -h -n "$HOST" -o %T 2>/dev/null | head -1 || true)
  case "$state" in
    idle*|mixed*|allocated*|completing*) echo "slurm: node $HOST $state"; exit 0 ;;
    down*|drain*) scontrol update NodeName="$HOST" State=RESUME 2>/dev/null || true ;;
  esac
  sleep 0.5
done
echo "slurm_single_node.sh: node $HOST not up after 60 s (sinfo: ${state:-nothing}); see $STATE/*.log" >&2
exit 1
