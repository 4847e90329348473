#!/usr/bin/env python3
"""PyTorch side of bench/gpu/run.sh: a linear layer on the GPU.

    torch_linear.py [SECONDS]

TORCH_LINEAR_ONLY="DTYPE[,DTYPE] SHAPE[,SHAPE] [OP]" (e.g. "bfloat16
4096x4096x4096 backward") times only those: bench/gpu/run.sh's A/B and
ncu parts.

For each of the seeds' shapes (tokens x in x out) and dtype (float32 with TF32
off, bfloat16), times torch.nn.functional.linear(x, w, b) (forward) and its
autograd backward (dx, dW, db from y.backward(dy)), with CUDA events over
repeated calls, and prints tab-separated lines:

    torch  DTYPE  MxKxN  OP  TFLOP/s

2*M*N*K flops forward, 4*M*N*K backward, as kernels/cuda's BenchmarkLinear.
"""
import os
import sys

import torch
import torch.nn.functional as F

SHAPES = [(1, 4096, 4096), (8, 4096, 4096), (512, 4096, 4096), (2048, 4096, 4096), (4096, 4096, 4096), (8192, 4096, 4096), (4096, 1024, 4096)]


def timed(fn, seconds):
    fn()
    torch.cuda.synchronize()
    n, total = 1, 0.0
    while True:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(n):
            fn()
        end.record()
        torch.cuda.synchronize()
        total = start.elapsed_time(end) / 1e3
        if total >= seconds:
            return total / n
        n *= 2


def main():
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 0.5
    only = os.environ.get("TORCH_LINEAR_ONLY", "").split()
    dtypes = only[0].split(",") if only else None
    shapes = only[1].split(",") if len(only) > 1 else None
    ops = only[2:] or ["forward", "backward"]
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = torch.device("cuda")
    for name, dt in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        if dtypes and name not in dtypes:
            continue
        for m, k, n in SHAPES:
            if shapes and f"{m}x{k}x{n}" not in shapes:
                continue
            x = (torch.rand(m, k, device=dev, dtype=dt) * 2 - 1).requires_grad_()
            w = (torch.rand(n, k, device=dev, dtype=dt) * 2 - 1).requires_grad_()
            b = (torch.rand(n, device=dev, dtype=dt) * 2 - 1).requires_grad_()
            dy = torch.rand(m, n, device=dev, dtype=dt) * 2 - 1
            if "forward" in ops:
                with torch.no_grad():
                    t = timed(lambda: F.linear(x, w, b), seconds)
                print(f"torch\t{name}\t{m}x{k}x{n}\tforward\t{2 * m * n * k / t / 1e12:.3f}", flush=True)
            if "backward" not in ops:
                continue
            y = F.linear(x, w, b)

            def backward():
                x.grad = w.grad = b.grad = None
                torch.autograd.backward(y, dy, retain_graph=True)

            t = timed(backward, seconds)
            print(f"torch\t{name}\t{m}x{k}x{n}\tbackward\t{4 * m * n * k / t / 1e12:.3f}", flush=True)


if __name__ == "__main__":
    main()
