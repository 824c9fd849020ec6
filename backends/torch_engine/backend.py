"""hearth's torch engine behind the Backend contract: one engine thread batches every stream.

Threads: callers of `stream()` (any number) each get a queue; the engine thread owns the Engine (scheduler,
block manager, sampler, runner) and is the only one touching it.  Callers talk to it through `_inbox` (typed
messages `Add` / `Finish` / `Call`, backends.torch_engine.messages, under a condition variable); it answers
through the per-request queues with `Started`, `Token` and `Finished`.  Detokenizing and stop strings happen in
the caller's thread (backends.textstream), so a slow reader never slows the batch; a stop string found there
finishes the request in the engine through the inbox.

One request's failure is that request's alone: a bad token id or seed is refused at `stream()`
(InvalidRequestError), and a request that fails while the engine prepares or samples it, or while its caller
detokenizes it, ends with FinishReason.ERROR and its message while the batch goes on.  Only a failure of the
batched forward itself ends every running stream.

After every step the engine thread publishes an immutable EngineStats (`stats()`), so /metrics and the TUI
never read the scheduler's live structures from another thread.

The model half (tokenizer, weights, ModelRunner) comes from `EngineParts` (backends.torch_engine.parts), built
by `build_parts` from the ModelSpec and LoadOptions; tests pass their own `build` with a fake runner.
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from backends.api import (
    Backend,
    Description,
    EngineStats,
    GenerationEvent,
    LoadOptions,
    ProgressCallback,
    Request,
    SamplingParams,
    peak_rss_bytes,
)
from backends.constrained import compiler_for_tokenizer
from backends.embeddings import is_embedding_model, not_for_chat, pooling_type
from backends.engine_capabilities import TORCH
from backends.errors import ContextOverflowError, InvalidRequestError, ModelLoadError
from backends.modelspec import ModelSpec
from backends.torch_engine.block_manager import BlockManager
from backends.torch_engine.build import build_engine_parts
from backends.torch_engine.engine import Engine
from backends.torch_engine.messages import (
    Add,
    Call,
    Finish,
    Finished,
    InboxMessage,
    Reply,
    Started,
    Token,
)
from backends.torch_engine.parts import EngineParts, Runner, Tokenizer, kv_pool_blocks  # noqa: F401 - re-exported
from backends.torch_engine.request import EngineRequest, RequestStatus
from backends.torch_engine.sampler import Sampler
from backends.torch_engine.scheduler import Scheduler, error_line
from backends.torch_engine.stream_events import stream_events

log = logging.getLogger(__name__)

_CLOSED = "the torch backend was closed"


def build_parts(spec: ModelSpec, options: LoadOptions, progress: ProgressCallback | None) -> EngineParts:
    """Load the real model (the model half: backends.torch_engine.model_runner)."""
    return build_engine_parts(spec, options, progress)


@dataclass
class _Channel:
    """The engine thread's view of one stream."""

    request: EngineRequest
    out: queue.SimpleQueue  # StreamMessages to the caller's thread
    announced: bool = False  # Started was sent


class TorchBackend(Backend):
    name = "torch"
    capabilities = TORCH

    def __init__(
        self,
        spec: ModelSpec,
        options: LoadOptions | None = None,
        build: Callable[[ModelSpec, LoadOptions, ProgressCallback | None], EngineParts] = build_parts,
    ) -> None:
        super().__init__(spec, options)
        self._build = build
        self._parts: EngineParts | None = None
        self._engine: Engine | None = None
        self._thread: threading.Thread | None = None
        self._cv = threading.Condition()
        self._inbox: list[InboxMessage] = []
        self._closing = False
        self._stats = EngineStats()  # the engine thread's last published snapshot (replaced whole, never mutated)
        self._generated_tokens = 0  # engine thread only
        self._constraints: Any = None  # backends.constrained.ConstraintCompiler, built at the first constraint
        self._constraints_lock = threading.Lock()

    # -- lifecycle ---------------------------------------------------------------------------------------
    def load(self, progress: ProgressCallback | None = None) -> None:
        """Start the engine thread, which loads the model and then serves; returns once it is ready and
        re-raises what loading raised.  `progress` is called from the engine thread.

        Why the engine thread loads the model itself: torch's CPU ops run on an OpenMP team that belongs to
        the thread that calls them.  Once a second thread has run a parallel op, the process has more OpenMP
        threads than cores and libgomp stops spinning between ops; on the 2-core dev machine that made a
        starter-model decode step 2.5x slower (13 ms -> 33 ms).  So every torch op of this backend runs on
        its one thread, weights included (see also `logits`)."""
        if self._engine is not None:
            return
        ready: queue.SimpleQueue = queue.SimpleQueue()
        self._closing = False
        self._thread = threading.Thread(
            target=self._run, args=(progress, ready), name="hearth-torch-engine", daemon=True
        )
        self._thread.start()
        reply: Reply = ready.get()
        if reply.error is not None:
            self._thread.join()
            self._thread = None
            raise reply.error

    def _run(self, progress: ProgressCallback | None, ready: queue.SimpleQueue) -> None:
        o = self.options
        try:
            parts = self._build(self.spec, o, progress)
            scheduler = Scheduler(
                BlockManager(parts.num_blocks, num_host_blocks=parts.num_host_blocks),
                o.max_num_seqs,
                o.n_batch,
                o.n_ctx,
                ttft_target_s=o.ttft_target_ms / 1000 if o.ttft_target_ms > 0 else None,
                swap_cost=parts.swap_cost,
            )
        except BaseException as exc:  # noqa: BLE001 - handed to load() in the caller's thread
            ready.put(Reply(error=exc))
            return
        self._parts = parts
        self._engine = Engine(parts.runner, scheduler, Sampler(o.seed), parts.speculator)
        self._generated_tokens = 0
        self._publish(self._engine)
        ready.put(Reply())
        self._loop()

    def close(self) -> None:
        thread, parts = self._thread, self._parts
        if thread is None:
            return
        with self._cv:
            self._closing = True
            self._cv.notify_all()
        thread.join()
        self._thread = self._engine = self._parts = None
        if parts is not None and parts.close is not None:
            parts.close()

    @property
    def n_ctx(self) -> int:
        return self._engine.scheduler.max_model_len if self._engine is not None else self.options.n_ctx

    def _require(self) -> Engine:
        if self._engine is None:
            raise ModelLoadError("the torch backend is not loaded", "call load() first")
        return self._engine

    # -- tokens ------------------------------------------------------------------------------------------
    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        self._require()
        assert self._parts is not None
        return list(self._parts.tokenizer.encode(text, add_special=add_special, parse_special=parse_special))

    def detokenize(self, token_ids: Sequence[int]) -> str:
        self._require()
        assert self._parts is not None
        return self._parts.tokenizer.decode(list(token_ids))

    def logits(self, token_ids: Sequence[int]) -> Any:
        """Logits after every position, computed on the engine thread between steps."""
        self._require()
        assert self._parts is not None
        ids = list(token_ids)
        if len(ids) > self.n_ctx:
            raise ContextOverflowError(
                f"{len(ids)} tokens do not fit the context of {self.n_ctx}",
                "use a smaller window (--ctx) or load a larger context",
            )
        self._check_token_ids(ids)
        if self._parts.prompt_logits is None:
            raise NotImplementedError("this torch engine build does not return prompt logits")
        fn = self._parts.prompt_logits
        engine = self._engine
        assert engine is not None

        def run() -> Any:  # on the engine thread, between steps
            bm = engine.scheduler.block_manager
            scratch = EngineRequest("logits", tuple(ids), SamplingParams(temperature=0))
            if not bm.allocate(scratch, len(ids)):
                raise ContextOverflowError(
                    f"{len(ids)} tokens need {bm.blocks_needed(len(ids))} KV blocks but only "
                    f"{bm.num_free_blocks} are free while other requests run",
                    "score when the backend is idle",
                )
            try:
                result = fn(ids, tuple(scratch.block_ids))
                return np.array(result.float().cpu().numpy(), dtype=np.float32)  # torch ops stay on this thread
            finally:
                bm.free(scratch)  # never registered in the prefix cache: its blocks go back as plain free blocks

        return self._call(run)

    def embed(self, inputs: Sequence[Sequence[int]]) -> Any:
        """Pooled, normalized last hidden states (backends/embeddings.py says which pooling), computed on the
        engine thread between steps: an embedding request waits at most one step of the batch, and the batch
        waits for its forward.  The inputs go in groups (_embed_group_size), each taking scratch KV blocks from
        the pool for one packed run (ModelRunner.embed_batch: several inputs to a forward, in chunks of n_batch
        tokens like a prompt's prefill) and giving them back (never to the prefix cache)."""
        self._require()
        assert self._parts is not None
        if self._parts.embed is None:
            raise InvalidRequestError(
                "this torch engine build gives no embeddings (tensor parallelism)", "serve it with --tensor-parallel 1"
            )
        pooling = pooling_type(self.spec)
        if pooling == "rank":
            raise InvalidRequestError("this model is a reranker (rank pooling): it gives no embeddings")
        batch = [list(ids) for ids in inputs]
        for i, ids in enumerate(batch):
            if not ids:
                raise InvalidRequestError(f"input {i} is empty")
            if len(ids) > self.n_ctx:
                raise ContextOverflowError(
                    f"input {i} is {len(ids)} tokens but the context is {self.n_ctx}",
                    "shorten it (Ollama's truncate: true cuts it to fit) or load a larger --ctx",
                )
            self._check_token_ids(ids, f"input {i}")
        fn, engine = self._parts.embed, self._engine
        assert engine is not None
        # one call per group: the batch's steps go on between them, so a long list never stalls the streams
        # for longer than its longest input would alone
        vectors: list[np.ndarray] = []
        while len(vectors) < len(batch):
            group = batch[len(vectors) : len(vectors) + _embed_group_size(batch[len(vectors) :], self.options.n_batch)]
            vectors.extend(self._call(lambda group=group: _embed_on_engine(engine, fn, group, pooling)))
        return np.stack(vectors)

    def _check_token_ids(self, ids: Sequence[int], where: str = "") -> None:
        """Token ids outside the vocabulary would fail the batched forward (everyone's step): refuse them here."""
        vocab = self.spec.vocab_size
        bad = next((t for t in ids if not 0 <= t < vocab), None) if vocab > 0 else None
        if bad is not None:
            raise InvalidRequestError(
                f"{where + ': ' if where else ''}token id {bad} is outside the vocabulary of {vocab} tokens",
                f"send token ids from 0 to {vocab - 1}",
            )

    # -- generation --------------------------------------------------------------------------------------
    def stream(self, request: Request) -> Iterator[GenerationEvent]:
        self.refuse_unsupported(request)
        if is_embedding_model(self.spec):
            raise InvalidRequestError(not_for_chat(self.spec))
        engine = self._require()
        assert self._parts is not None
        submitted = time.perf_counter()
        if request.prompt_token_ids is not None:
            ids = list(request.prompt_token_ids)
            self._check_token_ids(ids)
        else:
            assert request.prompt is not None
            ids = self.tokenize(request.prompt, add_special=request.add_special, parse_special=True)
        if not ids:
            raise ContextOverflowError("the prompt tokenized to nothing", "send some text")  # pragma: no cover
        max_len = engine.scheduler.max_model_len
        if len(ids) >= max_len:
            raise ContextOverflowError(
                f"the prompt is {len(ids)} tokens but the context is {max_len}",
                f"shorten the conversation, or load the model with a larger --ctx (trained on "
                f"{self.spec.context_length})",
            )
        self._check_token_ids([t for t, _ in request.sampling.logit_bias], "logit_bias")
        eos = frozenset() if request.sampling.ignore_eos else self.eos_token_ids
        matcher, sampling = None, request.sampling
        if request.constraint is not None:  # compiled here, in the caller's thread: the batch never waits on it
            matcher = self._constraint_compiler().matcher(request.constraint)
            # the grammar's end is end-of-sequence (its only allowed token), even with ignore_eos
            eos, sampling = self.eos_token_ids, dataclasses.replace(sampling, ignore_eos=False)
        er = EngineRequest(
            request.request_id,
            tuple(ids),
            sampling,
            eos,
            arrival_time=submitted,
            priority=request.priority,
            matcher=matcher,
        )
        out: queue.SimpleQueue = queue.SimpleQueue()
        self._post(Add(er, out))
        return stream_events(self._parts.tokenizer, request, er, out, self._post)

    def _constraint_compiler(self) -> Any:
        """The model's ConstraintCompiler (its vocabulary as llguidance sees it: ~0.1 s for 49k tokens, once)."""
        with self._constraints_lock:
            if self._constraints is None:
                assert self._parts is not None
                self._constraints = compiler_for_tokenizer(
                    self._parts.tokenizer, self.spec.eos_token_ids, self.spec.bos_token_id, self.spec.vocab_size or None
                )
            return self._constraints

    def abort(self, request_id: str) -> None:
        if self._engine is not None:
            self._post(Finish(request_id, RequestStatus.FINISHED_ABORTED, notify=True))

    # -- the engine thread -------------------------------------------------------------------------------
    def _post(self, message: InboxMessage) -> None:
        with self._cv:
            if not self._closing:
                self._inbox.append(message)
                self._cv.notify()
                return
        _refuse(message)  # closing or closed: the engine thread takes no more messages (nobody waits forever)

    def _call(self, fn: Callable[[], Any]) -> Any:
        """Run fn on the engine thread between steps; re-raise what it raises."""
        reply_queue: queue.SimpleQueue = queue.SimpleQueue()
        self._post(Call(fn, reply_queue))
        reply: Reply = reply_queue.get()
        if reply.error is not None:
            raise reply.error
        return reply.value

    def _loop(self) -> None:
        engine = self._engine
        assert engine is not None
        channels: dict[str, _Channel] = {}
        while True:
            with self._cv:
                while not self._inbox and not engine.has_work and not self._closing:
                    self._cv.wait()
                if self._closing:
                    break
                inbox, self._inbox = self._inbox, []
            for message in inbox:
                self._handle(engine, channels, message)
            if engine.has_work:
                self._step(engine, channels)
            self._publish(engine)
        with self._cv:
            inbox, self._inbox = self._inbox, []
        for message in inbox:  # closing: streams still arriving end at once, calls are refused
            _refuse(message)
        for channel in channels.values():  # every open stream ends with ABORT
            channel.out.put(Finished(RequestStatus.FINISHED_ABORTED))
        engine.scheduler.abort_all()
        self._publish(engine)

    def _step(self, engine: Engine, channels: dict[str, _Channel]) -> None:
        try:
            updates = engine.step()
        except Exception as exc:  # noqa: BLE001 - the batched forward failed: every running stream ends
            self._fail_all(engine, channels, error_line("the torch engine failed", exc))
            return
        self._announce(channels)
        now = time.perf_counter()
        for u in updates:
            rid = u.request.request_id
            channel = channels.pop(rid, None) if u.finished else channels.get(rid)
            if channel is None:
                continue
            if u.error is not None:  # this request failed alone (preparing, sampling or its stop check)
                channel.out.put(Finished(RequestStatus.FINISHED_ERROR, u.error, u.error_code))
                continue
            self._generated_tokens += len(u.new_token_ids)
            last = len(u.new_token_ids) - 1  # a speculative row brings several: only the last one ends the stream
            for i, token in enumerate(u.new_token_ids):
                logprob = u.logprobs[i] if i < len(u.logprobs) else None
                channel.out.put(Token(token, u.request.status if u.finished and i == last else None, now, logprob))

    def _handle(self, engine: Engine, channels: dict[str, _Channel], message: InboxMessage) -> None:
        if isinstance(message, Add):
            try:
                engine.add_request(message.request)
            except Exception as exc:  # noqa: BLE001 - stream() checked what it could; this request alone ends
                message.out.put(Finished(RequestStatus.FINISHED_ERROR, error_line("the request failed", exc)))
                return
            channels[message.request.request_id] = _Channel(message.request, message.out)
        elif isinstance(message, Finish):
            channel = channels.pop(message.request_id, None)
            if channel is None:
                return  # unknown or already finished: ignored
            engine.finish_request(message.request_id, message.status)
            if message.notify:
                channel.out.put(Finished(message.status))
        elif isinstance(message, Call):
            try:
                message.reply.put(Reply(value=message.fn()))
            except Exception as exc:  # noqa: BLE001 - handed back to the caller's thread
                message.reply.put(Reply(error=exc))

    def _announce(self, channels: dict[str, _Channel]) -> None:
        for channel in channels.values():
            r = channel.request
            if not channel.announced and r.first_scheduled_time is not None:
                if r.sampling.prompt_logprobs and not r.prompt_logprobs_ready:
                    continue  # announced once the whole prompt is scored (Started carries the entries)
                channel.announced = True
                channel.out.put(
                    Started(r.num_cached_tokens, r.first_scheduled_time - r.arrival_time, tuple(r.prompt_logprobs))
                )

    def _fail_all(self, engine: Engine, channels: dict[str, _Channel], error: str) -> None:
        for r in engine.scheduler.abort_all(RequestStatus.FINISHED_ERROR):
            engine.forget(r.request_id)
        for channel in channels.values():
            channel.out.put(Finished(RequestStatus.FINISHED_ERROR, error))
        channels.clear()

    def _publish(self, engine: Engine) -> None:
        """Swap in a new EngineStats (one reference assignment: readers see the old or the new one whole)."""
        s, bm = engine.scheduler, engine.scheduler.block_manager
        self._stats = EngineStats(
            running=len(s.running),
            waiting=len(s.waiting),
            kv_blocks=bm.num_blocks,
            kv_blocks_free=bm.num_free_blocks,
            kv_block_size=bm.block_size,
            prefix_cached_blocks=bm.num_cached_blocks,
            prefix_hit_tokens=bm.num_hit_tokens,
            preemptions=s.num_preemptions,
            preemptions_swapped=s.num_swap_preemptions,
            swapped_out_blocks=bm.num_swapped_out,
            swapped_in_blocks=bm.num_swapped_in,
            deferred=s.num_deferred,
            generated_tokens=self._generated_tokens,
            spec_proposed_tokens=engine.speculator.num_proposed if engine.speculator else 0,
            spec_accepted_tokens=engine.speculator.num_accepted if engine.speculator else 0,
        )

    # -- facts -------------------------------------------------------------------------------------------
    def stats(self) -> EngineStats:
        """The engine thread's last snapshot (published after every step), with the process's memory now."""
        memory = self.memory_in_use()
        return dataclasses.replace(
            self._stats,
            rss_bytes=memory.get("rss_bytes", 0),
            gpu_bytes=memory.get("gpu_bytes", 0),
            peak_rss_bytes=peak_rss_bytes(),
        )

    def describe(self) -> Description:
        info: dict[str, Any] = {
            "backend": self.name,
            "model": self.spec.name,
            "path": self.spec.path,
            "n_ctx": self.n_ctx,
            "max_num_seqs": self.options.max_num_seqs,
            "n_batch": self.options.n_batch,
        }
        if self._engine is not None:
            st = self._stats  # the published snapshot, not the scheduler's live structures
            info.update(
                kv_blocks=st.kv_blocks,
                kv_block_size=st.kv_block_size,
                kv_blocks_free=st.kv_blocks_free,
                prefix_cached_blocks=st.prefix_cached_blocks,
                prefix_hit_tokens=st.prefix_hit_tokens,
                preemptions=st.preemptions,
            )
        if self._parts is not None and self._parts.describe is not None:
            info.update(self._parts.describe())
        speculator = self._engine.speculator if self._engine is not None else None
        info["speculative"] = "off" if speculator is None else speculator.proposer.name
        if speculator is not None:  # the published counters (the speculator's own are the engine thread's)
            st = self._stats
            info.update(spec_proposed_tokens=st.spec_proposed_tokens, spec_accepted_tokens=st.spec_accepted_tokens)
        return Description.from_mapping(info)

    def memory_in_use(self) -> dict[str, int]:
        info = super().memory_in_use()
        parts = self._parts
        ranks = getattr(parts.runner, "ranks_rss_bytes", None) if parts is not None else None
        if ranks is not None:  # tensor parallelism: the other ranks' processes hold their shares
            info["rss_bytes"] += ranks()
        try:
            if torch.cuda.is_available() and torch.cuda.is_initialized():
                info["gpu_bytes"] = int(torch.cuda.memory_reserved())
        except Exception:
            log.debug("GPU memory figure unavailable", exc_info=True)
        return info


def _embed_group_size(batch: Sequence[Sequence[int]], n_batch: int) -> int:
    """How many of `batch`'s first inputs go to one packed embedding run: while their tokens fit the forwards
    the first input takes alone (n_batch tokens each), so a group holds the engine thread no longer than that."""
    budget = -(-len(batch[0]) // n_batch) * n_batch - len(batch[0])
    count = 1
    while count < len(batch) and len(batch[count]) <= budget:
        budget -= len(batch[count])
        count += 1
    return count


def _embed_on_engine(engine: Engine, fn: Callable[..., Sequence[Any]], group: list[list[int]], pooling: str) -> list:
    """On the engine thread, between steps: scratch KV blocks for as many of `group`'s first inputs as the free
    blocks hold, their embeddings in one packed run (`fn`: ModelRunner.embed_batch), the blocks given back (never
    registered in the prefix cache).  Returns a float32 vector for each input it embedded, at least the first."""
    bm = engine.scheduler.block_manager
    scratch: list[EngineRequest] = []
    try:
        for ids in group:
            request = EngineRequest("embed", tuple(ids), SamplingParams(temperature=0))
            if not bm.allocate(request, len(ids)):
                break  # the rest wait for a later group
            scratch.append(request)
        if not scratch:
            raise ContextOverflowError(
                f"{len(group[0])} tokens need {bm.blocks_needed(len(group[0]))} KV blocks but only "
                f"{bm.num_free_blocks} are free while other requests run",
                "retry shortly, or send shorter inputs",
            )
        out = fn([(ids, tuple(r.block_ids)) for ids, r in zip(group, scratch)], pooling)
        return [np.asarray(v.numpy(), dtype=np.float32) for v in out]  # torch ops stay on this thread
    finally:
        for request in scratch:
            bm.free(request)


def _refuse(message: InboxMessage) -> None:
    """Answer a message the engine thread will never take (the backend is closing or closed)."""
    if isinstance(message, Add):
        message.out.put(Finished(RequestStatus.FINISHED_ABORTED))
    elif isinstance(message, Call):
        message.reply.put(Reply(error=ModelLoadError(_CLOSED, "load it again")))
