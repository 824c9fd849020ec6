"""The one Backend contract every engine implements (llama.cpp, hearth's torch engine, test fakes).

Streaming first: `Backend.stream(request)` yields `GenerationEvent`s, always in the order
`STARTED`, `TOKEN`*, `FINISHED`; exactly one `FINISHED` ends every stream, whatever happens (stop string,
length, abort, error).  `generate()` only drains the stream.  `abort(request_id)` may be called from any thread
at any time; the stream then ends with `FinishReason.ABORT` and keeps the text generated so far.

Threading: `stream()` may be called from several threads at once.  A backend whose capabilities say
`concurrent_requests` batches them; any other backend serialises them behind a lock (the requests queue, in
arrival order), so callers never need to know which kind they hold.

Text in `TOKEN` events is the new, safely printable text: a multi-byte UTF-8 character split across tokens is
held back until complete, and text that might be the start of a stop string is held back until it is known
not to be one, so a stop string is never shown.

Nothing here imports torch or llama_cpp: the contract is pure Python, importable from the TUI.
"""

from __future__ import annotations

import enum
import itertools
import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

from backends.describe import Description
from backends.errors import InvalidRequestError
from backends.load_options import (
    Capabilities,
    LoadOptions,
)
from backends.priority import (  # noqa: F401 - the priority constants are the contract's, re-exported
    API_PRIORITY,
    INTERACTIVE_PRIORITY,
    PRIORITY_MAX,
    PRIORITY_MIN,
    PriorityLock,
)

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np

    from backends.modelspec import ModelSpec

ProgressCallback = Callable[[float, str], None]
"""Called while loading with (fraction done in 0..1, what is happening)."""


MAX_TOP_LOGPROBS = 20  # OpenAI's limit for top_logprobs
MAX_LOGIT_BIAS = 1024  # entries in one request's logit_bias (OpenAI documents no cap; this bounds the work)
SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1  # a seed is any 64-bit integer, signed or unsigned (as OpenAI's API takes)


def seed_u64(seed: int) -> int:
    """A 64-bit seed, signed or unsigned, as the unsigned value with the same bits (-1 -> 2**64 - 1): the range
    torch.Generator.manual_seed takes, so every seed SamplingParams accepts reaches a sampler unchanged or
    two's-complement mapped."""
    return seed % 2**64


@dataclass(frozen=True)
class SamplingParams:
    """How to pick each next token.  Defaults follow llama.cpp's and Ollama's."""

    temperature: float = 0.8  # 0 = greedy (argmax); > 0 scales logits by 1/temperature
    top_p: float = 0.95  # nucleus: keep the smallest set of tokens whose probability sums to >= top_p; 1 = off
    top_k: int = 40  # keep the k most likely tokens; 0 = off
    min_p: float = 0.05  # drop tokens whose probability is below min_p x the best token's; 0 = off
    repeat_penalty: float = 1.0  # > 1 divides positive logits (multiplies negative) of tokens already seen
    seed: int | None = None  # same seed + same prompt + same params = same reply; None = random; any 64-bit int
    max_tokens: int = 512  # most tokens to generate; the reply ends with FinishReason.LENGTH when reached
    stop: tuple[str, ...] = ()  # strings that end the reply; the stop string itself is not returned
    ignore_eos: bool = False  # keep generating past end-of-sequence tokens (benchmarks want fixed lengths)
    # OpenAI's penalties, over the tokens generated so far (not the prompt), applied to the logits before the
    # filters: presence subtracts its value once from every token that appeared, frequency subtracts its value x
    # the number of times it appeared.  -2..2; 0 = off
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    # (token id, bias) pairs added to the logits before sampling (OpenAI's logit_bias: -100..100; -100 bans a
    # token, 100 all but forces it).  A dict is accepted and stored sorted by token id
    logit_bias: tuple[tuple[int, float], ...] = ()
    # None = no log-probabilities; k = 0..MAX_TOP_LOGPROBS: each generated token's log-probability plus the k most
    # likely tokens at that step (OpenAI's logprobs=true + top_logprobs=k on chat, logprobs=k on completions)
    logprobs: int | None = None
    # the log-probability of every prompt token given the ones before it (completions' echo + logprobs)
    prompt_logprobs: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.stop, (list, str)):
            object.__setattr__(self, "stop", (self.stop,) if isinstance(self.stop, str) else tuple(self.stop))
        if isinstance(self.logit_bias, dict):
            object.__setattr__(self, "logit_bias", tuple(sorted(self.logit_bias.items())))
        elif not isinstance(self.logit_bias, tuple):
            object.__setattr__(self, "logit_bias", tuple(tuple(pair) for pair in self.logit_bias))
        self.validate()

    def validate(self) -> None:
        """Raise InvalidRequestError naming the first bad value."""
        checks: list[tuple[bool, str]] = [
            (self.temperature >= 0, f"temperature must be >= 0, got {self.temperature}"),
            (0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p}"),
            (self.top_k >= 0, f"top_k must be >= 0, got {self.top_k}"),
            (0 <= self.min_p <= 1, f"min_p must be in [0, 1], got {self.min_p}"),
            (self.repeat_penalty > 0, f"repeat_penalty must be > 0, got {self.repeat_penalty}"),
            (self.max_tokens >= 1, f"max_tokens must be >= 1, got {self.max_tokens}"),
            (all(isinstance(s, str) and s for s in self.stop), f"stop strings must be non-empty, got {self.stop!r}"),
            (
                self.seed is None
                or (
                    isinstance(self.seed, int) and not isinstance(self.seed, bool) and SEED_MIN <= self.seed <= SEED_MAX
                ),
                f"seed must be a 64-bit integer, signed or unsigned ({SEED_MIN} .. {SEED_MAX}), got {self.seed!r}",
            ),
            (-2 <= self.presence_penalty <= 2, f"presence_penalty must be in [-2, 2], got {self.presence_penalty}"),
            (-2 <= self.frequency_penalty <= 2, f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty}"),
            (
                len(self.logit_bias) <= MAX_LOGIT_BIAS,
                f"logit_bias has {len(self.logit_bias)} entries; at most {MAX_LOGIT_BIAS} are allowed",
            ),
            (
                all(
                    len(pair) == 2
                    and isinstance(pair[0], int)
                    and not isinstance(pair[0], bool)
                    and pair[0] >= 0
                    and isinstance(pair[1], (int, float))
                    and -100 <= pair[1] <= 100
                    for pair in self.logit_bias
                ),
                "logit_bias maps token ids (integers >= 0) to biases in [-100, 100]",
            ),
            (
                self.logprobs is None
                or (
                    isinstance(self.logprobs, int)
                    and not isinstance(self.logprobs, bool)
                    and 0 <= self.logprobs <= MAX_TOP_LOGPROBS
                ),
                f"top logprobs must be an integer in [0, {MAX_TOP_LOGPROBS}], got {self.logprobs!r}",
            ),
        ]
        for ok, message in checks:
            if not ok:
                raise InvalidRequestError(message)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def penalized(self) -> bool:
        """Whether any logit is changed before the filters (repeat/presence/frequency penalty, logit_bias)."""
        return (
            self.repeat_penalty != 1.0
            or self.presence_penalty != 0.0
            or self.frequency_penalty != 0.0
            or bool(self.logit_bias)
        )


def peak_rss_bytes() -> int:
    """The highest resident memory of this process so far (Linux VmHWM; the current RSS elsewhere)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    import psutil  # lazy: keeps `hearth --help` light (+psutil)

    return int(psutil.Process().memory_info().rss)


_request_counter = itertools.count()


def new_request_id(prefix: str = "req") -> str:
    """A process-unique request id."""
    return f"{prefix}-{next(_request_counter)}"


@dataclass(frozen=True)
class ToolCall:
    """One function call an assistant message made (OpenAI's `tool_calls[i]`, type "function")."""

    id: str  # "call_..." as the server gave it; a tool message answers it by this id
    name: str  # the function's name
    arguments: str  # the arguments as JSON text, as the model wrote them (OpenAI sends text, not an object)


@dataclass(frozen=True)
class ChatMessage:
    """One message of a conversation, as chat templates and OpenAI-compatible servers take it.

    The tool fields default to empty, so a message of a plain conversation (and every one saved before tool
    calls existed) is what it was: role and content."""

    role: str  # "system" | "user" | "assistant" | "tool"
    content: str  # "" for an assistant message that only calls tools (OpenAI's content null)
    tool_calls: tuple[ToolCall, ...] = ()  # assistant: the calls it made, in order
    tool_call_id: str | None = None  # tool: the id of the call this message answers
    name: str | None = None  # tool: the function's name (some templates print it)

    def __post_init__(self) -> None:
        if not isinstance(self.tool_calls, tuple):
            object.__setattr__(self, "tool_calls", tuple(self.tool_calls))


@dataclass(frozen=True)
class Constraint:
    """What the generated text must be, enforced token by token by constrained decoding (a grammar mask in the
    sampler): `prefix`, then one JSON value, then `suffix`, then end of sequence.

    kind "json_object": any JSON object (OpenAI's response_format json_object).
    kind "json_schema": a JSON value valid against `schema`, the JSON text of a JSON Schema (response_format
    json_schema; tool calls with tool_choice "required" or a named function build one from the tools' schemas).
    `prefix` / `suffix` are literal text around it (a tool-call format's `<tool_call>\n` ... `\n</tool_call>`).

    When max_tokens cuts the text off first, the stream ends with FinishReason.LENGTH and the text is a prefix
    of a valid output.  A backend that cannot honour a constraint refuses the request (InvalidRequestError),
    never ignores it.
    """

    kind: str  # "json_object" | "json_schema"
    schema: str | None = None  # kind "json_schema": the schema as JSON text (hashable, crosses processes as is)
    prefix: str = ""
    suffix: str = ""

    KINDS: ClassVar[tuple[str, ...]] = ("json_object", "json_schema")

    def __post_init__(self) -> None:
        if self.kind not in self.KINDS:
            raise InvalidRequestError(f"constraint kind must be one of {', '.join(self.KINDS)}, got {self.kind!r}")
        if (self.kind == "json_schema") != (self.schema is not None):
            raise InvalidRequestError("a json_schema constraint needs a schema, and only it takes one")


@dataclass(frozen=True)
class TokenLogprob:
    """One token's log-probability, and the most likely tokens at its position.

    Log-probabilities are of the model's own distribution (log-softmax of the raw logits), before penalties,
    logit_bias, temperature and the top-k/top-p/min-p filters, as vLLM's and OpenAI's APIs report them."""

    token_id: int
    logprob: float | None  # None only for the first prompt token (nothing comes before it)
    top: tuple[tuple[int, float], ...] = ()  # (token id, logprob) best first: SamplingParams.logprobs of them
    # The bytes of token_id and of each `top` token, in order, as the backend's tokenizer has them (special
    # tokens as their text): the API reports a token's text and bytes, and only the backend holds the tokenizer
    token_bytes: bytes = b""
    top_bytes: tuple[bytes, ...] = ()


@dataclass(frozen=True)
class Request:
    """One generation: a prompt (text or token ids) and how to sample its continuation.

    Exactly one of `prompt` and `prompt_token_ids` is set.  A text prompt is tokenized by the backend with
    `add_special` (BOS where the model's metadata asks for it) and with special tokens in the text parsed as
    special (chat templates emit `<|im_start|>` and the like as text).

    A chat request (app/requests.py builds every one) also carries the messages its prompt was rendered from:
    local engines read the prompt; a backend that applies the chat template itself (the remote backend, whose
    server renders with the model's own template) reads the messages.
    """

    prompt: str | None = None
    prompt_token_ids: tuple[int, ...] | None = None
    sampling: SamplingParams = field(default_factory=SamplingParams)
    request_id: str = field(default_factory=new_request_id)
    add_special: bool = True  # add BOS (per the model's add_bos_token) when tokenizing a text prompt
    messages: tuple[ChatMessage, ...] | None = None  # the conversation `prompt` was rendered from; None = raw
    constraint: Constraint | None = None  # constrained decoding (structured outputs, forced tool calls)
    # the OpenAI `tools` array and `tool_choice` as JSON text, for a backend that applies the chat template
    # itself (remote); local engines read the prompt, where the tools are rendered already.  None = no tools
    tools: str | None = None
    tool_choice: str | None = None
    # scheduling rank (vLLM's `priority`): lower runs first, then earlier arrival; PRIORITY_MIN..PRIORITY_MAX.
    # The torch engine admits and preempts by it; llama.cpp orders its queue by it (backends/priority.py)
    priority: int = API_PRIORITY

    def __post_init__(self) -> None:
        if (
            not isinstance(self.priority, int)
            or isinstance(self.priority, bool)
            or not PRIORITY_MIN <= self.priority <= PRIORITY_MAX
        ):
            raise InvalidRequestError(
                f"priority must be an integer from {PRIORITY_MIN} to {PRIORITY_MAX} (lower runs first), "
                f"got {self.priority!r}"
            )
        if (self.prompt is None) == (self.prompt_token_ids is None):
            raise InvalidRequestError("a request needs exactly one of prompt and prompt_token_ids")
        if self.prompt_token_ids is not None:
            object.__setattr__(self, "prompt_token_ids", tuple(int(t) for t in self.prompt_token_ids))
            if not self.prompt_token_ids:
                raise InvalidRequestError("prompt_token_ids is empty")
        if self.messages is not None:
            object.__setattr__(self, "messages", tuple(self.messages))


class FinishReason(str, enum.Enum):
    """Why a stream ended.  The values are the OpenAI API's where it has one."""

    STOP = "stop"  # an end-of-sequence token or a stop string
    LENGTH = "length"  # max_tokens reached, or the context is full
    ABORT = "abort"  # abort(request_id) was called (user pressed Esc, client disconnected)
    ERROR = "error"  # the backend failed mid-stream; GenerationEvent.error says how


@dataclass
class RequestStats:
    """What one request cost.  Times are seconds of wall clock measured by the backend."""

    prompt_tokens: int = 0  # tokens in the prompt, BOS included
    completion_tokens: int = 0  # tokens generated (the stop token included when one ended the reply)
    cached_tokens: int = 0  # prompt tokens whose KV came from the prefix cache (torch engine)
    ttft_s: float = 0.0  # request submitted -> first generated token available
    queue_s: float = 0.0  # request submitted -> its prefill started (waiting behind others)
    total_s: float = 0.0  # request submitted -> finished
    spec_proposed_tokens: int = 0  # speculative decoding (torch engine): proposals verified for this request
    spec_accepted_tokens: int = 0  # of which accepted (each saved one decode step)

    @property
    def decode_s(self) -> float:
        return max(self.total_s - self.ttft_s, 0.0)

    @property
    def decode_tokens_per_s(self) -> float:
        """Tokens per second after the first one (the first one's cost is the prefill)."""
        n = self.completion_tokens - 1
        return n / self.decode_s if n > 0 and self.decode_s > 0 else 0.0

    @property
    def prefill_tokens_per_s(self) -> float:
        computed = self.prompt_tokens - self.cached_tokens
        prefill_s = self.ttft_s - self.queue_s
        return computed / prefill_s if computed > 0 and prefill_s > 0 else 0.0

    def as_dict(self) -> dict[str, float | int]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "cached_tokens": self.cached_tokens,
            "ttft_s": round(self.ttft_s, 6),
            "queue_s": round(self.queue_s, 6),
            "total_s": round(self.total_s, 6),
            "decode_tokens_per_s": round(self.decode_tokens_per_s, 3),
            "prefill_tokens_per_s": round(self.prefill_tokens_per_s, 3),
        }


class EventKind(str, enum.Enum):
    STARTED = "started"  # the request was accepted; stats.prompt_tokens (and cached_tokens) are known
    TOKEN = "token"  # new text (possibly empty while held back) and the token ids behind it
    FINISHED = "finished"  # the last event: finish_reason and final stats are set


@dataclass
class GenerationEvent:
    kind: EventKind
    request_id: str
    text: str = ""  # TOKEN: the new printable text since the previous event
    token_ids: tuple[int, ...] = ()  # TOKEN: the token ids generated since the previous event
    finish_reason: FinishReason | None = None  # FINISHED only
    stats: RequestStats | None = None  # STARTED (partial) and FINISHED (final)
    error: str | None = None  # FINISHED with FinishReason.ERROR: one-line message
    # FINISHED with FinishReason.ERROR: what kind of failure, for front ends that map it (HTTP status, TUI notice):
    # "runner_crashed" (the runner process died or stopped answering), "constraint_limit" (the request's constraint
    # hit llguidance's per-step limits mid-reply: the schema's fault, a 400), None for the backend's other errors
    error_code: str | None = None
    # TOKEN, when sampling.logprobs is set: one entry per id in token_ids, in order
    logprobs: tuple[TokenLogprob, ...] = ()
    # STARTED, when sampling.prompt_logprobs is set: one entry per prompt token (the first one's logprob None)
    prompt_logprobs: tuple[TokenLogprob, ...] = ()


@dataclass
class Completion:
    """A drained stream: what `Backend.generate()` returns."""

    request_id: str
    text: str
    token_ids: tuple[int, ...]
    finish_reason: FinishReason
    stats: RequestStats
    error: str | None = None
    error_code: str | None = None  # GenerationEvent.error_code of the FINISHED event
    logprobs: tuple[TokenLogprob, ...] = ()  # the TOKEN events' logprobs, in order
    prompt_logprobs: tuple[TokenLogprob, ...] = ()  # the STARTED event's


@dataclass(frozen=True)
class EngineStats:
    """One snapshot of a loaded engine's state, published by the backend: /metrics and the TUI read this and
    nothing else.  Counters a backend does not have stay 0 (llama.cpp has no paged KV pool)."""

    running: int = 0  # requests generating now
    waiting: int = 0  # requests queued inside the backend
    kv_blocks: int = 0  # KV pool size in blocks (torch engine); 0 = no paged pool
    kv_blocks_free: int = 0  # free blocks in that pool
    kv_block_size: int = 0  # tokens per block
    prefix_cached_blocks: int = 0  # blocks that hold a reusable prompt prefix
    prefix_hit_tokens: int = 0  # prompt tokens served from the prefix cache since load
    preemptions: int = 0  # requests preempted (for KV space or for a higher priority) since load
    preemptions_swapped: int = 0  # of which swapped out to host RAM (the others recomputed; torch engine on GPU)
    swapped_out_blocks: int = 0  # KV blocks copied to host RAM since load
    swapped_in_blocks: int = 0  # KV blocks copied back since load
    deferred: int = 0  # running requests held back a step by the TTFT plan since load (torch engine)
    generated_tokens: int = 0  # tokens generated since load
    spec_proposed_tokens: int = 0  # speculative decoding: proposed tokens verified since load (torch engine)
    spec_accepted_tokens: int = 0  # of which the target accepted
    rss_bytes: int = 0  # resident memory of the process that holds the model
    peak_rss_bytes: int = 0  # the highest resident memory that process has had (VmHWM): loading's peaks count
    gpu_bytes: int = 0  # GPU memory that process holds (0 without a GPU)


class Backend(ABC):
    """A loaded model that generates text.  Subclasses set `name` and `capabilities`.

    Lifecycle: `__init__(spec, options)` does no heavy work; `load(progress)` loads the weights (raising
    OutOfMemoryError / ModelLoadError / UnsupportedArchitectureError); then any number of `stream()` calls;
    `close()` frees memory, is idempotent, and is also called by `__exit__`.
    """

    name: ClassVar[str] = "abstract"
    capabilities: ClassVar[Capabilities] = Capabilities()

    def on_notice(self, text: str) -> None:
        """Called with a one-line notice about the backend itself, not about one request (a runner that crashed
        and is restarting, a configuration the runner fell back to).  A front end that shows them assigns its
        own callable (`backend.on_notice = post`); the default drops them.  May be called from any thread."""
        return None  # the no-op default (not abstract: most backends have nothing to tell)

    def __init__(self, spec: ModelSpec, options: LoadOptions | None = None) -> None:
        self.spec = spec
        self.options = options or LoadOptions()
        # engines that serve one request at a time take turns by priority, then arrival (backends/priority.py)
        self._serial = PriorityLock()

    # -- lifecycle ---------------------------------------------------------------------------------------
    @abstractmethod
    def load(self, progress: ProgressCallback | None = None) -> None:
        """Load the weights and allocate the context.  Idempotent."""

    @abstractmethod
    def close(self) -> None:
        """Free everything the backend holds.  Idempotent; aborts running streams first."""

    def unload(self) -> bool:
        """Free the model's memory while idle, keeping this backend usable: the next call loads it again (what
        Ollama's keep_alive does).  Returns False when this backend cannot (the default: it stays loaded), or
        when requests are running.  `resident` says which state it is in."""
        return False

    @property
    def resident(self) -> bool:
        """False only between an unload() and the next load (see unload)."""
        return True

    def __enter__(self) -> Backend:
        self.load()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- generation --------------------------------------------------------------------------------------
    @abstractmethod
    def stream(self, request: Request) -> Iterator[GenerationEvent]:
        """Generate, yielding STARTED, TOKEN*, FINISHED.  Raises ContextOverflowError before STARTED when the
        prompt does not fit the context; errors after STARTED end the stream with FinishReason.ERROR."""

    def refuse_unsupported(self, request: Request) -> None:
        """Raise InvalidRequestError when the request asks for something this backend's capabilities lack
        (a constraint, log-probabilities): a request is honoured or refused, never silently half-served.
        Every backend's stream() calls this before STARTED."""
        caps = self.capabilities
        if request.constraint is not None and not caps.constraints:
            raise InvalidRequestError(
                f"the {self.name} backend does not support constrained decoding (response_format, forced tool calls)"
            )
        wants_logprobs = request.sampling.logprobs is not None or request.sampling.prompt_logprobs
        if wants_logprobs and not caps.logprobs:
            raise InvalidRequestError(f"the {self.name} backend does not return log-probabilities")

    @abstractmethod
    def abort(self, request_id: str) -> None:
        """Stop a running or queued request; unknown or finished ids are ignored."""

    def generate(self, request: Request) -> Completion:
        """Drain `stream(request)` into one Completion."""
        parts: list[str] = []
        ids: list[int] = []
        logprobs: list[TokenLogprob] = []
        prompt_logprobs: tuple[TokenLogprob, ...] = ()
        for event in self.stream(request):
            if event.kind is EventKind.STARTED:
                prompt_logprobs = event.prompt_logprobs
            elif event.kind is EventKind.TOKEN:
                parts.append(event.text)
                ids.extend(event.token_ids)
                logprobs.extend(event.logprobs)
            elif event.kind is EventKind.FINISHED:
                assert event.finish_reason is not None and event.stats is not None
                return Completion(
                    request.request_id,
                    "".join(parts),
                    tuple(ids),
                    event.finish_reason,
                    event.stats,
                    event.error,
                    event.error_code,
                    tuple(logprobs),
                    prompt_logprobs,
                )
        raise AssertionError(f"{self.name} stream ended without a FINISHED event")  # contract violation

    # -- tokens and scores -------------------------------------------------------------------------------
    @abstractmethod
    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """Token ids of `text`; `add_special` adds BOS where the model's metadata asks for it."""

    @abstractmethod
    def detokenize(self, token_ids: Sequence[int]) -> str:
        """Text of token ids (special tokens rendered as their text)."""

    def embed(self, inputs: Sequence[Sequence[int]]) -> np.ndarray:
        """One embedding per input (token ids, special tokens included as the caller tokenized them): a float32
        array of shape (len(inputs), hidden), each row the model's last hidden states (after the final norm)
        pooled as `spec.pooling` says ("mean" unless the GGUF names its own: cls, last) and L2-normalized, as
        llama.cpp's embedding mode and Ollama give them.  Each input must fit `n_ctx`; raises
        ContextOverflowError naming the input otherwise.  Backends whose capabilities lack `embeddings` raise
        InvalidRequestError."""
        raise InvalidRequestError(f"the {self.name} backend does not compute embeddings")

    def logits(self, token_ids: Sequence[int]) -> np.ndarray:
        """Raw next-token logits after every position: float32 array of shape (len(token_ids), vocab).
        Used by `hearth ppl` (perplexity, KL divergence between backends or quants).  Must fit n_ctx."""
        raise NotImplementedError(f"the {self.name} backend does not return logits")

    # -- facts -------------------------------------------------------------------------------------------
    @property
    @abstractmethod
    def n_ctx(self) -> int:
        """The context length actually loaded, in tokens."""

    @property
    def eos_token_ids(self) -> frozenset[int]:
        return frozenset(self.spec.eos_token_ids)

    def describe(self) -> Description:
        """What was loaded, for --verbose and the TUI: backend, model, context, and the engine's own facts
        (device, layers on GPU, KV type, ...): see backends/describe.py."""
        return Description(self.name, self.spec.name, self.n_ctx)

    def stats(self) -> EngineStats:
        """The engine's current state (see EngineStats); the base class knows only memory."""
        memory = self.memory_in_use()
        return EngineStats(
            rss_bytes=memory.get("rss_bytes", 0), gpu_bytes=memory.get("gpu_bytes", 0), peak_rss_bytes=peak_rss_bytes()
        )

    def memory_in_use(self) -> dict[str, int]:
        """Bytes held: {'rss_bytes': ..., 'gpu_bytes': ...} (gpu_bytes 0 without a GPU)."""
        import psutil  # lazy: keeps `hearth --help` light (+psutil)

        return {"rss_bytes": psutil.Process(os.getpid()).memory_info().rss, "gpu_bytes": 0}
