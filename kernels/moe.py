"""Mixture-of-experts feed-forward: top-k routing and the grouped expert matmul.

Math, for a step's tokens x (T, H) and E experts of width F:
    p = softmax(x Wr^T)                          (T, E) router probabilities, float32
    (w, e) = top_k(p, k)                         (T, k) each: weights and expert ids, w renormalised to sum 1
                                                 where the architecture does (Mixtral, Qwen3-MoE; Qwen2-MoE's
                                                 norm_topk_prob flag, false in its configs)
    y_t = sum_j w_tj * Wd[e_tj] (silu(Wg[e_tj] x_t) * Wu[e_tj] x_t)
with the gate and up weights of each expert merged as gate_up (E, 2F, H) (models/moe.py), down (E, H, F).

The grouped form (`moe_experts_grouped`): the T*k (token, slot) pairs are sorted by expert (`sort_by_expert`),
so each expert's rows are contiguous, and `grouped_matmul(x_sorted, W, offsets)` multiplies every expert's rows
by its own weight: one matmul per expert in plain torch (`grouped_matmul_torch`), one Triton launch over all
experts on CUDA (kernels/moe_triton.py).  Every expert weight is read once per step however many tokens use it,
which is what makes a batch cheaper than its tokens one by one.  The results go back to pair order and are
summed over the k slots in a fixed order (deterministic; no atomics).

`moe_experts_reference` is the obvious per-token loop the others are tested against.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from kernels.activation import silu_and_mul_torch


def route(router_logits: torch.Tensor, top_k: int, normalize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(T, E) logits -> (weights (T, k) float32, expert ids (T, k) int64): softmax over all experts, then the
    k largest (torch.topk; the order among equal probabilities is unspecified), renormalised to sum 1 when
    `normalize`."""
    probs = torch.softmax(router_logits.float(), dim=-1)
    weights, ids = torch.topk(probs, top_k, dim=-1)
    if normalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids


def moe_experts_reference(
    x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor
) -> torch.Tensor:
    """x (T, H), gate_up (E, 2F, H), down (E, H, F), weights/ids (T, k) -> (T, H) in x's dtype; float32 math,
    token by token, slot by slot."""
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    xf = x.float()
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            gate, up = (gate_up[e].float() @ xf[t]).chunk(2)
            out[t] += weights[t, j].float() * (down[e].float() @ (torch.nn.functional.silu(gate) * up))
    return out.to(x.dtype)


def sort_by_expert(ids: torch.Tensor, n_experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """ids (T, k) -> (order (T*k,) int64: pair indices (t * k + j) sorted by expert, stable; offsets (E + 1,)
    int64: expert e's rows of the sorted pairs are offsets[e]:offsets[e + 1])."""
    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.zeros(n_experts, dtype=torch.int64, device=ids.device)
    counts.index_add_(0, flat, torch.ones_like(flat))  # not bincount: no host sync (CUDA graphs capture this)
    offsets = torch.zeros(n_experts + 1, dtype=torch.int64, device=ids.device)
    offsets[1:] = torch.cumsum(counts, 0)
    return order, offsets


def grouped_matmul_torch(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """x (M, K) rows sorted by expert, w (E, N, K), offsets (E + 1,) -> (M, N): rows offsets[e]:offsets[e+1]
    times w[e]^T.  One matmul per expert that has rows (the offsets are read on the host once)."""
    out = torch.empty(x.shape[0], w.shape[1], dtype=x.dtype, device=x.device)
    bounds = offsets.tolist()
    for e in range(w.shape[0]):
        lo, hi = bounds[e], bounds[e + 1]
        if hi > lo:
            out[lo:hi] = x[lo:hi] @ w[e].t()
    return out


GroupedMatmul = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def moe_experts_grouped(
    x: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    weights: torch.Tensor,
    ids: torch.Tensor,
    grouped_matmul: GroupedMatmul = grouped_matmul_torch,
    silu_and_mul: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """moe_experts_reference's result through two grouped matmuls over expert-sorted rows (module docstring)."""
    n, k = ids.shape
    order, offsets = sort_by_expert(ids, gate_up.shape[0])
    x_sorted = x[order // k]  # (n * k, H): each pair's token, expert by expert
    h = (silu_and_mul or silu_and_mul_torch)(grouped_matmul(x_sorted, gate_up, offsets))  # (n * k, F)
    y_sorted = grouped_matmul(h.contiguous(), down, offsets)  # (n * k, H)
    y = torch.empty_like(y_sorted)
    y[order] = y_sorted  # back to pair order
    return (y.view(n, k, -1).float() * weights.unsqueeze(-1)).sum(dim=1).to(x.dtype)


def moe_experts_torch(
    x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor
) -> torch.Tensor:
    """The plain-torch path: moe_experts_grouped with one matmul per used expert."""
    return moe_experts_grouped(x, gate_up, down, weights, ids)
