"""A tensor-parallel rank > 0: `python -m backends.torch_engine.tp_group.worker`, a child process of rank 0 (the
engine's process), started by group.py with one end of a socket pair.

It says hello, joins the group, loads the model and keeps its share (ModelRunner with tp=comm), says ready, and
then runs every forward rank 0 sends, in the order sent, until told to close.  Its logits go to rank 0 inside
the forward (the head's gather); it returns nothing itself.  It ends when rank 0's end of the pipe closes
(rank 0's process died: EOFError), and it exits at once when its own forward fails: rank 0 sees the death and
takes the group down (group.py), instead of waiting in a collective this rank will never join.
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import sys
import traceback
from multiprocessing.connection import Connection
from typing import Any

from backends.errors import HearthError


def _failure(exc: BaseException) -> tuple[str, str, str | None]:
    if isinstance(exc, HearthError):
        return "failed", exc.message, exc.hint
    return "failed", f"{type(exc).__name__}: {exc}", None


def worker_main(rank: int, world: int, port: int, conn: Connection) -> None:
    try:
        spec, options = conn.recv()  # the ModelSpec and this rank's LoadOptions (group.rank_options)
        import torch  # lazy: heavy: torch (~3 s)

        from backends.torch_engine.devices import resolve_device  # lazy: heavy: torch (~3 s)
        from backends.torch_engine.model_runner import ModelRunner  # lazy: heavy: torch (~3 s)
        from backends.torch_engine.tp.comm import init_group  # lazy: heavy: torch (~3 s)

        device = resolve_device(options.device)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        conn.send(("hello",))
        comm = init_group(rank, world, port, device)
        runner = ModelRunner(spec, options, tp=comm)
        conn.send(("ready",))
    except BaseException as exc:  # noqa: BLE001 - told to rank 0, which raises it where the load was asked
        traceback.print_exc()
        try:
            conn.send(_failure(exc))
        except OSError:
            pass
        os._exit(1)
    _serve(runner, conn, rank)


def _serve(runner: Any, conn: Connection, rank: int) -> None:
    from backends.torch_engine.tp.comm import leave_group  # lazy: heavy: torch (~3 s)

    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):  # rank 0 is gone: never outlive it
            os._exit(0)
        if msg[0] == "close":
            break
        try:
            if msg[0] == "forward":
                runner.forward(*msg[1:])
            else:
                raise ValueError(f"unknown message {msg[0]!r}")
        except BaseException:  # noqa: BLE001 - the group cannot go on without this rank: exit, rank 0 sees it
            print(f"hearth tensor-parallel rank {rank}: its forward failed", file=sys.stderr)
            traceback.print_exc()
            sys.stderr.flush()
            os._exit(1)
    runner.close()
    leave_group()
    conn.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hearth-tp-rank")
    for flag in ("--fd", "--rank", "--world", "--port"):
        parser.add_argument(flag, type=int, required=True)
    args = parser.parse_args(argv)

    faulthandler.enable()
    worker_main(args.rank, args.world, args.port, Connection(args.fd))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
