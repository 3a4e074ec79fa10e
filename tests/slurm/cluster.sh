#!/usr/bin/env bash
# A Slurm cluster of two emulated nodes on this machine (n1, n2, both 127.0.0.1), for the runner's Slurm
# tests and for trying `hydra/launcher=slurm` without a real cluster.
#
#   cluster.sh up      install Debian's packages when missing (needs root), start munged, slurmctld and
#                      one slurmd per node; wait until both nodes are idle
#   cluster.sh down    stop the daemons by their pid files; nothing is left running
#   cluster.sh status  exit 0 when the cluster answers (sinfo)
#
# State, spool, pid and log files live under $RUNNER_SLURM_DIR (default /tmp/runner-slurm). The config is
# /etc/slurm/slurm.conf, where Slurm's commands look for it; one that this script did not write is never
# replaced (a real cluster's config stays as it is).
set -euo pipefail
STATE=${RUNNER_SLURM_DIR:-/tmp/runner-slurm}
CONF=/etc/slurm/slurm.conf
MARK="# written by the runner's tests/slurm/cluster.sh"
PORT_CTLD=${RUNNER_SLURM_PORT:-16817}
export PATH="/usr/sbin:/sbin:$PATH"

say() { echo "[slurm] $*"; }
die() { echo "error: $*" >&2; exit 1; }

install_packages() {
  local missing=()
  for b in slurmctld slurmd sbatch munged; do command -v "$b" >/dev/null || missing+=("$b"); done
  [ ${#missing[@]} -eq 0 ] && return
  [ "$(id -u)" -eq 0 ] || die "Slurm is not installed ($(IFS=,; echo "${missing[*]}") missing) and installing it needs root: apt-get install slurmctld slurmd slurm-client munge"
  say "installing Debian's slurmctld slurmd slurm-client munge"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q slurmctld slurmd slurm-client munge >/dev/null 2>&1 \
    || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q slurmctld slurmd slurm-client munge >/dev/null; } \
    || die "apt-get could not install Slurm"
}

write_conf() {
  if [ -f "$CONF" ] && ! grep -qF "$MARK" "$CONF"; then
    die "$CONF exists and was not written by this script; refusing to replace a real cluster's config"
  fi
  local cpus mem host
  cpus=$(nproc); [ "$cpus" -ge 4 ] || cpus=4  # emulated nodes share the host: room for two 2-worker jobs
  mem=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 / 2 ))
  host=$(hostname)
  mkdir -p /etc/slurm "$STATE/ctld" "$STATE/spool"
  cat > "$CONF" <<CONF
$MARK
# Two emulated nodes on one host (state in $STATE). 'tests/slurm/cluster.sh down' stops them.
ClusterName=runner
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$PORT_CTLD
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/spool/%n
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd-%n.pid
SlurmctldLogFile=$STATE/slurmctld.log
SlurmdLogFile=$STATE/slurmd-%n.log
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
ReturnToService=2
KillWait=10
MinJobAge=600
InactiveLimit=0
NodeName=n1 NodeHostname=$host NodeAddr=127.0.0.1 Port=$((PORT_CTLD + 1)) CPUs=$cpus RealMemory=$mem State=UNKNOWN
NodeName=n2 NodeHostname=$host NodeAddr=127.0.0.1 Port=$((PORT_CTLD + 2)) CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=n1,n2 Default=YES MaxTime=INFINITE State=UP
# A node on another host (TEST-NET address, never reached, kept DOWN): what a submission to it must reach is
# checked against real Slurm (tests/slurm). Jobs never run there.
NodeName=far NodeAddr=192.0.2.1 Port=$((PORT_CTLD + 3)) CPUs=1 RealMemory=100 State=DOWN
PartitionName=remote Nodes=far MaxTime=INFINITE State=UP
CONF
}

start_munge() {
  if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then return; fi
  if [ ! -s /etc/munge/munge.key ]; then
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
  fi
  chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
  mkdir -p /run/munge /var/log/munge /var/lib/munge
  chown munge:munge /run/munge /var/log/munge /var/lib/munge
  runuser -u munge -- munged --force
  mkdir -p "$STATE" && touch "$STATE/munged.ours"  # started here: 'down' stops it
  for _ in $(seq 50); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && return; sleep 0.1; done
  die "munged did not start (see /var/log/munge/munged.log)"
}

running() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

up() {
  [ "$(id -u)" -eq 0 ] || die "starting Slurm's daemons needs root"
  install_packages
  write_conf
  start_munge
  running "$STATE/slurmctld.pid" || slurmctld -c
  for n in n1 n2; do running "$STATE/slurmd-$n.pid" || slurmd -N "$n"; done
  for _ in $(seq 100); do
    if [ "$(sinfo -h -p debug -o '%t' 2>/dev/null | sort -u | tr -d '\n')" = "idle" ]; then
      say "up: nodes n1,n2 idle ($(sinfo -h -p debug -o '%D nodes, partition %P'))"; return
    fi
    sleep 0.2
  done
  sinfo 2>&1 | sed 's/^/[slurm] /' >&2 || true
  die "the nodes did not become idle (logs in $STATE)"
}

stop_pidfile() {
  local f=$1
  running "$f" || { rm -f "$f"; return; }
  local pid; pid=$(cat "$f")
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || { rm -f "$f"; return; }; sleep 0.1; done
  kill -9 "$pid" 2>/dev/null || true; rm -f "$f"
}

down() {
  if command -v scancel >/dev/null && [ -f "$CONF" ] && grep -qF "$MARK" "$CONF"; then
    scancel --full --quiet $(squeue -h -o %A 2>/dev/null) 2>/dev/null || true
  fi
  for n in n1 n2; do stop_pidfile "$STATE/slurmd-$n.pid"; done
  stop_pidfile "$STATE/slurmctld.pid"
  pkill -f "slurmstepd: \[" 2>/dev/null || true
  if [ -f "$STATE/munged.ours" ]; then
    stop_pidfile /run/munge/munged.pid; rm -f "$STATE/munged.ours"
    say "down: slurmctld, slurmd and munged stopped"
  else
    say "down: slurmctld and slurmd stopped (munged was already running before: it stays)"
  fi
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) [ -f "$CONF" ] && grep -qF "$MARK" "$CONF" && [ "$(sinfo -h -p debug -o '%t' 2>/dev/null | sort -u | tr -d '\n')" = "idle" ] ;;
  *) echo "usage: $0 up|down|status" >&2; exit 2 ;;
esac
