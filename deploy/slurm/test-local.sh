#!/bin/bash
# Runs deploy/slurm/meshrun-cpu.sbatch for real, on a Slurm cluster of one
# machine made for the purpose, and checks what the jobs did.
#
#   sudo deploy/slurm/test-local.sh            # from the repository root, as root
#
# What it does:
#   1. installs Debian's slurm-wlm and munge with apt-get when slurmctld is not
#      there (package scripts are kept from starting the packages' services);
#   2. starts, in a private temporary folder, munged (its own key and socket),
#      slurmctld and two slurmd, "node0" and "node1", both on this machine
#      (Debian builds Slurm with multiple-slurmd support), each claiming what
#      the script's #SBATCH lines ask for, 8 CPUs and 16 GiB, whatever this
#      machine has (SlurmdParameters=config_overrides; nothing enforces them),
#      and waits until sinfo shows both idle (three tries, each on other
#      ports below the ephemeral range, when slurmctld exits or the nodes do
#      not come up; every Slurm client call is bounded by timeout);
#   3. submits the batch script as an unprivileged user (nobody, or
#      MESHRUN_TEST_USER), exactly as a user would:
#        mlp      sbatch meshrun-cpu.sbatch mlp --mesh dp=2,tp=8 --tokens 64 --hidden 32 --steps 5
#                 the script's own #SBATCH lines (2 nodes, 8 CPUs and 8 ranks
#                 each), a small workload; MESHRUN_NATS unset: the batch script
#                 starts the job's own NATS server (TLS, a user for the job) on
#                 the first node
#        verify   sbatch --cpus-per-task=1 --mem=256M meshrun-cpu.sbatch verify --quick
#                 with a NATS server of the "site" (started here) in MESHRUN_NATS,
#                 MESHRUN_NATS_CREDS and MESHRUN_JOB_ID, as deploy/README.md says
#        badflag  sbatch --cpus-per-task=1 --mem=256M meshrun-cpu.sbatch mlp --tokns 5
#                 a workload flag the worker refuses: the job must fail, exit 2
#        rankfail sbatch --cpus-per-task=1 --mem=256M meshrun-cpu.sbatch exit 3 1
#                 rank 1 (on node 1) exits 3: both launchers must name it as
#                 the root cause and the job must fail with its code, exit 3
#      and waits for every job to end (MESHRUN_TEST_JOB_TIMEOUT seconds, 300);
#   4. checks each job's state, exit code and output: both launchers' start
#      lines ("node 0 of 2", "node 1 of 2"), the workload's result (mlp's
#      loss_last, verify's table with nothing failed), each node's
#      summary.json under runs/node-K/<job-id>/;
#   5. stops everything it started (slurmd, slurmctld, munged, the site NATS
#      server; any process left with a file, folder or program in its
#      temporary folder is killed and named) and removes the folder.
#
# Exit status: 0 every check passed; 1 a check failed; 77 it cannot run here
# (not root, no apt-get, Slurm would not install or start), with the reason on
# the last line of stderr.
#
# Environment:
#   MESHRUN_BIN               a folder holding launcher, worker and nats-server
#                             (default: built here with go build, which needs Go)
#   MESHRUN_TEST_KEEP         a folder to copy the jobs' output files, runs/
#                             folders and the daemons' logs into
#   MESHRUN_TEST_USER         who submits the jobs (default nobody)
#   MESHRUN_TEST_JOB_TIMEOUT  seconds to wait for the jobs (default 300)
#   MESHRUN_TEST_APT_TIMEOUT  seconds apt-get may take in all (default 600)
set -uo pipefail

say() { echo "test-local: $*" >&2; }
skip() { say "SKIP: $*"; echo "cannot run: $*" >&2; exit 77; }

repo=$(cd "$(dirname "$0")/../.." && pwd)
sbatch_file="$repo/deploy/slurm/meshrun-cpu.sbatch"
[ -f "$sbatch_file" ] || { say "no $sbatch_file"; exit 1; }
[ "$(id -u)" = 0 ] || skip "needs root: it installs Slurm and starts munged, slurmctld and slurmd"
[ "$(uname -s)" = Linux ] || skip "needs Linux"

# --- 1. Slurm and munge ---
install_slurm() {
  command -v apt-get >/dev/null || skip "slurmctld is not installed and there is no apt-get to install slurm-wlm and munge"
  local policy=/usr/sbin/policy-rc.d made_policy='' log
  log=$(mktemp)
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod 755 "$policy" && made_policy=1
  fi
  say "installing slurm-wlm and munge with apt-get (this takes a few minutes)"
  local end=$((SECONDS + ${MESHRUN_TEST_APT_TIMEOUT:-600})) ok=''
  for attempt in 1 2; do
    if [ "$attempt" = 2 ]; then # the package lists may be stale or missing
      [ "$SECONDS" -lt "$end" ] || break
      DEBIAN_FRONTEND=noninteractive timeout $((end - SECONDS)) apt-get update >>"$log" 2>&1
    fi
    [ "$SECONDS" -lt "$end" ] || break
    if DEBIAN_FRONTEND=noninteractive timeout $((end - SECONDS)) apt-get install -y --no-install-recommends slurm-wlm munge >>"$log" 2>&1; then
      ok=1
      break
    fi
  done
  [ -n "$made_policy" ] && rm -f "$policy"
  if [ -z "$ok" ]; then
    local why
    why=$(grep -E '^(E:|W:)' "$log" | tail -n 3 | tr '\n' ' ')
    [ "$SECONDS" -ge "$end" ] && why="timed out after ${MESHRUN_TEST_APT_TIMEOUT:-600} s (MESHRUN_TEST_APT_TIMEOUT) $why"
    rm -f "$log"
    skip "apt-get install slurm-wlm munge failed: ${why:-see apt-get}"
  fi
  rm -f "$log"
}
for p in slurmctld slurmd munged sbatch srun sinfo scontrol scancel; do
  if ! command -v "$p" >/dev/null; then
    install_slurm
    break
  fi
done
for p in slurmctld slurmd munged munge sbatch srun sinfo scontrol scancel openssl runuser; do
  command -v "$p" >/dev/null || skip "$p is not on the PATH"
done
submit_user=${MESHRUN_TEST_USER:-nobody}
id -u "$submit_user" >/dev/null 2>&1 || skip "no user $submit_user to submit the jobs as (set MESHRUN_TEST_USER)"

# --- the temporary folder and the teardown ---
tmp=$(mktemp -d /tmp/meshrun-slurm.XXXXXX) || exit 1
chmod 755 "$tmp"
pids=()
teardown() {
  local rc=$?
  trap - EXIT INT TERM
  cd / || true
  if [ -n "${ctld_started:-}" ]; then
    local jobs
    jobs=$(timeout 10 squeue -h -o %i 2>/dev/null)
    if [ -n "$jobs" ]; then
      timeout 10 scancel --full $jobs 2>/dev/null
      for _ in $(seq 100); do
        [ -z "$(timeout 5 squeue -h -o %i 2>/dev/null)" ] && break
        sleep 0.1
      done
    fi
  fi
  for f in "$tmp"/run/slurmd-node*.pid "$tmp"/run/slurmctld.pid "$tmp"/munge/munged.pid; do
    [ -s "$f" ] && pids+=("$(cat "$f")")
  done
  local p left
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  for _ in $(seq 100); do
    left=
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && left=1; done
    [ -z "$left" ] && break
    sleep 0.1
  done
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
  # Whatever still has its program, its folder or an open file in $tmp is ours
  # (slurmstepd keeps the slurmd log open; the jobs run from there).
  local stray=()
  for _ in $(seq 50); do
    stray=()
    for d in /proc/[0-9]*; do
      p=${d#/proc/}
      [ "$p" = $$ ] && continue
      if readlink "$d/exe" "$d/cwd" "$d"/fd/* 2>/dev/null | grep -q "^$tmp/"; then
        stray+=("$p")
      fi
    done
    [ ${#stray[@]} = 0 ] && break
    sleep 0.1
  done
  if [ ${#stray[@]} -gt 0 ]; then
    for p in "${stray[@]}"; do
      say "left running, killed: pid $p: $(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null)"
      kill -9 "$p" 2>/dev/null
    done
    [ "$rc" = 0 ] && rc=1
  fi
  if [ -n "${MESHRUN_TEST_KEEP:-}" ]; then
    mkdir -p "$MESHRUN_TEST_KEEP" && cp -a "$tmp/submit/." "$tmp/log" "$MESHRUN_TEST_KEEP/" 2>/dev/null
  fi
  rm -rf "$tmp"
  exit "$rc"
}
trap teardown EXIT
trap 'exit 143' TERM
trap 'exit 130' INT
mkdir -p "$tmp"/{bin,munge,log,run,spool/ctld,spool/node0,spool/node1,submit}
chmod 755 "$tmp"/{bin,munge,log,run,spool,spool/node0,spool/node1,submit}
chmod 700 "$tmp"/spool/ctld

# --- the binaries, where the submitting user can run them ---
if [ -n "${MESHRUN_BIN:-}" ]; then
  for b in launcher worker nats-server; do
    cp "$MESHRUN_BIN/$b" "$tmp/bin/" || { say "no $b in MESHRUN_BIN=$MESHRUN_BIN"; exit 1; }
  done
else
  command -v go >/dev/null || { say "set MESHRUN_BIN to a folder with launcher, worker and nats-server, or put go on the PATH"; exit 1; }
  say "building launcher, worker and nats-server"
  (cd "$repo" && go build -o "$tmp/bin/" ./cmd/... && go build -o "$tmp/bin/nats-server" github.com/nats-io/nats-server/v2) || exit 1
fi
chmod 755 "$tmp"/bin/*

# --- 2. munged, slurmctld, two slurmd ---
# Ports below the kernel's ephemeral range, which the tests running beside
# this one take with port 0 (a port taken between the probe and the bind
# stops slurmctld: the start is then tried again on other ports).
eph_low=$(cut -f1 /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
[ "${eph_low:-0}" -gt 11000 ] 2>/dev/null || eph_low=32768
taken=()
free_port() {
  local p t
  while :; do
    p=$((10000 + RANDOM % (eph_low - 10000)))
    for t in "${taken[@]}"; do [ "$p" = "$t" ] && continue 2; done
    (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { echo "$p"; return; }
  done
}
host=$(hostname)

dd if=/dev/urandom of="$tmp/munge/munge.key" bs=1024 count=1 2>/dev/null
chmod 600 "$tmp/munge/munge.key"
munged --socket="$tmp/munge/munge.sock" --key-file="$tmp/munge/munge.key" --pid-file="$tmp/munge/munged.pid" \
  --log-file="$tmp/log/munged.log" --seed-file="$tmp/munge/munged.seed" ||
  skip "munged did not start: $(tail -n 2 "$tmp/log/munged.log" 2>/dev/null | tr '\n' ' ')"
munge -S "$tmp/munge/munge.sock" -n | unmunge -S "$tmp/munge/munge.sock" >/dev/null ||
  skip "munged started but does not answer on $tmp/munge/munge.sock"

export SLURM_CONF="$tmp/slurm.conf"
write_conf() {
  ctld_port=$(free_port) && taken+=("$ctld_port")
  node_port0=$(free_port) && taken+=("$node_port0")
  node_port1=$(free_port) && taken+=("$node_port1")
  cat >"$SLURM_CONF" <<CONF
# A one-machine cluster for deploy/slurm/test-local.sh: two slurmd on this host.
ClusterName=meshrun-test
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$tmp/munge/munge.sock
CredType=cred/munge
StateSaveLocation=$tmp/spool/ctld
SlurmdSpoolDir=$tmp/spool/%n
SlurmctldPidFile=$tmp/run/slurmctld.pid
SlurmdPidFile=$tmp/run/slurmd-%n.pid
SlurmctldLogFile=$tmp/log/slurmctld.log
SlurmdLogFile=$tmp/log/slurmd-%n.log
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU_Memory
SchedulerType=sched/backfill
ReturnToService=2
MpiDefault=none
SwitchType=switch/none
PlugStackConfig=/dev/null
MinJobAge=600
SlurmdTimeout=30
MessageTimeout=5
NodeName=node0 NodeHostname=$host NodeAddr=127.0.0.1 Port=$node_port0 CPUs=8 RealMemory=16384 State=UNKNOWN
NodeName=node1 NodeHostname=$host NodeAddr=127.0.0.1 Port=$node_port1 CPUs=8 RealMemory=16384 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=30 State=UP
CONF
  chmod 644 "$SLURM_CONF"
}
# Slurm's clients wait MessageTimeout and more for a controller that is not
# there (sinfo: 9 s); every call here has its own bound, so a wedged cluster
# costs seconds, and a TERM (go test's deadline) is answered within them.
slurm_q() { timeout 10 "$@"; }
alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
logs_tail() { # the daemons' last lines, for a start that failed
  local f
  for f in "$tmp"/log/slurm*.log "$tmp"/log/slurm*.err; do
    [ -s "$f" ] && { say "$f (last lines):"; tail -n 6 "$f" >&2; }
  done
}
stop_daemons() { # a failed start's daemons, before the next try
  local f p
  for f in "$tmp"/run/slurmd-node*.pid "$tmp"/run/slurmctld.pid; do
    [ -s "$f" ] || continue
    p=$(cat "$f")
    kill "$p" 2>/dev/null
    for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$p" 2>/dev/null
    rm -f "$f"
  done
  rm -rf "$tmp"/spool/ctld/* "$tmp"/spool/node0/* "$tmp"/spool/node1/*
}
# start_cluster: slurmctld, once it answers the two slurmd, then both nodes
# idle; 0 when they are, 1 (with the reason said) when not.
start_cluster() {
  local end
  slurm_q slurmctld -f "$SLURM_CONF" -i 2>>"$tmp/log/slurmctld.err" || {
    say "slurmctld did not start: $(tail -q -n 3 "$tmp/log/slurmctld.err" "$tmp/log/slurmctld.log" 2>/dev/null | tr '\n' ' ')"
    return 1
  }
  ctld_started=1
  # slurmctld forks before it listens: a slurmd that registers too early is
  # lost until the controller's next ping of the node (SlurmdTimeout/3).
  local begun=$SECONDS
  end=$((SECONDS + 30))
  until slurm_q scontrol ping 2>/dev/null | grep -q 'is UP'; do
    # (its pid file is written within a second or two of the fork)
    if [ "$SECONDS" -gt $((begun + 3)) ] && ! alive "$tmp/run/slurmctld.pid"; then
      say "slurmctld exited before it answered (port $ctld_port)"
      return 1
    fi
    [ "$SECONDS" -lt "$end" ] || { say "slurmctld did not answer scontrol ping in 30 s"; return 1; }
    sleep 0.25
  done
  for n in node0 node1; do
    slurm_q slurmd -f "$SLURM_CONF" -N "$n" 2>>"$tmp/log/slurmd-$n.err" ||
      skip "slurmd -N $n did not start (Slurm built without multiple-slurmd?): $(tail -q -n 3 "$tmp/log/slurmd-$n.err" "$tmp/log/slurmd-$n.log" 2>/dev/null | tr '\n' ' ')"
  done
  end=$((SECONDS + 90))
  until [ "$(slurm_q sinfo -h -N -o '%N %t' 2>/dev/null | sort | tr '\n' ' ')" = "node0 idle node1 idle " ]; do
    if [ "$SECONDS" -ge "$end" ]; then
      say "the Slurm nodes did not become idle in 90 s: $(slurm_q sinfo -h -N -o '%N %t %E' 2>&1 | tr '\n' ' ')"
      return 1
    fi
    alive "$tmp/run/slurmctld.pid" || { say "slurmctld exited while the nodes registered"; return 1; }
    sleep 0.25
  done
}

say "starting slurmctld and slurmd node0, node1 ($tmp)"
up=
for attempt in 1 2 3; do
  write_conf
  if start_cluster; then
    up=1
    break
  fi
  logs_tail
  say "start $attempt of 3 failed; stopping its daemons"
  stop_daemons
done
[ -n "$up" ] || skip "the Slurm cluster did not start in 3 tries (the daemons' last lines are above)"
say "cluster up: $(slurm_q sinfo -h -N -o '%N %t %c CPUs' | tr '\n' ';')"

# --- 3. the jobs, submitted as a user would ---
cp "$sbatch_file" "$tmp/submit/meshrun-cpu.sbatch"
chown -R "$submit_user" "$tmp/submit"
chmod 755 "$tmp/submit"
chmod 644 "$tmp/submit/meshrun-cpu.sbatch"
cd "$tmp/submit" || exit 1

# A "site" NATS server for the job that brings its own, as deploy/README.md
# describes: one user per job, allowed only the job's subjects.
site_job=verify-site-nats
site_pass=$(openssl rand -hex 16)
site_port=$(free_port)
cat >"$tmp/run/site-nats.conf" <<CONF
listen: 127.0.0.1:$site_port
max_payload: 8MB
authorization { users: [
  { user: "job-$site_job", password: "$site_pass",
    permissions: { publish: ["meshrun.$site_job.>", "_INBOX.>"], subscribe: ["meshrun.$site_job.>", "_INBOX.>"] } }
] }
CONF
"$tmp/bin/nats-server" -c "$tmp/run/site-nats.conf" -l "$tmp/log/site-nats.log" &
pids+=($!)
(umask 077 && printf '# meshrun NATS credentials\nuser=job-%s\npassword=%s\n' "$site_job" "$site_pass" >"$tmp/submit/site.creds")
chown "$submit_user" "$tmp/submit/site.creds"
for _ in $(seq 100); do grep -q "Server is ready" "$tmp/log/site-nats.log" 2>/dev/null && break; sleep 0.1; done

submit() { # submit NAME ENV... -- SBATCH ARGS...
  local name=$1 envs=()
  shift
  while [ "$1" != -- ]; do envs+=("$1"); shift; done
  shift
  local out
  out=$(runuser -u "$submit_user" -- env -i HOME=/ PATH="$tmp/bin:/usr/local/bin:/usr/bin:/bin" SLURM_CONF="$SLURM_CONF" "${envs[@]}" \
    sbatch --parsable --job-name="meshrun-$name" "$@" 2>&1) || { say "sbatch $name: $out"; exit 1; }
  job_ids[$name]=${out%%;*}
  say "submitted $name as job ${job_ids[$name]}: sbatch $*"
}
declare -A job_ids
submit mlp -- meshrun-cpu.sbatch mlp --mesh dp=2,tp=8 --tokens 64 --hidden 32 --steps 5
submit verify MESHRUN_NATS="nats://127.0.0.1:$site_port" MESHRUN_NATS_CREDS="$tmp/submit/site.creds" MESHRUN_JOB_ID="$site_job" -- \
  --cpus-per-task=1 --mem=256M meshrun-cpu.sbatch verify --quick
submit badflag -- --cpus-per-task=1 --mem=256M meshrun-cpu.sbatch mlp --tokns 5
submit rankfail -- --cpus-per-task=1 --mem=256M meshrun-cpu.sbatch exit 3 1

deadline=$((SECONDS + ${MESHRUN_TEST_JOB_TIMEOUT:-300}))
declare -A state exitcode
while :; do
  pending=0
  for name in "${!job_ids[@]}"; do
    line=$(slurm_q scontrol show job -o "${job_ids[$name]}" 2>/dev/null)
    s=$(sed -n 's/.* JobState=\([A-Z_]*\) .*/\1/p' <<<"$line")
    state[$name]=$s
    exitcode[$name]=$(sed -n 's/.* ExitCode=\([0-9:]*\) .*/\1/p' <<<"$line")
    case "$s" in
    COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY | PREEMPTED | BOOT_FAIL | DEADLINE) ;;
    *) pending=$((pending + 1)) ;;
    esac
  done
  [ "$pending" = 0 ] && break
  if [ "$SECONDS" -ge "$deadline" ]; then
    say "jobs still running after ${MESHRUN_TEST_JOB_TIMEOUT:-300} s: $(slurm_q squeue 2>&1 | tr '\n' ';')"
    break
  fi
  sleep 0.5
done

# --- 4. the checks ---
failed=0
check() { # check NAME DESCRIPTION COMMAND...
  local name=$1 what=$2
  shift 2
  if "$@"; then
    say "ok   $name: $what"
  else
    say "FAIL $name: $what"
    failed=1
  fi
}
has() { grep -q -- "$2" "$1" 2>/dev/null; }
summary_ok() { # summary_ok JOBID NODE EXIT
  local f="runs/node-$2/$1/summary.json"
  grep -q '"exit_code": '"$3"',' "$f" 2>/dev/null && grep -q '"node": '"$2"',' "$f"
}
for name in mlp verify badflag rankfail; do
  id=${job_ids[$name]}
  out="meshrun-$id.out"
  say "job $name ($id): ${state[$name]}, exit ${exitcode[$name]}; $out:"
  sed 's/^/    /' "$out" >&2
done
id=${job_ids[mlp]} out=meshrun-${job_ids[mlp]}.out
check mlp "COMPLETED, exit 0:0" test "${state[mlp]}:${exitcode[mlp]}" = COMPLETED:0:0
check mlp "the batch script started the job's NATS server" has "$out" "NATS server for this job at tls://"
check mlp "launcher of node 0 started" has "$out" "job slurm-$id, node 0 of 2, 8 of 16 ranks"
check mlp "launcher of node 1 started" has "$out" "job slurm-$id, node 1 of 2, 8 of 16 ranks"
check mlp "rank 0 reports the training" has "$out" '"mesh":"dp=2,tp=8".*"loss_last"'
check mlp "node 0 summary.json: exit 0" summary_ok "slurm-$id" 0 0
check mlp "node 1 summary.json: exit 0" summary_ok "slurm-$id" 1 0
check mlp "the job's NATS folder is gone" test ! -e "runs/.nats-slurm-$id"
out=meshrun-${job_ids[verify]}.out
check verify "COMPLETED, exit 0:0" test "${state[verify]}:${exitcode[verify]}" = COMPLETED:0:0
check verify "launcher of node 0 started" has "$out" "job $site_job, node 0 of 2, 1 of 2 ranks"
check verify "launcher of node 1 started" has "$out" "job $site_job, node 1 of 2, 1 of 2 ranks"
check verify "every case passed" has "$out" "linear  *tp=2 .* 0$"
check verify "node 0 summary.json: exit 0" summary_ok "$site_job" 0 0
check verify "node 1 summary.json: exit 0" summary_ok "$site_job" 1 0
out=meshrun-${job_ids[badflag]}.out
check badflag "FAILED, exit 2:0" test "${state[badflag]}:${exitcode[badflag]}" = FAILED:2:0
check badflag "the worker's refusal is in the output" has "$out" "did you mean --tokens"
out=meshrun-${job_ids[rankfail]}.out
check rankfail "FAILED, exit 3:0" test "${state[rankfail]}:${exitcode[rankfail]}" = FAILED:3:0
check rankfail "both launchers name rank 1 as the root cause" test "$(grep -c "rank failed: root cause rank 1 (node 1" "$out")" = 2
if [ "$failed" = 0 ]; then
  say "PASS"
else
  for f in "$tmp"/log/*.log; do say "$f (last lines):"; tail -n 8 "$f" >&2; done
  say "FAIL"
fi
exit "$failed"
