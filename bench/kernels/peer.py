#!/usr/bin/env python3
"""OpenBLAS (through numpy) side of bench/kernels/run.sh.

Prints the same tab-separated lines as the Go command:
    impl  threads  case  op  M  K  N  gflops
The thread count comes from OPENBLAS_NUM_THREADS, set by run.sh.
"""
import os
import sys
import time

import numpy as np

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
    min_time = float(sys.argv[2]) if len(sys.argv) > 2 else 0.4
    only = sys.argv[3] if len(sys.argv) > 3 else ""
    threads = os.environ.get("OPENBLAS_NUM_THREADS", "?")
    rng = np.random.default_rng(1)
    for name, m, k, n, linear in CASES:
        if only and only not in f"{name}_{m}_{k}_{n}":
            continue
        flops = 2.0 * m * k * n
        f32 = lambda *s: (rng.random(s, dtype=np.float32) * 2 - 1)
        if not linear:
            a, b, c = f32(m, k), f32(k, n), np.empty((m, n), np.float32)
            ops = [("gemm", lambda: np.matmul(a, b, out=c))]
        else:
            x, w, dy = f32(m, k), f32(n, k), f32(m, n)
            y, dx, dw = np.empty((m, n), np.float32), np.empty((m, k), np.float32), np.empty((n, k), np.float32)
            ops = [
                ("forward", lambda: np.matmul(x, w.T, out=y)),
                ("backward_input", lambda: np.matmul(dy, w, out=dx)),
                ("backward_weight", lambda: np.matmul(dy.T, x, out=dw)),
            ]
        for op, run in ops:
            g = measure(run, flops, min_time)
            print(f"{impl}\t{threads}\t{name}\t{op}\t{m}\t{k}\t{n}\t{g:.1f}", flush=True)


if __name__ == "__main__":
    main()
