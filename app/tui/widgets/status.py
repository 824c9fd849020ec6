"""The status bar: model state, tokens/s, time to first token, context used, cached prefix, memory."""

from __future__ import annotations

from typing import Any

from textual.widgets import Static


def _mib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def format_status(model: str, state: str, stats: Any | None, n_ctx: int | None, memory: dict[str, int]) -> str:
    """Numbers first so they fit in 80 columns; the model name (also on the prompt box) goes last."""
    parts = [state]
    if stats is not None:
        parts.append(f"{stats.decode_tokens_per_s:.1f} tok/s")
        parts.append(f"TTFT {stats.ttft_s * 1000:.0f} ms")
        used = stats.prompt_tokens + stats.completion_tokens
        parts.append(f"ctx {used}/{n_ctx}" if n_ctx else f"ctx {used}")
        parts.append(f"cached {stats.cached_tokens}")
    elif n_ctx:
        parts.append(f"ctx limit {n_ctx}")
    if memory.get("gpu_bytes"):
        parts.append(f"GPU {_mib(memory['gpu_bytes'])}")
    if memory.get("rss_bytes"):
        parts.append(f"RAM {_mib(memory['rss_bytes'])}")
    return " │ ".join(parts + ["F1 help", model])


class StatusBar(Static):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__("", markup=False, **kwargs)
        self.model = "no model"
        self.state = "starting"
        self.stats: Any | None = None
        self.n_ctx: int | None = None
        self.memory: dict[str, int] = {}

    def set(self, **values: Any) -> None:
        for k, v in values.items():
            setattr(self, k, v)
        self.update(format_status(self.model, self.state, self.stats, self.n_ctx, self.memory))
