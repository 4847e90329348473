#!/usr/bin/env bash
# Mutation check: each bench/mutate/*.patch is a small deliberate bug, and
# the tests named in its header must catch it. For each, the working tree is
# copied to a temporary directory, the patch applied there, and its test
# command run under a time limit: a failing (or timed-out) test is "caught",
# a passing one "SURVIVED". The working tree is never touched.
#
#   bench/mutate/run.sh [NAME ...]     # all, or the named patches (no .patch)
#   bench/mutate/run.sh --check        # only that every patch still applies
#
# A patch's header (before its diff) says what it breaks and what catches it:
#   # why: one line: the bug, and the weakness it stands for
#   # test: go test -count=1 -run 'TestX' ./pkg   (run in the copy's root)
#   # timeout: 300                                (seconds; default 300)
# Make one with: edit the code, `git diff > bench/mutate/NAME.patch`, add
# the header, `git checkout` the code back.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
root=$PWD
check_only=0
if [ "${1:-}" = --check ]; then check_only=1; shift; fi
if [ $# -gt 0 ]; then
  patches=()
  for n in "$@"; do patches+=("bench/mutate/${n%.patch}.patch"); done
else
  patches=(bench/mutate/*.patch)
fi
header() { sed -n "s/^# $1: //p" "$2" | head -n1; }

# tree DIR: a copy of the working tree (tracked and untracked files that git
# does not ignore) in DIR.
tree() {
  git ls-files -co --exclude-standard -z | (cd "$root" && xargs -0 cp --parents -t "$1" 2>/dev/null)
  cp -a "$root/.git" "$1/.git" 2>/dev/null || true # go test -buildvcs reads it
}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
caught=0 survived=0 broken=0
began=$SECONDS
for p in "${patches[@]}"; do
  name=$(basename "$p" .patch)
  [ -f "$p" ] || { echo "$name: no such patch"; broken=$((broken + 1)); continue; }
  if [ "$check_only" = 1 ]; then
    if git apply --check "$p" 2>/dev/null; then echo "$name: applies"; else echo "$name: DOES NOT APPLY"; broken=$((broken + 1)); fi
    continue
  fi
  dir=$work/$name
  mkdir -p "$dir"
  tree "$dir"
  if ! (cd "$dir" && git apply "$root/$p" 2>"$work/$name.apply"); then
    echo "$name: DOES NOT APPLY: $(head -n1 "$work/$name.apply")"
    broken=$((broken + 1)); rm -rf "$dir"; continue
  fi
  cmd=$(header test "$p") limit=$(header timeout "$p")
  t0=$SECONDS
  (cd "$dir" && timeout -k 5 "${limit:-300}" bash -c "$cmd") >"$work/$name.log" 2>&1
  rc=$?
  secs=$((SECONDS - t0))
  if [ "$rc" = 0 ]; then
    echo "$name: SURVIVED ($secs s): $(header why "$p")"
    survived=$((survived + 1))
  else
    what=$(grep -m1 -E -- '--- FAIL|panic:|FAIL|fatal' "$work/$name.log" | sed 's/^[[:space:]]*//' | cut -c1-120)
    [ "$rc" = 124 ] && what="timed out after ${limit:-300} s"
    echo "$name: caught ($secs s): ${what:-exit $rc}"
    caught=$((caught + 1))
  fi
  rm -rf "$dir"
done
total=${#patches[@]}
if [ "$check_only" = 1 ]; then
  echo "mutate: $((total - broken)) of $total patches apply"
else
  echo "mutate: $caught of $total caught, $survived survived, $broken did not apply ($((SECONDS - began)) s)"
fi
[ "$survived" = 0 ] && [ "$broken" = 0 ]
