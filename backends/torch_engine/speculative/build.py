"""Build the Speculator a LoadOptions asks for (the model half calls this after loading the target)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from backends.api import LoadOptions
from backends.engine_options import TorchOptions
from backends.modelspec import ModelSpec, load_spec
from backends.torch_engine.speculative.draft import DraftProposer, check_same_vocabulary, draft_options
from backends.torch_engine.speculative.ngram import NgramProposer
from backends.torch_engine.speculative.proposer import SpecConfig
from backends.torch_engine.speculative.speculator import Speculator
from backends.torch_engine.tokenizer import load_tokenizer


def build_speculator(
    options: LoadOptions,
    target_spec: ModelSpec | None = None,
    target_tokenizer: Any = None,
    load_runner: Callable[[ModelSpec, LoadOptions], Any] | None = None,
) -> Speculator | None:
    """None for "off"; prompt lookup for "ngram"; for "draft" the draft model (options.draft_model) loaded by
    `load_runner` (the model half's ModelRunner: same device and dtype), its vocabulary checked against the
    target's.  Raises ConfigError / ModelFormatError for a draft that cannot serve."""
    typed = TorchOptions.of(options)
    if typed.speculative == "off":
        return None
    k_start = min(4, typed.speculative_k)
    if typed.speculative == "ngram":
        config = SpecConfig("ngram", k_max=typed.speculative_k, k_start=k_start)
        return Speculator(NgramProposer(config.ngram_max, config.ngram_min), config, options.seed)
    assert target_spec is not None and target_tokenizer is not None and load_runner is not None
    draft_spec = load_spec(typed.draft_model or "")
    check_same_vocabulary(
        target_tokenizer, load_tokenizer(draft_spec), target_spec.vocab_size, draft_spec.vocab_size, draft_spec.name
    )
    runner = load_runner(draft_spec, draft_options(options))
    config = SpecConfig("draft", k_max=typed.speculative_k, k_start=k_start)
    return Speculator(DraftProposer(runner, options.max_num_seqs, options.n_batch), config, options.seed)
