#!/usr/bin/env bash
# Every GPU check of docs/gpu.md in one command, made for a GPU machine lent
# for minutes: run in the repository root, it ends before a hard deadline
# (default 540 s from its start, for a 600 s command limit) and leaves two
# files in $OUT (gpu-check/ without it): summary.md, one line per step, and
# gpu-logs.tgz, every step's log so far (the launcher runs' rank logs too)
# and the summary, rewritten after each step through a temporary name, so
# that a kill at any moment still leaves the last complete archive.
#
#   bench/gpu/check.sh [--dry] [--deadline SECONDS]
#
# Steps, in order, each under its own timeout (coreutils timeout -k), never
# longer than what is left before the deadline; a failed or timed-out step
# does not stop the next, and one whose least planned time does not fit in
# what is left is skipped ("SKIPPED: needs N s, M s left"):
#
#   probe        GPU, driver, CUDA, nvcc, ptxas, PyTorch, NCCL and cuBLAS
#                versions, compilers, CPUs; the CUDA libraries (deploy/gpu.sh
#                libs where it has that command, else a search of the loader
#                cache and PyTorch's nvidia-* wheels); exports
#                MESHRUN_NCCL_LIBRARY (and LD_LIBRARY_PATH) for the steps after
#   ptxas        kernels/cuda/ptx/kernels.ptx through ptxas -arch=sm_90, as the
#                driver will JIT it
#   build        bin/launcher, bin/worker, bin/cuda.test, bin/nccl.test: used
#                as they are when all four are there, else unpacked from
#                gpu-prebuilt/ (deploy/gpu.sh install), else built
#                (deploy/gpu.sh build); ldd of each, failing on "not found"
#   dispatch     bin/cuda.test TestDispatchTable: the conformance suite through
#                a recorder, which prints what served each call on the GPU
#   conformance-float32, -float64, -bfloat16
#                the kernels conformance suite, one dtype per process,
#                MESHRUN_CUDA_SYNC=1
#   conformance-fallback
#                float32 and bfloat16 again with MESHRUN_CUBLASLT=0: every
#                GEMM on its fallback plan (cuBLAS and the kernels)
#   nccl         bin/nccl.test: a world of one through NCCL
#   mlp-1        launcher run -n 1 --device cuda mlp against --device cpu: the
#                largest relative loss difference (float32, TF32 off: fails
#                above 1e-4) and the step's copies
#   mlp-2        the same with -n 2 --share-gpus (staged collectives)
#   verify       worker verify --device cuda --quick
#   gpt          launcher run -n 1 --device cuda gpt, a small model and a few
#                steps, against the cpu run's losses (fails above 1e-4)
#   gpt-2        the same with -n 2 --share-gpus (staged collectives)
#   gpt-bf16     -n 1 with --dtype bfloat16 on both (fails above 1e-2)
#   gpt-fused, gpt-fused-bf16
#                gpt and gpt-bf16 on the block kernels: the fused attention
#                (MESHRUN_CUDA_ATTENTION=fused) and layer norm a block per
#                row (MESHRUN_CUDA_LAYERNORM=block)
#   gpt-pp       -n 2 --share-gpus --mesh pp=2 --schedule zb (staged)
#   gpt-recipe   gpt with --clip-grad 0.5 --warmup 2: the gradients' norm on
#                the device (a gemv of each gradient by itself) and the
#                clipping, against the cpu run's losses (fails above 1e-4)
#   bench        bench/gpu/run.sh against PyTorch, when 150 s are left
#
# Settings (environment):
#   MESHRUN_CHECK_DEADLINE=SECONDS          as --deadline
#   MESHRUN_CHECK_TIMEOUTS="STEP=SECONDS …" a step's longest time (else as in
#                                           the step calls at the end)
#   MESHRUN_CHECK_SKIP="STEP …"             steps not to run
#
# --dry runs the same steps on the sim device, with bench/gpu/fake-tools.sh
# standing in for nvidia-smi, nvcc, ptxas, python3 and the two test binaries,
# and launcher and worker built without tags (go build, or from
# MESHRUN_CHECK_BIN=DIR): CI's test of this script (check_test.go).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
root=$PWD

usage() { echo "usage: bench/gpu/check.sh [--dry] [--deadline SECONDS]"; }
dry=0
deadline=${MESHRUN_CHECK_DEADLINE:-540}
while [ $# -gt 0 ]; do
  case $1 in
    --dry) dry=1 ;;
    --deadline) deadline=${2-}; shift ;;
    --deadline=*) deadline=${1#*=} ;;
    -h | --help) usage; exit 0 ;;
    *) usage >&2; exit 2 ;;
  esac
  shift || break
done
case $deadline in '' | *[!0-9]*) echo "check.sh: --deadline: whole seconds, not '$deadline'" >&2; exit 2 ;; esac
for t in timeout tar gzip; do
  command -v "$t" >/dev/null || { echo "check.sh: needs $t" >&2; exit 2; }
done

grace=5   # timeout -k: SIGKILL this long after SIGTERM
reserve=5 # kept after the last step: its summary line and the archive
out=${OUT:-gpu-check}
mkdir -p "$out" && out=$(cd "$out" && pwd) || exit 1
work=$(mktemp -d "${TMPDIR:-/tmp}/gpu-check.XXXXXX") || exit 1
logs=$work/gpu-logs
mkdir -p "$logs"
sum=$out/summary.md
: >"$sum"
current='' current_step='' # the running step's timeout process (its process group) and name
trap 'rm -rf "$work"' EXIT

if [ "$dry" = 1 ]; then
  mkdir -p "$work/fake" "$work/bin"
  for t in nvidia-smi nvcc ptxas python3; do ln -s "$root/bench/gpu/fake-tools.sh" "$work/fake/$t"; done
  for t in cuda.test nccl.test; do ln -s "$root/bench/gpu/fake-tools.sh" "$work/bin/$t"; done
  if [ -n "${MESHRUN_CHECK_BIN:-}" ]; then
    for t in launcher worker; do ln -s "$(cd "$MESHRUN_CHECK_BIN" && pwd)/$t" "$work/bin/$t"; done
  fi
  PATH=$work/fake:$PATH
  BIN=$work/bin DEVICE=sim NEED_LIB=
  BUILD_CMD="go build -o $BIN/ ./cmd/launcher ./cmd/worker"
  MLP_ARGS="--tokens 64 --hidden 64 --steps 3"
  GPT_ARGS="--steps 3 --layers 1 --dim 32 --heads 2 --context 16 --batch 4 --sample 20 --data docs"
  SHARE= # sim ranks have no GPU to share: staged collectives as --share-gpus gives
  export MESHRUN_BENCH_DEVICE=sim MESHRUN_BENCH_MLP_SHAPES="64 64 256" MESHRUN_BENCH_GPT_SHAPES="1 2 32 16 4"
else
  PATH=$PATH:/usr/local/cuda/bin # nvcc and ptxas where the toolkit is not on PATH
  BIN=$root/bin DEVICE=cuda NEED_LIB=libcuda.so
  BUILD_CMD="deploy/gpu.sh build"
  MLP_ARGS="--tokens 512 --hidden 1024 --steps 10"
  GPT_ARGS="--steps 5 --layers 2 --dim 128 --heads 4 --context 64 --batch 16 --sample 40 --data docs"
  SHARE=--share-gpus
fi
export MESHRUN_BENCH_WORKER=$BIN/worker
export root work logs BIN DEVICE NEED_LIB BUILD_CMD MLP_ARGS GPT_ARGS SHARE

say() { printf '%s\n' "$*" >>"$sum"; printf '%s\n' "$*"; }

# archive: gpu-logs.tgz anew, through a temporary name; logs over 8 MiB keep
# their first and last 4 MiB.
archive() {
  local f
  for f in "$logs"/*; do
    if [ ! -f "$f" ] || [ "$(stat -c %s "$f")" -le 8388608 ]; then continue; fi
    { head -c 4194304 "$f"; printf '\n[... cut by check.sh ...]\n'; tail -c 4194304 "$f"; } >"$f.cut" && mv -f "$f.cut" "$f"
  done
  cp "$sum" "$logs/summary.md"
  tar -C "$work" -czf "$out/gpu-logs.tgz.part" --exclude=nats.creds gpu-logs || return
  if [ "$(stat -c %s "$out/gpu-logs.tgz.part")" -gt 15728640 ]; then # what comes back: 16 MiB a file
    tar -C "$work" -czf "$out/gpu-logs.tgz.part" --exclude=nats.creds --exclude=trace.json gpu-logs || return
  fi
  mv -f "$out/gpu-logs.tgz.part" "$out/gpu-logs.tgz"
}

on_signal() {
  trap - TERM INT HUP
  [ -n "$current" ] && kill -TERM -- "-$current" 2>/dev/null
  say "- check.sh: killed by SIG$1 after $SECONDS s${current_step:+, in step $current_step}"
  archive
  exit 143
}
trap 'on_signal TERM' TERM
trap 'on_signal INT' INT
trap 'on_signal HUP' HUP

# listed WORD LIST: whether WORD is one of LIST's words.
listed() { case " $2 " in *" $1 "*) return 0 ;; esac; return 1; }
# setting NAME DEFAULT: NAME's value in $MESHRUN_CHECK_TIMEOUTS, else DEFAULT.
setting() {
  local kv v=$2
  for kv in ${MESHRUN_CHECK_TIMEOUTS:-}; do [ "${kv%%=*}" = "$1" ] && v=${kv#*=}; done
  echo "$v"
}

# step NAME MIN MAX COMMAND: runs COMMAND (a function below, with its
# arguments) in bash under timeout, at most MAX seconds and never past the
# deadline less grace and reserve; skipped when fewer than MIN seconds are
# left. Its output goes to gpu-logs/NN-NAME.log (some steps write
# NN-NAME.*.log beside it); then its line goes to the summary, with the
# figures of figures_<function> when there is one, and the archive is
# rewritten.
n=0
step() {
  local name=$1 min=$2 max=$3 cmd=$4 log status='' secs=0 figs='' fargs='' left t rc t0
  n=$((n + 1))
  log=$logs/$(printf %02d "$n")-$name.log
  max=$(setting "$name" "$max")
  left=$((deadline - SECONDS))
  if listed "$name" "${MESHRUN_CHECK_SKIP:-}"; then
    status="SKIPPED: listed in MESHRUN_CHECK_SKIP"
  elif [ "$left" -lt "$min" ]; then
    status="SKIPPED: needs $min s, $left s left"
  fi
  if [ -n "$status" ]; then
    echo "$name: $status" >"$log"
  else
    t=$((left - grace - reserve))
    [ "$t" -gt "$max" ] && t=$max
    [ "$t" -lt 1 ] && t=1
    echo "check.sh: $name (at most $t s)" >&2
    echo "# $name: $cmd (at most $t s, from $(date -u +%FT%TZ))" >"$log"
    t0=$SECONDS
    MESHRUN_CHECK_STEP=$name STEP_LOG=$log STEP_TIMEOUT=$t \
      timeout -k "$grace" "$t" bash -c "set -o pipefail; $cmd" >>"$log" 2>&1 </dev/null &
    current=$! current_step=$name
    wait "$current"
    rc=$?
    current='' current_step=''
    secs=$((SECONDS - t0))
    if [ "$rc" = 0 ]; then
      status=ok
    elif { [ "$rc" = 124 ] || [ "$rc" = 137 ]; } && [ "$secs" -ge "$t" ]; then
      status="TIMEOUT after $t s"
    else
      status="FAIL rc $rc"
    fi
    echo "# $name: $status, $secs s" >>"$log"
    if declare -F "figures_${cmd%% *}" >/dev/null; then
      [ "$cmd" != "${cmd#* }" ] && fargs=${cmd#* }
      # shellcheck disable=SC2086 # the command's arguments, split
      figs=$("figures_${cmd%% *}" "$log" $fargs 2>/dev/null | head -n1)
    fi
    if [ "$status" != ok ]; then # the log's last word on it
      figs="${figs:+$figs; }last: $(grep -vE '^(# |== |rc [0-9]+$|FAIL$|PASS$|exit status|[[:space:]]*$)' "$log" | tail -n1 | cut -c1-200)"
    fi
  fi
  [ "$name" = probe ] && probe_lines
  say "- $name: $status; $secs s${figs:+; $figs}"
  archive
}

# --- the steps (run by bash -c: exported) ---

# probe: versions to $work/versions (KEY=VALUE), the GPU to $work/gpu.csv,
# the library settings to $work/probe.env.
probe() {
  local v=$work/versions nccl='' dirs=''
  : >"$v"
  kv() { printf '%s=%s\n' "$1" "$2" | tee -a "$v"; }
  t() { timeout --foreground -k 2 30 "$@"; } # in the step's process group, killed with it
  echo "== nvidia-smi"
  if t nvidia-smi | tee "$work/nvidia-smi.txt"; then # not again if it hung
    t nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader | head -n1 | tee "$work/gpu.csv"
  fi
  kv cuda_driver "$(sed -n 's/.*CUDA Version: *\([0-9.]*\).*/\1/p' "$work/nvidia-smi.txt" | head -n1)"
  echo "== compilers"
  t nvcc --version && kv nvcc "$(t nvcc --version | sed -n 's/.*, V\([0-9.]*\).*/\1/p')"
  t ptxas --version && kv ptxas "$(t ptxas --version | sed -n 's/.*, V\([0-9.]*\).*/\1/p')"
  kv gcc "$(gcc -dumpfullversion 2>/dev/null || echo none)"
  kv go "$(go env GOVERSION 2>/dev/null || echo "no go")"
  kv cpus "$(nproc)"
  echo "== python3: PyTorch, its CUDA, NCCL and cuBLAS"
  t python3 -c '
import glob, os, site
import importlib.metadata as md
def kv(k, v): print(f"{k}={v}", flush=True)
dists = sorted((d.metadata["Name"] or "", d.version) for d in md.distributions())
for n, v in dists:
    if n.lower().startswith("nvidia-"): kv("wheel " + n, v)
cb = [(n, v) for n, v in dists if n.lower().startswith("nvidia-cublas")]
dirs = [s + "/nvidia" for s in site.getsitepackages()]
libs = lambda name: sorted(f for d in dirs for f in glob.glob(d + "/*/lib/" + name))
if cb: kv("cublas", f"{cb[0][1]} ({cb[0][0]})")
else: kv("cublas", " ".join(os.path.basename(f) for f in libs("libcublas.so*")) or "no wheel")
kv("nccl_lib", (libs("libnccl.so.2") or [""])[0])
kv("cuda_lib_dirs", ":".join(sorted({os.path.dirname(f) for f in libs("libcublasLt.so*")})))
import torch
kv("torch", torch.__version__)
kv("torch_cuda", torch.version.cuda)
n = torch.cuda.nccl.version()
kv("nccl", ".".join(map(str, n)) if isinstance(n, tuple) else n)
kv("torch_gpu", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none")
' | tee -a "$v"
  echo "== libraries"
  : >"$work/probe.env"
  if has_command libs; then
    kv libs "deploy/gpu.sh libs"
    t deploy/gpu.sh libs | tee "$work/libs.txt"
    grep -E '^export (LD_LIBRARY_PATH|MESHRUN_[A-Z_]+)=' "$work/libs.txt" >>"$work/probe.env"
    nccl=$(grep -o '/[^ "'\'':=]*libnccl\.so[.0-9]*' "$work/libs.txt" | head -n1)
  else
    kv libs "search"
    ldconfig -p 2>/dev/null | grep -E 'libcuda\.so|libcublas|libnccl'
    ldconfig -p 2>/dev/null | grep -q 'libnccl\.so\.2' || nccl=$(sed -n 's/^nccl_lib=//p' "$v" | tail -n1)
    if ! ldconfig -p 2>/dev/null | grep -q 'libcublasLt\.so'; then
      dirs=$(sed -n 's/^cuda_lib_dirs=//p' "$v" | tail -n1)
      [ -n "$dirs" ] && echo "export LD_LIBRARY_PATH=$dirs\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}" >>"$work/probe.env"
    fi
  fi
  if [ -n "${MESHRUN_NCCL_LIBRARY:-}" ]; then # set by hand: kept
    sed -i '/^export MESHRUN_NCCL_LIBRARY=/d' "$work/probe.env"
  elif [ -n "$nccl" ] && ! grep -q '^export MESHRUN_NCCL_LIBRARY=' "$work/probe.env"; then
    echo "export MESHRUN_NCCL_LIBRARY=$nccl" >>"$work/probe.env"
  fi
  echo "== settings for the next steps"
  cat "$work/probe.env"
}

ptxas_sm90() { ptxas -arch=sm_90 -v kernels/cuda/ptx/kernels.ptx -o /dev/null; }

have_bins() { local b; for b in launcher worker cuda.test nccl.test; do [ -x "$BIN/$b" ] || return 1; done; }
# has_command NAME: whether deploy/gpu.sh has the command NAME.
has_command() { grep -qE "^[[:space:]]*$1\)" deploy/gpu.sh 2>/dev/null; }

# build HOW: the binaries as they are (prebuilt), unpacked from gpu-prebuilt/
# (install: deploy/gpu.sh install) or built (compile: $BUILD_CMD); then ldd
# of each, failing on a library not found.
build() {
  local b rc=0
  case $1 in
    prebuilt) echo "== prebuilt: launcher, worker, cuda.test, nccl.test in $BIN" ;;
    install) echo "== deploy/gpu.sh install"; deploy/gpu.sh install || rc=$? ;;
    *) echo "== $BUILD_CMD"; $BUILD_CMD || rc=$? ;;
  esac
  for b in launcher worker cuda.test nccl.test; do
    if [ ! -x "$BIN/$b" ]; then
      echo "build: $BIN/$b missing"
      rc=1
      continue
    fi
    echo "== ldd $BIN/$b"
    ldd "$BIN/$b" 2>&1 | tee "$work/ldd.$b"
    if grep -q 'not found' "$work/ldd.$b"; then
      echo "build: $b: $(grep 'not found' "$work/ldd.$b" | awk '{print $1}' | tr '\n' ' ')not found"
      rc=1
    fi
  done
  if [ -n "$NEED_LIB" ] && [ -f "$work/ldd.worker" ] && ! grep -q "$NEED_LIB" "$work/ldd.worker"; then
    echo "build: worker is not linked against $NEED_LIB: not a -tags cuda build"
    rc=1
  fi
  return $rc
}

# gotimeout: a Go test binary's -test.timeout, inside the step's, so that a
# hung test prints its goroutines before it is killed.
gotimeout() { echo "$((STEP_TIMEOUT > 10 ? STEP_TIMEOUT - 5 : STEP_TIMEOUT))s"; }

# gotest BINARY ARGS: a Go test binary, -v, under the step's timeout; a test
# skipped whole (no device, no NCCL) fails the step: it did not run.
gotest() {
  local rc=0
  "$@" -test.v -test.timeout "$(gotimeout)" 2>&1 | tee "$work/gotest.out" || rc=$?
  if [ "$rc" = 0 ] && grep -q '^--- SKIP: ' "$work/gotest.out"; then
    echo "check.sh: skipped, not run"
    rc=3
  fi
  return "$rc"
}

dispatch() { gotest "$BIN/cuda.test" -test.run '^TestDispatchTable$'; }

conformance() { MESHRUN_CUDA_SYNC=1 gotest "$BIN/cuda.test" -test.run "^TestConformance\$/^$1\$"; }

# conformance_fallback: float32 and bfloat16 with cuBLASLt off, every GEMM on
# the plan cuBLASLt's refusal leaves (cuBLAS and the kernels).
conformance_fallback() { MESHRUN_CUBLASLT=0 MESHRUN_CUDA_SYNC=1 gotest "$BIN/cuda.test" -test.run '^TestConformance$/^(float32|bfloat16)$'; }

nccl() { NCCL_DEBUG=${NCCL_DEBUG:-INFO} gotest "$BIN/nccl.test"; }

# losses LOG: "KEY VALUE" for each loss of a launcher run's rank 0: its steps
# and its JSON line's loss fields.
losses() {
  sed -n 's/.*0:0| step \([0-9]*\)\/[0-9]* loss \([^ ]*\).*/step\1 \2/p' "$1"
  sed -n 's/.*0:0| {/{/p' "$1" | tail -n1 | grep -o '"\(loss_first\|loss_last\|heldout_loss\)":[^,}]*' | tr -d '"' | tr : ' '
}
# lossdiff A B: the largest relative difference of the losses both runs have
# (to B's), and how many: "1.2e-07 23"; "nan N" when one is not a number.
lossdiff() {
  join <(losses "$1" | sort) <(losses "$2" | sort) | awk '
    { n++; if ($2 !~ /^-?[0-9]/ || $3 !~ /^-?[0-9]/) { bad = 1; next }
      d = $2 - $3; if (d < 0) d = -d; a = $3 < 0 ? -$3 : $3; r = a > 0 ? d / a : d; if (r > m) m = r }
    END { if (n) { if (bad) print "nan", n; else printf "%.3g %d\n", m, n } }'
}
# field LOG KEY: KEY of the run's JSON line.
field() { sed -n 's/.*0:0| {/{/p' "$1" | tail -n1 | grep -o "\"$2\":[^,}]*" | cut -d: -f2; }

# pair WORKLOAD N TOLERANCE [FLAGS]: the workload on $DEVICE (with FLAGS),
# then on cpu, logs NN-NAME.DEVICE.log and NN-NAME.cpu.log; fails when a run
# does, or when the losses differ by more than TOLERANCE (0: not judged).
pair() {
  local w=$1 np=$2 tol=$3 rc=0 d args
  shift 3
  case $w in mlp) read -ra args <<<"$MLP_ARGS" ;; *) read -ra args <<<"$GPT_ARGS" ;; esac
  # The ranks' own logs (log.jsonl: each op's provider, the collectives'
  # backend) go into the archive, under runs/NN-NAME-DEVICE.
  local id launcher=("$BIN/launcher" run --log-dir "$logs/runs" --grace 3s --trace-max 2M)
  id=$(basename "${STEP_LOG%.log}")
  local dev=${STEP_LOG%.log}.$DEVICE.log cpu=${STEP_LOG%.log}.cpu.log r=0
  echo "== ${MESHRUN_COLLECTIVES:+MESHRUN_COLLECTIVES=$MESHRUN_COLLECTIVES }launcher run -n $np --device $DEVICE${*:+ $*} $w ${args[*]}"
  "${launcher[@]}" --job-id "$id-$DEVICE" --timeout "$((STEP_TIMEOUT * 2 / 3))s" -n "$np" --device "$DEVICE" "$@" "$w" "${args[@]}" >"$dev" 2>&1 || r=$?
  echo "rc $r"
  [ "$r" = 0 ] || { rc=$r; echo "the $DEVICE run failed: $(grep -v '^[[:space:]]*$' "$dev" | tail -n1)"; }
  echo "== launcher run -n $np --device cpu $w ${args[*]}"
  r=0
  "${launcher[@]}" --job-id "$id-cpu" -n "$np" --device cpu "$w" "${args[@]}" >"$cpu" 2>&1 || r=$?
  echo "rc $r"
  [ "$r" = 0 ] || { rc=$r; echo "the cpu run failed: $(grep -v '^[[:space:]]*$' "$cpu" | tail -n1)"; }
  [ "$rc" = 0 ] || return "$rc"
  d=$(lossdiff "$dev" "$cpu")
  echo "largest relative loss difference, count: ${d:-none}"
  [ -n "$d" ] || { echo "no losses to compare"; return 1; }
  if [ "$tol" != 0 ] && ! awk -v d="${d%% *}" -v t="$tol" 'BEGIN { exit !(d != "nan" && d + 0 <= t + 0) }'; then
    echo "above the tolerance $tol"
    return 1
  fi
}
mlp1() { pair mlp 1 1e-4; }
mlp2() { MESHRUN_COLLECTIVES=staged pair mlp 2 1e-4 $SHARE; }
gpt() { pair gpt 1 1e-4; }
gpt2() { MESHRUN_COLLECTIVES=staged pair gpt 2 1e-4 $SHARE; }
# gptbf16: bfloat16 on both, within docs/transformer.md's 1e-2 (TestGPTBFloat16's
# bound against float32).
gptbf16() { GPT_ARGS="$GPT_ARGS --dtype bfloat16" pair gpt 1 1e-2; }
# gptpp: two pipeline stages (ZB-H1), their activations and gradients
# passed as device tensors through the links (staged: one GPU, which NCCL
# refuses to two ranks), against the same pipeline on cpu ranks (a block a
# stage).
# gptfused, gptfusedbf16: gpt and gptbf16 on the block kernels (fused
# attention, layer norm a block per row).
gptfused() { MESHRUN_CUDA_ATTENTION=fused MESHRUN_CUDA_LAYERNORM=block pair gpt 1 1e-4; }
gptfusedbf16() { MESHRUN_CUDA_ATTENTION=fused MESHRUN_CUDA_LAYERNORM=block GPT_ARGS="$GPT_ARGS --dtype bfloat16" pair gpt 1 1e-2; }
gptpp() { MESHRUN_COLLECTIVES=staged GPT_ARGS="$GPT_ARGS --layers 2 --mesh pp=2 --schedule zb" pair gpt 2 1e-4 $SHARE; }
gptrecipe() { GPT_ARGS="$GPT_ARGS --clip-grad 0.5 --warmup 2" pair gpt 1 1e-4; }

verify() { "$BIN/worker" verify --device "$DEVICE" --quick; }

bench() { bench/gpu/run.sh "$BIN/cuda.test" "$1"; }

export -f probe ptxas_sm90 have_bins has_command build gotimeout gotest dispatch conformance conformance_fallback nccl losses lossdiff field pair mlp1 mlp2 gpt gpt2 gptbf16 gptfused gptfusedbf16 gptpp gptrecipe verify bench

# --- each step's figures for the summary: one line, from LOG [ARGS] ---

val() { # KEY of the probe's versions, "?" when it has none
  local v
  v=$(sed -n "s/^$1=//p" "$work/versions" 2>/dev/null | tail -n1)
  echo "${v:-?}"
}
probe_lines() {
  say "device: $(cat "$work/gpu.csv" 2>/dev/null || echo unknown)"
  say "versions: CUDA $(val cuda_driver) (driver), nvcc $(val nvcc), ptxas $(val ptxas), PyTorch $(val torch) (CUDA $(val torch_cuda)), NCCL $(val nccl), cuBLAS $(val cublas); gcc $(val gcc), $(val go), $(val cpus) CPUs"
  # shellcheck disable=SC1091
  [ -f "$work/probe.env" ] && . "$work/probe.env"
}
figures_probe() {
  local nccl
  nccl=$(sed -n 's/^export MESHRUN_NCCL_LIBRARY=//p' "$work/probe.env" 2>/dev/null | tail -n1)
  printf 'libraries: %s; NCCL: %s%s\n' "$(val libs)" "${nccl:-${MESHRUN_NCCL_LIBRARY:-none found (libnccl.so.2 if the loader has one)}}" \
    "$(grep -q '^export LD_LIBRARY_PATH=' "$work/probe.env" 2>/dev/null && echo '; LD_LIBRARY_PATH set')"
}
figures_ptxas_sm90() {
  printf '%s entry functions for sm_90, %s with spills\n' "$(grep -c 'Compiling entry function' "$1")" \
    "$(grep 'bytes spill stores' "$1" | grep -vc ' 0 bytes spill stores')"
}
figures_build() { # LOG HOW
  case $2 in
    prebuilt) printf 'prebuilt in %s' "${BIN#"$root"/}" ;;
    install) printf 'unpacked from gpu-prebuilt/ by deploy/gpu.sh install' ;;
    *) printf 'built by %s' "$BUILD_CMD" ;;
  esac
  grep '^build: ' "$1" | sed 's/^build: /; /' | tr -d '\n'
  echo
}
testcounts() { # a Go test's leaf tests passed, failed (the first three named) and skipped, a crash, a skip's reason
  awk '/--- (PASS|FAIL|SKIP): / {
      for (i = 1; i < NF; i++) if ($i ~ /^(PASS|FAIL|SKIP):$/) { name = $(i + 1); if (!(name in st)) order[++n] = name; st[name] = substr($i, 1, 4); break } }
    END {
      for (k in st) { p = k; while (match(p, /\/[^\/]*$/)) { p = substr(p, 1, RSTART - 1); inner[p] = 1 } }
      for (i = 1; i <= n; i++) { k = order[i]; if (k in inner) continue; c[st[k]]++
        if (st[k] == "FAIL" && ++nf <= 3) failed = failed (nf > 1 ? " " : "; failed: ") k }
      printf "%d passed, %d failed, %d skipped%s", c["PASS"], c["FAIL"], c["SKIP"], failed }' "$1"
  printf '%s%s%s\n' \
    "$(grep -m1 -E '^(panic:|fatal error:|SIGSEGV|signal )' "$1" | sed 's/^/; /')" \
    "$(grep -q 'no tests to run' "$1" && echo '; no such test in the binary')" \
    "$(grep -m1 -A1 -- '--- SKIP' "$1" | sed -n '2s/^ */; skipped: /p')"
}
figures_dispatch() { # and the calls the provider claims but refused
  local n
  n=$(grep -c 'claimed but refused' "$1")
  printf '%s%s\n' "$(testcounts "$1")" "$([ "$n" -gt 0 ] && echo "; $n calls claimed but refused")"
}
figures_conformance() { testcounts "$1"; }
figures_conformance_fallback() { testcounts "$1"; }
figures_nccl() { testcounts "$1"; }
figures_pair() { # LOG WORKLOAD TOLERANCE
  local dev=${1%.log}.$DEVICE.log cpu=${1%.log}.cpu.log d copies=''
  d=$(lossdiff "$dev" "$cpu")
  [ "$2" = mlp ] && copies=" h2d $(f "$dev" h2d_bytes_per_step) B, d2h $(f "$dev" d2h_bytes_per_step) B, staged $(f "$dev" staged_bytes_per_step) B,"
  printf '%s%s; %s per step:%s %s ms median (cpu %s ms)\n' \
    "$([ -n "$d" ] && echo "largest relative loss difference ${d%% *} over ${d#* } losses" || echo "no losses to compare")" \
    "$([ "$3" != 0 ] && echo " (tolerance $3)")" "$DEVICE" "$copies" \
    "$(f "$dev" step_ms_median)" "$(f "$cpu" step_ms_median)"
}
f() { local v; v=$(field "$@"); echo "${v:-?}"; } # field, "?" for none
figures_mlp1() { figures_pair "$1" mlp 1e-4; }
figures_mlp2() { figures_pair "$1" mlp 1e-4; }
figures_gpt() { figures_pair "$1" gpt 1e-4; }
figures_gpt2() { figures_pair "$1" gpt 1e-4; }
figures_gptbf16() { figures_pair "$1" gpt 1e-2; }
figures_gptpp() { figures_pair "$1" gpt 1e-4; }
figures_gptrecipe() { figures_pair "$1" gpt 1e-4; }
figures_gptfused() { figures_pair "$1" gpt 1e-4; }
figures_gptfusedbf16() { figures_pair "$1" gpt 1e-2; }
figures_verify() {
  awk 'NF == 5 && $3 ~ /^[0-9]+$/ && $4 ~ /^[0-9]+$/ && $5 ~ /^[0-9]+$/ { c += $3; p += $4; f += $5 }
       END { printf "%d cases, %d passed, %d failed\n", c, p, f }' "$1"
}
figures_bench() { # run.sh's tables: a linear row has 6 cells, an MLP or GPT row 5 (GPT's first with 3 commas); the ratio last
  local lin mlp gpt
  lin=$(awk -F'|' 'NF == 8 && $2 !~ /dtype|---/ { r = $7; gsub(/[ ×]/, "", r); print r }' "$1" | sort -g)
  mlp=$(awk -F'|' 'NF == 7 && $2 !~ /MLP|GPT|---/ && gsub(/,/, ",", $2) == 2 { r = $6; gsub(/[ ×]/, "", r); printf " %s", r }' "$1")
  gpt=$(awk -F'|' 'NF == 7 && $2 !~ /MLP|GPT|---/ && gsub(/,/, ",", $2) == 3 { r = $6; gsub(/[ ×]/, "", r); printf " %s", r }' "$1")
  if [ -n "$lin" ]; then
    echo "$lin" | awk -v mlp="$mlp" -v gpt="$gpt" '{ r[NR] = $1 } END { printf "linear meshrun/PyTorch over %d rows: min %s, median %s, max %s; MLP step PyTorch/meshrun:%s; GPT step PyTorch/meshrun:%s\n", NR, r[1], r[int((NR + 1) / 2)], r[NR], mlp == "" ? " none" : mlp, gpt == "" ? " none" : gpt }'
  else
    echo "no linear rows; MLP step PyTorch/meshrun:${mlp:- none}; GPT step PyTorch/meshrun:${gpt:- none}"
  fi
}

# --- the run ---

began=$(date -u +%FT%TZ)
step probe 15 60 probe
step ptxas 15 60 ptxas_sm90
if have_bins; then
  step build 15 60 "build prebuilt"
elif [ "$dry" = 0 ] && [ -f gpu-prebuilt/bin.tar.xz ] && has_command install; then
  step build 20 120 "build install"
else
  step build 150 330 "build compile"
fi
step dispatch 20 150 dispatch
for dt in float32 float64 bfloat16; do step "conformance-$dt" 20 120 "conformance $dt"; done
step conformance-fallback 20 120 conformance_fallback
step nccl 15 60 nccl
step mlp-1 20 90 mlp1
step mlp-2 20 90 mlp2
step verify 20 120 verify
step gpt 20 90 gpt
step gpt-2 20 90 gpt2
step gpt-bf16 20 90 gptbf16
step gpt-fused 20 90 gptfused
step gpt-fused-bf16 20 90 gptfusedbf16
step gpt-pp 20 90 gptpp
step gpt-recipe 20 90 gptrecipe
secs=0.5
[ $((deadline - SECONDS)) -lt 240 ] && secs=0.25
step bench 150 300 "bench $secs"
say "- end: $SECONDS s of the $deadline s deadline (bench/gpu/check.sh$([ "$dry" = 1 ] && echo ' --dry'), from $began); every log in gpu-logs.tgz"
archive
