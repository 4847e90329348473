#!/usr/bin/env bash
# Measures the cpu kernels provider against OpenBLAS 0.3 (Debian's) in float32
# and against PyTorch (Debian's python3-torch, oneDNN) in bfloat16, in one run, on
# 1 and 2 cores, and prints two Markdown tables.
#
#   bench/kernels/run.sh [rounds] [seconds-per-measurement]
#
# The main comparison runs in one process (bench/kernels built with -tags openblas,
# OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE unset for that command only, so OpenBLAS
# picks its AVX-512 kernels): meshrun and OpenBLAS alternate, five slices each per
# measurement, and each keeps its best slice, so background load on this shared
# machine hits both alike. Debian's numpy on the same OpenBLAS is measured too, with
# the variables unset (a cross-check) and in the default environment (where this
# machine may force the Haswell/AVX2 kernels). The same Go process measures
# meshrun's bfloat16 GEMMs (bfloat16 operands and outputs, float32 sums) in the
# same rotation; PyTorch's bfloat16 (peer_torch.py) runs after it in every
# round. Each cell is the best of the rounds.
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds=${1:-3}
secs=${2:-0.4}
py=/usr/bin/python3

need=()
$py -c 'import numpy' 2>/dev/null || need+=(python3-numpy)
$py -c 'import torch' 2>/dev/null || need+=(python3-torch)
[ -e /usr/include/x86_64-linux-gnu/cblas.h ] || [ -e /usr/include/cblas.h ] || need+=(libopenblas-dev)
if [ ${#need[@]} -gt 0 ]; then
  echo "installing ${need[*]}" >&2
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >&2
fi

bin=$(mktemp -d)/kernels
trap 'rm -rf "$(dirname "$bin")"' EXIT
CGO_ENABLED=1 go build -tags openblas -o "$bin" ./bench/kernels

# Which OpenBLAS kernels does each environment select? (numpy's config.)
corename() {
  $py - <<'PY' 2>/dev/null || echo unknown
import ctypes, numpy, glob, os
libs = glob.glob(os.path.join(os.path.dirname(numpy.__file__), "..", "numpy.libs", "*openblas*")) + \
       glob.glob("/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas*.so*") + glob.glob("/usr/lib/x86_64-linux-gnu/libopenblas*.so*")
for l in libs:
    try:
        lib = ctypes.CDLL(l)
        f = lib.openblas_get_corename
        f.restype = ctypes.c_char_p
        print(f().decode()); break
    except Exception:
        continue
else:
    print("unknown")
PY
}
core512=$(env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE bash -c "$(declare -f corename); py=$py; corename")
coredef=$(corename)
echo "OpenBLAS core: $core512 (variables unset), $coredef (default environment: OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-unset} OPENBLAS_L2_SIZE=${OPENBLAS_L2_SIZE:-unset})" >&2

peak1=$("$bin" -peak -threads 1 -mintime 1s | cut -f8)
peak16=$("$bin" -peakbf16 -threads 1 -mintime 1s 2>/dev/null | cut -f8 || true)
peak16=${peak16:-0}
out=$(mktemp)
for r in $(seq "$rounds"); do
  for t in 1 2; do
    echo "round $r/$rounds, $t thread(s)" >&2
    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE \
      "$bin" -peer -threads "$t" -mintime "${secs}s" 2>/dev/null >>"$out"
    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE OPENBLAS_NUM_THREADS=$t \
      $py bench/kernels/peer.py numpy-avx512 "$secs" >>"$out"
    OPENBLAS_NUM_THREADS=$t $py bench/kernels/peer.py openblas-default "$secs" >>"$out"
    OMP_NUM_THREADS=$t $py bench/kernels/peer_torch.py torch-bf16 "$t" "$secs" 2>/dev/null >>"$out"
  done
done
torchdesc=$($py - <<'PY' 2>/dev/null || echo "PyTorch (not found)"
import re, torch
m = re.search(r"MKL-DNN (v[0-9.]+)", torch.__config__.show())
print(f"PyTorch {torch.__version__} (Debian python3-torch, oneDNN {m.group(1) if m else '?'}, mkldnn available: {torch.backends.mkldnn.is_available()})")
PY
)

$py - "$out" "$peak1" "$core512" "$coredef" "$peak16" "$torchdesc" <<'PY'
import sys, collections
path, peak1, core512, coredef = sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4]
peak16, torchdesc = float(sys.argv[5]), sys.argv[6]
best = collections.defaultdict(float)
order = []
for line in open(path):
    impl, t, case, op, m, k, n, g = line.split("\t")
    key = (int(t), case, op, int(m), int(k), int(n))
    if key not in order:
        order.append(key)
    best[(impl,) + key] = max(best[(impl,) + key], float(g))
print(f"FMA peak measured: {peak1:.0f} GFLOP/s on one core (fraction of peak = GFLOP/s / (threads x {peak1:.0f})).")
print(f"OpenBLAS 0.3.21 (Debian) kernels: `{core512}` with OPENBLAS_CORETYPE/OPENBLAS_L2_SIZE unset, `{coredef}` in the default environment.")
print()
print("| threads | shape (M, K, N) | op | meshrun cpu | OpenBLAS AVX-512 | numpy AVX-512 | numpy default env | meshrun / OpenBLAS AVX-512 | meshrun % of peak |")
print("|---|---|---|---|---|---|---|---|---|")
worst = 9.9
for key in sorted(order, key=lambda k: (k[0], order.index(k))):
    t, case, op, m, k, n = key
    me, ob = best[("meshrun",) + key], best[("openblas",) + key]
    na, od = best[("numpy-avx512",) + key], best[("openblas-default",) + key]
    ratio = me / ob if ob else float("nan")
    worst = min(worst, ratio)
    shape = f"{m}x{k}x{n}" if case.startswith("gemm") else f"({m}, {k}, {n})"
    name = "gemm" if case.startswith("gemm") else op
    print(f"| {t} | {shape} | {name} | {me:.1f} | {ob:.1f} | {na:.1f} | {od:.1f} | {ratio:.2f} | {100*me/(t*peak1):.0f}% |")
print()
print(f"Lowest meshrun / OpenBLAS AVX-512 ratio: {worst:.2f}")
print()
print("GFLOP/s, best of the rounds; forward includes the bias for meshrun and the in-process OpenBLAS")
print("(numpy's forward is x @ w.T alone). Fraction of peak: meshrun GFLOP/s / (threads x one-core FMA peak).")
print()
print(f"bfloat16 (operands and outputs bfloat16, sums float32). VDPBF16PS peak measured: {peak16:.0f} GFLOP/s on one core;")
print(f"peer: {torchdesc}, torch.nn.functional.linear (forward, with the bias) and torch.matmul (backward).")
print()
print("| threads | shape (M, K, N) | op | meshrun float32 | meshrun bf16 | PyTorch bf16 | bf16 / float32 | bf16 / PyTorch | bf16 % of bf16 peak |")
print("|---|---|---|---|---|---|---|---|---|")
worst_f, worst_t = 9.9, 9.9
for key in sorted(order, key=lambda k: (k[0], order.index(k))):
    t, case, op, m, k, n = key
    me, mb, pt = best[("meshrun",) + key], best[("meshrun-bf16",) + key], best[("torch-bf16",) + key]
    rf = mb / me if me else float("nan")
    rt = mb / pt if pt else float("nan")
    if m >= 512:
        worst_f = min(worst_f, rf)
    worst_t = min(worst_t, rt)
    shape = f"{m}x{k}x{n}" if case.startswith("gemm") else f"({m}, {k}, {n})"
    name = "gemm" if case.startswith("gemm") else op
    frac = f"{100*mb/(t*peak16):.0f}%" if peak16 else "-"
    print(f"| {t} | {shape} | {name} | {me:.1f} | {mb:.1f} | {pt:.1f} | {rf:.2f} | {rt:.2f} | {frac} |")
print()
print(f"Lowest bf16 / float32 at M >= 512: {worst_f:.2f}; lowest bf16 / PyTorch: {worst_t:.2f}")
PY
rm -f "$out"
