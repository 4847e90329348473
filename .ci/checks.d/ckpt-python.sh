#!/usr/bin/env bash
# A checkpoint converted by meshrun reads in an independent safetensors reader
# (ckpt/testdata/read_safetensors.py: json and numpy only). Installs Debian's
# python3-numpy when /usr/bin/python3 lacks it, then runs that test with the
# interpreter required (no skip).
set -euo pipefail
cd "$(dirname "$0")/../.."
if ! /usr/bin/python3 -c 'import numpy' 2>/dev/null; then
  command -v apt-get >/dev/null || { echo "ckpt-python.sh: python3-numpy missing and no apt-get" >&2; exit 1; }
  echo "ckpt-python.sh: installing python3-numpy"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-numpy >/dev/null
fi
MESHRUN_PYTHON=/usr/bin/python3 MESHRUN_REQUIRE_PYTHON=1 .ci/gotest ckpt-python -count=1 -run TestConvertReadByPython ./ckpt/
