#!/usr/bin/env python3
"""PyTorch side of bench/gpu/run.sh's GPT rows: `worker gpt`'s model on one GPU.

    torch_gpt.py LAYERS HEADS DIM CONTEXT BATCH VOCAB STEPS DTYPE [PROFILE]

The same GPT as `worker gpt --device cuda` (learned positions, pre-norm
blocks, fused QKV, tanh GELU MLP of 4·DIM, final norm, untied head; AdamW
with decay on matrices, lr 3e-3, betas 0.9/0.95), in eager PyTorch with
scaled_dot_product_attention (causal) and F.cross_entropy. DTYPE float32
(TF32 off) or bfloat16 (autocast: float32 parameters and optimizer, as
meshrun's --dtype bfloat16). A step is zero_grad, forward, backward, the
optimizer step and the loss read back (.item(), as meshrun copies its loss
out), timed by the host clock after that sync. Prints one JSON line:
step_ms_median of the steps after the first two. With PROFILE (a number of
steps), torch.profiler runs that many more steps and prints its kernel table
(CUDA time, the top 30) to stderr.
"""
import json
import sys
import time

import torch
import torch.nn.functional as F

L, H, D, C, B, V, steps = (int(a) for a in sys.argv[1:8])
dtype = sys.argv[8]
profile = int(sys.argv[9]) if len(sys.argv) > 9 else 0
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
dev = torch.device("cuda")
torch.manual_seed(1)


def P(*shape, std=0.02):
    return torch.nn.Parameter(torch.randn(*shape, device=dev) * std)


def ones(n):
    return torch.nn.Parameter(torch.ones(n, device=dev))


def zeros(n):
    return torch.nn.Parameter(torch.zeros(n, device=dev))


params = {"wte": P(V, D), "wpe": P(C, D, std=0.01)}
for i in range(L):
    p = "h.%d." % i
    params.update({
        p + "ln_1.weight": ones(D), p + "ln_1.bias": zeros(D),
        p + "attn.c_attn.weight": P(3 * D, D), p + "attn.c_attn.bias": zeros(3 * D),
        p + "attn.c_proj.weight": P(D, D), p + "attn.c_proj.bias": zeros(D),
        p + "ln_2.weight": ones(D), p + "ln_2.bias": zeros(D),
        p + "mlp.c_fc.weight": P(4 * D, D), p + "mlp.c_fc.bias": zeros(4 * D),
        p + "mlp.c_proj.weight": P(D, 4 * D), p + "mlp.c_proj.bias": zeros(D),
    })
params.update({"ln_f.weight": ones(D), "ln_f.bias": zeros(D), "lm_head.weight": P(V, D)})
hd = D // H


def ln(x, p):
    return F.layer_norm(x, (D,), params[p + ".weight"], params[p + ".bias"], eps=1e-5)


def forward(ids, targets):
    x = F.embedding(ids, params["wte"]) + params["wpe"]
    for i in range(L):
        p = "h.%d." % i
        qkv = F.linear(ln(x, p + "ln_1"), params[p + "attn.c_attn.weight"], params[p + "attn.c_attn.bias"])
        q, k, v = qkv.view(B, C, H, 3, hd).permute(3, 0, 2, 1, 4).unbind(0)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, C, D)
        x = x + F.linear(o, params[p + "attn.c_proj.weight"], params[p + "attn.c_proj.bias"])
        u = F.gelu(F.linear(ln(x, p + "ln_2"), params[p + "mlp.c_fc.weight"], params[p + "mlp.c_fc.bias"]), approximate="tanh")
        x = x + F.linear(u, params[p + "mlp.c_proj.weight"], params[p + "mlp.c_proj.bias"])
    logits = F.linear(ln(x, "ln_f"), params["lm_head.weight"])
    return F.cross_entropy(logits.float().view(B * C, V), targets.view(B * C))


decay = [w for w in params.values() if w.dim() == 2]
rest = [w for w in params.values() if w.dim() != 2]
opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                        lr=3e-3, betas=(0.9, 0.95), eps=1e-8)
g = torch.Generator(device=dev).manual_seed(5)


def step():
    ids = torch.randint(0, V, (B, C), generator=g, device=dev)
    targets = torch.randint(0, V, (B, C), generator=g, device=dev)
    opt.zero_grad(set_to_none=False)
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=dtype == "bfloat16"):
        loss = forward(ids, targets)
    loss.backward()
    opt.step()
    return loss.item()


times = []
for s in range(steps):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    loss = step()
    times.append((time.perf_counter() - t0) * 1e3)
t = sorted(times[2:] or times)
print(json.dumps({"impl": "torch", "dtype": dtype, "layers": L, "heads": H, "dim": D, "context": C, "batch": B, "vocab": V,
                  "step_ms_median": t[len(t) // 2], "loss_last": loss}), flush=True)
if profile:
    from torch.profiler import ProfilerActivity, profile as prof
    with prof(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
        for _ in range(profile):
            step()
        torch.cuda.synchronize()
    print(f"torch profile: {profile} steps, {dtype}", file=sys.stderr)
    print(p.key_averages().table(sort_by="self_cuda_time_total", row_limit=30), file=sys.stderr)
