#!/usr/bin/env bash
# Every deliberate bug in bench/mutate still applies to the code (git apply
# --check), so that the patches do not rot as the code moves on. Running
# them against their tests (bench/mutate/run.sh) takes minutes: not here.
set -euo pipefail
cd "$(dirname "$0")/../.."
bench/mutate/run.sh --check
