"""hearth's defaults, each in one place: the CLI's flags and help, Settings, the TUI's new conversations and the
request builder (app/requests.py) all read them from here.

Sampling defaults are the Backend contract's own (backends.api.SamplingParams, llama.cpp's and Ollama's values);
the backend names are the registry's (backends.registry), so a new backend shows up in `--backend` by being
registered.
"""

from __future__ import annotations

from backends.api import INTERACTIVE_PRIORITY, SamplingParams
from backends.registry import BACKEND_CHOICES, LOCAL_BACKENDS

SAMPLING = SamplingParams()  # temperature 0.8, top_p 0.95, top_k 40, min_p 0.05, repeat_penalty 1 (off)

# A short neutral default: measured here, SmolLM2-135M's own template default ("You are a helpful AI
# assistant named SmolLM, ...") makes it answer "What is the capital of France?" wrongly at temperature 0,
# while this one gives "The capital of France is Paris."  An empty string sends no system message.
SYSTEM_PROMPT = "You are a helpful assistant."

REPLY_MAX_TOKENS = 1024  # most tokens in one reply of `hearth run` and the TUI (the API server's is its own)

# Quality of service (issue 27): the chat app's own requests and `hearth run` rank ahead of API traffic (the API's
# default priority is 0, vLLM's), so a person typing is not queued behind batch jobs on the same engine; and the
# torch engine plans each step for a first token within TTFT_TARGET_MS (the seed's interactive target).
APP_PRIORITY = INTERACTIVE_PRIORITY
TTFT_TARGET_MS = 500.0

__all__ = [
    "APP_PRIORITY",
    "BACKEND_CHOICES",
    "LOCAL_BACKENDS",
    "REPLY_MAX_TOKENS",
    "SAMPLING",
    "SYSTEM_PROMPT",
    "TTFT_TARGET_MS",
]
