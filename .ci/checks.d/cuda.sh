#!/usr/bin/env bash
# Compile check for the cuda kernels provider (build tag "cuda") without a GPU or a
# CUDA install: fetch Debian's nvidia-cuda-dev package (non-free) into a cache,
# unpack it without installing, and build/vet with -tags cuda against its headers
# and link stubs. Idempotent: the unpacked tree is reused while the .deb is cached.
# Then the binaries a GPU machine gets (deploy/gpu.sh prebuild): the sonames
# they need, and the cuda launcher, which links no CUDA library, run here
# without the driver; and deploy TestGPUStubs, which needs the package (the
# unit run before it may have skipped it), and kernels/cuda/ptx
# TestPTXAssembles, which needs ptxas (fetched from nvidia-cuda-toolkit).
#
#   cuda.sh --fetch   only fetch and unpack; print include=DIR and stubs=DIR
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
cache="${MESHRUN_CUDA_CACHE:-$root/.cache/cuda}"
pkg=nvidia-cuda-dev
fail() { echo "cuda.sh: $*" >&2; exit 1; }

mkdir -p "$cache"
# fetch PKG: the cached .deb of Debian's (non-free) PKG, downloaded if absent.
fetch() {
  local deb
  deb=$(ls "$cache"/"$1"_*.deb 2>/dev/null | head -n1 || true)
  if [ -n "$deb" ]; then
    echo "$deb"
    return
  fi
  command -v apt-get >/dev/null || fail "apt-get not found; cannot fetch $1"
  apt="$cache/apt"
  opts=(-o Dir::Etc::SourceList="$apt/sources.list" -o Dir::Etc::SourceParts="$apt/sources.list.d"
        -o Dir::State::Lists="$apt/lists" -o Dir::Cache="$apt" -o Dir::Cache::archives="$apt/archives"
        -o APT::Get::List-Cleanup=0 -o Debug::NoLocking=1)
  if [ ! -e "$apt/.updated.$$" ]; then # once a run ($$ is this script's, in the subshells too)
    mkdir -p "$apt/sources.list.d" "$apt/lists/partial" "$apt/archives/partial"
    # The machine's own Debian sources, with the non-free components added.
    : >"$apt/sources.list.d/debian.sources"
    for f in /etc/apt/sources.list.d/*.sources; do
      [ -e "$f" ] || continue
      grep -qiE '^URIs:.*debian' "$f" || continue
      sed -E 's/^(Components:).*/\1 main contrib non-free non-free-firmware/' "$f" >>"$apt/sources.list.d/debian.sources"
      echo >>"$apt/sources.list.d/debian.sources"
    done
    : >"$apt/sources.list"
    if [ -e /etc/apt/sources.list ]; then
      grep -E '^deb .*debian' /etc/apt/sources.list |
        awk '{print $1, $2, $3, "main contrib non-free non-free-firmware"}' >"$apt/sources.list" || true
    fi
    [ -s "$apt/sources.list.d/debian.sources" ] || [ -s "$apt/sources.list" ] ||
      fail "no Debian apt sources found in /etc/apt to derive a non-free source from"
    apt-get "${opts[@]}" -qq update >&2 || fail "apt-get update with non-free sources failed"
    rm -f "$apt"/.updated.*
    touch "$apt/.updated.$$"
  fi
  echo "cuda.sh: fetching $1 (Debian non-free) into $cache" >&2
  (cd "$cache" && apt-get "${opts[@]}" -qq download "$1" >&2) || fail "apt-get download $1 failed"
  deb=$(ls "$cache"/"$1"_*.deb 2>/dev/null | head -n1 || true)
  [ -n "$deb" ] || fail "download produced no $1 .deb"
  echo "$deb"
}
deb=$(fetch "$pkg")

tree="$cache/root"
stamp="$tree/.from-$(basename "$deb")"
if [ ! -e "$stamp" ]; then
  rm -rf "$tree"
  mkdir -p "$tree"
  dpkg-deb -x "$deb" "$tree" || fail "dpkg-deb -x $deb failed"
  touch "$stamp"
fi

inc=$(dirname "$(find "$tree" -name cuda.h -path '*include*' | head -n1)")
[ -f "$inc/cuda.h" ] || fail "cuda.h not found in $deb"
[ -f "$inc/cublas_v2.h" ] || fail "cublas_v2.h not found in $deb"
libdirs=()
for lib in libcuda.so libcublas.so; do
  f=$(find "$tree" -name "$lib" \( -type f -o -type l \) -path '*stubs*' | head -n1)
  [ -n "$f" ] || f=$(find "$tree" -name "$lib" -type f | head -n1)
  [ -n "$f" ] || fail "$lib (link stub) not found in $deb"
  libdirs+=("$(dirname "$f")")
done
ldflags=""
for d in $(printf '%s\n' "${libdirs[@]}" | sort -u); do ldflags="$ldflags -L$d"; done
if [ "${1:-}" = --fetch ]; then
  echo "include=$inc"
  echo "stubs=${libdirs[0]}"
  exit 0
fi

# The stand-ins prebuild links against, held to the package's link stubs.
MESHRUN_CUDA_CACHE="$cache" .ci/gotest cuda -count=1 -run '^TestGPUStubs$' ./deploy/ || fail "deploy TestGPUStubs failed"

# NVIDIA's assembler takes every kernel of the embedded PTX for sm_80 and
# sm_90 (the toolkit package's ptxas alone is unpacked).
tdeb=$(fetch nvidia-cuda-toolkit)
ptxas="$cache/toolkit/usr/bin/ptxas"
if [ ! -e "$cache/toolkit/.from-$(basename "$tdeb")" ]; then
  rm -rf "$cache/toolkit"
  mkdir -p "$cache/toolkit"
  dpkg-deb --fsys-tarfile "$tdeb" | tar -x -C "$cache/toolkit" ./usr/bin/ptxas || fail "no ptxas in $tdeb"
  touch "$cache/toolkit/.from-$(basename "$tdeb")"
fi
MESHRUN_PTXAS="$ptxas" .ci/gotest cuda -count=1 -run '^TestPTXAssembles$' ./kernels/cuda/ptx/ || fail "kernels/cuda/ptx TestPTXAssembles failed"

export CGO_ENABLED=1
export CGO_CFLAGS="-I$inc"
export CGO_LDFLAGS="$ldflags"
echo "cuda.sh: go build -tags cuda ./... (CGO_CFLAGS=$CGO_CFLAGS CGO_LDFLAGS=$CGO_LDFLAGS)"
go build -tags cuda ./... || fail "go build -tags cuda failed"
go vet -tags cuda ./... || fail "go vet -tags cuda failed"
# Link the test binary too (it needs the stubs) without running it: there is no GPU.
go test -tags cuda -count=1 -c -o /dev/null ./kernels/cuda/ && go test -tags cuda -count=1 -c -o /dev/null ./collective/nccl/ || fail "go test -tags cuda (compile and link) failed"

# The launcher links no CUDA code: it starts on a machine without the driver.
deps=$(go list -tags cuda -deps ./cmd/launcher) || fail "go list -tags cuda -deps ./cmd/launcher failed"
if grep -E '^(gorgonia\.org/cu|github\.com/meshrun/meshrun/kernels(/.*)?)$' <<<"$deps"; then
  fail "the cuda launcher imports the packages above: it would need the driver to start"
fi

# The binaries a GPU machine gets, linked against stand-ins with CUDA 13's sonames.
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
deploy/gpu.sh prebuild "$out" || fail "deploy/gpu.sh prebuild failed"
mkdir -p "$out/bin" && tar -C "$out/bin" -xJf "$out/gpu-prebuilt/bin.tar.xz"
needed() { readelf -d "$out/bin/$1" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | tr '\n' ' '; }
for b in worker cuda.test; do
  for so in libcuda.so.1 libcublas.so.13 libcublasLt.so.13; do
    [[ " $(needed $b)" == *" $so "* ]] || fail "prebuilt $b does not need $so: $(needed $b)"
  done
done
[[ " $(needed nccl.test)" == *" libcuda.so.1 "* ]] || fail "prebuilt nccl.test does not need libcuda.so.1: $(needed nccl.test)"
[[ "$(needed launcher)" != *libcu* ]] || fail "prebuilt launcher needs $(needed launcher)"
echo "cuda.sh: prebuilt: launcher needs $(needed launcher); worker needs $(needed worker)"
# ... and starts without the driver: a program job runs; --device cuda is refused.
if ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1 ' || [ -e /usr/local/nvidia/lib64/libcuda.so.1 ]; then
  echo "cuda.sh: this machine has libcuda.so.1: not running the launcher without the driver"
else
  "$out/bin/launcher" run -n 1 --log-dir "$out/runs" -- true || fail "prebuilt launcher: run -n 1 -- true failed"
  set +e
  msg=$("$out/bin/launcher" run -n 1 --log-dir "$out/runs" --device cuda -- true 2>&1)
  code=$?
  set -e
  echo "cuda.sh: launcher run --device cuda without the driver: exit $code: $msg"
  [ "$code" = 2 ] && [[ "$msg" == *"cudadriver: no NVIDIA driver on this machine: libcuda.so.1: cannot open shared object file"* ]] ||
    fail "prebuilt launcher: --device cuda without the driver: want exit 2 naming libcuda.so.1"
fi
echo "cuda.sh: ok"
