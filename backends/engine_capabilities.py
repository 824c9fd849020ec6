"""What each engine can do, in one place: the registry lists it without importing the engines, and each engine
class declares it (`capabilities = TORCH`).  Two copies used to disagree (the registry's left out `constraints`
for all three engines and `logprobs` for two), and a runner's client reports the registry's, so the torch
engine's logprobs read False under the runner and True in process; tests/unit/test_engine_capabilities.py checks
that the registry and the classes give the same object."""

from __future__ import annotations

from backends.api import Capabilities

LLAMA_CPP = Capabilities(
    concurrent_requests=False,
    preempts=True,  # between tokens and prompt pieces: backends/llama_cpp/turns.py
    prefix_cache=False,
    gpu_offload=True,
    gguf=True,
    safetensors=False,
    logits=True,
    extra_bufts=True,
    constraints=True,
    logprobs=True,
    embeddings=True,
)
TORCH = Capabilities(
    concurrent_requests=True,
    preempts=True,
    prefix_cache=True,
    gpu_offload=True,
    gguf=True,
    safetensors=True,
    logits=True,
    constraints=True,
    logprobs=True,
    embeddings=True,
)
REMOTE = Capabilities(concurrent_requests=True, gguf=False, logits=False, local=False, constraints=True)
