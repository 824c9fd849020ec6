"""What one `hearth serve` is configured with (its own module so the request builders and the app share it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from app.defaults import SAMPLING
from app.server.ollama_models import Catalog
from app.server.runner import Limits

if TYPE_CHECKING:
    from app.server.pool import Opener
    from hwprobe.plan_types import Plan
    from hwprobe.report import HardwareReport


@dataclass
class ServerConfig:
    model_name: str  # the id /v1/models lists; requests must name it
    api_key: str | None = None  # Bearer key required on every path but /health; None = open
    limits: Limits = field(default_factory=Limits)
    default_max_tokens: int = SAMPLING.max_tokens  # when a request gives none (bounded by the context)
    system_prompt: str | None = None  # not injected: OpenAI clients send their own system message
    max_messages: int = 4096  # messages in one chat request (render and tokenize cost grows with them)
    max_json_depth: int = 64  # nesting of arrays/objects in a body (OpenAI bodies nest well under 20)
    # the registered models Ollama's /api/tags and /api/show list (app/server/ollama_models.py); None = only the
    # served one
    catalog: Catalog | None = None
    # seconds the model stays loaded after the last request (Ollama's keep_alive; a request's own keep_alive wins
    # on /api/*); None = forever.  app/server/keep_alive.py
    keep_alive_s: float | None = None
    # model switching (app/server/pool.py): loads another local model on demand; None = serve model_name only
    opener: Opener | None = None
    # the hardware report the first model was planned for; later loads plan for it less what is loaded
    report: HardwareReport | None = None
    max_loaded_models: int | None = None  # --max-loaded-models; None = as many as fit
    first_plan: Plan | None = None  # model_name's plan: its memory counts as taken when another model loads
