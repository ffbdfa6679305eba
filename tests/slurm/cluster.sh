#!/bin/sh
# tests/slurm/cluster.sh: a one-node Slurm cluster on this machine for tests/lua/slurm_spec.lua:
# munged, slurmctld and slurmd with every file (key, config, sockets, state, logs) in DIR.
#   tests/slurm/cluster.sh start DIR    prints "ready" once the node takes jobs, or why not (exit 1)
#   tests/slurm/cluster.sh stop DIR     ends the three daemons
# Then: SLURM_CONF=DIR/slurm.conf srun -n 2 --mpi=pmix ...
set -u
cmd=$1
dir=$2
stop() {
  for d in slurmd slurmctld munged; do
    [ -f "$dir/$d.pid" ] && kill "$(cat "$dir/$d.pid")" 2>/dev/null
  done
  sleep 1
  for d in slurmd slurmctld munged; do
    [ -f "$dir/$d.pid" ] && kill -9 "$(cat "$dir/$d.pid")" 2>/dev/null
    rm -f "$dir/$d.pid"
  done
  return 0
}
if [ "$cmd" = stop ]; then stop; exit 0; fi

for c in munged slurmctld slurmd srun sinfo; do
  command -v $c >/dev/null 2>&1 || { echo "$c is not installed (apt-get install slurm-wlm munge)"; exit 1; }
done
mkdir -p "$dir/state" "$dir/spool" "$dir/munge"
chmod 700 "$dir" "$dir/munge"
user=$(id -un)
host=$(hostname -s)
cpus=$(nproc)
# free TCP ports for slurmctld and slurmd
port=$(( 20000 + $$ % 20000 ))

dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 2>/dev/null
chmod 400 "$dir/munge/munge.key"
munged --force --key-file="$dir/munge/munge.key" --socket="$dir/munge/munge.sock" --pid-file="$dir/munged.pid" \
  --log-file="$dir/munged.log" --seed-file="$dir/munge/munged.seed" >"$dir/munged.out" 2>&1 ||
  { echo "munged did not start: $(tail -n 2 "$dir/munged.out" "$dir/munged.log" 2>/dev/null | tr '\n' ' ')"; exit 1; }

cat >"$dir/slurm.conf" <<CONF
ClusterName=remaxtest
SlurmctldHost=$host
SlurmUser=$user
SlurmdUser=$user
SlurmctldPort=$port
SlurmdPort=$((port + 1))
AuthType=auth/munge
AuthInfo=socket=$dir/munge/munge.sock
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
SlurmdTimeout=30
NodeName=$host CPUs=$cpus State=UNKNOWN
PartitionName=test Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
CONF

export SLURM_CONF="$dir/slurm.conf"
slurmctld -f "$dir/slurm.conf" >"$dir/slurmctld.out" 2>&1 ||
  { echo "slurmctld did not start: $(tail -n 3 "$dir/slurmctld.log" "$dir/slurmctld.out" 2>/dev/null | tr '\n' ' ')"; stop; exit 1; }
slurmd -f "$dir/slurm.conf" >"$dir/slurmd.out" 2>&1 ||
  { echo "slurmd did not start: $(tail -n 3 "$dir/slurmd.log" "$dir/slurmd.out" 2>/dev/null | tr '\n' ' ')"; stop; exit 1; }
i=0
while [ $i -lt 60 ]; do
  state=$(sinfo -h -N -o %t 2>/dev/null | head -n 1)
  case "$state" in idle*|mix*|alloc*) echo ready; exit 0 ;; esac
  sleep 0.5
  i=$((i + 1))
done
echo "the node did not come up in 30 s (sinfo says '$state'): $(tail -n 3 "$dir/slurmd.log" "$dir/slurmctld.log" 2>/dev/null | tr '\n' ' ')"
stop
exit 1
