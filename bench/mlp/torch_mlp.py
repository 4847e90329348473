#!/usr/bin/env python3
"""The Megatron MLP training step of `worker mlp`, written in PyTorch (gloo, CPU).

    python3 bench/mlp/torch_mlp.py --tp 2 --tokens 512 --hidden 1024 --ffn 4096 --steps 20

Starts one process per rank itself (a loopback TCP store, the gloo backend), each
with torch.set_num_threads(cores // tp) unless --threads is given. The step is
the one meshrun's models/mlp.go runs, sharded by hand the Megatron way:

    x[tokens, hidden]           replicated; its gradient is all-reduced backward
    h = x W1_local^T + b1_local  W1[ffn, hidden] split by rows, b1 split
    g = gelu(h, tanh)
    y = allreduce(g W2_local^T) + b2   W2[hidden, ffn] split by columns, b2 replicated
    loss = mean((y - target)^2), autograd backward (dW, db, dx), SGD in place

so it issues one all-reduce forward (y) and one backward (dx), as meshrun does.
With --dtype bfloat16 the step runs under torch.autocast("cpu", bfloat16): the
parameters and SGD stay float32, the linears compute in bf16 (oneDNN), and the
two all-reduces move bf16 tensors (upcast to float32 for gloo only when this
torch's gloo refuses bf16; the report says which).
Rank 0 prints one JSON line: step_ms_median (median over the steps after the
warm-up), gflops = 12 tokens hidden ffn / step time, comm_ms (median time inside
the two all-reduces per step), and which BLAS kernels the process runs.
"""
import argparse
import ctypes
import json
import os
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F


class _CommClock:
    """Seconds spent inside collectives during the current step."""

    seconds = 0.0


class _Wire:
    """Whether gloo all-reduced bf16 tensors as they are (set on first use)."""

    bf16_native = None


def _all_reduce(t):
    start = time.perf_counter()
    if t.dtype == torch.bfloat16 and _Wire.bf16_native is not False:
        try:
            dist.all_reduce(t)
            _Wire.bf16_native = True
        except RuntimeError:
            _Wire.bf16_native = False
    if t.dtype == torch.bfloat16 and _Wire.bf16_native is False:
        f = t.float()
        dist.all_reduce(f)
        t.copy_(f)
    elif t.dtype != torch.bfloat16:
        dist.all_reduce(t)
    _CommClock.seconds += time.perf_counter() - start
    return t


class ReduceFromTP(torch.autograd.Function):
    """Row-parallel output: sum the partial results forward, pass the gradient through."""

    @staticmethod
    def forward(ctx, partial):
        return _all_reduce(partial.clone())

    @staticmethod
    def backward(ctx, grad):
        return grad


class CopyToTP(torch.autograd.Function):
    """Column-parallel input: identity forward, sum the input's gradient backward."""

    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, grad):
        return _all_reduce(grad.clone())


def _openblas():
    """The OpenBLAS libraries loaded in this process (torch reaches it through libblas)."""
    try:
        with open("/proc/self/maps") as f:
            libs = sorted({line.split()[-1] for line in f if "openblas" in line.split()[-1]})
    except OSError:
        libs = []
    for path in libs:
        try:
            lib = ctypes.CDLL(path)
            lib.openblas_get_corename.restype = ctypes.c_char_p
            yield lib
        except (OSError, AttributeError):
            continue


def blas_info():
    """Which OpenBLAS kernels and how many BLAS threads this process runs."""
    for lib in _openblas():
        return lib.openblas_get_corename().decode(), lib.openblas_get_num_threads()
    return "no openblas loaded", 0


def shard(full, dim, rank, tp):
    """Rank's balanced block of full along dim (sizes differ by at most one)."""
    n = full.shape[dim]
    lo = rank * n // tp
    hi = (rank + 1) * n // tp
    return full.narrow(dim, lo, hi - lo).contiguous()


def run(rank, args, port, out):
    torch.set_num_threads(args.threads)
    for lib in _openblas():
        lib.openblas_set_num_threads(args.threads)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=args.tp)
    tp = args.tp
    gen = torch.Generator().manual_seed(args.seed)

    def uniform(*shape, scale):
        return (torch.rand(*shape, generator=gen) * 2 - 1) * scale

    # Whole tensors from the seed on every rank, then each keeps its shard.
    w1 = uniform(args.ffn, args.hidden, scale=args.hidden ** -0.5)
    b1 = uniform(args.ffn, scale=0.1)
    w2 = uniform(args.hidden, args.ffn, scale=args.ffn ** -0.5)
    b2 = uniform(args.hidden, scale=0.1)
    x = uniform(args.tokens, args.hidden, scale=1.0)
    target = uniform(args.tokens, args.hidden, scale=1.0)
    params = [
        shard(w1, 0, rank, tp).requires_grad_(),
        shard(b1, 0, rank, tp).requires_grad_(),
        shard(w2, 1, rank, tp).requires_grad_(),
        b2.clone().requires_grad_(),
    ]
    w1l, b1l, w2l, b2r = params
    x.requires_grad_()
    del w1, w2

    bf16 = args.dtype == "bfloat16"

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            xin = CopyToTP.apply(x) if tp > 1 else x
            h = F.linear(xin, w1l, b1l)
            g = F.gelu(h, approximate="tanh")
            part = F.linear(g, w2l)
            y = (ReduceFromTP.apply(part) if tp > 1 else part) + b2r
            loss = F.mse_loss(y.float(), target)
        loss.backward()
        with torch.no_grad():
            for p in params:
                p.add_(p.grad, alpha=-args.lr)
                p.grad = None
        # x.grad is the block's input gradient (dx), handed to the layer before;
        # there is none here, so it is dropped.
        x.grad = None
        return loss.item()

    times, comm, losses = [], [], []
    dist.barrier()
    for s in range(args.steps):
        _CommClock.seconds = 0.0
        start = time.perf_counter()
        loss = step()
        times.append(time.perf_counter() - start)
        comm.append(_CommClock.seconds)
        losses.append(loss)
    measured = times[args.warmup:] or times
    measured_comm = comm[args.warmup:] or comm
    if rank == 0:
        core, blas_threads = blas_info()
        step_s = statistics.median(measured)
        report = {
            "impl": "pytorch",
            "backend": "gloo",
            "mesh": f"tp={tp}",
            "tokens": args.tokens,
            "hidden": args.hidden,
            "ffn": args.ffn,
            "steps": args.steps,
            "warmup": args.warmup,
            "threads_per_rank": torch.get_num_threads(),
            "loss_first": losses[0],
            "loss_last": losses[-1],
            "step_ms_median": step_s * 1e3,
            "step_ms_min": min(measured) * 1e3,
            "gflops": 12.0 * args.tokens * args.hidden * args.ffn / step_s / 1e9,
            "comm_ms": statistics.median(measured_comm) * 1e3,
            "collectives_per_step": {"all_reduce y": 1, "all_reduce dx": 1} if tp > 1 else {},
            "comm_bytes_per_step": 2 * (2 if bf16 and _Wire.bf16_native else 4) * args.tokens * args.hidden if tp > 1 else 0,
            "dtype": args.dtype,
            "bf16_on_wire": bool(bf16 and _Wire.bf16_native),
            "torch": torch.__version__,
            "blas_core": core,
            "blas_threads": blas_threads,
            "openblas_env": {k: os.environ.get(k) for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")},
        }
        out.put(json.dumps(report))
    dist.barrier()
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--ffn", type=int, default=0, help="default 4 x hidden")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=2, help="steps left out of the median")
    ap.add_argument("--threads", type=int, default=0, help="intra-op threads per rank (default cores / tp)")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    args = ap.parse_args()
    if args.ffn == 0:
        args.ffn = 4 * args.hidden
    if min(args.tp, args.tokens, args.hidden, args.ffn, args.steps) < 1:
        ap.error("--tp, --tokens, --hidden, --ffn and --steps must be positive")
    if args.threads == 0:
        args.threads = max(1, len(os.sched_getaffinity(0)) // args.tp)
    # Each rank's BLAS and OpenMP pools get its share of the cores from the start.
    os.environ["OMP_NUM_THREADS"] = os.environ["OPENBLAS_NUM_THREADS"] = str(args.threads)
    ctx = mp.get_context("spawn")
    out = ctx.SimpleQueue()
    mp.start_processes(run, args=(args, free_port(), out), nprocs=args.tp, join=True, start_method="spawn")
    print(out.get())
    sys.stdout.flush()


if __name__ == "__main__":
    main()
