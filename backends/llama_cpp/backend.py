"""The GGUF fallback backend: llama-cpp-python behind hearth's Backend contract.

What it maps from LoadOptions: n_ctx, n_gpu_layers, split_mode (none/layer/row/tensor = 0/1/2/3),
tensor_split, main_gpu, KV-cache type (type_k / type_v), flash attention, threads, n_batch, logits_all, and
cpu_expert_layers (a MoE model's first blocks' routed experts in host RAM: backends/llama_cpp/overrides.py).
A quantized V cache needs flash attention in llama.cpp ("Failed to create llama_context" otherwise), so a
q8_0/q4_0 KV type turns flash attention on, and `describe()` says so.

One llama.cpp context serves one sequence, so requests are served one after another behind a lock (they queue
in arrival order); its own prefix reuse keeps the shared start of a multi-turn chat, reported as cached_tokens.
Every call into llama.cpp that computes (load, eval, each generated token, close) runs on one thread of the
backend's own (backends/llama_cpp/one_thread.py explains the 2x it saves).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import threading
import time
from collections.abc import Generator, Iterator, Sequence
from typing import Any

from backends.api import (
    Backend,
    Description,
    EngineStats,
    EventKind,
    FinishReason,
    GenerationEvent,
    LoadOptions,
    ProgressCallback,
    Request,
    RequestStats,
    TokenLogprob,
)
from backends.constrained import compiler_for_llama
from backends.embeddings import is_embedding_model, not_for_chat, pooling_type
from backends.engine_capabilities import LLAMA_CPP
from backends.engine_options import LlamaCppOptions
from backends.errors import (
    ContextOverflowError,
    InvalidRequestError,
    ModelLoadError,
    OutOfMemoryError,
)
from backends.llama_cpp.embedding import EmbeddingContext
from backends.llama_cpp.extra_bufts import extra_bufts_default
from backends.llama_cpp.loading import KV_TYPES as KV_TYPES
from backends.llama_cpp.loading import SPLIT_MODES as SPLIT_MODES
from backends.llama_cpp.loading import gpu_offload_supported as gpu_offload_supported
from backends.llama_cpp.loading import known_architectures as known_architectures
from backends.llama_cpp.loading import llama_kwargs, new_llama, refuse_unloadable
from backends.llama_cpp.loading import open_llama as open_llama
from backends.llama_cpp.one_thread import OneThread
from backends.llama_cpp.overrides import cpu_expert_overrides
from backends.llama_cpp.sampling import Sampling, start_sampling
from backends.llama_cpp.threads import LlamaThreads, threads_to_use
from backends.llama_cpp.tokens import tokenize
from backends.llama_cpp.turns import PieceSizer, common_prefix, park, prefill_piece, resume
from backends.modelspec import ModelSpec
from backends.priority import effective_priority
from hwprobe.spare_cores import SpareCores

# (the "X as X" imports above: what Llama() is built with, importable from here as before it moved to loading.py)


class LlamaCppBackend(Backend):
    name = "llama.cpp"
    capabilities = LLAMA_CPP

    def __init__(self, spec: ModelSpec, options: LoadOptions | None = None) -> None:
        super().__init__(spec, options)
        self._llm: Any = None
        self._aborted: set[str] = set()
        self._abort_lock = threading.Lock()
        self._notes: list[str] = []
        self._threads: LlamaThreads | None = None  # the count llama.cpp computes with, once loaded (threads.py)
        self._running: str | None = None  # the request holding the context
        self._active: set[str] = set()  # requests holding or waiting to take back the context (preempted ones)
        self._preemptions = 0  # turns given to a better-ranked request since load (EngineStats.preemptions)
        self._waited: dict[str, float] = {}  # request id -> seconds it has waited for the context so far
        self._worker = OneThread("hearth-llama-cpp")
        self._extra_bufts: bool | None = None  # as loaded
        self._overrides: Any = None  # overrides.BuftOverrides the loaded model was given (kept alive)
        self._constraints: Any = None  # backends.constrained.ConstraintCompiler, built at the first constraint
        self._constraints_lock = threading.Lock()
        self._bytes_of: dict[int, bytes] = {}  # token id -> its bytes (special tokens as text), for logprobs
        self._embedder: Any = None  # backends/llama_cpp/embedding.EmbeddingContext, made at the first embed()
        self._embedding_model = is_embedding_model(spec)

    # -- lifecycle ---------------------------------------------------------------------------------------
    def load(self, progress: ProgressCallback | None = None) -> None:
        if self._llm is not None:
            return
        refuse_unloadable(self.spec)
        spare = SpareCores()  # what other processes leave free while this loads: the thread count (threads.py)
        import llama_cpp  # lazy: heavy: llama_cpp

        o = self.options
        typed = LlamaCppOptions.of(o)  # this engine's own values, typed (checked at the command line already)
        flash_attn = self._flash_attn(typed)
        if progress:
            progress(0.05, f"loading {os.path.basename(self.spec.path)} with llama.cpp")
        kwargs = llama_kwargs(self.spec, o, typed, flash_attn, self._embedding_model)
        self._choose_extra_bufts(typed)
        self._overrides = cpu_expert_overrides(o.cpu_expert_layers) if self.spec.n_experts else None
        if o.cpu_expert_layers and self._overrides is None:
            self._notes.append(f"cpu_expert_layers={o.cpu_expert_layers} ignored: {self.spec.name} has no experts")
        self._llm = self._build(llama_cpp.Llama, kwargs)
        self._use_threads(spare())
        if self._embedding_model:
            llm = self._llm
            self._embedder = self._worker.call(
                lambda: EmbeddingContext(llm._model, llm._ctx, self.n_ctx, o.verbose, owned=False)
            )
        if progress:
            progress(1.0, "ready")

    def _flash_attn(self, typed: LlamaCppOptions) -> bool:
        """Flash attention as asked, or on (with a note) for a quantized KV cache: llama.cpp needs it for a
        quantized V cache ("Failed to create llama_context" otherwise)."""
        if typed.kv_cache_type not in ("f16", "bf16", "f32") and not typed.flash_attn:
            self._notes.append(f"flash attention on: llama.cpp needs it for a {typed.kv_cache_type} V cache")
            return True
        return typed.flash_attn

    def _choose_extra_bufts(self, typed: LlamaCppOptions) -> None:
        """Extra weight-buffer types as asked, else by this machine's rule (extra_bufts.py); a note when off."""
        if typed.extra_bufts is None:
            self._extra_bufts, why = extra_bufts_default()
        else:
            self._extra_bufts, why = typed.extra_bufts, "as asked"
        if not self._extra_bufts:
            self._notes.append(f"extra weight-buffer types {why if why.startswith('off') else 'off: ' + why}")

    def _build(self, llama: Any, kwargs: dict[str, Any]) -> Any:
        """`llama(path, **kwargs)` on the backend's thread, its failures as hearth's errors."""
        o = self.options
        try:
            return self._worker.call(new_llama, llama, self.spec.path, kwargs, self._extra_bufts, self._overrides)
        except MemoryError as exc:
            raise OutOfMemoryError(
                f"out of memory loading {self.spec.name} with n_ctx={o.n_ctx}, n_gpu_layers={o.n_gpu_layers}: {exc}",
                "try a smaller --ctx or fewer --n-gpu-layers (see `hearth plan`)",
            ) from None
        except ValueError as exc:
            # llama-cpp-python raises ValueError for both a failed model load and a failed context; the file
            # header was already validated, so this is memory or an option llama.cpp rejected.
            raise ModelLoadError(
                f"llama.cpp could not load {self.spec.path} (n_ctx={o.n_ctx}, "
                f"n_gpu_layers={o.n_gpu_layers}, kv={o.kv_cache_type}): {exc}",
                "likely out of memory: try a smaller --ctx or fewer --n-gpu-layers; run with "
                "--verbose to see llama.cpp's log",
            ) from None

    def _use_threads(self, spare: float | None) -> None:
        llm, adaptive = self._llm, self.options.adaptive_threads
        asked = self.options.n_threads or llm.n_threads
        start, note = threads_to_use(asked, adaptive, spare)
        if note is not None:
            self._notes.append(note)
        self._threads = self._worker.call(LlamaThreads, llm, asked, adaptive, start)

    def _describe_threads(self) -> dict[str, Any]:
        """The same keys as the torch engine's (hearth bench reads cpu_threads)."""
        tuner = self._threads.tuner if self._threads is not None else None
        if tuner is None:
            return {"cpu_threads": self._thread_count(), "cpu_threads_policy": "fixed"}
        return tuner.describe()

    def _require_threads(self) -> LlamaThreads:
        assert self._threads is not None, "generate after load"
        return self._threads

    def _thread_count(self) -> int | None:
        return self._threads.threads if self._threads is not None else self.options.n_threads

    def close(self) -> None:
        llm, self._llm = self._llm, None
        if llm is not None:
            for rid in list(self._active):  # the running one and any preempted one waiting for its turn back
                self.abort(rid)
            with self._serial:  # the running generation stops at its next token, then the context is freed
                embedder, self._embedder = self._embedder, None
                if embedder is not None:
                    self._worker.call(embedder.close)
                self._worker.call(llm.close)
        self._worker.stop()

    @property
    def n_ctx(self) -> int:
        # llama.cpp may pad its context up (to 256), but llama-cpp-python sizes its token buffers by the
        # n_ctx asked for: the smaller one is the real limit.
        n = min(self._llm.n_ctx(), self.options.n_ctx) if self._llm is not None else self.options.n_ctx
        if self._embedding_model and self.spec.context_length:  # an encoder has positions for this many, no more
            n = min(n, self.spec.context_length)
        return n

    def _require(self) -> Any:
        if self._llm is None:
            raise ModelLoadError("the llama.cpp backend is not loaded", "call load() first")
        return self._llm

    # -- tokens ------------------------------------------------------------------------------------------
    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        return tokenize(self._require(), text, add_special, parse_special)

    def detokenize(self, token_ids: Sequence[int]) -> str:
        return self._require().detokenize(list(token_ids), special=True).decode("utf-8", errors="replace")

    def _token_bytes(self, token_ids: Sequence[int]) -> bytes:
        # special=False: control tokens (end-of-turn markers) never show up in a reply's text.
        return self._require().detokenize(list(token_ids), special=False)

    def _one_token_bytes(self, token_id: int) -> bytes:
        """A token's bytes as the API reports them (special tokens as their text); cached per id."""
        b = self._bytes_of.get(token_id)
        if b is None:
            b = self._bytes_of[token_id] = self._require().detokenize([token_id], special=True)
        return b

    def logits(self, token_ids: Sequence[int]) -> Any:
        import numpy as np  # lazy: heavy: numpy

        llm = self._require()
        ids = list(token_ids)
        if not self.options.logits_all:
            raise ModelLoadError(
                "logits for every position need the model loaded with logits_all",
                "load with LoadOptions(logits_all=True) (hearth ppl does)",
            )
        if len(ids) > self.n_ctx:
            raise ContextOverflowError(
                f"{len(ids)} tokens do not fit the context of {self.n_ctx}",
                "use a smaller window (--ctx) or load a larger context",
            )

        def run() -> Any:
            llm.reset()
            llm.eval(ids)
            out = np.array(llm.scores[: len(ids)], dtype=np.float32, copy=True)
            llm.reset()
            return out

        with self._serial:
            return self._worker.call(run)

    def embed(self, inputs: Sequence[Sequence[int]]) -> Any:
        """llama.cpp's embedding mode (backends/llama_cpp/embedding.py): a chat model gets a second context on
        its loaded weights at the first call, of the chat context's size; an encoder uses its own context."""
        llm = self._require()
        vocab = llm.n_vocab()
        for i, ids in enumerate(inputs):
            bad = next((t for t in ids if not 0 <= t < vocab), None)
            if bad is not None:
                raise InvalidRequestError(
                    f"input {i}: token id {bad} is outside the vocabulary of {vocab} tokens",
                    f"send token ids from 0 to {vocab - 1}",
                )
        with self._serial:  # one request at a time on llama.cpp's thread, in arrival order with the chats
            if self._embedder is None:
                o = self.options
                try:
                    self._embedder = self._worker.call(
                        EmbeddingContext.new,
                        llm._model,
                        self.n_ctx,
                        pooling_type(self.spec),
                        self._thread_count(),
                        o.verbose,
                    )
                except ValueError as exc:  # llama.cpp could not make the context: memory, most likely
                    raise OutOfMemoryError(
                        f"llama.cpp could not make an embedding context of {self.n_ctx} tokens: {exc}",
                        "load the model with a smaller --ctx",
                    ) from None
            embedder = self._embedder
            try:
                return self._worker.call(embedder.embed, [list(ids) for ids in inputs])
            except RuntimeError as exc:  # llama_decode failed
                raise ModelLoadError(f"llama.cpp failed while embedding: {exc}") from None

    # -- generation --------------------------------------------------------------------------------------
    def abort(self, request_id: str) -> None:
        with self._abort_lock:
            self._aborted.add(request_id)

    def _is_aborted(self, request_id: str) -> bool:
        with self._abort_lock:
            return request_id in self._aborted

    def _prompt_ids(self, request: Request) -> list[int]:
        if request.prompt_token_ids is not None:
            return list(request.prompt_token_ids)
        assert request.prompt is not None
        return self.tokenize(request.prompt, add_special=request.add_special, parse_special=True)

    def stream(self, request: Request) -> Iterator[GenerationEvent]:
        self.refuse_unsupported(request)
        if self._embedding_model:
            raise InvalidRequestError(not_for_chat(self.spec))
        llm = self._require()
        submitted = time.perf_counter()
        ids = self._prompt_ids(request)
        vocab = llm.n_vocab()
        bad = next((t for t in [*ids, *(t for t, _ in request.sampling.logit_bias)] if not 0 <= t < vocab), None)
        if bad is not None:  # llama.cpp would crash on it (a prompt id) or ignore it silently (a logit_bias key)
            raise InvalidRequestError(
                f"token id {bad} is outside the vocabulary of {vocab} tokens", f"send token ids from 0 to {vocab - 1}"
            )
        if len(ids) >= self.n_ctx:
            raise ContextOverflowError(
                f"the prompt is {len(ids)} tokens but the context is {self.n_ctx}",
                f"shorten the conversation, or load the model with a larger --ctx (trained on "
                f"{self.spec.context_length})",
            )
        matcher = self._matcher(llm, request)
        return self._run(llm, request, ids, submitted, matcher)

    def _matcher(self, llm: Any, request: Request) -> Any:
        """A constrained request's grammar state (backends.constrained), compiled in the caller's thread.

        Why llguidance through logits_processor and not llama.cpp's GBNF grammar: one compiler for both
        backends gives the same JSON (compact, prefix/suffix literal) and the same bounds on a hostile schema
        (backends/constrained/grammar.py), where llama-cpp-python's JSON-schema-to-GBNF converter has neither a
        size bound nor the same subset of JSON Schema, and its grammar sampler can backtrack without limit."""
        if request.constraint is None:
            return None
        with self._constraints_lock:
            if self._constraints is None:
                self._constraints = compiler_for_llama(llm, self.spec.eos_token_ids)
        return self._constraints.matcher(request.constraint)

    def _run(
        self, llm: Any, request: Request, ids: list[int], submitted: float, matcher: Any = None
    ) -> Iterator[GenerationEvent]:
        rid = request.request_id
        stats = RequestStats(prompt_tokens=len(ids))
        with self._serial.hold(request.priority, submitted):  # one at a time, in priority order
            self._running = rid
            self._active.add(rid)
            try:
                stats.queue_s = time.perf_counter() - submitted
                self._waited[rid] = stats.queue_s
                stats.cached_tokens = common_prefix(llm._input_ids[: llm.n_tokens], ids)
                if stats.cached_tokens >= len(ids):
                    stats.cached_tokens = len(ids) - 1  # llama.cpp replays the last prompt token
                prompt_logprobs, error = self._score_prompt(llm, request, ids)
                if request.sampling.prompt_logprobs:
                    stats.cached_tokens = 0  # the whole prompt was evaluated to keep every position's logits
                yield GenerationEvent(EventKind.STARTED, rid, stats=stats, prompt_logprobs=prompt_logprobs)
                error_code = None
                if error is not None:
                    reason = FinishReason.ERROR
                else:
                    reason, error, error_code = yield from self._generate(llm, request, ids, stats, submitted, matcher)
            finally:
                self._running = None
                self._active.discard(rid)
                self._waited.pop(rid, None)
                with self._abort_lock:
                    self._aborted.discard(rid)
        stats.total_s = time.perf_counter() - submitted
        yield GenerationEvent(
            EventKind.FINISHED, rid, finish_reason=reason, stats=stats, error=error, error_code=error_code
        )

    def _score_prompt(self, llm: Any, request: Request, ids: list[int]) -> tuple[tuple[TokenLogprob, ...], str | None]:
        """(the prompt's log-probabilities, None) when the request asks for them, or ((), the error)."""
        if not request.sampling.prompt_logprobs:
            return (), None
        from backends.llama_cpp.logit_steps import eval_prompt_scored  # lazy: heavy: numpy

        try:
            return self._worker.call(
                eval_prompt_scored, llm, ids, request.sampling.logprobs or 0, self._one_token_bytes
            ), None
        except MemoryError as exc:
            return (), f"out of memory while scoring the prompt: {exc}"
        except (RuntimeError, ValueError) as exc:
            return (), f"llama.cpp failed while scoring the prompt: {exc}"

    def _generate(
        self, llm: Any, request: Request, ids: list[int], stats: RequestStats, submitted: float, matcher: Any = None
    ) -> Iterator[GenerationEvent]:
        rid = request.request_id
        if self._is_aborted(rid):
            return FinishReason.ABORT, None, None
        try:
            if not self._prefill(llm, request, ids, submitted):
                return FinishReason.ABORT, None, None
        except MemoryError as exc:
            return FinishReason.ERROR, f"out of memory while evaluating the prompt: {exc}", None
        except (RuntimeError, ValueError) as exc:
            return FinishReason.ERROR, f"llama.cpp failed while evaluating the prompt: {exc}", None
        s = start_sampling(
            llm, request.sampling, ids, self.spec.eos_token_ids, self._token_bytes, self._one_token_bytes, matcher
        )
        try:
            reason = yield from self._decode(llm, s, request, len(ids), stats, submitted)
        except MemoryError as exc:
            return FinishReason.ERROR, f"out of memory while generating: {exc}", None
        except (RuntimeError, ValueError) as exc:  # llama_decode failures surface as RuntimeError
            return FinishReason.ERROR, f"llama.cpp failed while generating: {exc}", None
        except InvalidRequestError as exc:  # the constraint's matcher refused a token or hit a limit (typed)
            return FinishReason.ERROR, exc.message, getattr(exc, "error_code", None)
        finally:
            self._worker.call(s.tokens.close)
        tail = s.text.flush()
        if tail:
            yield GenerationEvent(EventKind.TOKEN, rid, text=tail)
        return reason, None, None

    def _prefill(self, llm: Any, request: Request, ids: list[int], submitted: float) -> bool:
        """Evaluate a long prompt a piece at a time (pieces of about PIECE_S each: turns.py PieceSizer), handing
        the context to a better-ranked request between pieces; False when the request was aborted meanwhile."""
        pieces = PieceSizer(int(llm.n_batch))
        while True:
            began = time.perf_counter()
            if not self._worker.call(prefill_piece, llm, ids, pieces.size):
                return True
            pieces.timed(pieces.size, time.perf_counter() - began)
            if not self._let_better_ones_run(llm, request, submitted):
                return False

    def _let_better_ones_run(self, llm: Any, request: Request, submitted: float) -> bool:
        """When a request of a better priority waits: park this generation's context, give the turn away, and
        put the context back when the turn returns (turns.py).  False when this request was aborted meanwhile.

        "Better" as the torch engine's scheduler has it: a waiter's own priority strictly below this request's
        priority aged by the time it has waited so far (backends.priority.effective_priority), so a request that
        waited long is not pushed back again by every slightly better newcomer."""
        rid = request.request_id
        aged = effective_priority(request.priority, self._waited.get(rid, 0.0), self._serial.aging_s)
        if not self._serial.outranked(aged):
            return True
        parked = self._worker.call(park, llm)
        self._preemptions += 1
        self._running = None
        gave = time.perf_counter()
        # queued as if it had arrived `waited` seconds ago: the lock ages it by its waiting, not by its running
        # time, as `aged` above does (by its arrival it would outrank the newcomer it yields to and take the turn
        # straight back, token after token)
        self._serial.yield_turn(request.priority, gave - self._waited.get(rid, 0.0))
        self._waited[rid] = self._waited.get(rid, 0.0) + time.perf_counter() - gave
        self._running = rid
        if self._is_aborted(rid):
            return False
        self._worker.call(resume, llm, parked)
        return True

    def _decode(
        self, llm: Any, s: Sampling, request: Request, n_prompt: int, stats: RequestStats, submitted: float
    ) -> Generator[GenerationEvent, None, FinishReason]:
        """A TOKEN event per token decoded, until end-of-sequence, a stop string, an abort, max_tokens or the
        context's end; returns the finish reason.  Between tokens the context goes to a request of a better
        priority when one waits, and comes back with this generation's state (turns.py)."""
        rid, sp = request.request_id, request.sampling
        end = object()
        threads, next_token = self._require_threads(), functools.partial(next, s.tokens, end)
        # each call decodes a token; the first also evaluates the prompt (timed apart: threads.py)
        while (token := self._worker.call(threads.step, stats.completion_tokens > 0, next_token)) is not end:
            if stats.completion_tokens == 0:
                stats.ttft_s = time.perf_counter() - submitted
            stats.completion_tokens += 1
            if s.matcher is not None:
                s.matcher.accept(token)  # raises ConstraintViolation (this request's error, in _generate)
            if token in s.eos:
                return FinishReason.STOP
            out, stopped = s.text.push([token])
            entry = s.steps.entry(token) if s.steps is not None else None
            yield GenerationEvent(
                EventKind.TOKEN, rid, text=out, token_ids=(token,), logprobs=(entry,) if entry is not None else ()
            )
            if stopped:
                return FinishReason.STOP
            if self._is_aborted(rid):
                return FinishReason.ABORT
            if stats.completion_tokens >= sp.max_tokens or n_prompt + stats.completion_tokens >= self.n_ctx:
                return FinishReason.LENGTH
            if not self._let_better_ones_run(llm, request, submitted):
                return FinishReason.ABORT
        return FinishReason.LENGTH

    # -- facts -------------------------------------------------------------------------------------------
    def stats(self) -> EngineStats:
        """Memory (the base class's), and the one context's queue: running, waiting, turns given away."""
        return dataclasses.replace(
            super().stats(),
            running=int(self._serial.locked()),
            waiting=self._serial.num_waiting,
            preemptions=self._preemptions,
        )

    def describe(self) -> Description:
        o = self.options
        info: dict[str, Any] = {
            "backend": self.name,
            "model": self.spec.name,
            "path": self.spec.path,
            "n_ctx": self.n_ctx,
            "n_gpu_layers": o.n_gpu_layers,
            "split_mode": o.split_mode,
            "kv_cache_type": o.kv_cache_type,
            "threads": self._thread_count(),
            **self._describe_threads(),
            "gpu_offload_supported": gpu_offload_supported(),
            "extra_bufts": self._extra_bufts,
            "cpu_expert_layers": o.cpu_expert_layers if self._overrides is not None else 0,
        }
        if self._overrides is not None:
            info["tensor_buft_overrides"] = f"{self._overrides.pattern}=CPU"
        if self._notes:
            info["notes"] = list(self._notes)
        return Description.from_mapping(info)
