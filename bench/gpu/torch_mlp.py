#!/usr/bin/env python3
"""PyTorch side of bench/gpu/run.sh's MLP row: the training step of
`worker mlp --device cuda` (one rank) on the GPU.

    torch_mlp.py TOKENS HIDDEN FFN STEPS DTYPE [PROFILE]

h = x W1^T + b1; g = gelu(h, tanh); y = g W2^T + b2; loss = mean((y - t)^2);
autograd backward, the input's gradient too; SGD in place; the loss read back every step (as meshrun
reads its one float64). DTYPE float32 (TF32 off) or bfloat16 (autocast,
float32 parameters). Prints one JSON line with step_ms_median; with
PROFILE (a number of steps), torch.profiler runs that many more steps and
prints its table of kernels by their own CUDA time on stderr.
"""
import json
import statistics
import sys
import time

import torch
import torch.nn.functional as F


def main():
    tokens, hidden, ffn, steps = (int(a) for a in sys.argv[1:5])
    dtype = sys.argv[5] if len(sys.argv) > 5 else "float32"
    torch.backends.cuda.matmul.allow_tf32 = False
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(1)
    w1 = (torch.randn(ffn, hidden, device=dev, generator=g) / hidden**0.5).requires_grad_()
    b1 = torch.zeros(ffn, device=dev, requires_grad=True)
    w2 = (torch.randn(hidden, ffn, device=dev, generator=g) / ffn**0.5).requires_grad_()
    b2 = torch.zeros(hidden, device=dev, requires_grad=True)
    x = torch.randn(tokens, hidden, device=dev, generator=g)
    t = torch.randn(tokens, hidden, device=dev, generator=g)
    # The block's input gradient too, as meshrun's block (which sits inside
    # a network) computes it, and as bench/mlp/torch_mlp.py does.
    x.requires_grad_()
    params = [w1, b1, w2, b2]

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=dtype == "bfloat16"):
            y = F.linear(F.gelu(F.linear(x, w1, b1), approximate="tanh"), w2, b2)
            loss = torch.mean((y.float() - t) ** 2)
        for p in params:
            p.grad = None
        loss.backward()
        with torch.no_grad():
            for p in params:
                p.add_(p.grad, alpha=-0.05)
        return loss.item()

    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        times.append((time.perf_counter() - start) * 1e3)
    warm = times[min(3, len(times) - 1):]
    print(json.dumps({"impl": "torch", "dtype": dtype, "step_ms_median": statistics.median(warm), "torch": torch.__version__}), flush=True)
    profile = int(sys.argv[6]) if len(sys.argv) > 6 else 0
    if profile:
        from torch.profiler import ProfilerActivity, profile as prof
        with prof(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as pr:
            for _ in range(profile):
                step()
            torch.cuda.synchronize()
        print(f"torch profile: {profile} steps, mlp {tokens} {hidden} {ffn}, {dtype}", file=sys.stderr)
        print(pr.key_averages().table(sort_by="self_cuda_time_total", row_limit=25), file=sys.stderr)


if __name__ == "__main__":
    main()
