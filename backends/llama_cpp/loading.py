"""How the llama.cpp backend builds llama-cpp-python's `Llama`: the arguments LoadOptions map to, the model params
llama-cpp-python gives no argument for (extra buffer types, tensor buffer overrides), and the architectures
llama.cpp knows (backends/llama_cpp/backend.py loads with them)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from backends.api import LoadOptions
from backends.embeddings import POOLING_IDS, pooling_type
from backends.engine_options import LlamaCppOptions
from backends.errors import UnsupportedArchitectureError
from backends.llama_cpp.embedding import refuse_rank
from backends.llama_cpp.extra_bufts import extra_bufts_default
from backends.llama_cpp.no_templates import templates_skipped
from backends.modelspec import ModelSpec

SPLIT_MODES = {"none": 0, "layer": 1, "row": 2, "tensor": 3}
KV_TYPES = {"f16": 1, "q8_0": 8, "q4_0": 2, "bf16": 30, "f32": 0}  # ggml_type values


def gpu_offload_supported() -> bool:
    """Whether the installed llama-cpp-python was built with a GPU backend (CUDA, Metal, Vulkan, ...)."""
    import llama_cpp  # lazy: heavy: llama_cpp

    return bool(llama_cpp.llama_supports_gpu_offload())


@contextlib.contextmanager
def model_params(extra_bufts: bool, overrides: Any = None) -> Iterator[None]:
    """llama-cpp-python's Llama() takes no use_extra_bufts or tensor_buft_overrides argument; it builds its
    llama_model_params from llama_model_default_params(), so that function is wrapped while the model loads (on
    the one thread that touches llama.cpp, in a process that holds this one model).  overrides: an
    overrides.BuftOverrides, kept alive by the caller."""
    import llama_cpp.llama as llama_module  # lazy: heavy: llama_cpp

    if extra_bufts and overrides is None:
        yield
        return
    lib = llama_module.llama_cpp
    original = lib.llama_model_default_params

    def params() -> Any:
        p = original()
        if not extra_bufts:
            p.use_extra_bufts = False
        if overrides is not None:
            p.tensor_buft_overrides = overrides.address
        return p

    lib.llama_model_default_params = params
    try:
        yield
    finally:
        lib.llama_model_default_params = original


def open_llama(path: str, extra_bufts: bool | None = None, **kwargs: Any) -> Any:
    """A bare `llama_cpp.Llama(path, **kwargs)` under this machine's extra-buffer rule (extra_bufts_default when
    None): for the places that use llama.cpp directly as a reference (tests, scripts), which would otherwise
    segfault at the first decode on an AMX CPU."""
    import llama_cpp  # lazy: heavy: llama_cpp

    on = extra_bufts_default()[0] if extra_bufts is None else extra_bufts
    with model_params(on):
        return llama_cpp.Llama(str(path), **kwargs)


def known_architectures() -> frozenset[str]:
    """Architectures llama.cpp can load.  The gguf package mirrors llama.cpp's list (MODEL_ARCH_NAMES), so this
    needs no model load; an architecture missing here fails fast with a clear error instead of a C++ log."""
    from gguf.constants import MODEL_ARCH_NAMES  # lazy: heavy: gguf (numpy)

    return frozenset(MODEL_ARCH_NAMES.values())


def refuse_unloadable(spec: ModelSpec) -> None:
    """UnsupportedArchitectureError for a model llama.cpp cannot load: not a GGUF, or an architecture it does
    not know."""
    if spec.format != "gguf":
        raise UnsupportedArchitectureError(
            f"the llama.cpp backend loads GGUF files; {spec.path} is a {spec.format} folder",
            "use --backend torch",
        )
    if spec.architecture not in known_architectures():
        raise UnsupportedArchitectureError(
            f"llama.cpp does not know the architecture {spec.architecture!r} of {spec.path}",
            "update llama-cpp-python, or use a model of a supported architecture",
        )


def llama_kwargs(
    spec: ModelSpec, o: LoadOptions, typed: LlamaCppOptions, flash_attn: bool, embedding_model: bool
) -> dict[str, Any]:
    """The keyword arguments of `Llama(path, ...)` for these options (refuse_rank's error for a rank model)."""
    kwargs: dict[str, Any] = dict(
        n_ctx=o.n_ctx,
        n_gpu_layers=o.n_gpu_layers,
        split_mode=SPLIT_MODES[o.split_mode],
        main_gpu=o.main_gpu,
        n_batch=min(o.n_batch, o.n_ctx),
        n_ubatch=min(o.n_batch, o.n_ctx),
        n_threads=o.n_threads,
        n_threads_batch=o.n_threads,
        logits_all=o.logits_all,
        flash_attn=flash_attn,
        type_k=KV_TYPES[typed.kv_cache_type],
        type_v=KV_TYPES[typed.kv_cache_type],
        seed=o.seed,
        verbose=o.verbose,
    )
    if o.tensor_split:
        kwargs["tensor_split"] = list(o.tensor_split)
    if embedding_model:  # an encoder: its own context is the embedding one, sized to what it was trained on
        refuse_rank(pooling_type(spec))
        n = min(o.n_ctx, spec.context_length or o.n_ctx)
        kwargs.update(n_ctx=n, n_batch=n, n_ubatch=n, embedding=True, pooling_type=POOLING_IDS[pooling_type(spec)])
    return kwargs


def new_llama(llama: Callable[..., Any], path: str, kwargs: dict[str, Any], extra_bufts: bool, overrides: Any) -> Any:
    """`llama(path, **kwargs)` (llama_cpp.Llama) with the extra buffer types and overrides of model_params; the
    file's template is untrusted: only hearth's budgeted renderer runs it, so llama-cpp-python compiles none."""
    with templates_skipped(), model_params(extra_bufts, overrides):
        return llama(path, **kwargs)
