"""OneThread: run callables on one long-lived thread, one at a time, in the order they were submitted.

Why the llama.cpp backend needs it: ggml's CPU backend runs each llama_decode on an OpenMP team that belongs
to the calling thread.  Requests arrive on whatever thread the caller uses (a server's thread pool, a thread
per TUI reply, 16 bench clients), and every new calling thread adds a team; once a process has more OpenMP
threads than cores, libgomp stops spinning between parallel regions.  On the 2-core dev machine that halved
llama.cpp's decode speed (129 -> 66 tok/s with 16 client threads).  Routing every llama.cpp call through one
thread keeps one team, whoever calls.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


class OneThread:
    def __init__(self, name: str) -> None:
        self._name = name
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """fn(*args) on the thread; returns its result or re-raises what it raised.  Re-entrant: called from
        the thread itself, fn runs at once."""
        if threading.current_thread() is self._thread:
            return fn(*args)
        reply: queue.SimpleQueue = queue.SimpleQueue()
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
                self._thread.start()
            self._jobs.put((fn, args, reply))
        ok, value = reply.get()
        if not ok:
            raise value
        return value

    def stop(self) -> None:
        """Let the thread finish the jobs already queued and exit; a later call starts a new one."""
        with self._lock:
            thread, self._thread = self._thread, None
            if thread is not None:
                self._jobs.put(None)
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def _loop(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            fn, args, reply = job
            try:
                reply.put((True, fn(*args)))
            except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
                reply.put((False, exc))
