"""The mixture-of-experts layer of docs/moe.md in PyTorch, for
TestMoEMatchesPyTorch (spmd/spmdref/moe_test.go).

Reads from DIR the inputs meshrun wrote as float64 .npy (x [T, H], router
[E, H], w1 [E, F, H], b1 [E, F], w2 [E, H, F], b2 [E, H], dy [T, H]) and
config.json (T, E, k, aux_coef, capacity: the capacity factor, 0 for
dropless), computes the layer's forward in float64 and, with autograd, the
gradients of sum(dy * y) + aux_coef * aux, and writes into DIR: y, aux [1],
tokens [E] (the slots each expert kept), dropped [1], dx, drouter, dw1, db1,
dw2, db2, all float64 .npy.

The routing is written from the definition, not taken from meshrun: the top-k
by a stable sort of the negated probabilities (ties to the lower expert),
gates the chosen probabilities over their sum, capacity ceil(T*k*c/E) slots
per expert kept in token order, a dropped slot's gate not renormalized, the
counts f_e constants (no gradient).

  /usr/bin/python3 spmd/spmdref/testdata/torch_moe.py DIR
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
T, E, k, aux_coef, c = cfg["T"], cfg["E"], cfg["k"], cfg["aux_coef"], cfg["capacity"]


def load(name):
    return torch.from_numpy(np.load(os.path.join(d, name + ".npy"))).to(torch.float64)


def save(name, t):
    np.save(os.path.join(d, name + ".npy"), t.detach().to(torch.float64).reshape(-1).numpy())


x, router, w1, b1, w2, b2, dy = (load(n) for n in ("x", "router", "w1", "b1", "w2", "b2", "dy"))
params = [x, router, w1, b1, w2, b2]
for t in params:
    t.requires_grad_(True)
assert x.shape[0] == T and router.shape[0] == E

# Logits x·routerᵀ, each as one reduction over H (so that equal router rows
# give exactly equal logits), softmax over the experts.
logits = (x[:, None, :] * router[None, :, :]).sum(-1)
p = torch.softmax(logits, dim=1)
choice = torch.sort(-p.detach(), dim=1, stable=True).indices[:, :k]  # [T, k]
chosen = p.gather(1, choice)
gates = chosen / chosen.sum(dim=1, keepdim=True)

cap = math.ceil(T * k * c / E) if c > 0 else 0
kept = torch.zeros(T, k, dtype=torch.bool)
tokens = [0] * E
dropped = 0
for t in range(T):
    for j in range(k):
        e = int(choice[t, j])
        if cap == 0 or tokens[e] < cap:
            kept[t, j] = True
            tokens[e] += 1
        else:
            dropped += 1

y = torch.zeros(T, x.shape[1], dtype=torch.float64)
for e in range(E):
    t_idx, j_idx = torch.nonzero((choice == e) & kept, as_tuple=True)
    if len(t_idx) == 0:
        continue
    h = x[t_idx] @ w1[e].T + b1[e]
    out = F.gelu(h, approximate="tanh") @ w2[e].T + b2[e]
    y = y.index_add(0, t_idx, gates[t_idx, j_idx][:, None] * out)

routed = torch.bincount(choice.reshape(-1), minlength=E).to(torch.float64)
f = routed / (T * k)  # a count: no gradient
P = p.mean(dim=0)
aux = E * (f * P).sum()

loss = (dy * y).sum() + aux_coef * aux
grads = torch.autograd.grad(loss, params)
save("y", y)
save("aux", aux.reshape(1))
save("tokens", torch.tensor(tokens, dtype=torch.float64))
save("dropped", torch.tensor([dropped], dtype=torch.float64))
for name, g in zip(("dx", "drouter", "dw1", "db1", "dw2", "db2"), grads):
    save(name, g)
