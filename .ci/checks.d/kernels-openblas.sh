#!/usr/bin/env bash
# The openblas kernels provider (build tag openblas, cgo against Debian's
# libopenblas-dev): installs the library if it is missing, then vets and runs the
# conformance suite through a dispatcher.
set -euo pipefail
cd "$(dirname "$0")/../.."
fail() { echo "kernels-openblas.sh: $*" >&2; exit 1; }
if [ ! -e /usr/include/x86_64-linux-gnu/cblas.h ] && [ ! -e /usr/include/cblas.h ]; then
  command -v apt-get >/dev/null || fail "libopenblas-dev is missing and apt-get is not available"
  echo "kernels-openblas.sh: installing libopenblas-dev"
  apt-get update -qq || fail "apt-get update failed"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libopenblas-dev >/dev/null || fail "apt-get install libopenblas-dev failed"
fi
export CGO_ENABLED=1
go vet -tags openblas ./kernels/...
.ci/gotest kernels-openblas -count=1 -tags openblas ./kernels/...
