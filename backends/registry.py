"""The backends hearth knows, listed without importing them (torch and llama_cpp load only when chosen).

Each entry names the module and class and states its capabilities statically; `is_installed()` checks that
its heavy library can be imported without importing it (importlib.util.find_spec).
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass

from backends.api import Backend, Capabilities
from backends.errors import BackendUnavailableError


@dataclass(frozen=True)
class BackendInfo:
    name: str  # what --backend takes
    module: str
    cls: str
    requires: tuple[str, ...]  # top-level modules that must be importable
    capabilities: Capabilities
    description: str

    def is_installed(self) -> bool:
        return all(importlib.util.find_spec(m) is not None for m in self.requires)

    def load_class(self) -> type[Backend]:
        if not self.is_installed():
            missing = [m for m in self.requires if importlib.util.find_spec(m) is None]
            raise BackendUnavailableError(
                f"the {self.name} backend needs {', '.join(missing)}, which is not installed",
                "run the README's set-up command, or pick another with --backend")
        module = importlib.import_module(self.module)
        return getattr(module, self.cls)


BACKENDS: dict[str, BackendInfo] = {
    "llama.cpp": BackendInfo(
        "llama.cpp", "backends.llama_cpp.backend", "LlamaCppBackend", ("llama_cpp",),
        Capabilities(concurrent_requests=False, prefix_cache=False, gpu_offload=True, gguf=True,
                     safetensors=False, logits=True),
        "llama-cpp-python: any GGUF, CPU or partial/full GPU offload; serves one request at a time"),
    "torch": BackendInfo(
        "torch", "backends.torch_engine.backend", "TorchBackend", ("torch",),
        Capabilities(concurrent_requests=True, prefix_cache=True, gpu_offload=True, gguf=True,
                     safetensors=True, logits=True),
        "hearth's PyTorch engine: paged KV cache, prefix caching, continuous batching"),
}

ALIASES = {"llama_cpp": "llama.cpp", "llamacpp": "llama.cpp", "llama-cpp": "llama.cpp", "pytorch": "torch"}


def get_backend_info(name: str) -> BackendInfo:
    key = ALIASES.get(name, name)
    if key not in BACKENDS:
        raise BackendUnavailableError(f"unknown backend {name!r}", f"choose one of: auto, {', '.join(BACKENDS)}")
    return BACKENDS[key]
