"""Per-engine load options, typed and known without importing the engine (so hearth checks them at the command
line, before a runner process starts).

`LoadOptions` (backends/api.py) is the plan's decision, shared by every engine; what each value may be depends on
the engine: `kv_cache_type` is a ggml type for llama.cpp (f16, q8_0, q4_0, ...) and a torch dtype name for the
torch engine (f16, bf16, fp32).  `OptionRules` states each engine's accepted values (the registry holds one per
backend); `check_options` turns a wrong one into a one-line ConfigError naming the flag and the way out, instead
of a failure inside the runner at load.  `RemoteTarget` is the remote engine's own option: where its server is.
"""

from __future__ import annotations

from dataclasses import dataclass

from backends.api import LoadOptions
from backends.errors import ConfigError


@dataclass(frozen=True)
class OptionRules:
    """The LoadOptions values one engine takes; an empty tuple = the engine does not use that option (any value
    is ignored, and describe() says what it used)."""

    kv_cache_types: tuple[str, ...] = ()  # --kv-cache-type
    dtypes: tuple[str, ...] = ()  # LoadOptions.dtype (torch engine weights)
    weight_quants: tuple[str, ...] = ()  # LoadOptions.weight_quant (torch engine)
    tensor_parallel: bool = False  # --tensor-parallel N > 1


def check_options(backend: str, rules: OptionRules, options: LoadOptions) -> None:
    """ConfigError (one line, exit 2) when `options` asks `backend` for a value it does not take."""
    if rules.kv_cache_types and options.kv_cache_type not in rules.kv_cache_types:
        others = ", ".join(rules.kv_cache_types)
        raise ConfigError(
            f"the {backend} backend's KV cache type is one of {others}, got {options.kv_cache_type!r}",
            f"pass --kv-cache-type {rules.kv_cache_types[0]}, or choose another engine with --backend",
        )
    if rules.dtypes and options.dtype not in rules.dtypes:
        raise ConfigError(f"the {backend} backend's dtype is one of {', '.join(rules.dtypes)}, got {options.dtype!r}")
    if rules.weight_quants and options.weight_quant not in rules.weight_quants:
        raise ConfigError(
            f"the {backend} backend's weight quantization is one of {', '.join(rules.weight_quants)}, "
            f"got {options.weight_quant!r}"
        )
    if options.tensor_parallel > 1 and not rules.tensor_parallel:
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
