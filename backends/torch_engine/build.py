"""The model half of the torch engine, built for TorchBackend: tokenizer, ModelRunner (or, with
--tensor-parallel N > 1, rank 0's TPModelRunner) and the KV pool size.  Its own module so that the model runner
and the tensor-parallel runner (a subclass of it) are both imported from here, not from each other."""

from __future__ import annotations

import dataclasses

from backends.api import LoadOptions, ProgressCallback
from backends.errors import ConfigError
from backends.modelspec import ModelSpec
from backends.torch_engine.model_runner import ModelRunner
from backends.torch_engine.parts import EngineParts
from backends.torch_engine.seams import BLOCK_SIZE
from backends.torch_engine.speculative.build import build_speculator
from backends.torch_engine.tokenizer import load_tokenizer
from backends.torch_engine.tp_group.runner import TPModelRunner


def _draft_runner(spec: ModelSpec, options: LoadOptions) -> ModelRunner:
    return ModelRunner(spec, dataclasses.replace(options, swap_space_bytes=0))


def build_engine_parts(
    spec: ModelSpec,
    options: LoadOptions,
    progress: ProgressCallback | None = None,
) -> EngineParts:
    """The model half for TorchBackend: runner, tokenizer, pool size, prompt logits, describe, close."""
    if progress is not None:
        progress(0.0, "reading the tokenizer")
    tokenizer = load_tokenizer(spec, options.weight_cache_dir)  # kept beside the prepared weights
    # first, so that a draft with another vocabulary is refused before the target's weights load
    # None unless --speculative; a draft model keeps no swap space (the plan prices the target's alone, and a
    # draft's KV of a preempted request is recomputed by its proposer anyway)
    speculator = build_speculator(options, spec, tokenizer, _draft_runner)
    if progress is not None:
        progress(0.1, "loading and dequantizing the weights")
    if options.tensor_parallel > 1:  # rank 0 of a group of processes (backends/torch_engine/tp)
        runner: ModelRunner = TPModelRunner(spec, options)
    else:
        runner = ModelRunner(spec, options)
    if progress is not None:
        progress(1.0, f"weights in {runner.describe()['dtype']} on {runner.device}")
    if options.n_ctx > runner.num_blocks * BLOCK_SIZE:
        raise ConfigError(
            f"the KV pool holds {runner.num_blocks * BLOCK_SIZE} tokens, less than the context of {options.n_ctx}",
            "raise the KV budget or lower --ctx",
        )
    draft = getattr(speculator.proposer, "runner", None) if speculator is not None else None

    def close() -> None:
        runner.close()
        if draft is not None:  # the draft model's weights and KV pool
            draft.close()

    return EngineParts(
        speculator=speculator,
        runner=runner,
        tokenizer=tokenizer,
        num_blocks=runner.num_blocks,
        prompt_logits=runner.prompt_logits,
        embed=runner.embed_batch if options.tensor_parallel == 1 else None,  # TP: the other ranks would wait forever
        describe=runner.describe,
        close=close,
        num_host_blocks=runner.swapper.store.num_blocks if runner.swapper is not None else 0,
        swap_cost=runner.swap_cost,
    )
