#!/usr/bin/env python3
"""The mixture-of-experts layer of docs/moe.md in PyTorch, float32, written the
way Hugging Face's Mixtral sparse MoE block (MixtralSparseMoeBlock) writes it,
timed on the CPU as the baseline for `worker moe` (bench/moe/run.sh).

    /usr/bin/python3 bench/moe/torch_moe_hf.py --tokens 1024 --hidden 1024 --ffn 1024 \\
        --experts 8 --top-k 2 --steps 20 --threads 2
    /usr/bin/python3 bench/moe/torch_moe_hf.py --check

The forward, as Mixtral's block does it:

    router_logits = x R^T                    (a Linear without bias)
    p = softmax(router_logits, dtype=float)  (float32, or wider for float64 inputs)
    weights, experts = topk(p, k); weights /= weights.sum(-1)
    expert_mask = one_hot(experts, E).permute(2, 1, 0)
    for e in range(E):                        (a Python loop over the experts)
        idx, top_x = where(expert_mask[e])    (the tokens routed to e, and which choice)
        out = W2_e gelu_tanh(W1_e x[top_x] + b1_e) + b2_e
        y.index_add_(0, top_x, out * weights[top_x, idx, None])

plus docs/moe.md's load-balancing loss aux = E * sum_e f_e P_e (f_e the share of
the T*k slots routed to e, a constant; P_e the mean of p[:, e] over the tokens).
Each step: the forward, L = sum(dy * y) + aux_coef * aux, and autograd's
backward into x, the router, w1, b1, w2 and b2; the gradients are cleared
between steps (no optimizer: the routing is the same every step). Dropless.

The parameters are stacked as docs/moe.md has them (w1 [E, F, H], ...), not one
nn.Linear per expert as in Mixtral; the loop takes each expert's slices with one
unbind per parameter (--slices unbind, the default), whose backward costs about
what per-expert Linears cost. --slices index takes w1[e] etc. inside the loop
instead, and its backward does E times the gradients' size in extra work (see
SparseMoE.expert_weights): about twice the step at 256 x 512 x 512, E = 8.

torch.topk does not promise which of two equal probabilities it takes first
(docs/moe.md: the lower expert); the inputs are random floats, so ties do not
occur.

Prints one JSON line: step_ms_median (forward + backward, median over the steps
after the warm-up), fwd_ms_median, bwd_ms_median, and the tokens each expert
received.

--check runs this block in float64 on tiny layers (k = 1, 2, 3, and one with an
expert no token reaches) against two other formulations written here from
docs/moe.md: a dense one (every expert on every token, weighted by a [T, E]
gate matrix that is zero off the chosen experts; top-k by a stable sort, ties
to the lower expert) differentiated by autograd, and the hand-written backward
of docs/moe.md's "Backward" section; and the float32 block against the float64
dense one. Prints "ok" when y, aux and the six gradients agree.
"""
import argparse
import json
import math
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class SparseMoE(nn.Module):
    """docs/moe.md's layer, in the shape of Hugging Face's MixtralSparseMoeBlock."""

    def __init__(self, hidden, ffn, experts, top_k, dtype=torch.float32, generator=None, slices="unbind"):
        super().__init__()
        self.num_experts, self.top_k, self.slices = experts, top_k, slices

        def rnd(*shape, fan_in):
            return nn.Parameter(torch.randn(*shape, generator=generator, dtype=dtype) / math.sqrt(fan_in))

        self.router = rnd(experts, hidden, fan_in=hidden)  # gate: Linear(hidden, E, bias=False)
        self.w1 = rnd(experts, ffn, hidden, fan_in=hidden)
        self.b1 = rnd(experts, ffn, fan_in=hidden)
        self.w2 = rnd(experts, hidden, ffn, fan_in=ffn)
        self.b2 = rnd(experts, hidden, fan_in=ffn)

    def expert_weights(self):
        """Each expert's (W1_e, b1_e, W2_e, b2_e), views of the stacked parameters.

        "unbind" takes them with one unbind per parameter: its backward stacks
        the E slices' gradients once. "index" takes W1[e] etc. in the loop, one
        select per expert and parameter: each select's backward writes a whole
        [E, ...] zero tensor with its slice filled in, and autograd adds the E of
        them, E times the gradient's size in extra work (what an [E, F, H]
        parameter indexed in a Python loop costs; Mixtral's nn.Linear per expert
        does not pay it)."""
        params = (self.w1, self.b1, self.w2, self.b2)
        if self.slices == "unbind":
            return list(zip(*(q.unbind(0) for q in params)))
        return [tuple(q[e] for q in params) for e in range(self.num_experts)]

    @staticmethod
    def expert(weights, h):
        w1, b1, w2, b2 = weights
        return F.linear(F.gelu(F.linear(h, w1, b1), approximate="tanh"), w2, b2)

    def forward(self, hidden_states):
        tokens, hidden_dim = hidden_states.shape
        router_logits = F.linear(hidden_states, self.router)
        # Mixtral: softmax in float (float32), whatever the activations' dtype.
        p = F.softmax(router_logits, dim=1, dtype=torch.promote_types(hidden_states.dtype, torch.float32))
        routing_weights, selected_experts = torch.topk(p, self.top_k, dim=-1)
        routing_weights = routing_weights / routing_weights.sum(dim=-1, keepdim=True)
        routing_weights = routing_weights.to(hidden_states.dtype)

        final_hidden_states = torch.zeros(tokens, hidden_dim, dtype=hidden_states.dtype)
        # [E, k, T]: expert_mask[e, j, t] is 1 when token t's j-th choice is e.
        expert_mask = F.one_hot(selected_experts, num_classes=self.num_experts).permute(2, 1, 0)
        tokens_per_expert = []
        experts = self.expert_weights()
        for expert_idx in range(self.num_experts):
            idx, top_x = torch.where(expert_mask[expert_idx])
            tokens_per_expert.append(int(top_x.numel()))
            if top_x.numel() == 0:
                continue
            current_state = hidden_states[None, top_x].reshape(-1, hidden_dim)
            current_hidden_states = self.expert(experts[expert_idx], current_state) * routing_weights[top_x, idx, None]
            final_hidden_states.index_add_(0, top_x, current_hidden_states.to(hidden_states.dtype))

        # docs/moe.md's aux: f_e from the routing (integers: no gradient), P_e from p.
        f = expert_mask.sum(dim=(1, 2)).to(p.dtype) / (tokens * self.top_k)
        aux = self.num_experts * (f * p.mean(dim=0)).sum() if tokens else p.sum() * 0
        return final_hidden_states, aux, tokens_per_expert


def step(model, x, dy, aux_coef):
    """One forward and backward; returns (forward s, backward s, tokens per expert)."""
    t0 = time.perf_counter()
    y, aux, tpe = model(x)
    loss = (dy * y).sum() + aux_coef * aux
    t1 = time.perf_counter()
    loss.backward()
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1, tpe


def bench(a):
    torch.set_num_threads(a.threads)
    torch.set_num_interop_threads(1)
    g = torch.Generator().manual_seed(a.seed)
    model = SparseMoE(a.hidden, a.ffn, a.experts, a.top_k, generator=g, slices=a.slices)
    x = torch.randn(a.tokens, a.hidden, generator=g).requires_grad_(True)
    dy = torch.randn(a.tokens, a.hidden, generator=g) / math.sqrt(a.hidden)
    leaves = [x] + list(model.parameters())
    fwd, bwd = [], []
    for i in range(a.warmup + a.steps):
        for t in leaves:
            t.grad = None
        f, b, tpe = step(model, x, dy, a.aux_coef)
        if i >= a.warmup:
            fwd.append(f * 1e3)
            bwd.append(b * 1e3)
    total = [f + b for f, b in zip(fwd, bwd)]
    print(json.dumps({
        "impl": "torch_hf", "tokens": a.tokens, "hidden": a.hidden, "ffn": a.ffn, "experts": a.experts,
        "top_k": a.top_k, "aux_coef": a.aux_coef, "threads": a.threads, "slices": a.slices, "steps": a.steps, "warmup": a.warmup,
        "step_ms_median": round(statistics.median(total), 3),
        "fwd_ms_median": round(statistics.median(fwd), 3),
        "bwd_ms_median": round(statistics.median(bwd), 3),
        "torch": torch.__version__, "tokens_per_expert": tpe,
    }))


# ---- --check: the same layer, formulated two other ways from docs/moe.md ----

SQRT_2_OVER_PI = 0.7978845608028654


def gelu_tanh(u):
    return 0.5 * u * (1 + torch.tanh(SQRT_2_OVER_PI * (u + 0.044715 * u ** 3)))


def gelu_tanh_grad(u):
    t = torch.tanh(SQRT_2_OVER_PI * (u + 0.044715 * u ** 3))
    return 0.5 * (1 + t) + 0.5 * u * (1 - t * t) * SQRT_2_OVER_PI * (1 + 3 * 0.044715 * u * u)


def routing(p, k):
    """Top-k by a stable sort (ties to the lower expert), gates, f."""
    T, E = p.shape
    choice = torch.sort(-p.detach(), dim=1, stable=True).indices[:, :k]
    f = torch.bincount(choice.reshape(-1), minlength=E).to(p.dtype) / (T * k)
    return choice, f


def dense_forward(x, R, w1, b1, w2, b2, k):
    """Every expert on every token; y = sum_e G[t, e] expert_e(x_t)."""
    T, E = x.shape[0], R.shape[0]
    p = torch.softmax(x @ R.T, dim=1)
    choice, f = routing(p, k)
    chosen = p.gather(1, choice)
    G = torch.zeros(T, E, dtype=x.dtype).scatter(1, choice, chosen / chosen.sum(dim=1, keepdim=True))
    h = torch.einsum("th,efh->tef", x, w1) + b1
    o = torch.einsum("tef,ehf->teh", gelu_tanh(h), w2) + b2
    y = torch.einsum("te,teh->th", G, o)
    aux = E * (f * p.mean(dim=0)).sum()
    return y, aux


def manual_backward(x, R, w1, b1, w2, b2, dy, k, aux_coef):
    """docs/moe.md's "Backward", written out (dropless): dx, dR, dw1, db1, dw2, db2."""
    T, E = x.shape[0], R.shape[0]
    p = torch.softmax(x @ R.T, dim=1)
    choice, f = routing(p, k)
    chosen = p.gather(1, choice)
    s = chosen.sum(dim=1, keepdim=True)
    gates = chosen / s
    dx = torch.zeros_like(x)
    dw1, db1, dw2, db2 = (torch.zeros_like(w) for w in (w1, b1, w2, b2))
    dgate = torch.zeros(T, k, dtype=x.dtype)
    for t in range(T):
        for j in range(k):
            e = int(choice[t, j])
            h = w1[e] @ x[t] + b1[e]
            o = w2[e] @ gelu_tanh(h) + b2[e]
            g = gates[t, j] * dy[t]
            db2[e] += g
            dw2[e] += torch.outer(g, gelu_tanh(h))
            dh = (w2[e].T @ g) * gelu_tanh_grad(h)
            db1[e] += dh
            dw1[e] += torch.outer(dh, x[t])
            dx[t] += w1[e].T @ dh
            dgate[t, j] = dy[t] @ o
    dp = torch.zeros(T, E, dtype=x.dtype)
    dp.scatter_add_(1, choice, (dgate - (dgate * gates).sum(dim=1, keepdim=True)) / s)
    dp += aux_coef * E * f / T
    dlogit = p * (dp - (dp * p).sum(dim=1, keepdim=True))
    dR = dlogit.T @ x
    dx += dlogit @ R
    return dx, dR, dw1, db1, dw2, db2


def check_one(T, H, Fd, E, k, aux_coef, seed, idle=False, slices="unbind"):
    g = torch.Generator().manual_seed(seed)
    m = SparseMoE(H, Fd, E, k, dtype=torch.float64, generator=g, slices=slices)
    x = torch.randn(T, H, generator=g, dtype=torch.float64)
    dy = torch.randn(T, H, generator=g, dtype=torch.float64)
    if idle:
        # No token routes to the last expert: every token has 3 in hidden
        # coordinate 0, which only the last router row reads (with -3).
        with torch.no_grad():
            x[:, 0] = 3
            m.router[:, 0] = 0
            m.router[-1, 0] = -3
    names = ("x", "router", "w1", "b1", "w2", "b2")
    params = [x.requires_grad_(True), m.router, m.w1, m.b1, m.w2, m.b2]

    y, aux, tpe = m(x)
    g_hf = torch.autograd.grad((dy * y).sum() + aux_coef * aux, params)
    if idle:
        assert tpe[-1] == 0, f"the idle expert got {tpe[-1]} tokens"

    yd, auxd = dense_forward(*params, k)
    g_dense = torch.autograd.grad((dy * yd).sum() + aux_coef * auxd, params)
    with torch.no_grad():
        g_manual = manual_backward(*[t.detach() for t in params], dy, k, aux_coef)

    def close(a, b, what, rtol=1e-10):
        a, b = a.detach(), b.detach()
        scale = max(b.abs().max().item(), 1e-30)
        err = (a - b).abs().max().item() / scale
        assert err <= rtol, f"T={T} E={E} k={k} --slices {slices}: {what} differs, max error {err:.2e} of its largest value"

    close(y, yd, "y (Mixtral-style vs dense)")
    close(aux, auxd, "aux (Mixtral-style vs dense)")
    for n, a, b, c in zip(names, g_hf, g_dense, g_manual):
        close(a, b, f"d{n} (Mixtral-style vs dense autograd)")
        close(c, b, f"d{n} (docs/moe.md backward vs dense autograd)")
    if idle:
        for n, a in zip(names[2:], g_hf[2:]):
            assert a[-1].abs().max().item() == 0, f"d{n} of the idle expert is not zero"

    # The timed path is float32: the same block in float32 against the float64 dense one.
    m32 = SparseMoE(H, Fd, E, k, slices=slices)
    with torch.no_grad():
        for q32, q64 in zip(m32.parameters(), m.parameters()):
            q32.copy_(q64)
    x32 = x.detach().float().requires_grad_(True)
    y32, aux32, _ = m32(x32)
    g32 = torch.autograd.grad((dy.float() * y32).sum() + aux_coef * aux32, [x32] + list(m32.parameters()))
    close(y32.double(), yd, "y (float32 vs float64)", rtol=1e-5)
    close(aux32.double(), auxd, "aux (float32 vs float64)", rtol=1e-5)
    for n, a, b in zip(names, g32, g_dense):
        close(a.double(), b, f"d{n} (float32 vs float64)", rtol=1e-4)


def check():
    torch.set_num_threads(1)
    for slices in ("unbind", "index"):
        check_one(T=10, H=6, Fd=5, E=6, k=2, aux_coef=0.3, seed=1, slices=slices)
        check_one(T=14, H=6, Fd=5, E=6, k=2, aux_coef=0.01, seed=2, slices=slices)
        check_one(T=9, H=7, Fd=4, E=4, k=1, aux_coef=0.5, seed=3, slices=slices)
        check_one(T=11, H=5, Fd=6, E=5, k=3, aux_coef=0.2, seed=4, slices=slices)
        check_one(T=12, H=6, Fd=5, E=6, k=2, aux_coef=0.3, seed=5, idle=True, slices=slices)
    print("ok")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--ffn", type=int, default=1024)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--aux-coef", type=float, default=0.01)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--slices", choices=("unbind", "index"), default="unbind",
                    help="how the loop takes each expert's weights from the [E, ...] parameters (see SparseMoE.expert_weights)")
    ap.add_argument("--check", action="store_true", help="compare with docs/moe.md's formulation on tiny layers and exit")
    a = ap.parse_args()
    if a.check:
        check()
        return
    if not 1 <= a.top_k <= a.experts or a.steps < 1 or a.warmup < 0 or a.threads < 1:
        sys.exit("torch_moe_hf.py: want 1 <= --top-k <= --experts, --steps >= 1, --warmup >= 0, --threads >= 1")
    bench(a)


if __name__ == "__main__":
    main()
