"""Kernel self-check: run each kernel a model will use on this device, on small shapes, against its torch
reference, and time it against the op that would replace it; a kernel that fails to compile, errs beyond the
tolerance or is slower is replaced by that op (per kernel, not all or nothing).

Why: hearth's Triton kernels are tested under the Triton interpreter on CPU and on the GPUs the team had; a
user's GPU, driver and Triton build are new every time (the first GPU run found an FP8 weight path that the
interpreter ran and Triton 3.6 refused to compile).  The engine calls `run_checks` once per device key
(backends/torch_engine/kernel_check.py keeps the record) and `apply` swaps the failing ops out.

What is compared:
- correctness: the kernel against the slow reference (rms_norm_reference, paged_attention_reference, ...) with
  the tolerance the kernel tests use for the dtype (torch.allclose with atol = rtol = TOLERANCES[dtype]);
- speed: the kernel against the plain-torch op of the same contract (the "torch" KernelSet, or
  quant_matmul_torch), which is what replaces it: a Triton kernel slower than SLOW_FACTOR x that op is no gain.
  Shapes are a decode step's (16 tokens at the model's own widths, capped at 2048), timed after a warm-up call
  (the compile) as the mean of several calls with the device synchronised.  Under the interpreter timings are
  recorded but never judged (interpreted Triton is always slower).

Verdicts: "ok" (kept), "wrong" (beyond tolerance or not finite), "failed" (raised: compile error, launch
error), "slow", "unchecked" (the time budget ran out first: kept, checked at the next load).
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import os
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from kernels import quant_matmul as qm
from kernels.attention import allocate_kv_cache, build_attention_metadata, with_sliding_window
from kernels.dispatch import KernelSet

SLOW_FACTOR = 1.5  # a kernel may take up to 1.5x its replacement's time (timing noise on microsecond ops)
SLOW_MARGIN_S = 20e-6  # ... and is slow only when that is also 20 us a call more (a step calls it per layer)
BUDGET_S = 5.0  # the whole check on a first load; kernels not reached are kept and checked next time
TOLERANCES = {torch.float32: 1e-3, torch.float16: 1e-2, torch.bfloat16: 5e-2}  # as tests/kernels use
TOKENS = 16  # rows of the activation-shaped checks: a decode step of 16 sequences
WIDTH_CAP = 2048  # widest hidden / FFN width checked (small shapes: the check costs a few seconds at most)
BLOCK_SIZE = 16


@dataclass(frozen=True)
class CheckShape:
    """What of a model the check needs: its widths, its attention (window), experts and quantized weights."""

    hidden: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    ffn: int
    window: int = 0  # sliding window of some layers (Gemma 3, Mistral), 0 = none
    n_experts: int = 0
    top_k: int = 0
    activation: str = "silu"  # "silu" | "gelu" (Gemma's GeGLU)
    quant_kinds: tuple[str, ...] = ()  # weight formats of the quantized projections: "int8", "int4", "fp8", "q6"


@dataclass(frozen=True)
class KernelVerdict:
    """One kernel's result on one device (kept in the record as a dict: `asdict` / `KernelVerdict(**d)`)."""

    name: str  # "rms_norm", "paged_attention.decode", "quant_matmul.int4", ...
    field: str  # the KernelSet field it decides ("paged_attention"), or "quant_matmul.<kind>"
    verdict: str  # "ok" | "wrong" | "failed" | "slow" | "unchecked"
    max_error: float | None = None  # max |kernel - reference| over the check's outputs
    tolerance: float = 0.0
    kernel_us: float | None = None  # mean time per call, microseconds
    fallback_us: float | None = None  # the replacing torch op's
    detail: str = ""  # the error's first line, or why it is slow / unchecked

    @property
    def kept(self) -> bool:
        return self.verdict in ("ok", "unchecked")

    def line(self) -> str:
        """One line for reasons and logs: "quant_matmul.fp8 replaced by torch: failed (CompilationError ...)"."""
        if self.kept:
            return f"{self.name}: {self.verdict}"
        what = self.detail or (f"max error {self.max_error:.3g} > {self.tolerance:g}" if self.max_error else "")
        return f"{self.name} replaced by the torch op: {self.verdict}" + (f" ({what})" if what else "")


@dataclass
class _Case:
    name: str
    field: str
    kernel: Callable[[], Any]  # the candidate, on fresh inputs each call
    fallback: Callable[[], Any]  # the op that replaces it
    want: Callable[[], Any]  # the reference's output
    same_op: bool = False  # the candidate is the fallback itself: nothing to check
    # False for the paged attention and the KV write: their torch ops read the step's metadata on the host, so
    # replacing them turns CUDA graphs off, which costs more than any slower kernel (gpu_bench on an H200: a
    # 7B decode step 4.9x slower eager than as a graph); their time is recorded, never judged
    speed_matters: bool = True


def plan_checks(
    shape: CheckShape, kernels: KernelSet, fallback: KernelSet, reference: KernelSet, device: Any, dtype: Any
) -> list[_Case]:
    """The checks of every kernel a model of `shape` calls through `kernels`, with inputs on `device`."""
    gen = torch.Generator().manual_seed(0)

    def randn(*size: int, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*size, generator=gen) * scale).to(device=device, dtype=dtype)

    hidden, ffn = min(shape.hidden, WIDTH_CAP), min(shape.ffn, WIDTH_CAP)
    heads, kv_heads, hd = shape.num_heads, shape.num_kv_heads, shape.head_dim
    cases: list[_Case] = []

    def add(name: str, field: str, call: Callable[[KernelSet], Any]) -> None:
        cases.append(
            _Case(
                name,
                field,
                lambda: call(kernels),
                lambda: call(fallback),
                lambda: call(reference),
                same_op=getattr(kernels, field) is getattr(fallback, field),
            )
        )

    x, res, w = randn(TOKENS, hidden), randn(TOKENS, hidden), randn(hidden, scale=0.1) + 1
    add("rms_norm", "rms_norm", lambda k: k.rms_norm(x, w, 1e-6))
    add("add_rms_norm", "add_rms_norm", lambda k: k.add_rms_norm(x.clone(), res.clone(), w, 1e-6))
    q, kk = randn(TOKENS, heads, hd), randn(TOKENS, kv_heads, hd)
    angle = torch.rand(TOKENS, 1, hd // 2, generator=gen) * 6.28
    cos, sin = angle.cos().to(device), angle.sin().to(device)
    add("rope", "rope", lambda k: k.rope(q.clone(), kk.clone(), cos, sin))
    gate_up = randn(TOKENS, 2 * ffn)
    if shape.activation == "gelu":
        add("gelu_tanh_and_mul", "gelu_tanh_and_mul", lambda k: k.gelu_tanh_and_mul(gate_up))
    else:
        add("silu_and_mul", "silu_and_mul", lambda k: k.silu_and_mul(gate_up))
    cases += _attention_cases(shape, kernels, fallback, reference, device, dtype, randn)
    if shape.n_experts and kernels.moe_experts is not None:
        e, top = shape.n_experts, max(1, shape.top_k)
        mh, mf = min(hidden, 512), min(ffn, 512)
        mx, gu, dn = randn(TOKENS, mh), randn(e, 2 * mf, mh, scale=mh**-0.5), randn(e, mh, mf, scale=mf**-0.5)
        ids = torch.stack([torch.randperm(e, generator=gen)[:top] for _ in range(TOKENS)]).to(device)
        wts = torch.softmax(torch.randn(TOKENS, top, generator=gen), -1).to(device)
        add("moe_experts", "moe_experts", lambda k: k.moe_experts(mx, gu, dn, wts, ids))
    for kind in shape.quant_kinds:
        cases.append(_quant_case(kind, hidden, ffn, device, dtype, randn))
    return cases


def _attention_cases(shape, kernels, fallback, reference, device, dtype, randn) -> list[_Case]:  # type: ignore[no-untyped-def]
    """KV write, and paged attention for decode-only steps, mixed steps and (when the model has one) a window."""
    kv_heads, hd = shape.num_kv_heads, shape.head_dim
    rng = random.Random(0)
    # (start, q_len): decodes at awkward lengths; a prefill chunk on a cached prefix beside a decode and a prompt
    steps = {"decode": [(0, 1), (16, 1), (32, 1), (69, 1)], "prefill": [(40, 1), (16, 17), (0, 5)]}
    need = sum(-(-(s + n) // BLOCK_SIZE) for spec in steps.values() for s, n in spec)
    blocks = list(range(need + 2))
    rng.shuffle(blocks)
    k_cache = allocate_kv_cache(need + 2, BLOCK_SIZE, kv_heads, hd, dtype, torch.device(device), False)
    v_cache = allocate_kv_cache(need + 2, BLOCK_SIZE, kv_heads, hd, dtype, torch.device(device), False)
    k_cache.copy_(randn(*k_cache.shape))
    v_cache.copy_(randn(*v_cache.shape))
    metas = {}
    for name, spec in steps.items():
        seqs = [(s, n, tuple(blocks.pop() for _ in range(-(-(s + n) // BLOCK_SIZE)))) for s, n in spec]
        metas[name] = build_attention_metadata(seqs, BLOCK_SIZE, device)
    if shape.window:
        window = max(1, min(shape.window, 24))  # inside the test contexts, so the window masks something
        metas.update({f"window.{n}": with_sliding_window(m, window) for n, m in list(metas.items())})
    scale = hd**-0.5
    cases = []
    for name, meta in metas.items():
        q = randn(meta.slot_mapping.shape[0], shape.num_heads, hd)

        def call(k: KernelSet, q: torch.Tensor = q, meta: Any = meta) -> torch.Tensor:
            return k.paged_attention(q, k_cache, v_cache, meta, scale)

        cases.append(
            _Case(
                f"paged_attention.{name}",
                "paged_attention",
                lambda call=call: call(kernels),
                lambda call=call: call(fallback),
                lambda call=call: call(reference),
                same_op=kernels.paged_attention is fallback.paged_attention,
                speed_matters=False,
            )
        )
    meta = metas["prefill"]
    new_k, new_v = randn(meta.slot_mapping.shape[0], kv_heads, hd), randn(meta.slot_mapping.shape[0], kv_heads, hd)

    def write(k: KernelSet) -> tuple[torch.Tensor, torch.Tensor]:
        kc, vc = k_cache.clone(), v_cache.clone()
        k.write_kv(new_k, new_v, kc, vc, meta.slot_mapping, {})
        return kc, vc

    same = kernels.write_kv is fallback.write_kv
    cases.append(
        _Case(
            "write_kv",
            "write_kv",
            lambda: write(kernels),
            lambda: write(fallback),
            lambda: write(reference),
            same,
            False,
        )
    )
    return cases


def _quant_case(kind: str, hidden: int, ffn: int, device, dtype, randn) -> _Case:  # type: ignore[no-untyped-def]

    if kind == "q6":  # GGUF Q6_K as it is: no quantizer makes it, so random blocks; K whole 256-weight blocks
        hidden = max(256, hidden // 256 * 256)
        qw = _random_q6(ffn, hidden, device)
    else:
        weight = randn(ffn, hidden, scale=hidden**-0.5).float()
        qw = {
            "int8": lambda: qm.quantize_int8(weight, None, dtype),
            "int4": lambda: qm.quantize_int4(weight, 128 if hidden % 128 == 0 else 32, dtype),
            "fp8": lambda: qm.quantize_fp8(weight, dtype),
        }[kind]()
    x = randn(TOKENS, hidden)

    def triton_matmul() -> torch.Tensor:
        from kernels.quant_matmul_triton import quant_matmul_triton  # lazy: heavy: triton

        return quant_matmul_triton(x, qw)

    return _Case(
        f"quant_matmul.{kind}",
        f"quant_matmul.{kind}",
        triton_matmul,
        lambda: qm.quant_matmul_torch(x, qw),
        lambda: qm.quant_matmul_reference(x, qw),
    )


def _random_q6(n: int, k: int, device: Any) -> qm.QuantWeight:
    """A q6 weight of random 6-bit values, sub-scales in 1..15 and d = 1 / (150 sqrt(k)): weights of about 1 / sqrt(k)
    (sc ~ 8, q - 32 ~ 18), so outputs of order one."""
    gen = torch.Generator().manual_seed(6)
    q = torch.randint(0, 64, (n, k), generator=gen)
    sub = torch.randint(1, 16, (n, k // 16), generator=gen).to(torch.int8)
    d = torch.full((n, k // 256), 1 / (150 * k**0.5), dtype=torch.float16)
    w = qm.QuantWeight("q6", qm.pack_int4(q & 15), sub, None, 16, k, n, qm.pack_q6_high(q >> 4), d)
    return w.to(device)


def _flat(out: Any) -> list[torch.Tensor]:
    return [t for t in (out if isinstance(out, (tuple, list)) else (out,)) if isinstance(t, torch.Tensor)]


def _error(got: Any, want: Any, tol: float) -> tuple[float, bool]:
    """(max |got - want|, within tolerance and finite)."""
    worst, ok = 0.0, True
    for g, w in zip(_flat(got), _flat(want), strict=True):
        g, w = g.float(), w.float()
        if g.shape != w.shape:
            return float("inf"), False
        finite = torch.isfinite(w)
        if not torch.equal(torch.isfinite(g), finite):
            return float("inf"), False
        diff = (g - w)[finite].abs()
        worst = max(worst, float(diff.max()) if diff.numel() else 0.0)
        ok = ok and bool(torch.allclose(g[finite], w[finite], atol=tol, rtol=tol))
    return worst, ok


def _mean_s(fn: Callable[[], Any], device: Any, reps: int, rounds: int = 3) -> float:
    """Seconds per call: the best of `rounds` means of `reps` calls (the best, not the average: on a busy
    machine, another process's burst is noise, not the kernel's speed)."""
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
    best = float("inf")
    for _ in range(rounds):
        sync()
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        sync()
        best = min(best, (time.perf_counter() - t0) / reps)
    return best


def interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def run_checks(
    cases: Sequence[_Case],
    device: Any,
    dtype: Any,
    *,
    budget_s: float = BUDGET_S,
    judge_speed: bool | None = None,
    reps: int | None = None,
) -> list[KernelVerdict]:
    """One verdict per case (in order).  judge_speed None: on CUDA outside the interpreter."""
    if judge_speed is None:
        judge_speed = torch.device(device).type == "cuda" and not interpreted()
    reps = reps or (20 if judge_speed else 1)
    tol = TOLERANCES.get(dtype, 1e-2)
    start = time.perf_counter()
    verdicts = []
    for case in cases:
        if case.same_op:
            verdicts.append(KernelVerdict(case.name, case.field, "ok", 0.0, tol, detail="the torch op itself"))
            continue
        if time.perf_counter() - start > budget_s:
            verdicts.append(
                KernelVerdict(
                    case.name, case.field, "unchecked", tolerance=tol, detail=f"over the {budget_s:g} s budget"
                )
            )
            continue
        verdicts.append(_run_one(case, device, tol, judge_speed, reps))
    return verdicts


def _run_one(case: _Case, device: Any, tol: float, judge_speed: bool, reps: int) -> KernelVerdict:
    try:
        got = case.kernel()  # the first call compiles
        if torch.device(device).type == "cuda":
            torch.cuda.synchronize()
    except Exception as exc:  # noqa: BLE001 - any failure of the kernel is the finding
        first = (str(exc).strip().splitlines() or [""])[0]
        return KernelVerdict(
            case.name, case.field, "failed", tolerance=tol, detail=f"{type(exc).__name__}: {first}"[:200]
        )
    err, ok = _error(got, case.want(), tol)
    if not ok:
        return KernelVerdict(case.name, case.field, "wrong", err, tol, detail=f"max error {err:.3g} > {tol:g}")
    kernel_s = _mean_s(case.kernel, device, reps)
    case.fallback()  # its warm-up
    fallback_s = _mean_s(case.fallback, device, reps)
    # slower by the factor and by more than SLOW_MARGIN_S a call: microsecond ops differ by launch overhead
    slower = judge_speed and kernel_s > SLOW_FACTOR * fallback_s and kernel_s - fallback_s > SLOW_MARGIN_S
    slow = slower and case.speed_matters
    note = f"{kernel_s / fallback_s:.2f}x the torch op's time" if slower else ""
    if slower and not slow:
        note += "; kept: CUDA graphs need it"
    return KernelVerdict(
        case.name, case.field, "slow" if slow else "ok", err, tol, kernel_s * 1e6, fallback_s * 1e6, note
    )


def apply(kernels: KernelSet, fallback: KernelSet, verdicts: Sequence[KernelVerdict]) -> KernelSet:
    """`kernels` with every op that some verdict rejects taken from `fallback`; `replaced` names them."""
    bad = {v.field for v in verdicts if not v.kept and hasattr(kernels, v.field)}
    if not bad:
        return kernels
    swaps = {f: getattr(fallback, f) for f in sorted(bad)}
    return dataclasses.replace(kernels, **swaps, replaced=tuple(sorted(set(kernels.replaced) | bad)))


def replaced_quant_kinds(verdicts: Sequence[KernelVerdict]) -> set[str]:
    return {v.field.split(".", 1)[1] for v in verdicts if not v.kept and v.field.startswith("quant_matmul.")}


def table(verdicts: Sequence[KernelVerdict]) -> list[str]:
    """The check as a text table: kernel, max error (tolerance), time vs the torch op, verdict."""
    rows = [f"{'kernel':<30} {'max error':>10} {'tol':>7} {'kernel us':>10} {'torch us':>9} {'ratio':>6}  verdict"]
    for v in verdicts:
        err = "-" if v.max_error is None else f"{v.max_error:.2e}"
        k = "-" if v.kernel_us is None else f"{v.kernel_us:.1f}"
        f = "-" if v.fallback_us is None else f"{v.fallback_us:.1f}"
        ratio = f"{v.kernel_us / v.fallback_us:.2f}" if v.kernel_us and v.fallback_us else "-"
        verdict = v.verdict if v.kept else f"{v.verdict} -> torch"
        note = f"  ({v.detail})" if v.detail else ""
        rows.append(f"{v.name:<30} {err:>10} {v.tolerance:>7g} {k:>10} {f:>9} {ratio:>6}  {verdict}{note}")
    return rows


def device_key(device: Any, dtype: Any, versions: dict[str, str]) -> dict[str, str]:
    """What a check's verdicts hold for: the GPU (name, compute capability), its driver, torch, Triton and the
    caller's versions (hearth's), the compute dtype, and whether Triton was interpreted.  A change of any of
    them checks again."""
    dev = torch.device(device)
    if dev.type == "cuda":
        name = torch.cuda.get_device_name(dev)
        cc = ".".join(map(str, torch.cuda.get_device_capability(dev)))
        driver = _driver_version()
    else:
        name, cc, driver = "cpu", "-", "-"
    try:
        triton_version = importlib.metadata.version("triton")
    except importlib.metadata.PackageNotFoundError:
        triton_version = "-"
    return {
        "device": name,
        "cc": cc,
        "driver": driver,
        "torch": torch.__version__,
        "triton": triton_version,
        **versions,
        "dtype": str(dtype).removeprefix("torch."),
        "interpreter": str(interpreted()),
    }


def _driver_version() -> str:
    """The NVIDIA driver's version (580.159.04) from /proc on Linux, else the CUDA driver API's number."""
    try:
        with open("/proc/driver/nvidia/version") as f:
            for word in f.readline().split():
                if word[:1].isdigit() and "." in word:
                    return word
    except OSError:
        pass
    try:
        return str(torch._C._cuda_getDriverVersion())
    except (AttributeError, RuntimeError):
        return "-"
