"""Gloo peer benchmark for bench/collective: PyTorch's gloo backend over loopback.

Started once per rank by the Go runner with RANK, WORLD_SIZE, MASTER_PORT, OPS,
SIZES set; rank 0 prints one JSON line per (op, size) in the runner's format.
Timing: 1 warm-up call, then 3 repetitions of (barrier, K back-to-back calls),
the best repetition's mean is reported, as the runner does for meshrun and MPI.
"""
import json
import os
import sys
import time

import torch
import torch.distributed as dist


def iters_for(size):
    return max(3, min(200, (32 << 20) // size))


def main():
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    port = os.environ["MASTER_PORT"]
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    for op in os.environ["OPS"].split(","):
        for size in [int(s) for s in os.environ["SIZES"].split(",")]:
            if op == "reduce_scatter":
                continue  # the gloo backend has no reduce-scatter
            if op == "all_reduce":
                buf = torch.ones(size // 4, dtype=torch.float32)
                call = lambda: dist.all_reduce(buf)
            elif op == "all_gather":
                inp = torch.ones(size // 4 // world, dtype=torch.float32)
                outs = [torch.empty_like(inp) for _ in range(world)]
                call = lambda: dist.all_gather(outs, inp)
            else:
                continue
            call()
            k = iters_for(size)
            best = None
            for _ in range(3):
                dist.barrier()
                t0 = time.perf_counter()
                for _ in range(k):
                    call()
                t = (time.perf_counter() - t0) / k
                best = t if best is None else min(best, t)
            if rank == 0:
                print(json.dumps({"impl": "gloo", "op": op, "ranks": world, "bytes": size, "sec": best, "algo": "gloo"}), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
