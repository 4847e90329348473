#!/usr/bin/env bash
# The whole test suite: vet, unit and integration tests (with -race where it matters),
# and the build checks for tagged code. Run from the repository root.
#
# Every go test run goes through .ci/gotest, which keeps its events; the
# output ends with the tests that skipped, each with its reason, and a skip
# that .ci/skips does not allow fails the suite (.ci/testlog report).
set -euo pipefail
cd "$(dirname "$0")"
export GOFLAGS="${GOFLAGS:-} -buildvcs=false"

MESHRUN_CI_TESTLOG=$(mktemp -d)
export MESHRUN_CI_TESTLOG
finish() {
  local code=$?
  if compgen -G "$MESHRUN_CI_TESTLOG/*.json" >/dev/null; then
    "$MESHRUN_CI_TESTLOG/.testlog" report -allowed .ci/skips "$MESHRUN_CI_TESTLOG" || { [ "$code" != 0 ] || code=1; }
  fi
  rm -rf "$MESHRUN_CI_TESTLOG"
  exit "$code"
}
trap finish EXIT
(cd .ci/testlog && go build -o "$MESHRUN_CI_TESTLOG/.testlog" .)

echo "== go vet"
go vet ./... ./.ci/testlog
echo "== go test"
# One package at a time (-p 1): the fault tests hold heartbeat and
# collective deadlines of a second or so, with hundreds of ranks on 2
# cores; beside another package's tests, a live rank's heartbeats went
# unsent for 1.35 s and its watcher rightly called it lost.
.ci/gotest unit -count=1 -p 1 ./... ./.ci/testlog
# Extra checks (race runs, tagged builds) live in .ci/checks.d, one script each.
for check in .ci/checks.d/*.sh; do
  [ -e "$check" ] || continue
  echo "== $check"
  bash "$check"
done
