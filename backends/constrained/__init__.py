"""Constrained decoding: a `Constraint` (backends/api.py) compiled for a model's vocabulary into a per-request
`Matcher` that gives the allowed-token mask at each step and advances on each accepted token.

- grammar.py: the Constraint as an llguidance Lark grammar, and the size/depth bounds on a schema (pure Python);
- finite.py: whether any finite JSON value satisfies a schema (pure Python), so an endless one is a 400;
- compiler.py: `schema_constraint` (a schema -> a checked Constraint or a ConstraintError: the one entry for
  front ends), `ConstraintCompiler` (one per loaded model, an LRU of compiled grammars), built from hearth's own
  tokenizers (torch engine) or from llama.cpp's vocabulary;
- matcher.py: `Matcher`, one request's grammar state.

The torch engine applies the mask in its sampler (backends/torch_engine/grammar_mask.py); the llama.cpp backend
through llama-cpp-python's logits_processor (backends/llama_cpp/backend.py says why not GBNF).
"""

from backends.constrained.compiler import (
    ConstraintCompiler,
    check_constraint,
    compiler_for_llama,
    compiler_for_tokenizer,
    schema_constraint,
)
from backends.constrained.finite import check_finite
from backends.constrained.grammar import MAX_SCHEMA_BYTES, MAX_SCHEMA_DEPTH, check_schema, lark_grammar
from backends.constrained.matcher import ConstraintLimitError, ConstraintViolation, Matcher

__all__ = [
    "ConstraintCompiler",
    "ConstraintLimitError",
    "ConstraintViolation",
    "Matcher",
    "MAX_SCHEMA_BYTES",
    "MAX_SCHEMA_DEPTH",
    "check_constraint",
    "check_finite",
    "check_schema",
    "compiler_for_llama",
    "compiler_for_tokenizer",
    "lark_grammar",
    "schema_constraint",
]
