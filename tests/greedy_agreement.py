"""The one rule for "these two greedy replies agree" and "these two results are the same up to the kernels",
shared by every test that compares runs across batch sizes, prefix-cache hits or backends.

Why not bit equality: the machines are AMD EPYC (Zen 4) and Intel Xeon with AMX, and their bf16 GEMM kernels
block the work differently by row count (AMX kernels are chosen by the number of rows), so a row computed alone
and the same row among 16 can differ by a bf16 rounding.  Nothing in hearth's CPU path can make every GEMM
batch invariant short of computing the whole model in float32 (about 2x slower decode), so the promise is a
stated tolerance, derived from the dtype the model computes in:

Same engine (alone vs batched, prefix-cache hit vs miss): two greedy replies may differ only from a step where,
in the reference run (the request alone, on a cold prefix cache, recorded step by step), the token the reference
chose beat the other by at most NEAR_TIE_ULPS bf16 ulps at the magnitude of that step's top logit.  The logits
are the bf16 head's output, so they live on the bf16 grid: one ulp is 2**(floor(log2|top|) - 7), 0.125 for a
top logit in [16, 32) (the starter's median top logit is ~26).  Measured on the Zen 4 machine (starter model,
21 prompts, 808 positions, the same rows through a different row count): the top-2 gap of a row moved by at most
2 ulps (99th percentile 0); the Xeon with AMX showed a first-token tie of 0.25 (2 ulps).  NEAR_TIE_ULPS = 4 is
twice that.  After the first difference the replies are different contexts and are not compared further.

Across backends (torch engine vs llama.cpp): the arithmetic differs for real (ggml quantizes activations to 8
bits inside its quantized matmuls and keeps an f16 KV cache), so two engines may rank two close tokens
differently.  Where engine A picks token a and engine B picks b, the disagreement is a near-tie when A's lead of
a over b plus B's lead of b over a (`pair_margin`: how far the two engines disagree about that pair) is within
CROSS_TIE, the kernels' known error on the gap between two logits; past it a clear winner differs, which is a
bug.  Measured (Intel Xeon with AMX, 2026-12-07; torch engine vs llama.cpp on tests/data/english.txt, the
reference's top two tokens at every position): the gap error's 99th percentile is 0.32-0.46 logits and its
largest value 0.65-0.77 over 1922 starter positions (float32, bfloat16, bfloat16 with the file's blocks) and 1.27
over 640 Gemma 3 270M positions; the disagreements themselves (4-7 % of positions, where the top two are often
within a logit: the median top-2 gap is 0.8) added up to at most 0.77.  CROSS_TIE = 1.5 is above every gap error
seen at any position; a token one engine prefers by more than that (4.5x the probability) and the other
rejects is a clear winner.  Tiny random models in float32 agree to ~1e-3 of their logit range, so their tests pass
their own, much smaller, tie (twice their logits tolerance: a pair's gap moves by at most twice the error of a
logit).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

NEAR_TIE_ULPS = 4  # bf16 ulps of the top logit (see above)
CROSS_TIE = 1.5  # logits: the two engines' margins over a disputed pair of tokens, added (see above)
BF16_MANTISSA_BITS = 7


def bf16_ulp(x: float) -> float:
    """The spacing of bf16 numbers at |x| (x != 0)."""
    return 2.0 ** (math.floor(math.log2(abs(x))) - BF16_MANTISSA_BITS)


MANTISSA_BITS = {"bfloat16": 7, "float16": 10, "float32": 23}


def assert_same_up_to_rounding(got, want, ulps: float = 1, what: str = "") -> None:
    """Two tensors (..., n) computed by different GEMM blockings (a row alone vs among others): equal up to
    `ulps` roundings of their dtype at each row's largest magnitude.  A GEMM accumulates in float32 and rounds
    its output once, and the blocking a CPU picks by row count changes only the float32 sum's order, so a bf16
    output element moves by at most one rounding, which is what ulps=1 states."""
    import torch

    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, want.shape, got.dtype, want.dtype)
    bits = MANTISSA_BITS[str(want.dtype).removeprefix("torch.")]
    g, w = got.float(), want.float()
    scale = w.abs().amax(dim=-1, keepdim=True).clamp_min(torch.finfo(torch.float32).tiny)
    limit = ulps * torch.exp2(torch.floor(torch.log2(scale)) - bits)
    worst = ((g - w).abs() / limit).max().item()
    assert worst <= 1, f"{what}: differs by {worst * ulps:.2f} {want.dtype} ulps (allowed {ulps})"


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The first index where a and b differ (a length difference counts at the shorter length); None if equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def near_tie_limit(row: np.ndarray, ulps: float = NEAR_TIE_ULPS) -> float:
    """How far apart two logits of `row` may be and still count as a near-tie."""
    return ulps * bf16_ulp(float(np.max(row)))


def assert_greedy_agree(
    reference: Sequence[int],
    reply: Sequence[int],
    reference_rows: Sequence[np.ndarray],
    what: str = "",
    ulps: float = NEAR_TIE_ULPS,
) -> None:
    """`reply` equals the reference run's tokens, or first differs at a step whose reference logits
    (reference_rows[i]: the row the reference sampled token i from) hold a near-tie between the two tokens."""
    i = first_difference(reference, reply)
    if i is None:
        return
    assert i < min(len(reference), len(reply)), (
        f"{what}: one reply is a prefix of the other ({len(reference)} vs {len(reply)} tokens)"
    )
    row = np.asarray(reference_rows[i], dtype=np.float32)
    gap = float(row[reference[i]] - row[reply[i]])
    limit = near_tie_limit(row, ulps)
    print(
        f"{what}: differs at token {i} ({reference[i]} vs {reply[i]}), a near-tie of {gap:.4f} "
        f"(limit {limit:.4f} = {ulps} bf16 ulps at top logit {float(row.max()):.3f})"
    )
    assert 0 <= gap <= limit, (
        f"{what}: tokens differ at {i} ({reference[i]} vs {reply[i]}) but the reference "
        f"chose by {gap:.4f} logits, more than {ulps} bf16 ulps ({limit:.4f}): a real bug"
    )


def assert_text_agrees(
    reference: Sequence[int],
    reference_rows: Sequence[np.ndarray],
    token_bytes: Callable[[Sequence[int]], bytes],
    text: str,
    what: str = "",
    ulps: float = NEAR_TIE_ULPS,
) -> None:
    """The same rule for a reply known only as text (an HTTP reply): equal to the reference's text, or the
    texts part inside reference token k, and the reference's top two logits at step k or k - 1 (a longer
    alternative token parts the texts one token later) are a near-tie."""
    ref_text = token_bytes(list(reference)).decode("utf-8", "replace")
    if text == ref_text:
        return
    c = next((j for j, (x, y) in enumerate(zip(text, ref_text)) if x != y), min(len(text), len(ref_text)))
    k = next(
        j
        for j in range(len(reference) + 1)
        if j == len(reference) or len(token_bytes(list(reference[: j + 1])).decode("utf-8", "replace")) > c
    )
    k = min(k, len(reference) - 1)
    gaps = []
    for j in sorted({max(k - 1, 0), k}):
        top2 = np.sort(np.asarray(reference_rows[j], dtype=np.float32))[-2:]
        gaps.append((float(top2[1] - top2[0]), near_tie_limit(reference_rows[j], ulps), j))
    print(f"{what}: text parts at reference token {k}; top-2 gaps (gap, limit, step): {gaps}")
    assert any(gap <= limit for gap, limit, _ in gaps), (
        f"{what}: the reply parts from the reference at token {k} where the reference's choice was no near-tie "
        f"{gaps}: {text!r} vs {ref_text!r}"
    )


def reference_run(backend, prompt: Sequence[int], max_tokens: int) -> tuple[tuple[int, ...], list[np.ndarray]]:
    """The torch engine's greedy reply to `prompt` alone on a cold prefix cache, with the logits row it sampled
    each token from (recorded at the runner).  The backend must be idle."""
    from backends.api import Request, SamplingParams

    engine = backend._engine
    real = engine.runner
    rid = "greedy-agreement-reference"
    rows: list[np.ndarray] = []

    class Recording:
        def execute(self, out):
            result = real.execute(out)
            for r, row in zip(result.request_ids, result.logits):
                if r == rid:
                    rows.append(row.float().numpy().copy())
            return result

    def install() -> None:
        engine.scheduler.block_manager.reset_prefix_cache()
        engine.runner = Recording()

    backend._call(install)
    try:
        sp = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
        c = backend.generate(Request(prompt_token_ids=tuple(prompt), sampling=sp, request_id=rid))
    finally:
        backend._call(lambda: setattr(engine, "runner", real))
    assert len(rows) == len(c.token_ids)
    return c.token_ids, rows


def pair_margin(row_a: np.ndarray, row_b: np.ndarray, token_a: int, token_b: int) -> float:
    """How far two engines' logits rows disagree about two tokens: engine A's lead of token_a over token_b plus
    engine B's lead of token_b over token_a (each as an absolute value, so the order of the rows is free).  Where
    each engine picked its own token (its argmax), this is exactly the error of the pair's gap between them."""
    return abs(float(row_a[token_a] - row_a[token_b])) + abs(float(row_b[token_b] - row_b[token_a]))


def assert_argmax_agree(ours: np.ndarray, ref: np.ndarray, tie: float = CROSS_TIE, what: str = "") -> int:
    """Two engines' logits for the same positions ((n, vocab) each) pick the same token at every position, or
    differ only at near-ties: pair_margin within `tie`.  Returns how many positions were near-ties."""
    picked_ours, picked_ref = ours.argmax(-1), ref.argmax(-1)
    differ = np.nonzero(picked_ours != picked_ref)[0]
    margins = [(pair_margin(ours[p], ref[p], int(picked_ours[p]), int(picked_ref[p])), int(p)) for p in differ]
    clear = [(round(m, 3), p) for m, p in margins if m > tie]
    worst = max((m for m, _ in margins), default=0.0)
    print(f"{what}: {len(differ)} of {len(ours)} positions pick differently, largest pair margin {worst:.3f}")
    assert not clear, (
        f"{what}: a clear winner differs at {len(clear)} positions (pair margin, position): {clear[:5]}; "
        f"a near-tie is within {tie} logits"
    )
    return len(differ)


def assert_backends_agree(
    a: Sequence[int],
    b: Sequence[int],
    prompt: Sequence[int],
    logits: dict[str, Callable[[list[int]], np.ndarray]],
    tie: float = CROSS_TIE,
) -> None:
    """Two backends' greedy replies are equal, or first differ at a near-tie: the two backends' rows at that
    step (logits: backend name -> ids -> (len(ids), vocab) array, two of them) have a pair_margin over the two
    differing tokens within `tie`."""
    i = first_difference(a, b)
    if i is None:
        return
    assert i < min(len(a), len(b)), f"one reply is a prefix of the other ({len(a)} vs {len(b)} tokens)"
    ctx = list(prompt) + list(a[:i])
    (name_a, fn_a), (name_b, fn_b) = logits.items()
    margin = pair_margin(fn_a(ctx)[-1], fn_b(ctx)[-1], a[i], b[i])
    assert margin <= tie, (
        f"tokens differ at {i} ({a[i]} vs {b[i]}) where {name_a} and {name_b} disagree about them by "
        f"{margin:.3f} logits, more than a near-tie ({tie})"
    )
