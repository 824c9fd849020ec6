"""Model and runtime errors; the root (`HearthError`, `ConfigError`, ...) is in `hwprobe.errors`.

Messages state the numbers and the way out, e.g. "prompt is 9000 tokens but the context is 8192: shorten it or
load the model with --ctx 16384".  Out-of-memory is detected by exception type (torch.OutOfMemoryError, a
failed llama.cpp context), never by matching strings.
"""

from __future__ import annotations

from hwprobe.errors import ConfigError, HardwareReportError, HearthError, PlanError

__all__ = [
    "HearthError",
    "ConfigError",
    "HardwareReportError",
    "PlanError",
    "ModelNotFoundError",
    "ModelFormatError",
    "UnsupportedArchitectureError",
    "BackendUnavailableError",
    "ContextOverflowError",
    "InvalidRequestError",
    "ConstraintError",
    "OutOfMemoryError",
    "ModelLoadError",
    "TemplateError",
    "RunnerError",
    "RunnerCrashedError",
]


class ModelNotFoundError(HearthError):
    """A model name or path that is neither registered nor an existing file."""


class ModelFormatError(HearthError):
    """A file that is not GGUF, or a GGUF that is truncated or corrupt."""


class UnsupportedArchitectureError(HearthError):
    """A model whose architecture the chosen backend cannot run."""


class BackendUnavailableError(HearthError):
    """A backend name that is unknown, or whose libraries are not installed."""


class ContextOverflowError(HearthError):
    """A prompt (plus max_tokens where it matters) longer than the loaded context."""


class InvalidRequestError(HearthError):
    """Sampling parameters or a request that make no sense (negative temperature, max_tokens < 1, ...)."""


class ConstraintError(InvalidRequestError):
    """A constraint (a JSON schema, a forced tool call's parameters) refused before generation: no finite reply
    satisfies it, it uses what the constraint library does not implement, or compiling it exceeds the library's
    limits.  Front ends answer it as a 400 naming the field the schema came from (`response_format`, `tools`,
    Ollama's `format`; exit 2 for `hearth run --json-schema`)."""


class OutOfMemoryError(HearthError):
    """The backend ran out of GPU or host memory while loading or generating."""

    exit_code = 3


class ModelLoadError(HearthError):
    """The backend failed to load a model for a reason other than memory."""

    exit_code = 3


class TemplateError(HearthError):
    """A chat template that fails to render, or tries to escape the sandbox."""


class RunnerError(HearthError):
    """The runner process that holds a model failed in a way no other error names."""

    exit_code = 3


class RunnerCrashedError(RunnerError):
    """The runner process died (a signal, an exit) or stopped answering; the message names the signal and the
    backend call it was in."""

    exit_code = 4


class TensorParallelError(RunnerError):
    """A rank of the torch engine's tensor-parallel group died, failed or stopped answering: the whole group is
    down (backends/torch_engine/tp); in a runner process the runner then exits and hearth restarts it."""
