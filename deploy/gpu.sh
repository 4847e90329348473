#!/usr/bin/env bash
# Build meshrun's CUDA binaries on a GPU machine that has no Go toolchain and
# no network (CUDA 12 or 13 driver and libraries, e.g. from PyTorch's wheels).
#
#   deploy/gpu.sh bundle DIR   # here, with the module proxy: DIR/gpu-bundle/
#                              #   go.tar.xz   the Go toolchain, less src/cmd, tests, testdata
#                              #   vendor.tar.xz   go mod vendor
#                              #   cuda.tar.xz     CUDA 11.8 headers (Debian's nvidia-cuda-dev)
#   deploy/gpu.sh build        # there, in the source tree with gpu-bundle/ in it:
#                              #   bin/launcher, bin/worker built with -tags cuda
#
# Why 11.8 headers: gorgonia.org/cu v0.9.6 does not compile against CUDA 12 or
# 13 headers (cuCtxCreate's changed signature, its issue #66). The driver API is
# backward compatible, so the binary compiled against 11.8's declarations
# links against the machine's own libcuda.so.1 (the driver) and libcublas /
# libcublasLt (CUDA 12 or 13: the functions meshrun calls keep their
# signatures). NCCL is not linked: it is loaded at run time (collective/nccl).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
die() { echo "gpu.sh: $*" >&2; exit 1; }

bundle() {
  local out="${1:?usage: gpu.sh bundle DIR}/gpu-bundle"
  rm -rf "$out" && mkdir -p "$out"
  local goroot; goroot=$(go env GOROOT)
  echo "gpu.sh: Go toolchain from $goroot"
  tar -C "$(dirname "$goroot")" -cJf "$out/go.tar.xz" \
    --exclude='go/src/cmd' --exclude='go/test' --exclude='*/testdata' --exclude='*_test.go' \
    --exclude='go/pkg/tool/*/api' --exclude='go/doc' --exclude='go/misc' "$(basename "$goroot")"
  (cd "$root" && go mod vendor -o "$out/vendor" && tar -C "$out" -cJf "$out/vendor.tar.xz" vendor && rm -rf "$out/vendor")
  MESHRUN_CUDA_CACHE="${MESHRUN_CUDA_CACHE:-$root/.cache/cuda}" "$root/.ci/checks.d/cuda.sh" >/dev/null ||
    die "fetching CUDA 11.8 headers (.ci/checks.d/cuda.sh) failed"
  local inc; inc=$(dirname "$(find "${MESHRUN_CUDA_CACHE:-$root/.cache/cuda}/root" -name cuda.h -path '*include*' | head -n1)")
  tar -C "$inc" -cJf "$out/cuda.tar.xz" --transform 's,^\.,cuda,' .
  du -sh "$out"/* | sed 's/^/gpu.sh: /'
}

# findlib NAME: the machine's library NAME (unversioned, or its highest version),
# from $MESHRUN_CUDA_LIBS (a directory), the loader cache, the CUDA install and
# PyTorch's wheels.
findlib() {
  local name=$1 f
  for f in $( (ls "${MESHRUN_CUDA_LIBS:-/nonexistent}/$name"* 2>/dev/null; ldconfig -p 2>/dev/null | awk -v n="$name" '$1 ~ "^"n {print $NF}';
               ls /usr/local/cuda*/lib64/"$name"* /usr/local/cuda*/targets/*/lib/"$name"* 2>/dev/null;
               python3 -c 'import site,glob; [print(p) for s in site.getsitepackages() for p in glob.glob(s+"/nvidia/*/lib/'"$name"'*")]' 2>/dev/null) | sort -V -r); do
    [ -e "$f" ] && { echo "$f"; return; }
  done
}

build() {
  local b="$root/gpu-bundle"
  [ -d "$b" ] || die "no gpu-bundle/ in $root: run gpu.sh bundle first and carry it here"
  local work="$root/.cache/gpu-build"
  mkdir -p "$work/lib"
  if [ ! -x "$work/go/bin/go" ]; then tar -C "$work" -xJf "$b/go.tar.xz"; fi
  [ -d "$work/vendor" ] || tar -C "$work" -xJf "$b/vendor.tar.xz"
  [ -d "$work/cuda" ] || tar -C "$work" -xJf "$b/cuda.tar.xz"
  export GOROOT="$work/go" PATH="$work/go/bin:$PATH" GOFLAGS=-mod=vendor GOTOOLCHAIN=local GOPROXY=off
  export GOCACHE="$work/cache"
  [ -e "$root/vendor" ] || ln -s "$work/vendor" "$root/vendor"
  # Unversioned names for the linker, pointing at the machine's libraries.
  for l in libcuda.so libcublas.so libcublasLt.so; do
    f=$(findlib "$l") || true
    [ -n "$f" ] || die "$l not found (driver, CUDA toolkit or PyTorch's nvidia-* wheels)"
    ln -sf "$f" "$work/lib/$l"
    echo "gpu.sh: $l -> $f"
  done
  export CGO_ENABLED=1 CGO_CFLAGS="-I$work/cuda" CGO_LDFLAGS="-L$work/lib -Wl,-rpath,$work/lib"
  (cd "$root" && go build -tags cuda -o bin/ ./cmd/launcher ./cmd/worker)
  (cd "$root" && go test -tags cuda -c -o bin/cuda.test ./kernels/cuda/ && go test -tags cuda -c -o bin/nccl.test ./collective/nccl/)
  echo "gpu.sh: built bin/launcher bin/worker bin/cuda.test bin/nccl.test (go $(go env GOVERSION), -tags cuda)"
}

case "${1:-}" in
  bundle) shift; bundle "$@" ;;
  build) build ;;
  *) die "usage: gpu.sh bundle DIR | gpu.sh build" ;;
esac
