#!/usr/bin/env python3
"""PyTorch bfloat16 side of bench/kernels/run.sh.

    peer_torch.py IMPL THREADS [SECONDS] [ONLY]

Prints the same tab-separated lines as the Go command:
    impl  threads  case  op  M  K  N  gflops
for bfloat16 operands and outputs on the CPU: the square GEMMs as
torch.matmul(a, b, out=c), a linear layer's forward as
torch.nn.functional.linear(x, w, b) (allocating y, as a model does) and its
backward GEMMs as torch.matmul(dy, w, out=dx) and torch.matmul(dy.t(), x,
out=dw), what autograd runs for linear. Threads: torch.set_num_threads.
The first line on stderr says which backend ran (oneDNN for bf16 matmul).
"""
import sys
import time

import torch

CASES = [
    ("gemm1024", 1024, 1024, 1024, False),
    ("gemm2048", 2048, 2048, 2048, False),
    ("linear", 1, 4096, 4096, True),
    ("linear", 8, 4096, 4096, True),
    ("linear", 512, 1024, 4096, True),
    ("linear", 2048, 1024, 4096, True),
    ("linear", 4096, 4096, 1024, True),
]


def measure(run, flops, min_time):
    run()
    best = float("inf")
    start = time.perf_counter()
    n = 0
    while n < 3 or time.perf_counter() - start < min_time:
        t = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - t)
        n += 1
    return flops / best / 1e9


def main():
    impl = sys.argv[1]
    threads = int(sys.argv[2])
    min_time = float(sys.argv[3]) if len(sys.argv) > 3 else 0.4
    only = sys.argv[4] if len(sys.argv) > 4 else ""
    torch.set_num_threads(threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), "
          f"mkldnn available: {torch.backends.mkldnn.is_available()}", file=sys.stderr)
    bf = torch.bfloat16
    gen = torch.Generator().manual_seed(1)

    def rnd(*s):
        return (torch.rand(*s, generator=gen) * 2 - 1).to(bf)

    with torch.no_grad():
        for name, m, k, n, linear in CASES:
            if only and only not in f"{name}_{m}_{k}_{n}":
                continue
            flops = 2.0 * m * k * n
            if not linear:
                a, b, c = rnd(m, k), rnd(k, n), torch.empty(m, n, dtype=bf)
                ops = [("gemm", lambda: torch.matmul(a, b, out=c))]
            else:
                x, w, bias, dy = rnd(m, k), rnd(n, k), rnd(n), rnd(m, n)
                dx, dw = torch.empty(m, k, dtype=bf), torch.empty(n, k, dtype=bf)
                ops = [
                    ("forward", lambda: torch.nn.functional.linear(x, w, bias)),
                    ("backward_input", lambda: torch.matmul(dy, w, out=dx)),
                    ("backward_weight", lambda: torch.matmul(dy.t(), x, out=dw)),
                ]
            for op, run in ops:
                g = measure(run, flops, min_time)
                print(f"{impl}\t{threads}\t{name}\t{op}\t{m}\t{k}\t{n}\t{g:.1f}", flush=True)


if __name__ == "__main__":
    main()
