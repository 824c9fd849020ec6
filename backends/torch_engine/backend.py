"""hearth's torch engine behind the Backend contract: one engine thread batches every stream.

Threads: callers of `stream()` (any number) each get a queue; the engine thread owns the Engine (scheduler,
block manager, sampler, runner) and is the only one touching it.  Callers talk to it through `_inbox`
(add / finish / call messages under a condition variable); it answers through the per-request queues with
("started", ...), ("token", ...), ("finished", ...) messages.  Detokenizing and stop strings happen in the
caller's thread (backends.textstream), so a slow reader never slows the batch; a stop string found there
finishes the request in the engine through the inbox.

The model half (tokenizer, weights, ModelRunner) comes from `EngineParts`, built by `build_parts` from the
ModelSpec and LoadOptions; tests pass their own `build` with a fake runner.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

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
    SamplingParams,
)
from backends.errors import ContextOverflowError, ModelLoadError
from backends.modelspec import ModelSpec
from backends.textstream import TextStream
from backends.torch_engine.block_manager import BlockManager
from backends.torch_engine.engine import Engine, Runner
from backends.torch_engine.request import EngineRequest, RequestStatus
from backends.torch_engine.sampler import Sampler
from backends.torch_engine.scheduler import Scheduler

_REASONS = {
    RequestStatus.FINISHED_STOPPED: FinishReason.STOP,
    RequestStatus.FINISHED_LENGTH: FinishReason.LENGTH,
    RequestStatus.FINISHED_ABORTED: FinishReason.ABORT,
    RequestStatus.FINISHED_ERROR: FinishReason.ERROR,
}


class Tokenizer(Protocol):
    def encode(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]: ...
    def decode(self, token_ids: Sequence[int]) -> str: ...
    def token_bytes(self, token_ids: Sequence[int]) -> bytes: ...  # reply text: control tokens give b""


@dataclass
class EngineParts:
    """What the model half provides to the engine."""

    runner: Runner  # execute(SchedulerOutput) -> RunnerOutput, over a KV pool of num_blocks blocks
    tokenizer: Tokenizer
    num_blocks: int  # blocks in the runner's KV pool
    # (ids, block_table) -> (len(ids), vocab) float32 tensor: logits after every position, computed over the
    # given blocks (the backend takes them from the block manager, so no live or cached prefix is overwritten)
    prompt_logits: Callable[[Sequence[int], Sequence[int]], Any] | None = None
    describe: Callable[[], dict[str, Any]] | None = None  # device, dtype, KV pool bytes, ...
    close: Callable[[], None] | None = None


def kv_pool_blocks(spec: ModelSpec, options: LoadOptions, bytes_per_element: int) -> int:
    """Blocks in the KV pool: LoadOptions.kv_cache_bytes when set, else enough for max_num_seqs sequences of
    n_ctx tokens (what the plan budgets).  One block holds K and V of BLOCK_SIZE tokens in every layer."""
    from backends.torch_engine.seams import BLOCK_SIZE

    block_bytes = 2 * spec.n_layers * spec.n_kv_heads * spec.head_dim * bytes_per_element * BLOCK_SIZE
    if options.kv_cache_bytes is not None:
        return max(options.kv_cache_bytes // block_bytes, 1)
    return options.max_num_seqs * -(-options.n_ctx // BLOCK_SIZE)


def build_parts(spec: ModelSpec, options: LoadOptions, progress: ProgressCallback | None) -> EngineParts:
    """Load the real model (the model half: backends.torch_engine.model_runner)."""
    from backends.torch_engine.model_runner import build_engine_parts  # the model half's entry point

    return build_engine_parts(spec, options, progress)


@dataclass
class _Channel:
    """The engine thread's view of one stream."""

    request: EngineRequest
    out: queue.SimpleQueue  # messages to the caller's thread
    announced: bool = False  # ("started", ...) was sent


class TorchBackend(Backend):
    name = "torch"
    capabilities = Capabilities(concurrent_requests=True, prefix_cache=True, gpu_offload=True, gguf=True,
                                safetensors=True, logits=True)

    def __init__(self, spec: ModelSpec, options: LoadOptions | None = None,
                 build: Callable[[ModelSpec, LoadOptions, ProgressCallback | None], EngineParts] = build_parts,
                 ) -> None:
        super().__init__(spec, options)
        self._build = build
        self._parts: EngineParts | None = None
        self._engine: Engine | None = None
        self._thread: threading.Thread | None = None
        self._cv = threading.Condition()
        self._inbox: list[tuple[Any, ...]] = []
        self._closing = False

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
        self._thread = threading.Thread(target=self._run, args=(progress, ready), name="hearth-torch-engine",
                                        daemon=True)
        self._thread.start()
        ok, error = ready.get()
        if not ok:
            self._thread.join()
            self._thread = None
            raise error

    def _run(self, progress: ProgressCallback | None, ready: queue.SimpleQueue) -> None:
        o = self.options
        try:
            parts = self._build(self.spec, o, progress)
            scheduler = Scheduler(BlockManager(parts.num_blocks), o.max_num_seqs, o.n_batch, o.n_ctx)
        except BaseException as exc:  # noqa: BLE001 - handed to load() in the caller's thread
            ready.put((False, exc))
            return
        self._parts = parts
        self._engine = Engine(parts.runner, scheduler, Sampler(o.seed))
        ready.put((True, None))
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
        import numpy as np

        self._require()
        assert self._parts is not None
        ids = list(token_ids)
        if len(ids) > self.n_ctx:
            raise ContextOverflowError(f"{len(ids)} tokens do not fit the context of {self.n_ctx}",
                                       "use a smaller window (--ctx) or load a larger context")
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
                    f"{bm.num_free_blocks} are free while other requests run", "score when the backend is idle")
            try:
                result = fn(ids, tuple(scratch.block_ids))
                return np.array(result.float().cpu().numpy(), dtype=np.float32)  # torch ops stay on this thread
            finally:
                bm.free(scratch)  # never registered in the prefix cache: its blocks go back as plain free blocks

        return self._call(run)

    # -- generation --------------------------------------------------------------------------------------
    def stream(self, request: Request) -> Iterator[GenerationEvent]:
        engine = self._require()
        assert self._parts is not None
        submitted = time.perf_counter()
        if request.prompt_token_ids is not None:
            ids = list(request.prompt_token_ids)
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
                f"{self.spec.context_length})")
        eos = frozenset() if request.sampling.ignore_eos else self.eos_token_ids
        er = EngineRequest(request.request_id, tuple(ids), request.sampling, eos, arrival_time=submitted)
        out: queue.SimpleQueue = queue.SimpleQueue()
        self._post(("add", _Channel(er, out)))
        return self._events(request, er, out)

    def abort(self, request_id: str) -> None:
        if self._engine is not None:
            self._post(("finish", request_id, RequestStatus.FINISHED_ABORTED, True))

    def _events(self, request: Request, er: EngineRequest, out: queue.SimpleQueue) -> Iterator[GenerationEvent]:
        """The caller's side of one stream: turns engine messages into GenerationEvents."""
        assert self._parts is not None
        rid, sp = request.request_id, request.sampling
        stats = RequestStats(prompt_tokens=er.num_prompt_tokens)
        text = TextStream(self._parts.tokenizer.token_bytes, sp.stop)
        started = done = False
        reason, error = FinishReason.ERROR, None
        try:
            while True:
                msg = out.get()
                if msg[0] == "started":
                    stats.cached_tokens, stats.queue_s = msg[1], msg[2]
                if not started:
                    started = True
                    yield GenerationEvent(EventKind.STARTED, rid, stats=stats)
                if msg[0] == "token":
                    _, token, status, at = msg
                    if stats.completion_tokens == 0:
                        stats.ttft_s = at - er.arrival_time
                    stats.completion_tokens += 1
                    if status is RequestStatus.FINISHED_STOPPED and token in er.eos_token_ids:
                        reason = FinishReason.STOP  # the end-of-sequence token is counted, never shown
                        break
                    piece, stopped = text.push([token])
                    yield GenerationEvent(EventKind.TOKEN, rid, text=piece, token_ids=(token,))
                    if stopped:
                        reason = FinishReason.STOP
                        self._post(("finish", rid, RequestStatus.FINISHED_STOPPED, False))
                        break
                    if status is not None:
                        reason = _REASONS[status]
                        break
                elif msg[0] == "finished":
                    reason, error = _REASONS[msg[1]], msg[2]
                    break
            tail = text.flush()
            if tail:
                yield GenerationEvent(EventKind.TOKEN, rid, text=tail)
            stats.total_s = time.perf_counter() - er.arrival_time
            done = True
            yield GenerationEvent(EventKind.FINISHED, rid, finish_reason=reason, stats=stats, error=error)
        finally:
            if not done:  # the caller stopped reading (closed the generator): free the request's blocks
                self._post(("finish", rid, RequestStatus.FINISHED_ABORTED, False))

    # -- the engine thread -------------------------------------------------------------------------------
    def _post(self, message: tuple[Any, ...]) -> None:
        with self._cv:
            if not self._closing:
                self._inbox.append(message)
                self._cv.notify()
                return
        # Closing or closed: the engine thread takes no more messages, so answer here (nobody waits forever).
        if message[0] == "add":
            message[1].out.put(("finished", RequestStatus.FINISHED_ABORTED, None))
        elif message[0] == "call":
            message[2].put((False, ModelLoadError("the torch backend was closed", "load it again")))

    def _call(self, fn: Callable[[], Any]) -> Any:
        """Run fn on the engine thread between steps; re-raise what it raises."""
        reply: queue.SimpleQueue = queue.SimpleQueue()
        self._post(("call", fn, reply))
        ok, value = reply.get()
        if not ok:
            raise value
        return value

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
            if not engine.has_work:
                continue
            try:
                updates = engine.step()
            except Exception as exc:  # noqa: BLE001 - any failure ends the running streams, not the thread
                self._fail_all(engine, channels, f"the torch engine failed: {type(exc).__name__}: {exc}")
                continue
            self._announce(channels)
            for u in updates:
                rid = u.request.request_id
                channel = channels.get(rid)
                status = u.request.status if u.finished else None
                if channel is not None:
                    channel.out.put(("token", u.new_token_ids[0], status, time.perf_counter()))
                if u.finished:
                    channels.pop(rid, None)
        with self._cv:
            inbox, self._inbox = self._inbox, []
        for message in inbox:  # closing: streams still arriving end at once, calls are refused
            if message[0] == "add":
                message[1].out.put(("finished", RequestStatus.FINISHED_ABORTED, None))
            elif message[0] == "call":
                message[2].put((False, ModelLoadError("the torch backend was closed", "load it again")))
        for channel in channels.values():  # every open stream ends with ABORT
            channel.out.put(("finished", RequestStatus.FINISHED_ABORTED, None))
        engine.scheduler.abort_all()

    def _handle(self, engine: Engine, channels: dict[str, _Channel], message: tuple[Any, ...]) -> None:
        kind = message[0]
        if kind == "add":
            channel: _Channel = message[1]
            try:
                engine.add_request(channel.request)
            except Exception as exc:  # noqa: BLE001 - stream() checked the length; anything else ends it
                channel.out.put(("finished", RequestStatus.FINISHED_ERROR, f"{type(exc).__name__}: {exc}"))
                return
            channels[channel.request.request_id] = channel
        elif kind == "finish":
            _, rid, status, notify = message
            channel = channels.pop(rid, None)
            if channel is None:
                return  # unknown or already finished: ignored
            engine.finish_request(rid, status)
            if notify:
                channel.out.put(("finished", status, None))
        elif kind == "call":
            _, fn, reply = message
            try:
                reply.put((True, fn()))
            except Exception as exc:  # noqa: BLE001 - handed back to the caller's thread
                reply.put((False, exc))

    def _announce(self, channels: dict[str, _Channel]) -> None:
        for channel in channels.values():
            r = channel.request
            if not channel.announced and r.first_scheduled_time is not None:
                channel.announced = True
                channel.out.put(("started", r.num_cached_tokens, r.first_scheduled_time - r.arrival_time))

    def _fail_all(self, engine: Engine, channels: dict[str, _Channel], error: str) -> None:
        for r in engine.scheduler.abort_all(RequestStatus.FINISHED_ERROR):
            engine.sampler.forget(r.request_id)
        for channel in channels.values():
            channel.out.put(("finished", RequestStatus.FINISHED_ERROR, error))
        channels.clear()

    # -- facts -------------------------------------------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        info: dict[str, Any] = {"backend": self.name, "model": self.spec.name, "path": self.spec.path,
                                "n_ctx": self.n_ctx, "max_num_seqs": self.options.max_num_seqs,
                                "n_batch": self.options.n_batch}
        if self._engine is not None:
            bm = self._engine.scheduler.block_manager
            info.update(kv_blocks=bm.num_blocks, kv_block_size=bm.block_size, kv_blocks_free=bm.num_free_blocks,
                        prefix_cached_blocks=bm.num_cached_blocks, prefix_hit_tokens=bm.num_hit_tokens,
                        preemptions=self._engine.scheduler.num_preemptions)
        if self._parts is not None and self._parts.describe is not None:
            info.update(self._parts.describe())
        return info

    def memory_in_use(self) -> dict[str, int]:
        info = super().memory_in_use()
        try:
            import torch

            if torch.cuda.is_available() and torch.cuda.is_initialized():
                info["gpu_bytes"] = int(torch.cuda.memory_reserved())
        except Exception:  # noqa: BLE001 - memory figures are best effort
            pass
        return info
