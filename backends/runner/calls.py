"""RunnerBackend's calls (backends/runner/client.py): tokenize, detokenize, logits, embed, describe and stats, each
one message to the runner and its reply, as a mixin over the client's supervision state (the current runner, its
lock, the call ids, whether it gave up or was unloaded).  Every call is a pure read, so one its runner died under is
sent once more to the runner that replaces it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

from backends.api import Description, EngineStats
from backends.errors import HearthError, RunnerCrashedError
from backends.runner import protocol as p


class RunnerCalls:
    """The calls of a RunnerBackend (which supplies _call_ids, _lock, _current, _closed, _finished_ok, _unloaded,
    _describe, _runner and config)."""

    _call_ids: Any
    _lock: Any
    _closed: bool
    _unloaded: bool
    _describe: Any
    _runner: Any
    config: Any

    def _current(self) -> Any:  # RunnerBackend's: the runner to send to, waiting while one restarts
        raise NotImplementedError

    def _finished_ok(self) -> None:  # RunnerBackend's: the runner proved itself
        raise NotImplementedError

    def _call(self, make: Callable[[int], Any], what: str) -> Any:
        """One call to the runner, waiting while one restarts.  Every call is a pure read (tokenize, detokenize,
        logits, embed, describe, stats), so a call the runner died under is sent once more to the runner that
        replaces it, as a stream that had shown nothing is: it costs its caller time, not an error.  A second
        death under the same call (the call may be what kills it), or supervision giving up, raises
        RunnerCrashedError."""
        deaths = 0
        while True:
            call_id = next(self._call_ids)
            future: Future = Future()
            with self._lock:  # registered before the runner can be marked dead, so on_death fails it if it dies
                runner = self._current()
                runner.calls[call_id] = future
            runner.send(make(call_id), what)
            try:
                reply = future.result()
            except RunnerCrashedError:
                deaths += 1
                if deaths > 1 or self._closed:
                    raise
                continue
            if isinstance(reply, p.CallFailed):
                p.raise_error(reply.error)
            if isinstance(reply, p.ArrayReply):  # logits or embeddings
                # the model computed something on this runner: as a finished reply does, it proves the runner
                # works, so crashes before it were not "in a row" (an embeddings-only server under repeated
                # kills would otherwise stop restarting after MAX_CRASHES_IN_A_ROW)
                self._finished_ok()
            return reply

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        return self._call(lambda i: p.Tokenize(i, text, add_special, parse_special), "tokenize()").token_ids

    def detokenize(self, token_ids: Sequence[int]) -> str:
        return self._call(lambda i: p.Detokenize(i, [int(t) for t in token_ids]), "detokenize()").text

    def logits(self, token_ids: Sequence[int]) -> Any:
        import numpy as np  # lazy: heavy: numpy

        ids = [int(t) for t in token_ids]
        reply = self._call(lambda i: p.Logits(i, ids), f"logits({len(ids)} tokens)")
        return np.frombuffer(reply.data, dtype=np.float32).reshape(reply.shape)

    def embed(self, inputs: Sequence[Sequence[int]]) -> Any:
        import numpy as np  # lazy: heavy: numpy

        batch = [[int(t) for t in ids] for ids in inputs]
        reply = self._call(lambda i: p.Embed(i, batch), f"embed({len(batch)} inputs)")
        return np.frombuffer(reply.data, dtype=np.float32).reshape(reply.shape)

    def describe(self) -> Description:
        try:
            if self._unloaded:
                raise RunnerCrashedError("unloaded")  # what it said when loaded, without loading it again
            info = dict(self._call(lambda i: p.Describe(i), "describe()").describe)
        except HearthError:
            info = dict(self._describe)
        runner = self._runner
        info["runner_pid"] = runner.pid if runner is not None else None
        if runner is not None and runner.resident:  # left loaded by an earlier command (resident.py)
            info["runner_reused"] = True
        if self.config.why:
            info["runner_config"] = self.config.why
        return Description.from_mapping(info)

    def stats(self) -> EngineStats:
        if self._unloaded:  # nothing is loaded: nothing to ask (and no reason to load it for /metrics)
            return EngineStats()
        return self._call(lambda i: p.Stats(i), "stats()").stats

    def memory_in_use(self) -> dict[str, int]:
        s = self.stats()
        return {"rss_bytes": s.rss_bytes, "gpu_bytes": s.gpu_bytes}
