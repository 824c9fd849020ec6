"""The kernel self-check (kernels/selfcheck.py) with faults injected: a kernel that raises, one that returns wrong
values and one that is slow are each replaced by the torch op, and only they; the real kernels pass.  Under
TRITON_INTERPRET=1 on CPU, on the GPU when there is one."""

from __future__ import annotations

import dataclasses
import time

import pytest
import torch

from kernels import selfcheck
from kernels.dispatch import kernel_set
from tests.kernels.conftest import device, skip_triton_on_cpu_without_interpreter

pytest.importorskip("triton")

SHAPE = selfcheck.CheckShape(hidden=64, num_heads=4, num_kv_heads=2, head_dim=16, ffn=96, window=8)


def _dtype() -> torch.dtype:
    return torch.float32 if device() == "cpu" else torch.bfloat16


def _check(kernels, shape=SHAPE, **kw):  # type: ignore[no-untyped-def]
    skip_triton_on_cpu_without_interpreter(device())
    cases = selfcheck.plan_checks(shape, kernels, kernel_set("torch"), kernel_set("reference"), device(), _dtype())
    return selfcheck.run_checks(cases, device(), _dtype(), budget_s=600, **kw)


def _raises(*args, **kwargs):  # type: ignore[no-untyped-def]
    raise RuntimeError("CompilationError: at 49:16: cannot cast int32 to fp8e4nv (injected)")


def _wrong_rope(q, k, cos, sin):  # type: ignore[no-untyped-def]
    q2, k2 = kernel_set("torch").rope(q, k, cos, sin)
    return q2 + 0.5, k2


def _slow_silu(x):  # type: ignore[no-untyped-def]
    time.sleep(0.02)
    return kernel_set("torch").silu_and_mul(x)


def faulty_triton(base=None):  # type: ignore[no-untyped-def]
    """Triton's set with three broken kernels: RMSNorm raises, RoPE is wrong, SiLU-and-mul is slow."""
    base = base or kernel_set("triton")
    return dataclasses.replace(base, rms_norm=_raises, rope=_wrong_rope, silu_and_mul=_slow_silu)


def test_the_real_kernels_pass_on_this_device() -> None:
    verdicts = _check(kernel_set("triton"), judge_speed=False)
    names = [v.name for v in verdicts]
    assert names[:4] == ["rms_norm", "add_rms_norm", "rope", "silu_and_mul"]
    assert {"paged_attention.decode", "paged_attention.prefill", "paged_attention.window.decode", "write_kv"} <= set(
        names
    )
    assert all(v.verdict == "ok" for v in verdicts), selfcheck.table(verdicts)
    assert all(v.max_error is not None and v.max_error <= v.tolerance for v in verdicts)


def test_faults_are_found_and_only_the_faulty_kernels_are_replaced() -> None:
    triton, torch_set = faulty_triton(), kernel_set("torch")
    # correctness for every kernel (real ones included); speed judged for the slow one alone: under the
    # interpreter every real Triton kernel is slower than torch, which says nothing about the GPU
    verdicts = {v.name: v for v in _check(triton, judge_speed=False)}
    silu = [c for c in _cases(triton) if c.name == "silu_and_mul"]
    verdicts["silu_and_mul"] = selfcheck.run_checks(silu, device(), _dtype(), judge_speed=True, reps=2)[0]
    assert verdicts["rms_norm"].verdict == "failed" and "fp8e4nv" in verdicts["rms_norm"].detail
    assert verdicts["rope"].verdict == "wrong" and verdicts["rope"].max_error == pytest.approx(
        0.5, abs=0.05
    )  # bf16 on a GPU
    assert verdicts["silu_and_mul"].verdict == "slow" and verdicts["silu_and_mul"].kernel_us > 15_000
    kept = {n for n, v in verdicts.items() if v.kept}
    assert kept == set(verdicts) - {"rms_norm", "rope", "silu_and_mul"}
    patched = selfcheck.apply(triton, torch_set, list(verdicts.values()))
    assert patched.rms_norm is torch_set.rms_norm and patched.rope is torch_set.rope
    assert patched.silu_and_mul is torch_set.silu_and_mul
    assert patched.add_rms_norm is triton.add_rms_norm and patched.write_kv is triton.write_kv
    assert patched.paged_attention is triton.paged_attention
    assert set(patched.replaced) == {"rms_norm", "rope", "silu_and_mul"}


def _cases(kernels, shape=SHAPE):  # type: ignore[no-untyped-def]
    return selfcheck.plan_checks(shape, kernels, kernel_set("torch"), kernel_set("reference"), device(), _dtype())


def test_a_quantized_format_that_fails_is_replaced_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    import kernels.quant_matmul_triton as qmt

    real = qmt.quant_matmul_triton

    def int4_broken(x, w, bias=None, **kw):  # type: ignore[no-untyped-def]
        if w.kind == "int4":
            raise RuntimeError("injected: the int4 kernel does not compile here")
        return real(x, w, bias, **kw)

    monkeypatch.setattr(qmt, "quant_matmul_triton", int4_broken)
    shape = dataclasses.replace(SHAPE, hidden=128, ffn=64, quant_kinds=("int8", "int4", "q6"))
    verdicts = {v.name: v for v in _check(kernel_set("triton"), shape, judge_speed=False)}
    assert verdicts["quant_matmul.int8"].verdict == "ok" and verdicts["quant_matmul.q6"].verdict == "ok"
    assert verdicts["quant_matmul.int4"].verdict == "failed"
    assert selfcheck.replaced_quant_kinds(list(verdicts.values())) == {"int4"}


def test_the_budget_keeps_what_it_did_not_reach() -> None:
    skip_triton_on_cpu_without_interpreter(device())
    cases = selfcheck.plan_checks(
        SHAPE, kernel_set("triton"), kernel_set("torch"), kernel_set("reference"), device(), _dtype()
    )
    verdicts = selfcheck.run_checks(cases, device(), _dtype(), budget_s=0.0)
    assert verdicts[0].verdict in ("ok", "unchecked")
    assert all(v.verdict == "unchecked" and v.kept for v in verdicts[1:])
    assert selfcheck.apply(kernel_set("triton"), kernel_set("torch"), verdicts).replaced == ()


def test_the_table_names_kernel_error_time_and_verdict() -> None:
    v = [
        selfcheck.KernelVerdict("rope", "rope", "ok", 1e-6, 1e-3, 12.0, 10.0),
        selfcheck.KernelVerdict("quant_matmul.fp8", "quant_matmul.fp8", "failed", None, 5e-2, detail="boom"),
    ]
    lines = selfcheck.table(v)
    assert lines[0].split() == ["kernel", "max", "error", "tol", "kernel", "us", "torch", "us", "ratio", "verdict"]
    assert lines[1].split()[-2:] == ["1.20", "ok"] and "1.00e-06" in lines[1]
    assert lines[2].endswith("failed -> torch  (boom)")
    assert v[1].line() == "quant_matmul.fp8 replaced by the torch op: failed (boom)"


def test_the_key_names_device_versions_and_dtype() -> None:
    key = selfcheck.device_key(device(), torch.bfloat16, {"hearth": "9.9"})
    assert set(key) == {"device", "cc", "driver", "torch", "triton", "hearth", "dtype", "interpreter"}
    assert key["hearth"] == "9.9" and key["dtype"] == "bfloat16" and key["torch"] == torch.__version__
