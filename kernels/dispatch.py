"""Which implementation of the ops runs: "reference" (slow, obvious torch), "torch" (fast plain torch), and
later "triton".  A model receives one `KernelSet` when it is built and calls only through it.

Choosing: `kernel_set(name)`; name None means the innermost `use_kernels(...)` block, else the HEARTH_KERNELS
environment variable, else "torch".  Tests run a whole engine on the reference path with
`with use_kernels("reference"): ...` (or HEARTH_KERNELS=reference).

Adding an implementation: write a builder returning a KernelSet (start from `dataclasses.replace` of the torch
set to override only the ops you have), and add it to `_BUILDERS`.  Builders import their modules lazily.
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib.util
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

ENV_VAR = "HEARTH_KERNELS"
DEFAULT = "torch"


@dataclass(frozen=True)
class KernelSet:
    """The ops a model calls; signatures are those of the reference functions named in each comment."""

    name: str
    rms_norm: Callable[..., Any]  # rmsnorm.rms_norm_reference(x, weight, eps)
    add_rms_norm: Callable[..., Any]  # rmsnorm.fused_add_rms_norm_reference(x, residual, weight, eps) -> (out, x + r)
    rope: Callable[..., Any]  # rope.rope_reference(q, k, cos, sin) -> (q, k)
    silu_and_mul: Callable[..., Any]  # activation.silu_and_mul_reference(x)
    write_kv: Callable[..., Any]  # attention.write_kv(k, v, k_cache, v_cache, slot_mapping, memo=None)
    paged_attention: Callable[..., Any]  # attention.paged_attention_reference(q, k_cache, v_cache, meta, scale)
    gelu_tanh_and_mul: Callable[..., Any]  # activation.gelu_tanh_and_mul_reference(x) (Gemma's GeGLU)
    # moe.moe_experts_reference(x, gate_up, down, weights, ids) -> (T, H): the routed experts of a MoE layer
    moe_experts: Callable[..., Any] | None = None
    # fields whose kernel the self-check (kernels/selfcheck.py) replaced by the "torch" set's op on this device
    replaced: tuple[str, ...] = ()


def _reference() -> KernelSet:
    from kernels import activation, attention, moe, rmsnorm, rope  # lazy: heavy: torch (~3 s)

    return KernelSet(
        "reference",
        rmsnorm.rms_norm_reference,
        rmsnorm.fused_add_rms_norm_reference,
        rope.rope_reference,
        activation.silu_and_mul_reference,
        attention.write_kv,
        attention.paged_attention_reference,
        activation.gelu_tanh_and_mul_reference,
        moe_experts=moe.moe_experts_reference,
    )


def _torch() -> KernelSet:
    from kernels import activation, attention, moe, rmsnorm, rope  # lazy: heavy: torch (~3 s)

    return KernelSet(
        "torch",
        rmsnorm.rms_norm_torch,
        rmsnorm.fused_add_rms_norm_torch,
        rope.rope_torch,
        activation.silu_and_mul_torch,
        attention.write_kv,
        attention.paged_attention_torch,
        activation.gelu_tanh_and_mul_torch,
        moe_experts=moe.moe_experts_torch,
    )


def _triton() -> KernelSet:
    """Triton kernels (CUDA; on CPU only under TRITON_INTERPRET=1, for tests)."""
    # lazy: heavy: torch (~3 s)
    from kernels.activation import gelu_tanh_and_mul_torch  # no Triton GeGLU: torch's one fused op on CUDA
    from kernels.activation_triton import silu_and_mul_triton  # lazy: heavy: torch (~3 s), triton
    from kernels.attention_triton import paged_attention_triton  # lazy: heavy: torch (~3 s), triton
    from kernels.kv_write_triton import kv_write_triton  # lazy: heavy: torch (~3 s), triton
    from kernels.moe_triton import moe_experts_triton  # lazy: heavy: torch (~3 s), triton
    from kernels.rmsnorm_triton import fused_add_rms_norm_triton, rms_norm_triton  # lazy: heavy: torch (~3 s), triton
    from kernels.rope_triton import rope_triton  # lazy: heavy: torch (~3 s), triton

    return KernelSet(
        "triton",
        rms_norm_triton,
        fused_add_rms_norm_triton,
        rope_triton,
        silu_and_mul_triton,
        kv_write_triton,
        paged_attention_triton,
        gelu_tanh_and_mul_torch,
        moe_experts=moe_experts_triton,
    )


def _default(device: Any = None) -> str:
    """Triton when the model computes on a CUDA GPU (device None: when one is there) and triton is installed,
    else the fast plain-torch path.  A model on the CPU of a machine with a GPU takes the torch path: the Triton
    kernels refuse CPU tensors outside the interpreter (the first GPU run found a CPU runner failing so)."""
    import torch  # lazy: heavy: torch (~3 s)

    on_cuda = torch.cuda.is_available() if device is None else torch.device(device).type == "cuda"
    return "triton" if on_cuda and importlib.util.find_spec("triton") else DEFAULT


_BUILDERS: dict[str, Callable[[], KernelSet]] = {"reference": _reference, "torch": _torch, "triton": _triton}
_override: contextvars.ContextVar[str | None] = contextvars.ContextVar("hearth_kernels", default=None)


def available() -> tuple[str, ...]:
    return tuple(_BUILDERS)


def kernel_set(name: str | None = None, device: Any = None) -> KernelSet:
    """The KernelSet called `name` (see the module docstring for the default, which depends on `device`, the
    device the model computes on); ValueError for an unknown name."""
    chosen = name or _override.get() or os.environ.get(ENV_VAR) or _default(device)
    if chosen not in _BUILDERS:
        raise ValueError(f"unknown kernel implementation {chosen!r}; choose one of {', '.join(_BUILDERS)}")
    return _BUILDERS[chosen]()


@contextlib.contextmanager
def use_kernels(name: str) -> Iterator[None]:
    """Within the block, `kernel_set()` without a name returns `name`'s set."""
    if name not in _BUILDERS:
        raise ValueError(f"unknown kernel implementation {name!r}; choose one of {', '.join(_BUILDERS)}")
    token = _override.set(name)
    try:
        yield
    finally:
        _override.reset(token)
