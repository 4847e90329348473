#!/usr/bin/env bash
# Checkpoint save and load speed against cp, on the same disk, in one run.
#
#   bench/ckpt/run.sh [repetitions] [dir]      (defaults: 3, a folder under /tmp)
#
# The model is the MLP block at hidden 4096, ffn 32768: 2 x 4096 x 32768 float32
# weights plus biases, 1 GiB, on 2 ranks (each writes and reads 512 MiB).
#
# Save: `mlp --save --save-every 1 --keep 1` over 4 steps; the figure is the last
# save's "save_ms" (each rank writes its safetensors file with its checksums,
# rank 0 commits the index and renames the folder), in the steady state where
# the page cache of the checkpoint the save replaces is reused; once with
# fsync (the default) and once with --save-sync=false. Load: `mlp --resume` of
# the checkpoint; its "load_ms" (every rank verifies the checksums of the blocks
# its boxes touch, the ranks agree, every rank reads its boxes into its
# parameters in place). The peers, on the same files: `cp -r` of the checkpoint
# folder, and `cp -r` followed by `sync` (the save with fsync is durable; cp
# alone is not). Each figure is the best of the repetitions.
set -euo pipefail
cd "$(dirname "$0")/../.."
reps=${1:-3}
base=${2:-$(mktemp -d /tmp/meshrun-ckpt-bench.XXXXXX)}
mkdir -p "$base"
trap 'rm -rf "$base"' EXIT
go build -o "$base/bin/" ./cmd/launcher ./cmd/worker
model=(--tokens 8 --hidden 4096 --ffn 32768)
best() { sort -g | head -n1; }
field() { python3 -c 'import json,sys; l=sys.stdin.read(); d=json.loads(l[l.index("{"):]); print(d[sys.argv[1]])' "$1"; }
run() { "$base/bin/launcher" run -n 2 --log-dir "$base/runs" mlp "${model[@]}" "$@" 2>&1 | grep '"param_bytes"' | tail -n1; }
save=() nosync=() load=() cp_=() cps=() bytes=0
for r in $(seq "$reps"); do
  rm -rf "$base/ck" "$base/copy"
  line=$(run --steps 4 --save "$base/ck" --save-every 1 --keep 1 --save-sync=false)
  nosync+=("$(field save_ms <<<"$line")")
  line=$(run --steps 4 --save "$base/ck" --save-every 1 --keep 1)
  save+=("$(field save_ms <<<"$line")")
  bytes=$(field param_bytes <<<"$line")
  line=$(run --steps 5 --resume "$base/ck")
  load+=("$(field load_ms <<<"$line")")
  src="$base/ck/step-00000004"
  sync
  t0=$(date +%s%N); cp -r "$src" "$base/copy"; t1=$(date +%s%N)
  cp_+=("$(((t1 - t0) / 1000))")
  rm -rf "$base/copy"; sync
  t0=$(date +%s%N); cp -r "$src" "$base/copy"; sync; t1=$(date +%s%N)
  cps+=("$(((t1 - t0) / 1000))")
  rm -rf "$base/copy"
  echo "repetition $r/$reps: save ${save[-1]} ms (no fsync ${nosync[-1]} ms), load ${load[-1]} ms, cp $((cp_[-1] / 1000)) ms, cp+sync $((cps[-1] / 1000)) ms" >&2
done
s=$(printf '%s\n' "${save[@]}" | best); n=$(printf '%s\n' "${nosync[@]}" | best); l=$(printf '%s\n' "${load[@]}" | best)
c=$(printf '%s\n' "${cp_[@]}" | best); cs=$(printf '%s\n' "${cps[@]}" | best)
python3 - "$bytes" "$s" "$n" "$l" "$c" "$cs" "$base" <<'PY'
import sys
b, save, nosync, load = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
cp, cps, base = int(sys.argv[5]) / 1000, int(sys.argv[6]) / 1000, sys.argv[7]
gbs = lambda ms: b / (ms / 1e3) / 1e9
print(f"{b} bytes of parameters (2 ranks), checkpoint folder on the disk of {base}; best of the repetitions.")
print()
print("| operation | ms | GB/s | speed against cp | against cp + sync |")
print("|---|---|---|---|---|")
print(f"| meshrun save (write, checksums, commit; no fsync) | {nosync:.0f} | {gbs(nosync):.2f} | {cp / nosync:.2f} | |")
print(f"| meshrun save (write, checksums, fsync, commit) | {save:.0f} | {gbs(save):.2f} | {cp / save:.2f} | {cps / save:.2f} |")
print(f"| meshrun load (verify, agree, read in place) | {load:.0f} | {gbs(load):.2f} | {cp / load:.2f} | |")
print(f"| cp -r | {cp:.0f} | {gbs(cp):.2f} | 1.00 | |")
print(f"| cp -r; sync | {cps:.0f} | {gbs(cps):.2f} | | 1.00 |")
PY
