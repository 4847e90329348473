#!/usr/bin/env bash
# The GPT of package models against the same model in PyTorch
# (models/testdata/torch_gpt.py, Debian's python3-torch): same initial
# parameters (written by meshrun as .npy), same batches, same AdamW; the
# losses at tp = 1, 2 and 4 within 1e-6 relative for 20 steps, and with
# the gradients clipped and the learning rate warmed up and decayed
# (TestGPTRecipeMatchesPyTorch: clip_grad_norm_'s norms too). And the
# launcher running an ordinary torch.distributed program (gloo, env://) as
# torchrun does (launch TestTorchScript), and its ranks explained: a hang's
# stacks and odd one out, the first exception, launcher stacks on a running
# job (TestPythonHang, TestPythonException, TestStacksRunningJob). The
# mixture-of-experts reference against the same layer in PyTorch, forward and every gradient in float64
# (spmd/spmdref TestMoEMatchesPyTorch, testdata/torch_moe.py), and the
# distributed layer (`worker moe --load --dump` on ep=4, ep=2,tp=2, dp=2,ep=2
# and ep=3) against it (job TestMoEMatchesPyTorch). Installs
# python3-torch when /usr/bin/python3 lacks it, then runs the tests with
# torch required (no skip): the unit run before it may have skipped them.
set -euo pipefail
cd "$(dirname "$0")/../.."
if ! /usr/bin/python3 -c 'import torch, numpy' 2>/dev/null; then
  command -v apt-get >/dev/null || { echo "gpt-torch.sh: python3-torch missing and no apt-get" >&2; exit 1; }
  echo "gpt-torch.sh: installing python3-torch"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq python3-torch python3-numpy >/dev/null
fi
MESHRUN_PYTHON=/usr/bin/python3 MESHRUN_REQUIRE_TORCH=1 .ci/gotest gpt-torch -count=1 -run '^(TestGPTMatchesPyTorch|TestGPTRecipeMatchesPyTorch)$' ./models/
MESHRUN_PYTHON=/usr/bin/python3 MESHRUN_REQUIRE_TORCH=1 .ci/gotest gpt-torch -count=1 -run '^(TestTorchScript|TestPythonHang|TestPythonException|TestStacksRunningJob)$' ./launch/
MESHRUN_PYTHON=/usr/bin/python3 MESHRUN_REQUIRE_TORCH=1 .ci/gotest gpt-torch -count=1 -run '^TestMoEMatchesPyTorch$' ./spmd/spmdref/
MESHRUN_PYTHON=/usr/bin/python3 MESHRUN_REQUIRE_TORCH=1 .ci/gotest gpt-torch -count=1 -run '^TestMoEMatchesPyTorch$' ./job/
