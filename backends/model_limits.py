"""The shapes hearth accepts from a model file (GGUF metadata or a Hugging Face config.json), and the check that
names the key and the limit when a file claims more.

Each limit is far above any real model and far below what would make reading, planning or listing the model
cost real time or memory: a GGUF claiming block_count 10^8 once took 50 s and 8 GB before a MemoryError, because
per-layer lists were built before anything asked whether 10^8 layers made sense.  README "Limits on model files"
lists them; the error names the one that was hit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from backends.errors import ModelFormatError

HINT = "the file is damaged or not a real model: download or convert it again"


@dataclass(frozen=True)
class Limit:
    low: int
    high: int
    note: str  # why this number, said in the error


LIMITS: dict[str, Limit] = {
    "n_layers": Limit(1, 512, "llama.cpp's LLAMA_MAX_LAYERS; Llama 3.1 405B has 126"),
    "hidden_size": Limit(1, 65_536, "Llama 3.1 405B has 16,384"),
    "n_heads": Limit(1, 1_024, "Falcon 180B has 232"),
    "n_kv_heads": Limit(1, 1_024, "at most the attention heads"),
    "head_dim": Limit(1, 4_096, "real models use 64 to 576"),
    "ffn_size": Limit(0, 1 << 20, "Llama 3.1 405B has 53,248"),
    "vocab_size": Limit(1, 1 << 21, "Gemma 3 has 262,144 tokens"),
    "context_length": Limit(1, 1 << 24, "Llama 4 Scout trains for 10,485,760"),
    "n_experts": Limit(0, 512, "llama.cpp's LLAMA_MAX_EXPERTS"),
    "n_experts_used": Limit(0, 512, "at most the experts"),
    "sliding_window": Limit(0, 1 << 24, "at most the longest context"),
}


def check_limit(field: str, value: object, key: str, where: str) -> int:
    """`value` as an int within LIMITS[field]; else a ModelFormatError naming `key` (the file's own name for
    it, e.g. "llama.block_count" or "num_hidden_layers") and the accepted range."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ModelFormatError(f"{where}: {key} is {value!r}, expected an integer", HINT)
    lim = LIMITS[field]
    if not lim.low <= value <= lim.high:
        raise ModelFormatError(
            f"{where}: {key} is {value:,}; hearth accepts {lim.low:,} to {lim.high:,} ({lim.note})", HINT
        )
    return value


def check_positive_float(value: object, key: str, where: str, below: float = math.inf) -> float:
    """A finite float in (0, below): RoPE bases, norm epsilons, scaling factors."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ModelFormatError(f"{where}: {key} is {value!r}, expected a number", HINT)
    if not (math.isfinite(value) and 0 < value < below):
        bound = "" if below == math.inf else f" below {below:g}"
        raise ModelFormatError(f"{where}: {key} is {value!r}, expected a finite number above 0{bound}", HINT)
    return float(value)


def check_heads(n_heads: int, n_kv_heads: int, heads_key: str, kv_key: str, where: str) -> None:
    """Grouped-query attention: every KV head serves the same number of query heads."""
    if n_kv_heads > n_heads or n_heads % n_kv_heads:
        raise ModelFormatError(
            f"{where}: {kv_key} is {n_kv_heads} but {heads_key} is {n_heads}: the attention "
            "heads must be a whole multiple of the KV heads",
            HINT,
        )


def check_experts(n_experts: int, n_used: int, count_key: str, used_key: str, where: str) -> None:
    if n_used > n_experts or (n_experts and not n_used):
        raise ModelFormatError(
            f"{where}: {used_key} is {n_used} but {count_key} is {n_experts}: a mixture of "
            "experts routes each token to between 1 and all of them",
            HINT,
        )
