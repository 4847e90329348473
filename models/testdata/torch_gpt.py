"""The GPT of package models in PyTorch, for TestGPTMatchesPyTorch.

Reads from DIR the initial parameters meshrun wrote (one NAME.npy each,
meshrun's names and PyTorch's layouts: Linear weights [out, in]; the fused
QKV projection's rows ordered per head as q, k, v, Megatron's order), the
batches (ids.npy and targets.npy: [steps, batch*context]) and config.json,
trains the same model with the same AdamW for the given steps on one CPU
process in float32, and prints the losses as one JSON list.

With "clip_grad" in config.json the gradients are clipped each step
(torch.nn.utils.clip_grad_norm_) and their norms before clipping written to
DIR/norms.json; with "warmup" or "decay_steps" the learning rate of step n
(from 1) is "lr"·n/warmup over the warmup, then a half cosine down to
"min_lr" at step "decay_steps" (Megatron's schedule), set before each step.

Which parameters get weight decay is decided here, as PyTorch's GPT recipes
decide it (nanoGPT's configure_optimizers): every parameter of two or more
dims (the embeddings and the Linear weights), no bias and no layer-norm
parameter. config.json's "decay" lists the parameters meshrun decayed; a
list that differs from this rule fails the run (exit 1, the difference on
stderr) instead of being copied into the optimizer.
"""
import json
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

d = sys.argv[1]
cfg = json.load(open(os.path.join(d, "config.json")))
torch.set_num_threads(1)
torch.manual_seed(0)
V, D, H, L, C, B = (cfg[k] for k in ("vocab", "dim", "heads", "layers", "context", "batch"))
hd = D // H


def load(name):
    return torch.nn.Parameter(torch.from_numpy(np.load(os.path.join(d, name + ".npy"))).float())


P = {n: load(n) for n in cfg["params"]}


def layer_norm(x, p):
    return F.layer_norm(x, (D,), P[p + ".weight"], P[p + ".bias"], eps=1e-5)


def forward(ids, targets):
    pos = torch.arange(C).repeat(B)
    x = P["wte"][ids] + P["wpe"][pos]  # [B*C, D]
    for i in range(L):
        p = "h.%d." % i
        h = layer_norm(x, p + "ln_1")
        qkv = F.linear(h, P[p + "attn.c_attn.weight"], P[p + "attn.c_attn.bias"])
        qkv = qkv.view(B, C, H, 3, hd)
        q, k, v = (qkv[:, :, :, j, :].transpose(1, 2) for j in range(3))  # [B, H, C, hd]
        att = q @ k.transpose(-1, -2) / math.sqrt(hd)
        mask = torch.tril(torch.ones(C, C, dtype=torch.bool))
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        o = (att @ v).transpose(1, 2).reshape(B * C, D)
        x = x + F.linear(o, P[p + "attn.c_proj.weight"], P[p + "attn.c_proj.bias"])
        h = layer_norm(x, p + "ln_2")
        u = F.gelu(F.linear(h, P[p + "mlp.c_fc.weight"], P[p + "mlp.c_fc.bias"]), approximate="tanh")
        x = x + F.linear(u, P[p + "mlp.c_proj.weight"], P[p + "mlp.c_proj.bias"])
    x = layer_norm(x, "ln_f")
    logits = F.linear(x, P["lm_head.weight"])
    return F.cross_entropy(logits, targets)


def fail(msg):
    print("torch_gpt.py: " + msg, file=sys.stderr)
    sys.exit(1)


decayed = sorted(n for n in cfg["params"] if P[n].dim() >= 2)
if sorted(cfg["decay"]) != decayed:
    fail("weight decay: meshrun decays %s besides PyTorch's rule (parameters of 2 or more dims) and misses %s" % (
        sorted(set(cfg["decay"]) - set(decayed)), sorted(set(decayed) - set(cfg["decay"]))))
decay = [P[n] for n in cfg["params"] if n in decayed]
rest = [P[n] for n in cfg["params"] if n not in decayed]
opt = torch.optim.AdamW(
    [{"params": decay, "weight_decay": cfg["weight_decay"]}, {"params": rest, "weight_decay": 0.0}],
    lr=cfg["lr"], betas=(0.9, 0.95), eps=1e-8,
)
ids = torch.from_numpy(np.load(os.path.join(d, "ids.npy"))).long()
targets = torch.from_numpy(np.load(os.path.join(d, "targets.npy"))).long()


def lr_at(n):
    warm, end, top, low = cfg.get("warmup", 0), cfg.get("decay_steps", 0), cfg["lr"], cfg.get("min_lr", 0.0)
    if n <= warm:
        return top * n / warm
    if not end:
        return top
    if n >= end:
        return low
    return low + (top - low) * (1 + math.cos(math.pi * (n - warm) / (end - warm))) / 2


losses, norms = [], []
for s in range(ids.shape[0]):
    opt.zero_grad()
    loss = forward(ids[s], targets[s])
    loss.backward()
    if s == 0:
        unused = [n for n in cfg["params"] if P[n].grad is None]
        if unused:
            fail("parameters the PyTorch model does not use: %s" % unused)
    if "clip_grad" in cfg:
        norms.append(torch.nn.utils.clip_grad_norm_(list(P.values()), cfg["clip_grad"]).item())
    for g in opt.param_groups:
        g["lr"] = lr_at(s + 1)
    opt.step()
    losses.append(loss.item())
if "clip_grad" in cfg:
    json.dump(norms, open(os.path.join(d, "norms.json"), "w"))
print(json.dumps(losses))
