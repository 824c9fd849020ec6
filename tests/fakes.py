"""A scripted fake Backend for tests of anything that drives a Backend (TUI, server, chat session).

    backend = FakeBackend(replies=["Hello **world**", "Second reply"], token_delay_s=0.01)
    backend.fail_load = OutOfMemoryError("needs 9 GiB, 8 free")     # load() raises it
    backend.fail_next = ContextOverflowError("prompt 5000 > 4096")  # the next stream() raises it before STARTED
    backend.hold = threading.Event()                                # streams wait here between tokens until set

Replies are consumed in order (the last one repeats when they run out) and streamed one "token" at a time
(a token is a word with its leading space).  `abort(request_id)` ends that stream with FinishReason.ABORT at
the next token.  Every Request seen is kept in `requests`, so tests can check the prompt that was rendered.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

from backends.api import (
    Backend,
    Capabilities,
    EventKind,
    FinishReason,
    GenerationEvent,
    LoadOptions,
    ProgressCallback,
    Request,
    RequestStats,
)
from backends.modelspec import ModelSpec

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def fake_spec(
    name: str = "fake-model",
    chat_template: str | None = CHATML,
    context_length: int = 2048,
    path: str = "/nonexistent/fake.gguf",
) -> ModelSpec:
    """A ModelSpec that describes no real file (enough for templates, the TUI and planners' shapes)."""
    return ModelSpec(
        path=path,
        format="gguf",
        name=name,
        architecture="llama",
        n_layers=2,
        hidden_size=64,
        n_heads=4,
        n_kv_heads=2,
        head_dim=16,
        ffn_size=128,
        vocab_size=256,
        context_length=context_length,
        rope_base=1e4,
        rope_scaling={},
        rms_eps=1e-5,
        n_experts=0,
        n_experts_used=0,
        sliding_window=0,
        file_type="Q4_0",
        file_size_bytes=1_000_000,
        param_count=100_000,
        tensor_types={"Q4_0": 10},
        tensors=(),
        tied_embeddings=True,
        chat_template=chat_template,
        bos_token_id=1,
        eos_token_ids=(2,),
        pad_token_id=None,
        add_bos_token=False,
        add_eos_token=False,
        tokenizer_model="gpt2",
        tokenizer_pre="",
        bos_token_text="<s>",
        eos_token_text="</s>",
    )


def split_tokens(text: str) -> list[str]:
    """'a b  c' -> ['a', ' b', '  c']: words with the spaces before them, so ''.join() gives text back."""
    out: list[str] = []
    word = ""
    for ch in text:
        if ch.isspace() and word and not word.isspace():
            out.append(word)
            word = ""
        word += ch
    if word:
        out.append(word)
    return out


class FakeBackend(Backend):
    name = "fake"
    capabilities = Capabilities(prefix_cache=True, logits=False)

    def __init__(
        self,
        spec: ModelSpec | None = None,
        options: LoadOptions | None = None,
        *,
        replies: Sequence[str] = ("Hello from the fake backend.",),
        token_delay_s: float = 0.0,
        load_delay_s: float = 0.0,
    ) -> None:
        super().__init__(spec or fake_spec(), options or LoadOptions(n_ctx=2048))
        self.replies = list(replies)
        self.token_delay_s = token_delay_s  # sleep before each token
        self.load_delay_s = load_delay_s  # load() takes this long, reporting progress in 4 steps
        self.fail_load: Exception | None = None  # raised by load()
        self.fail_next: Exception | None = None  # raised by the next stream() before STARTED, then cleared
        self.error_mid_stream: str | None = None  # the next stream ends with FinishReason.ERROR after 1 token
        self.hold: threading.Event | None = None  # when set to an Event, each token waits for it
        self.requests: list[Request] = []  # every request streamed, in order
        self.loaded = False
        self.closed = False
        self._aborted: set[str] = set()
        self._reply_index = 0

    def load(self, progress: ProgressCallback | None = None) -> None:
        for step in range(4):
            if progress:
                progress(step / 4, f"loading fake weights {step + 1}/4")
            time.sleep(self.load_delay_s / 4)
        if self.fail_load is not None:
            raise self.fail_load
        if progress:
            progress(1.0, "loaded")
        self.loaded = True

    def close(self) -> None:
        self.closed = True
        self.loaded = False

    @property
    def n_ctx(self) -> int:
        return self.options.n_ctx

    def next_reply(self) -> str:
        reply = self.replies[min(self._reply_index, len(self.replies) - 1)]
        self._reply_index += 1
        return reply

    def stream(self, request: Request) -> Iterator[GenerationEvent]:
        assert self.loaded, "stream() before load()"
        self.requests.append(request)
        self.refuse_unsupported(request)  # as every backend's stream() does (the contract)
        if self.fail_next is not None:
            exc, self.fail_next = self.fail_next, None
            raise exc
        start = time.perf_counter()
        prompt_tokens = (
            len(self.tokenize(request.prompt or "")) if request.prompt else len(request.prompt_token_ids or ())
        )
        stats = RequestStats(prompt_tokens=prompt_tokens)
        yield GenerationEvent(EventKind.STARTED, request.request_id, stats=stats)
        tokens = split_tokens(self.next_reply())[: request.sampling.max_tokens]
        reason = FinishReason.STOP if len(tokens) < request.sampling.max_tokens else FinishReason.LENGTH
        error = None
        for i, tok in enumerate(tokens):
            if self.hold is not None:
                while not self.hold.wait(0.01):
                    if request.request_id in self._aborted:
                        break
            if self.token_delay_s:
                time.sleep(self.token_delay_s)
            if request.request_id in self._aborted:
                reason = FinishReason.ABORT
                break
            if self.error_mid_stream and i == 1:
                reason, error, self.error_mid_stream = FinishReason.ERROR, self.error_mid_stream, None
                break
            if i == 0:
                stats.ttft_s = time.perf_counter() - start
            stats.completion_tokens += 1
            yield GenerationEvent(EventKind.TOKEN, request.request_id, text=tok, token_ids=(100 + i,))
        stats.total_s = time.perf_counter() - start
        self._aborted.discard(request.request_id)
        yield GenerationEvent(EventKind.FINISHED, request.request_id, finish_reason=reason, stats=stats, error=error)

    def abort(self, request_id: str) -> None:
        self._aborted.add(request_id)

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        return [ord(c) % 256 for c in text]  # one token per character: context numbers are easy to check

    def detokenize(self, token_ids: Sequence[int]) -> str:
        return "".join(chr(t) for t in token_ids)

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "device": "cpu"}

    def memory_in_use(self) -> dict[str, int]:
        return {"rss_bytes": 123 * 2**20, "gpu_bytes": 0}


def loaded_fake(**kw: Any) -> FakeBackend:
    """A FakeBackend(**kw), already loaded (what the server tests start a live server on)."""
    backend = FakeBackend(**kw)
    backend.load()
    return backend
