"""Compile `Constraint`s for one vocabulary into per-request `Matcher`s, with llguidance.

Why llguidance (PyPI `llguidance`, Microsoft's guidance engine, also used by llama.cpp and vLLM): it takes a Lark
grammar with a JSON Schema embedded (`%json {...}`), so "literal prefix, a JSON value, literal suffix" is one
grammar; it computes a token mask in tens of microseconds without precomputing per-state tables, so a new schema
costs milliseconds; and every compile and mask step runs on fuel with limits we set (`PARSER_LIMITS`), which is
what bounds a hostile schema's cost.

A `ConstraintCompiler` belongs to one loaded model: it holds the vocabulary as llguidance sees it and an LRU of
compiled grammars keyed by the Constraint (a frozen dataclass), so the second request with the same schema pays a
deep copy (microseconds) instead of a compile.  Thread-safe: callers of Backend.stream() compile concurrently.
"""

from __future__ import annotations

import json
import threading
import warnings
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from backends.api import Constraint
from backends.constrained.grammar import lark_grammar
from backends.constrained.matcher import Matcher
from backends.errors import ConstraintError, InvalidRequestError

CACHE_ENTRIES = 64  # compiled grammars kept per loaded model (each is a few KB to a few MB)
SPECIAL_PREFIX = b"\xff"  # llguidance's marker for a special token's name: never matched as text


def _parser_limits() -> Any:
    import llguidance  # lazy: heavy: llguidance

    # Defaults are llguidance's except the grammar size and lexer states, lowered so that one schema costs at
    # most ~0.5 s and ~100 MB to compile; per-step fuel (~15 ms of mask work) keeps a mask step bounded.
    return llguidance.LLParserLimits(
        max_grammar_size=100_000,
        max_lexer_states=50_000,
        initial_lexer_fuel=1_000_000,
        step_lexer_fuel=200_000,
        step_max_items=50_000,
        verbose_errors=False,
    )


def check_constraint(constraint: Constraint) -> None:
    """Raise ConstraintError (one line) when `constraint` would not compile for any vocabulary: the bounds of
    grammar.py (size, depth, a schema no finite document satisfies), then llguidance's own check of the grammar
    under its limits (no tokenizer needed, so a front end refuses a bad schema before a model sees it)."""
    import llguidance  # lazy: heavy: llguidance

    error = llguidance.LLMatcher.validate_grammar(lark_grammar(constraint), None, limits=_parser_limits())
    if error and not error.startswith("WARNING"):
        raise ConstraintError(
            f"the {constraint.kind} constraint cannot be compiled: {_one_line(error)}",
            "use JSON Schema features llguidance supports, in a smaller schema",
        )


def schema_constraint(schema: Any, prefix: str = "", suffix: str = "") -> Constraint:
    """The one way a front end turns a JSON Schema into a Constraint a backend will take, or a ConstraintError
    (one line + hint) to answer as a 400 naming the field the schema came from (`response_format`, Ollama's
    `format`, a tool's parameters) or exit 2 (`hearth run --json-schema`).

    `schema`: parsed (a dict or a boolean) or JSON text.  Every check that needs no model runs here: size,
    depth, JSON, `false`, a schema only an endless document satisfies, keywords llguidance does not implement,
    and llguidance's compile under hearth's limits.  The backend compiles it once more for its vocabulary
    (ConstraintCompiler.matcher), which raises the same ConstraintError for what only a vocabulary shows."""
    text = schema if isinstance(schema, str) else json.dumps(schema)
    constraint = Constraint("json_schema", text, prefix=prefix, suffix=suffix)
    check_constraint(constraint)
    return constraint


class ConstraintCompiler:
    """Constraint -> Matcher for one vocabulary (an llguidance LLTokenizer)."""

    def __init__(self, lltokenizer: Any, model_vocab_size: int | None = None, limits: Any = None) -> None:
        self.lltokenizer = lltokenizer
        self.vocab_size = int(lltokenizer.vocab_size)  # the bitmask's width: ceil(vocab_size / 32) words
        self.model_vocab_size = model_vocab_size or self.vocab_size  # the logits' width (may be padded larger)
        self._limits = limits if limits is not None else _parser_limits()  # an llguidance.LLParserLimits
        self._cache: OrderedDict[Constraint, Any] = OrderedDict()
        self._lock = threading.Lock()

    def matcher(self, constraint: Constraint) -> Matcher:
        """A fresh matcher at the start of `constraint`'s grammar.  Raises ConstraintError (one line) for a
        schema that is too big, too deep, has no finite instance, uses what llguidance does not implement, or
        exceeds the limits while compiling or computing its first mask or forced tokens."""
        with self._lock:
            compiled = self._cache.get(constraint)
            if compiled is not None:
                self._cache.move_to_end(constraint)
        if compiled is None:
            compiled = self._compile(constraint)
            with self._lock:
                self._cache[constraint] = compiled
                while len(self._cache) > CACHE_ENTRIES:
                    self._cache.popitem(last=False)
        return Matcher(compiled.deep_copy(), self.vocab_size, self.model_vocab_size)

    def _compile(self, constraint: Constraint) -> Any:
        import llguidance  # lazy: heavy: llguidance

        grammar = lark_grammar(constraint)  # size/depth checks first: nothing big reaches the compiler
        ll = llguidance.LLMatcher(self.lltokenizer, grammar, log_level=0, limits=self._limits)
        probe = ll.deep_copy() if not ll.is_error() else ll
        if not ll.is_error():
            # some grammars compile but fail at their first mask (a $ref cycle with no value: a -> b -> a)
            first_mask = probe.compute_bitmask()
            if not probe.is_error() and not any(first_mask):
                raise ConstraintError(
                    f"the {constraint.kind} constraint allows no first token", "send a schema some value satisfies"
                )
            # and the text the grammar forces from the start: an endless forced run that finite.py cannot see
            # (a cycle through patternProperties, say) hits llguidance's item limit here, not at the first token
            probe.compute_ff_tokens()
        if probe.is_error():
            raise ConstraintError(
                f"the {constraint.kind} constraint cannot be compiled: {_one_line(probe.get_error())}",
                "use JSON Schema features llguidance supports, in a smaller schema",
            )
        return ll

    @property
    def cached(self) -> int:
        return len(self._cache)


def _one_line(text: str, limit: int = 300) -> str:
    text = text.split("\n1 |")[0].split(" 1 | ")[0]  # llguidance appends the grammar's source: not for clients
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


class _Wrapper:
    """llguidance's TokenizerWrapper contract: tokens (bytes per id), eos/bos ids, special ids, and a callable
    that tokenizes text (for the grammar's literal strings)."""

    def __init__(
        self, tokens: list[bytes], eos_token_id: int, bos_token_id: int | None, encode: Callable[[str], list[int]]
    ) -> None:
        self.tokens = tokens
        self.eos_token_id = eos_token_id
        self.bos_token_id = bos_token_id
        self.special_token_ids = [i for i, t in enumerate(tokens) if t.startswith(SPECIAL_PREFIX)]
        self.is_tokenizer_wrapper = True
        self._encode = encode

    def __call__(self, text: str | bytes) -> list[int]:
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="replace")
        return list(self._encode(text))


def compiler_for_tokenizer(
    tokenizer: Any, eos_token_ids: Sequence[int], bos_token_id: int | None, model_vocab_size: int | None = None
) -> ConstraintCompiler:
    """A compiler for hearth's own tokenizers (backends/torch_engine/tokenizer.py, spm_tokenizer.py): each id's
    bytes from `token_bytes`; control tokens (which give b"") become llguidance special tokens by name."""
    import llguidance  # lazy: heavy: llguidance

    if not eos_token_ids:
        raise InvalidRequestError(
            "the model declares no end-of-sequence token, so a constrained reply could never end",
            "use a model whose GGUF sets tokenizer.ggml.eos_token_id",
        )
    tokens: list[bytes] = []
    for i in range(tokenizer.vocab_size):
        piece = tokenizer.token_bytes([i])
        tokens.append(piece if piece else SPECIAL_PREFIX + tokenizer.decode([i]).encode("utf-8"))

    def encode(text: str) -> list[int]:
        return tokenizer.encode(text, add_special=False, parse_special=False)

    wrapper = _Wrapper(tokens, eos_token_ids[0], bos_token_id, encode)
    lltokenizer = llguidance.LLTokenizer(llguidance.TokenizerWrapper(wrapper), eos_token=list(eos_token_ids))
    return ConstraintCompiler(lltokenizer, model_vocab_size)


def compiler_for_llama(llm: Any, eos_token_ids: Sequence[int]) -> ConstraintCompiler:
    """A compiler for a llama-cpp-python `Llama`: llguidance reads llama.cpp's vocabulary and tokenizer itself
    (llguidance.llamacpp), so token bytes and tokenization are llama.cpp's exactly."""
    import llama_cpp  # lazy: heavy: llama_cpp
    from llguidance.llamacpp import lltokenizer_from_vocab  # lazy: heavy: llguidance

    eos = list(eos_token_ids) or [int(llm.token_eos())]
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    with warnings.catch_warnings():  # llguidance asks each token's attributes through llama-cpp-python's
        # deprecated llama_token_get_attr: one DeprecationWarning per token (49,152 for the starter) otherwise
        warnings.simplefilter("ignore", DeprecationWarning)
        tokenizer = lltokenizer_from_vocab(vocab, eos_token=eos)
    return ConstraintCompiler(tokenizer, int(llm.n_vocab()))
