"""The GPT of `worker gpt` in PyTorch, tensor parallel over gloo in
Megatron's layout: the peer `bench/gpt/run.sh` times meshrun against.

Each of WORLD_SIZE processes (torchrun's env://: RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT) holds its shards: the token embedding and the head
split by vocabulary, the fused QKV and MLP up projections split by output
features (whole heads), the attention and MLP output projections split by
input features. Megatron's conjugate collectives: an all-reduce of the
row-parallel outputs and of the embedding forward, of the column-parallel
inputs' gradients backward; the vocabulary-parallel cross-entropy reduces
the max, the target logit and the sum of exponentials (3 all-reduces).
Batches are random tokens (the step's cost does not depend on the text).
Prints one JSON line on rank 0: the median step time.
"""
import json
import math
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

cfg = json.loads(sys.argv[1])
V, D, H, L, C, B, steps = (cfg[k] for k in ("vocab", "dim", "heads", "layers", "context", "batch", "steps"))
torch.set_num_threads(cfg.get("threads", 1))
dist.init_process_group("gloo")
rank, tp = dist.get_rank(), dist.get_world_size()
hd = D // H
Hl = H // tp
torch.manual_seed(1 + rank)


def split(n, r):
    """Balanced split: the first n % tp ranks hold one more."""
    q, m = divmod(n, tp)
    lo = r * q + min(r, m)
    return lo, lo + q + (1 if r < m else 0)


class Reduce(torch.autograd.Function):  # Megatron's g: all-reduce forward, identity backward
    @staticmethod
    def forward(ctx, x):
        x = x.clone()
        dist.all_reduce(x)
        return x

    @staticmethod
    def backward(ctx, g):
        return g


class Copy(torch.autograd.Function):  # Megatron's f: identity forward, all-reduce backward
    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, g):
        g = g.clone()
        dist.all_reduce(g)
        return g


class VocabCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, target, lo, hi):
        m = logits.max(dim=-1)[0]
        dist.all_reduce(m, op=dist.ReduceOp.MAX)
        z = logits - m.unsqueeze(-1)
        inside = (target >= lo) & (target < hi)
        local = (target - lo).clamp(0, hi - lo - 1)
        picked = z.gather(1, local.unsqueeze(1)).squeeze(1) * inside
        dist.all_reduce(picked)
        e = z.exp()
        s = e.sum(-1)
        dist.all_reduce(s)
        loss = s.log() - picked
        sm = e / s.unsqueeze(-1)
        ctx.save_for_backward(sm, local, inside)
        return loss.mean()

    @staticmethod
    def backward(ctx, g):
        sm, local, inside = ctx.saved_tensors
        grad = sm.clone()
        grad[torch.arange(grad.shape[0]), local] -= inside.float()
        return grad * (g / grad.shape[0]), None, None, None


def P(*shape, std=0.02):
    return torch.nn.Parameter(torch.randn(*shape) * std)


v0, v1 = split(V, rank)
params = {"wte": P(v1 - v0, D), "wpe": P(C, D, std=0.01)}
for i in range(L):
    p = "h.%d." % i
    params.update({
        p + "ln_1.weight": torch.nn.Parameter(torch.ones(D)), p + "ln_1.bias": torch.nn.Parameter(torch.zeros(D)),
        p + "attn.c_attn.weight": P(3 * D // tp, D), p + "attn.c_attn.bias": torch.nn.Parameter(torch.zeros(3 * D // tp)),
        p + "attn.c_proj.weight": P(D, D // tp), p + "attn.c_proj.bias": torch.nn.Parameter(torch.zeros(D)),
        p + "ln_2.weight": torch.nn.Parameter(torch.ones(D)), p + "ln_2.bias": torch.nn.Parameter(torch.zeros(D)),
        p + "mlp.c_fc.weight": P(4 * D // tp, D), p + "mlp.c_fc.bias": torch.nn.Parameter(torch.zeros(4 * D // tp)),
        p + "mlp.c_proj.weight": P(D, 4 * D // tp), p + "mlp.c_proj.bias": torch.nn.Parameter(torch.zeros(D)),
    })
params.update({"ln_f.weight": torch.nn.Parameter(torch.ones(D)), "ln_f.bias": torch.nn.Parameter(torch.zeros(D)),
               "lm_head.weight": P(v1 - v0, D)})
mask = torch.tril(torch.ones(C, C, dtype=torch.bool))
pos = torch.arange(C).repeat(B)


def ln(x, p):
    return F.layer_norm(x, (D,), params[p + ".weight"], params[p + ".bias"], eps=1e-5)


def forward(ids, targets):
    inside = (ids >= v0) & (ids < v1)
    emb = F.embedding((ids - v0).clamp(0, v1 - v0 - 1), params["wte"]) * inside.unsqueeze(-1)
    x = Reduce.apply(emb) + params["wpe"][pos]
    for i in range(L):
        p = "h.%d." % i
        h = Copy.apply(ln(x, p + "ln_1"))
        qkv = F.linear(h, params[p + "attn.c_attn.weight"], params[p + "attn.c_attn.bias"]).view(B, C, Hl, 3, hd)
        q, k, v = (qkv[:, :, :, j, :].transpose(1, 2) for j in range(3))
        att = (q @ k.transpose(-1, -2) / math.sqrt(hd)).masked_fill(~mask, float("-inf")).softmax(-1)
        o = (att @ v).transpose(1, 2).reshape(B * C, Hl * hd)
        x = x + Reduce.apply(F.linear(o, params[p + "attn.c_proj.weight"])) + params[p + "attn.c_proj.bias"]
        h = Copy.apply(ln(x, p + "ln_2"))
        u = F.gelu(F.linear(h, params[p + "mlp.c_fc.weight"], params[p + "mlp.c_fc.bias"]), approximate="tanh")
        x = x + Reduce.apply(F.linear(u, params[p + "mlp.c_proj.weight"])) + params[p + "mlp.c_proj.bias"]
    h = Copy.apply(ln(x, "ln_f"))
    logits = F.linear(h, params["lm_head.weight"])
    return VocabCE.apply(logits, targets, v0, v1)


decay = [w for n, w in params.items() if w.dim() == 2]
rest = [w for n, w in params.items() if w.dim() != 2]
opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                        lr=3e-3, betas=(0.9, 0.95), eps=1e-8)
g = torch.Generator().manual_seed(5)
times = []
for s in range(steps):
    ids = torch.randint(0, V, (B * C,), generator=g)
    targets = torch.randint(0, V, (B * C,), generator=g)
    t0 = time.perf_counter()
    opt.zero_grad()
    loss = forward(ids, targets)
    loss.backward()
    opt.step()
    times.append((time.perf_counter() - t0) * 1e3)
times = sorted(times[2:])
if rank == 0:
    print(json.dumps({"impl": "torch", "tp": tp, "step_ms_median": times[len(times) // 2], "loss_last": loss.item()}))
dist.destroy_process_group()
