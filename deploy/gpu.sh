#!/usr/bin/env bash
# meshrun's CUDA binaries for a GPU machine that has no Go toolchain and no
# network (CUDA 12 or 13 driver and libraries, e.g. from PyTorch's wheels).
#
# Here, with the Go toolchain and the module proxy:
#   deploy/gpu.sh prebuild DIR  # DIR/gpu-prebuilt/: bin.tar.xz (launcher, worker,
#                               #   cuda.test, nccl.test: -tags cuda, stripped),
#                               #   linked against stand-ins of libcuda.so.1,
#                               #   libcublas.so.N and libcublasLt.so.N (N: 13,
#                               #   or $MESHRUN_CUBLAS_MAJOR), and MANIFEST
#   deploy/gpu.sh bundle DIR    # DIR/gpu-bundle/: the Go toolchain (go.tar.xz),
#                               #   go mod vendor (vendor.tar.xz), CUDA 11.8
#                               #   headers (cuda.tar.xz), for building there
# There, in the source tree that travelled with gpu-prebuilt/ or gpu-bundle/:
#   deploy/gpu.sh install       # bin/ from gpu-prebuilt/, then check
#   deploy/gpu.sh build         # bin/ built with -tags cuda from gpu-bundle/,
#                               #   linked against this machine's libraries
#   deploy/gpu.sh libs          # the libraries this machine has, as shell lines
#                               #   for eval: LD_LIBRARY_PATH, MESHRUN_NCCL_LIBRARY
#   deploy/gpu.sh check [BIN..] # ldd -r of each binary (bin/* by default) with
#                               #   those settings; fails on a library not found
# And for scripts and tests:
#   deploy/gpu.sh link DIR      # DIR/libcuda.so, libcublas.so, libcublasLt.so
#                               #   linked to the libraries found; prints CGO_LDFLAGS
#   deploy/gpu.sh stubs DIR [N] # stand-in libraries with CUDA N's sonames
#
# The libraries. Each is searched for by its soname: libcuda.so.1 (the
# driver), libcublas.so.N (N the highest in the first directory that has
# one), libcublasLt.so.N (the same N), libnccl.so.2 (loaded at run time by
# collective/nccl, not linked). The first directory that has it wins, in this
# order:
#   1. $MESHRUN_CUDA_LIBS (a directory)
#   2. each directory of $LD_LIBRARY_PATH
#   3. /usr/local/nvidia/lib64 (where container runtimes mount the driver)
#   4. the loader cache (ldconfig -p)
#   5. /usr/local/cuda/lib64 and /usr/local/cuda/targets/*/lib, then the same
#      of each /usr/local/cuda-X.Y, newest first
#   6. PyTorch's wheels: site-packages/nvidia/cuNN/lib (newest first), then
#      site-packages/nvidia/*/lib, in python3's site-packages and then in
#      /opt/torch/.venv/lib/python3*/site-packages
# A binary linked here names the sonames (its NEEDED entries), so the loader
# finds the library by the name it has on the machine; a found file whose
# own SONAME differs from its name is reported.
#
# Why 11.8 headers: gorgonia.org/cu v0.9.6 does not compile against CUDA 12 or
# 13 headers (cuCtxCreate's changed signature, its issue #66). The driver API is
# backward compatible, so the binary compiled against 11.8's declarations
# runs against the machine's own libcuda.so.1 and libcublas / libcublasLt
# (CUDA 12 or 13: the functions meshrun calls keep their signatures).
#
# MESHRUN_GPU_SYSROOT=DIR prefixes the fixed places of steps 3, 5 and 6 (for
# tests: a fake /usr/local and /opt laid out under DIR).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
die() { echo "gpu.sh: $*" >&2; exit 1; }
note() { echo "gpu.sh: $*" >&2; }
sysroot=${MESHRUN_GPU_SYSROOT:-}

# ---------------------------------------------------------------- search

# site_packages: python3's site-packages directories, then PyTorch's venv's.
site_packages() {
  if command -v python3 >/dev/null 2>&1; then
    python3 -c 'import site
for p in site.getsitepackages() + [site.getusersitepackages()]: print(p)' 2>/dev/null || true
  fi
  ls -d "$sysroot"/opt/torch/.venv/lib/python3*/site-packages 2>/dev/null | sort -V -r || true
}

# search_dirs REGEX: the directories to search for a library whose file name
# matches REGEX (for the loader cache), in order, as "DIR<TAB>WHERE" lines.
search_dirs() {
  local re=$1 d s c
  if [ -n "${MESHRUN_CUDA_LIBS:-}" ]; then printf '%s\tMESHRUN_CUDA_LIBS\n' "$MESHRUN_CUDA_LIBS"; fi
  local IFS=:
  for d in ${LD_LIBRARY_PATH:-}; do
    if [ -n "$d" ]; then printf '%s\tLD_LIBRARY_PATH\n' "$d"; fi
  done
  unset IFS
  printf '%s\t/usr/local/nvidia/lib64\n' "$sysroot/usr/local/nvidia/lib64"
  local ldconfig; ldconfig=$(command -v ldconfig || echo /sbin/ldconfig)
  { "$ldconfig" -p 2>/dev/null || true; } | awk -v re="$re" '$1 ~ re && $2 ~ /64/ {print $NF}' | while IFS= read -r f; do
    printf '%s\tthe loader cache\n' "${f%/*}"
  done
  for c in "$sysroot"/usr/local/cuda $(ls -d "$sysroot"/usr/local/cuda-* 2>/dev/null | sort -V -r || true); do
    for d in "$c"/lib64 "$c"/targets/*/lib; do
      if [ -d "$d" ]; then printf '%s\t%s\n' "$d" "the CUDA toolkit"; fi
    done
  done
  site_packages | while IFS= read -r s; do
    for d in $(ls -d "$s"/nvidia/cu[0-9]*/lib 2>/dev/null | sort -V -r || true) "$s"/nvidia/*/lib; do
      if [ -d "$d" ]; then printf '%s\t%s\n' "$d" "PyTorch's wheels"; fi
    done
  done
}

# match DIR BASE MAJOR: the file DIR/BASE.so.MAJOR, or with MAJOR empty the
# DIR/BASE.so.N of the highest N; nothing when DIR has none.
match() {
  local d=$1 base=$2 major=$3 f n best=-1
  if [ -n "$major" ]; then
    if [ -e "$d/$base.so.$major" ]; then echo "$d/$base.so.$major"; fi
    return 0
  fi
  for f in "$d/$base".so.*; do
    n=${f##*/$base.so.}
    case $n in '' | *[!0-9]*) continue ;; esac
    if [ -e "$f" ] && [ "$n" -gt "$best" ]; then best=$n; fi
  done
  if [ "$best" -ge 0 ]; then echo "$d/$base.so.$best"; fi
}

# find_lib BASE MAJOR: sets FOUND (the file, by its soname) and WHERE (which
# search step found it); returns 1 when no directory has it.
find_lib() {
  local base=$1 major=$2 re d where f seen=:
  re="^${base}[.]so[.]${major:-[0-9]+}\$"
  FOUND= WHERE=
  while IFS=$'\t' read -r d where; do
    case $seen in *":$d:"*) continue ;; esac
    seen="$seen$d:"
    f=$(match "$d" "$base" "$major")
    if [ -n "$f" ]; then FOUND=$f WHERE=$where; return 0; fi
  done < <(search_dirs "$re")
  return 1
}

# soname FILE: the SONAME recorded in FILE ("?" when no tool can read it).
soname() {
  if command -v readelf >/dev/null; then
    readelf -d "$1" 2>/dev/null | sed -n 's/.*(SONAME).*\[\(.*\)\].*/\1/p'
  elif command -v objdump >/dev/null; then
    objdump -p "$1" 2>/dev/null | awk '$1 == "SONAME" {print $2}'
  else
    echo "?"
  fi
}

# find_all: the four libraries, into LIB_cuda, LIB_cublas, LIB_cublasLt,
# LIB_nccl (empty when not found) and their WHERE_*; a found file whose SONAME
# is not its name is reported on stderr.
find_all() {
  local k base major s
  LIB_cuda= LIB_cublas= LIB_cublasLt= LIB_nccl=
  for k in cuda cublas cublasLt nccl; do
    case $k in
      cuda) base=libcuda major=1 ;;
      cublas) base=libcublas major= ;;
      cublasLt) base=libcublasLt major=${LIB_cublas##*.so.} ;;
      nccl) base=libnccl major=2 ;;
    esac
    if [ "$k" = cublasLt ] && [ -z "$LIB_cublas" ]; then continue; fi
    if find_lib "$base" "$major"; then
      printf -v "LIB_$k" '%s' "$FOUND"
      printf -v "WHERE_$k" '%s' "$WHERE"
      s=$(soname "$FOUND")
      if [ "$s" != "${FOUND##*/}" ] && [ "$s" != "?" ]; then
        note "warning: $FOUND has SONAME '${s:-none}', not ${FOUND##*/}: binaries linked to it need '${s:-${base#lib}.so}'"
      fi
    fi
  done
}

# need_linked: dies unless libcuda, libcublas and libcublasLt were found.
need_linked() {
  [ -n "$LIB_cuda" ] || die "libcuda.so.1 (the NVIDIA driver) not found (MESHRUN_CUDA_LIBS, LD_LIBRARY_PATH, /usr/local/nvidia/lib64, ldconfig -p)"
  [ -n "$LIB_cublas" ] || die "libcublas.so.N not found (the CUDA toolkit or PyTorch's nvidia-* wheels; or set MESHRUN_CUDA_LIBS)"
  [ -n "$LIB_cublasLt" ] || die "libcublasLt.so.${LIB_cublas##*.so.} (the version of ${LIB_cublas##*/}) not found"
}

# lib_dirs: the directories of the libraries found, each once, in the order
# cuda, cublas, cublasLt, nccl.
lib_dirs() {
  local f out=:
  for f in "$LIB_cuda" "$LIB_cublas" "$LIB_cublasLt" "$LIB_nccl"; do
    [ -n "$f" ] || continue
    case $out in *":${f%/*}:"*) ;; *) out="$out${f%/*}:" ;; esac
  done
  out=${out#:}
  echo "${out%:}"
}

libs() {
  find_all
  local k f
  echo "# deploy/gpu.sh libs: the CUDA libraries of this machine (eval this output)"
  for k in cuda cublas cublasLt nccl; do
    f=LIB_$k
    f=${!f}
    if [ -n "$f" ]; then
      local w=WHERE_$k
      printf '# %-18s %s (%s)\n' "${f##*/}" "$f" "${!w}"
    else
      case $k in
        cuda) printf '# %-18s not found\n' libcuda.so.1 ;;
        cublas) printf '# %-18s not found\n' libcublas.so.N ;;
        cublasLt) printf '# %-18s not found\n' "libcublasLt.so.${LIB_cublas:+${LIB_cublas##*.so.}}${LIB_cublas:-N}" ;;
        nccl) printf '# %-18s not found: device collectives are staged through the host\n' libnccl.so.2 ;;
      esac
    fi
  done
  local dirs; dirs=$(lib_dirs)
  if [ -n "$dirs" ]; then
    printf 'export LD_LIBRARY_PATH=%q"${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"\n' "$dirs"
  fi
  if [ -n "$LIB_nccl" ]; then printf 'export MESHRUN_NCCL_LIBRARY=%q\n' "$LIB_nccl"; fi
  [ -n "$LIB_cuda" ] && [ -n "$LIB_cublas" ] && [ -n "$LIB_cublasLt" ]
}

# link_dir DIR: DIR/libcuda.so, libcublas.so and libcublasLt.so point at the
# libraries found, for -lcuda -lcublas -lcublasLt; sets LDFLAGS: -L DIR and
# an rpath to each library's own directory. The linker records each
# library's SONAME, not the link's name.
link_dir() {
  local dir=$1 k f
  find_all
  need_linked
  mkdir -p "$dir"
  for k in cuda cublas cublasLt; do
    f=LIB_$k
    f=${!f}
    ln -sfn "$f" "$dir/lib$k.so"
    local w=WHERE_$k
    note "lib$k.so -> $f ($(soname "$f"), from ${!w})"
  done
  LDFLAGS="-L$dir -Wl,-rpath,$(lib_dirs)"
}

# check [BIN...]: ldd -r of each binary with the settings libs prints; fails
# when a library is not found. Functions a library lacks are listed: the
# binaries bind functions when first called, so they start, and fail if
# they call one.
check() {
  local b bad=0 out
  if [ $# -eq 0 ]; then set -- "$root"/bin/launcher "$root"/bin/worker "$root"/bin/cuda.test "$root"/bin/nccl.test; fi
  eval "$(libs || true)"
  for b in "$@"; do
    [ -e "$b" ] || { note "$b: missing"; bad=1; continue; }
    echo "== ldd $b"
    out=$(ldd -r "$b" 2>&1 || true)
    grep -v '^undefined symbol' <<<"$out" || true
    if grep -q 'not found' <<<"$out"; then
      note "$b: $(grep 'not found' <<<"$out" | awk '{print $1}' | tr '\n' ' ')not found"
      bad=1
    fi
    local n; n=$(grep -c '^undefined symbol' <<<"$out" || true)
    if [ "$n" -gt 0 ]; then
      note "$b: $n functions the libraries lack (fatal only if called):"
      grep '^undefined symbol' <<<"$out" | sed 's/^undefined symbol: /  /; s/\t.*//' | head -n 40 >&2
    fi
  done
  return $bad
}

# ---------------------------------------------------------------- here

# headers: fetch CUDA 11.8's headers and link stubs (Debian's nvidia-cuda-dev,
# as CI does); sets INC and DEBSTUBS.
headers() {
  local out
  out=$("$root/.ci/checks.d/cuda.sh" --fetch) || die "fetching CUDA 11.8 headers (.ci/checks.d/cuda.sh --fetch) failed"
  INC=$(sed -n 's/^include=//p' <<<"$out")
  DEBSTUBS=$(sed -n 's/^stubs=//p' <<<"$out")
  [ -f "$INC/cuda.h" ] && [ -d "$DEBSTUBS" ] || die "cuda.sh --fetch gave no headers or stubs: $out"
}

# stubs DIR [N]: stand-ins for libcuda.so.1, libcublas.so.N and
# libcublasLt.so.N (N default 13) to link against: every function of
# Debian's CUDA 11.8 link stubs, unversioned (the binaries' references then
# bind to whatever version the machine's library defines), with the soname
# of the machine's library; plus the unversioned names for -l.
stubs() {
  local dir=${1:?usage: gpu.sh stubs DIR [N]} major=${2:-${MESHRUN_CUBLAS_MAJOR:-13}} l so src
  [ -n "${DEBSTUBS:-}" ] || headers
  command -v gcc >/dev/null || die "gcc is needed to make the link stubs"
  mkdir -p "$dir"
  for l in cuda cublas cublasLt; do
    case $l in cuda) so=libcuda.so.1 ;; *) so=lib$l.so.$major ;; esac
    [ -f "$DEBSTUBS/lib$l.so" ] || die "$DEBSTUBS/lib$l.so: no such stub"
    src="$dir/lib$l.c"
    nm -D --defined-only "$DEBSTUBS/lib$l.so" | awk '$2 == "T" || $2 == "W" {sub(/@.*/, "", $3); print "void " $3 "(void) {}"}' >"$src"
    [ -s "$src" ] || die "no functions in $DEBSTUBS/lib$l.so"
    gcc -w -shared -fPIC -Wl,-soname,"$so" -o "$dir/$so" "$src"
    ln -sfn "$so" "$dir/lib$l.so"
    rm -f "$src"
  done
  note "stubs in $dir: libcuda.so.1 libcublas.so.$major libcublasLt.so.$major"
}

prebuild() {
  local out="${1:?usage: gpu.sh prebuild DIR}/gpu-prebuilt"
  command -v go >/dev/null || die "prebuild needs the Go toolchain"
  headers
  local work="$root/.cache/gpu-prebuild" major=${MESHRUN_CUBLAS_MAJOR:-13}
  rm -rf "$work" && mkdir -p "$work/bin" "$out"
  stubs "$work/stubs" "$major"
  # No rpath to this machine's stubs: at run time the loader finds the real
  # libraries in these places, or through LD_LIBRARY_PATH (gpu.sh libs).
  export CGO_ENABLED=1 CGO_CFLAGS="-I$INC" CGO_LDFLAGS="-L$work/stubs -Wl,-rpath,/usr/local/nvidia/lib64:/usr/local/cuda/lib64"
  local flags=(-tags cuda -ldflags=-s\ -w)
  (cd "$root" && go build "${flags[@]}" -o "$work/bin/" ./cmd/launcher ./cmd/worker &&
    go test "${flags[@]}" -c -o "$work/bin/cuda.test" ./kernels/cuda/ &&
    go test "${flags[@]}" -c -o "$work/bin/nccl.test" ./collective/nccl/) || die "go build -tags cuda failed"
  local b
  for b in "$work"/bin/*; do
    echo "== ${b##*/}: $(du -h "$b" | cut -f1), NEEDED: $(readelf -d "$b" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | tr '\n' ' ')"
  done
  rm -f "$out/bin.tar.xz"
  tar -C "$work/bin" -cf - launcher worker cuda.test nccl.test | xz -T0 -6 >"$out/bin.tar.xz.part"
  mv "$out/bin.tar.xz.part" "$out/bin.tar.xz"
  {
    echo "commit $(cd "$root" && git rev-parse HEAD 2>/dev/null || echo unknown)$(cd "$root" && [ -z "$(git status --porcelain --untracked-files=no 2>/dev/null)" ] || echo ' (with uncommitted changes)')"
    echo "go $(go env GOVERSION) $(go env GOOS)/$(go env GOARCH), -tags cuda -ldflags='-s -w'"
    echo "headers CUDA 11.8 (Debian nvidia-cuda-dev); linked against stand-ins of libcuda.so.1 libcublas.so.$major libcublasLt.so.$major"
    echo "rpath /usr/local/nvidia/lib64:/usr/local/cuda/lib64; elsewhere: eval \"\$(deploy/gpu.sh libs)\""
    (cd "$work/bin" && sha256sum launcher worker cuda.test nccl.test)
  } >"$out/MANIFEST"
  echo "gpu.sh: $out: $(du -sh "$out" | cut -f1) ($(du -sh "$work/bin" | cut -f1) unpacked)"
}

bundle() {
  local out="${1:?usage: gpu.sh bundle DIR}/gpu-bundle"
  rm -rf "$out" && mkdir -p "$out"
  local goroot; goroot=$(go env GOROOT)
  echo "gpu.sh: Go toolchain from $goroot"
  tar -C "$(dirname "$goroot")" -cJf "$out/go.tar.xz" \
    --exclude='go/src/cmd' --exclude='go/test' --exclude='*/testdata' --exclude='*_test.go' \
    --exclude='go/pkg/tool/*/api' --exclude='go/doc' --exclude='go/misc' "$(basename "$goroot")"
  (cd "$root" && go mod vendor -o "$out/vendor" && tar -C "$out" -cJf "$out/vendor.tar.xz" vendor && rm -rf "$out/vendor")
  headers
  tar -C "$INC" -cJf "$out/cuda.tar.xz" --transform 's,^\.,cuda,' .
  du -sh "$out"/* | sed 's/^/gpu.sh: /'
}

# ---------------------------------------------------------------- there

install_prebuilt() {
  local p="$root/gpu-prebuilt"
  [ -f "$p/bin.tar.xz" ] || die "no gpu-prebuilt/bin.tar.xz in $root: run gpu.sh prebuild first and carry it here"
  local want have
  want=$(sed -n 's/^commit \([0-9a-f]*\).*/\1/p' "$p/MANIFEST" 2>/dev/null || true)
  have=$(cd "$root" && git rev-parse HEAD 2>/dev/null || true)
  if [ -n "$want" ] && [ -n "$have" ] && [ "$want" != "$have" ]; then
    note "warning: gpu-prebuilt/ was built at commit $want, this tree is at $have"
  fi
  mkdir -p "$root/bin"
  tar -C "$root/bin" -xJf "$p/bin.tar.xz"
  echo "gpu.sh: bin/launcher bin/worker bin/cuda.test bin/nccl.test from gpu-prebuilt/ ($(head -n1 "$p/MANIFEST" 2>/dev/null))"
  check
}

build() {
  local b="$root/gpu-bundle"
  [ -d "$b" ] || die "no gpu-bundle/ in $root: run gpu.sh bundle first and carry it here"
  local work="$root/.cache/gpu-build"
  mkdir -p "$work"
  if [ ! -x "$work/go/bin/go" ]; then tar -C "$work" -xJf "$b/go.tar.xz"; fi
  [ -d "$work/vendor" ] || tar -C "$work" -xJf "$b/vendor.tar.xz"
  [ -d "$work/cuda" ] || tar -C "$work" -xJf "$b/cuda.tar.xz"
  export GOROOT="$work/go" PATH="$work/go/bin:$PATH" GOFLAGS=-mod=vendor GOTOOLCHAIN=local GOPROXY=off
  export GOCACHE="$work/cache"
  [ -e "$root/vendor" ] || ln -s "$work/vendor" "$root/vendor"
  rm -rf "$work/lib"
  link_dir "$work/lib"
  export CGO_ENABLED=1 CGO_CFLAGS="-I$work/cuda" CGO_LDFLAGS="$LDFLAGS"
  note "CGO_LDFLAGS=$CGO_LDFLAGS"
  (cd "$root" && go build -tags cuda -o bin/ ./cmd/launcher ./cmd/worker)
  (cd "$root" && go test -tags cuda -c -o bin/cuda.test ./kernels/cuda/ && go test -tags cuda -c -o bin/nccl.test ./collective/nccl/)
  echo "gpu.sh: built bin/launcher bin/worker bin/cuda.test bin/nccl.test (go $(go env GOVERSION), -tags cuda)"
  check
}

case "${1:-}" in
  prebuild) shift; prebuild "$@" ;;
  bundle) shift; bundle "$@" ;;
  install) install_prebuilt ;;
  build) build ;;
  libs) libs ;;
  check) shift; check "$@" ;;
  link)
    shift
    link_dir "${1:?usage: gpu.sh link DIR}"
    echo "CGO_LDFLAGS='$LDFLAGS'"
    ;;
  stubs) shift; stubs "$@" ;;
  *) die "usage: gpu.sh prebuild DIR | bundle DIR | install | build | libs | check [BIN...] | link DIR | stubs DIR [N]" ;;
esac
