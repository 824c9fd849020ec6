"""The backends hearth knows, listed without importing them (torch and llama_cpp load only when chosen).

Each entry names the module and class and states its capabilities statically; `is_installed()` checks that
its heavy library can be imported without importing it (importlib.util.find_spec).
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from backends import engine_capabilities as caps
from backends.api import Backend, Capabilities, LoadOptions
from backends.engine_options import EngineOptions, LlamaCppOptions, TorchOptions, refuse_tensor_parallel
from backends.errors import BackendUnavailableError
from backends.kernel_report import KernelReport

if TYPE_CHECKING:  # pragma: no cover
    from backends.modelspec import ModelSpec


@dataclass(frozen=True)
class BackendInfo:
    name: str  # what --backend takes
    module: str
    cls: str
    requires: tuple[str, ...]  # top-level modules that must be importable
    capabilities: Capabilities
    description: str
    # "module:function" answering, at run time, whether this installation can offload to a GPU (it depends on how
    # the library was built, not on the backend); "" = as capabilities.gpu_offload says
    gpu_offload_check: str = ""
    # "module:function" (checked_safe) -> (on, why): whether the engine's extra weight-buffer types are on by
    # default on this machine, asked before a runner starts; the module must not import the engine's library
    extra_bufts_rule: str = ""
    # the engine's own typed options (backends/engine_options.py), built from LoadOptions and checked before a
    # runner starts; None = the engine has no values of its own to check (remote: its RemoteTarget)
    options: type[TorchOptions] | type[LlamaCppOptions] | None = None
    # "module:function" (spec, record, check_now) -> KernelReport: the engine's kernel self-check for `hearth
    # doctor`, called inside a runner process (backends/runner/oneshot.py); "" = the engine has none
    kernel_report: str = ""

    def is_installed(self) -> bool:
        return all(importlib.util.find_spec(m) is not None for m in self.requires)

    def gpu_offload_installed(self) -> bool:
        """Whether this installation can place layers on a GPU (imports the backend's library when it must ask
        it).  Raises BackendUnavailableError when the library is not installed."""
        if not self.is_installed():
            raise BackendUnavailableError(f"the {self.name} backend is not installed")
        if not self.gpu_offload_check:
            return self.capabilities.gpu_offload
        module, function = self.gpu_offload_check.split(":")
        return bool(getattr(importlib.import_module(module), function)())

    def check_options(self, options: LoadOptions) -> EngineOptions | None:
        """This engine's typed options of `options`; ConfigError (one line) when it holds a value this engine does
        not take: checked before a runner starts, so a wrong flag is an error at the command line, not a failure
        in the child at load."""
        if self.options is None:
            refuse_tensor_parallel(self.name, options)
            return None
        return self.options.of(options, self.name)

    def extra_bufts_default(self, checked_safe: Callable[[], bool] | None = None) -> tuple[bool, str]:
        """(on, why) for LoadOptions.extra_bufts on this machine (False for an engine without them)."""
        if not self.extra_bufts_rule:
            return False, f"the {self.name} backend has no extra buffer types"
        module, function = self.extra_bufts_rule.split(":")
        return getattr(importlib.import_module(module), function)(checked_safe)

    def run_kernel_report(self, spec: ModelSpec, record: str, check_now: bool) -> KernelReport:
        """The engine's kernel report (imports the engine: call it in a runner process)."""
        if not self.kernel_report:
            return KernelReport()
        module, function = self.kernel_report.split(":")
        return getattr(importlib.import_module(module), function)(spec, record, check_now)

    def load_class(self) -> type[Backend]:
        if not self.is_installed():
            missing = [m for m in self.requires if importlib.util.find_spec(m) is None]
            raise BackendUnavailableError(
                f"the {self.name} backend needs {', '.join(missing)}, which is not installed",
                "run the README's set-up command, or pick another with --backend",
            )
        module = importlib.import_module(self.module)
        return getattr(module, self.cls)


BACKENDS: dict[str, BackendInfo] = {
    "llama.cpp": BackendInfo(
        "llama.cpp",
        "backends.llama_cpp.backend",
        "LlamaCppBackend",
        ("llama_cpp",),
        caps.LLAMA_CPP,
        "llama-cpp-python: any GGUF, CPU or partial/full GPU offload; serves one request at a time",
        gpu_offload_check="backends.llama_cpp.backend:gpu_offload_supported",
        extra_bufts_rule="backends.llama_cpp.extra_bufts:extra_bufts_default",
        options=LlamaCppOptions,
    ),
    "torch": BackendInfo(
        "torch",
        "backends.torch_engine.backend",
        "TorchBackend",
        ("torch",),
        caps.TORCH,
        "hearth's PyTorch engine: paged KV cache, prefix caching, continuous batching",
        options=TorchOptions,
        kernel_report="backends.torch_engine.kernel_doctor:doctor_report",
    ),
    "remote": BackendInfo(
        "remote",
        "backends.remote.backend",
        "RemoteBackend",
        ("httpx",),
        caps.REMOTE,
        "any OpenAI-compatible server (vLLM, SGLang, Ollama, llama.cpp's server, another hearth): --url URL",
    ),
}

# every backend except "remote" runs the model here, and hwprobe's planner chooses among exactly these
# (hwprobe.plan_types.PLANNED_BACKENDS; tests/unit check that the two lists agree)
LOCAL_BACKENDS = tuple(name for name, info in BACKENDS.items() if info.capabilities.local)
BACKEND_CHOICES = ("auto", *BACKENDS)  # what --backend, settings.toml and HEARTH_BACKEND take

ALIASES = {"llama_cpp": "llama.cpp", "llamacpp": "llama.cpp", "llama-cpp": "llama.cpp", "pytorch": "torch"}


def get_backend_info(name: str) -> BackendInfo:
    key = ALIASES.get(name, name)
    if key not in BACKENDS:
        raise BackendUnavailableError(f"unknown backend {name!r}", f"choose one of: auto, {', '.join(BACKENDS)}")
    return BACKENDS[key]


def backend_class(name: str) -> type[Backend]:
    """A registry name, or "module:Class" for a backend outside the registry (tests, plugins:
    HEARTH_BACKEND_CLASS)."""
    if ":" in name:
        module, cls = name.split(":", 1)
        return getattr(importlib.import_module(module), cls)
    return get_backend_info(name).load_class()
