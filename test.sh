#!/usr/bin/env bash
# The whole test suite: vet, unit and integration tests (with -race where it matters),
# and the build checks for tagged code. Run from the repository root.
set -euo pipefail
cd "$(dirname "$0")"
export GOFLAGS="${GOFLAGS:-} -buildvcs=false"

echo "== go vet"
go vet ./...
echo "== go test"
go test -count=1 ./...
# Extra checks (race runs, tagged builds) live in .ci/checks.d, one script each.
for check in .ci/checks.d/*.sh; do
  [ -e "$check" ] || continue
  echo "== $check"
  bash "$check"
done
