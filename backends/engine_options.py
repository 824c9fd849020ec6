"""Per-engine load options, typed and known without importing the engine (so hearth checks them at the command
line, before a runner process starts).

`LoadOptions` (backends/load_options.py) is the plan's decision as the flags and the JSON name it, shared by every
engine; what some values may be depends on the engine: `kv_cache_type` is a ggml type for llama.cpp (f16, q8_0,
q4_0, ...) and a torch dtype name for the torch engine (f16, bf16, fp32), and --tensor-parallel is the torch
engine's alone.  `TorchOptions` and `LlamaCppOptions` are those engine-specific values, each field a Literal of
what that engine takes; `of(options)` builds one from LoadOptions and turns a wrong value into a one-line
ConfigError naming the flag and the way out, instead of a failure inside the runner at load.  The registry holds
each engine's class (BackendInfo.options).  `RemoteTarget` is the remote engine's own option: where its server is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from backends.errors import ConfigError
from backends.load_options import LoadOptions

# the torch engine's names (backends/torch_engine/model_runner.py: _KV_DTYPES, _DTYPES, WEIGHT_QUANTS; a unit
# test checks they agree)
TorchKVCacheType = Literal["f16", "fp16", "bf16", "fp32", "f32"]
TorchDtype = Literal["auto", "float32", "bfloat16", "float16"]
# "int4+attn8": per-layer mixed precision, attention projections int8 and MLP int4 (torch_engine/quantize.MIXED)
TorchWeightQuant = Literal["auto", "none", "gguf", "int8", "int4", "fp8", "int4+attn8"]
Speculative = Literal["off", "ngram", "draft"]  # "auto" is the planner's, resolved before loading
# llama.cpp's: ggml types of the K and V caches (backends/llama_cpp/backend.py KV_TYPES)
LlamaCppKVCacheType = Literal["f16", "q8_0", "q4_0", "bf16", "f32"]


def _one_of(backend: str, what: str, value: str, kind: object, hint: str | None = None) -> None:
    allowed = get_args(kind)
    if value not in allowed:
        raise ConfigError(f"the {backend} backend's {what} is one of {', '.join(allowed)}, got {value!r}", hint)


@dataclass(frozen=True)
class TorchOptions:
    """What only the torch engine reads of LoadOptions, typed (each field's meaning: LoadOptions)."""

    kv_cache_type: TorchKVCacheType = "f16"
    dtype: TorchDtype = "auto"
    weight_quant: TorchWeightQuant = "auto"
    tensor_parallel: int = 1
    speculative: Speculative = "off"
    draft_model: str | None = None
    speculative_k: int = 8

    @classmethod
    def of(cls, options: LoadOptions, backend: str = "torch") -> TorchOptions:
        """The torch engine's values of `options`; ConfigError (one line) for one it does not take."""
        _one_of(
            backend,
            "KV cache type",
            options.kv_cache_type,
            TorchKVCacheType,
            f"pass --kv-cache-type {get_args(TorchKVCacheType)[0]}, or choose another engine with --backend",
        )
        _one_of(backend, "dtype", options.dtype, TorchDtype)
        _one_of(backend, "weight quantization", options.weight_quant, TorchWeightQuant)
        return cls(
            kv_cache_type=options.kv_cache_type,  # type: ignore[arg-type] - checked above
            dtype=options.dtype,  # type: ignore[arg-type]
            weight_quant=options.weight_quant,  # type: ignore[arg-type]
            tensor_parallel=options.tensor_parallel,
            speculative=options.speculative,  # type: ignore[arg-type] - LoadOptions checked it
            draft_model=options.draft_model,
            speculative_k=options.speculative_k,
        )


@dataclass(frozen=True)
class LlamaCppOptions:
    """What only the llama.cpp engine reads of LoadOptions, typed (each field's meaning: LoadOptions)."""

    kv_cache_type: LlamaCppKVCacheType = "f16"
    flash_attn: bool = False
    extra_bufts: bool | None = None

    @classmethod
    def of(cls, options: LoadOptions, backend: str = "llama.cpp") -> LlamaCppOptions:
        """The llama.cpp engine's values of `options`; ConfigError (one line) for one it does not take."""
        _one_of(
            backend,
            "KV cache type",
            options.kv_cache_type,
            LlamaCppKVCacheType,
            f"pass --kv-cache-type {get_args(LlamaCppKVCacheType)[0]}, or choose another engine with --backend",
        )
        refuse_tensor_parallel(backend, options)
        return cls(options.kv_cache_type, options.flash_attn, options.extra_bufts)  # type: ignore[arg-type]


EngineOptions = TorchOptions | LlamaCppOptions


def refuse_tensor_parallel(backend: str, options: LoadOptions) -> None:
    """ConfigError (one line) for --tensor-parallel N > 1 on an engine other than the torch engine."""
    if options.tensor_parallel > 1:
        raise ConfigError(
            f"--tensor-parallel {options.tensor_parallel} is the torch engine's; the {backend} backend splits "
            "a model over GPUs by layers or rows",
            "pass --backend torch, or leave --tensor-parallel out",
        )


@dataclass(frozen=True)
class RemoteTarget:
    """Where the remote model lives and how to reach it (the remote engine's own load option)."""

    url: str  # the API base, ending in /v1 ("http://host:8000" is taken as "http://host:8000/v1")
    model: str | None = None  # the id to ask for; None = the first id the server lists at /v1/models
    api_key: str | None = None  # sent as "Authorization: Bearer KEY"; never a CLI flag (it would show in ps)
    key_source: str = "no key"  # where the key came from, for the message when the server refuses it
    connect_timeout_s: float = 10.0
    read_timeout_s: float = 600.0  # between two chunks of a stream (a long prefill on a busy server)

    @property
    def base(self) -> str:
        """The API base: the URL with /v1 at its end."""
        url = self.url.rstrip("/")
        return url if url.endswith("/v1") else url + "/v1"
