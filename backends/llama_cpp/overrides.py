"""llama.cpp tensor buffer overrides: the routed experts of a MoE model's first blocks stay in host RAM.

llama_model_params.tensor_buft_overrides is a NULL-terminated array of {pattern, buffer type}: every tensor
whose name matches a pattern (std::regex_search) is allocated in that buffer type instead of where its layer
goes.  llama.cpp's `-ot exps=CPU` and `--n-cpu-moe N` are this, with the CPU buffer type; the plan's
`cpu_expert_layers` (hwprobe.experts) is N: with n_gpu_layers = all, attention, norms, router, shared experts
and KV of every layer are on the GPU and only the matched experts are multiplied by the CPU.

llama-cpp-python 0.3.36 declares the field (as a void pointer) but sets nothing there; this module builds the
array with ctypes (the CPU buffer type comes from ggml's ggml_backend_cpu_buffer_type) and
backends.llama_cpp.loading.model_params puts it into the params llama_model_default_params() returns while the
model loads.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

EXPERT_TENSORS = r"ffn_(up|down|gate)_exps"  # llama.cpp's routed-expert tensors (not the shared *_shexp)


class _Override(ctypes.Structure):
    """struct llama_model_tensor_buft_override { const char * pattern; ggml_backend_buffer_type_t buft; }"""

    _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]


def cpu_expert_pattern(cpu_expert_layers: int) -> str | None:
    """The regex that matches the routed-expert tensors of blocks 0 .. cpu_expert_layers - 1; None for none."""
    if cpu_expert_layers <= 0:
        return None
    layers = "|".join(str(i) for i in range(cpu_expert_layers))
    return rf"blk\.({layers})\.{EXPERT_TENSORS}"


def _cpu_buffer_type() -> int:
    from llama_cpp import _ggml  # lazy: heavy: llama_cpp

    fn = _ggml.libggml.ggml_backend_cpu_buffer_type
    fn.restype, fn.argtypes = ctypes.c_void_p, []
    buft = fn()
    if not buft:
        raise RuntimeError("ggml_backend_cpu_buffer_type() returned NULL")
    return int(buft)


@dataclass
class BuftOverrides:
    """The NULL-terminated array and the pattern bytes it points to; the owner keeps this alive while llama.cpp
    may read it (the model load)."""

    pattern: str
    array: Any  # ctypes array of _Override
    _pattern_bytes: bytes

    @property
    def address(self) -> int:
        return ctypes.addressof(self.array)

    def entries(self) -> list[tuple[str | None, int | None]]:
        """(pattern, buffer type address) of every entry, the NULL terminator included (for tests)."""
        return [(e.pattern.decode() if e.pattern else None, e.buft) for e in self.array]


def cpu_expert_overrides(cpu_expert_layers: int) -> BuftOverrides | None:
    """Overrides that keep the first `cpu_expert_layers` blocks' routed experts in host RAM; None for 0."""
    pattern = cpu_expert_pattern(cpu_expert_layers)
    if pattern is None:
        return None
    raw = pattern.encode()
    array = (_Override * 2)()
    array[0].pattern, array[0].buft = raw, _cpu_buffer_type()
    array[1].pattern, array[1].buft = None, None
    return BuftOverrides(pattern, array, raw)
