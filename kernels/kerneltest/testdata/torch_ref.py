"""PyTorch's values for the kernels' references, written to torch_ref.json.

The float64 references that meshrun's tests compare against are Go code, and
some of them are also what a provider computes (kernels.Gelu and
kernels.GeluGrad are the cpu provider's float64 GELU). This script pins them
from outside: each op computed by PyTorch (float64, autograd for the
gradients; AdamW by torch.optim.AdamW on float32 parameters), at inputs that
it writes next to the results. The tests that read the file:

  kernels      TestGeluMatchesPyTorch: kernels.Gelu, kernels.GeluGrad
  kerneltest   every provider's GeluForward and GeluBackward, every dtype
               (the GELU inputs are exact in bfloat16)
  kernels/cpu  TestTransformerMatchesPyTorch: layer norm, attention,
               cross-entropy, AdamW
  spmd         TestReferencesMatchPyTorch: spmdtest's gelu and layer norm

Regenerate (Debian's python3-torch and python3-numpy; the output is the same
on every run, so a diff shows a real change):

  /usr/bin/python3 kernels/kerneltest/testdata/torch_ref.py > kernels/kerneltest/testdata/torch_ref.json
"""
import json
import math

import numpy as np
import torch
import torch.nn.functional as F

torch.set_num_threads(1)
f64 = torch.float64


def grad_of(out, inputs, dout):
    """The gradients of sum(out * dout) with respect to inputs."""
    return torch.autograd.grad(out, inputs, grad_outputs=dout)


def flat(t):
    return [float(v) for v in t.detach().reshape(-1).tolist()]


rng = np.random.default_rng(20240611)


def uniform(*shape):
    return torch.tensor(rng.uniform(-1, 1, size=shape), dtype=f64)


# GELU, tanh approximation, as torch.nn.functional.gelu(approximate="tanh").
# Inputs: k/16 over [-8, 8], and a few small and large magnitudes, every one
# exact in bfloat16 (at most 8 significant bits), so that every dtype's
# provider runs at exactly these points.
xs = [k / 16 for k in range(-128, 129)]
for m in (9, 10, 12, 16, 24, 32, 2.0**-6, 2.0**-10, 2.0**-20, 2.0**-40, 0.3125, 1.4375, 2.71875):
    xs += [m, -m]
x = torch.tensor(xs, dtype=f64, requires_grad=True)
y = F.gelu(x, approximate="tanh")
(dydx,) = grad_of(y, [x], torch.ones_like(y))
gelu = {"x": flat(x), "y": flat(y), "dydx": flat(dydx)}

# Layer norm over the last dim (PyTorch's default epsilon), and the gradients
# of sum(y * dy).
eps = 1e-5
rows, d = 4, 7
lx, gamma, beta, ldy = uniform(rows, d), uniform(d), uniform(d), uniform(rows, d)
lx[1] *= 1e-3  # a row whose variance is near epsilon
for t in (lx, gamma, beta):
    t.requires_grad_(True)
ly = F.layer_norm(lx, (d,), gamma, beta, eps=eps)
ldx, lgamma, lbeta = grad_of(ly, [lx, gamma, beta], ldy)
layer_norm = {"eps": eps, "shape": [rows, d], "x": flat(lx), "gamma": flat(gamma), "beta": flat(beta), "dy": flat(ldy),
              "y": flat(ly), "dx": flat(ldx), "dgamma": flat(lgamma), "dbeta": flat(lbeta)}

# Causal attention, meshrun's layout q, k, v, o [B, S, H, E]: softmax(q kᵀ/√E,
# key t > query s masked) v per batch and head, and the gradients of sum(o * do).
B, S, H, E = 2, 5, 2, 4
q, k, v, do = uniform(B, S, H, E), uniform(B, S, H, E), uniform(B, S, H, E), uniform(B, S, H, E)
for t in (q, k, v):
    t.requires_grad_(True)
qh, kh, vh = (t.transpose(1, 2) for t in (q, k, v))  # [B, H, S, E]
att = qh @ kh.transpose(-1, -2) / math.sqrt(E)
mask = torch.tril(torch.ones(S, S, dtype=torch.bool))
o = (att.masked_fill(~mask, float("-inf")).softmax(-1) @ vh).transpose(1, 2)
dq, dk, dv = grad_of(o, [q, k, v], do)
attention = {"shape": [B, S, H, E], "q": flat(q), "k": flat(k), "v": flat(v), "do": flat(do),
             "o": flat(o), "dq": flat(dq), "dk": flat(dk), "dv": flat(dv)}

# Cross-entropy of logits [T, V] against integer targets: each row's loss, and
# the gradient of the mean loss.
T, V = 5, 9
logits = (3 * uniform(T, V)).requires_grad_(True)
targets = torch.tensor(rng.integers(0, V, size=T))
loss = F.cross_entropy(logits, targets, reduction="none")
(dlogits,) = grad_of(loss.mean(), [logits], torch.tensor(1.0, dtype=f64))
cross_entropy = {"rows": T, "vocab": V, "logits": flat(logits), "targets": [int(t) for t in targets],
                 "loss": flat(loss), "dlogits_mean": flat(dlogits)}

# AdamW on float32 parameters (GPT's settings), three steps of given
# gradients; the parameters after each step.
lr, betas, adam_eps, wd = 1e-2, (0.9, 0.95), 1e-8, 0.1
n = 6
p = torch.nn.Parameter(torch.tensor(rng.uniform(-2, 2, size=n), dtype=torch.float32))
p0 = flat(p)
opt = torch.optim.AdamW([p], lr=lr, betas=betas, eps=adam_eps, weight_decay=wd)
grads, after = [], []
for step in range(3):
    g = torch.tensor(rng.uniform(-1, 1, size=n), dtype=torch.float32)
    g[0] = 0  # a parameter with no gradient still decays
    p.grad = g.clone()
    opt.step()
    grads.append(flat(g))
    after.append(flat(p))
adamw = {"lr": lr, "beta1": betas[0], "beta2": betas[1], "eps": adam_eps, "weight_decay": wd,
         "param": p0, "grads": grads, "after": after}

out = {
    "generator": "kernels/kerneltest/testdata/torch_ref.py",
    "torch": torch.__version__,
    "gelu": gelu,
    "layer_norm": layer_norm,
    "attention": attention,
    "cross_entropy": cross_entropy,
    "adamw": adamw,
}
# One line per array: readable, and a regeneration's diff names what moved.
lines = []
for key, val in out.items():
    if isinstance(val, dict):
        fields = ",\n".join("  %s: %s" % (json.dumps(f), json.dumps(v)) for f, v in val.items())
        lines.append(" %s: {\n%s\n }" % (json.dumps(key), fields))
    else:
        lines.append(" %s: %s" % (json.dumps(key), json.dumps(val)))
print("{\n" + ",\n".join(lines) + "\n}")
