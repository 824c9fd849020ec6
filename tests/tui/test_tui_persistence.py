"""Killing the app with SIGKILL mid-reply loses at most the reply in flight; a restart shows the rest."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.tui.conftest import chat_text, wait_for

pytestmark = pytest.mark.tui

ROOT = Path(__file__).resolve().parents[2]

# Runs the real HearthApp headless with a slow FakeBackend: one full turn, then a second reply that is still
# streaming when the parent kills the process.
CHILD = textwrap.dedent("""
    import asyncio, sys
    from app.conversations import ConversationStore
    from app.settings import Settings
    from app.tui.app import HearthApp
    from tests.fakes import FakeBackend
    from tests.tui.conftest import fake_loader, wait_for

    async def main():
        backend = FakeBackend(replies=["the first reply", "word " * 500])
        app = HearthApp(Settings(model="fake-model"), loader=fake_loader(backend),
                        conversations=ConversationStore.open())
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_for(pilot, lambda: app.loaded is not None, 30)
            app.prompt_box.load_text("first question")
            await pilot.press("enter")
            await wait_for(pilot, lambda: app.turn is None and len(app.store.get(app.conv.id).messages) == 2, 30)
            backend.token_delay_s = 0.02
            app.prompt_box.load_text("second question")
            await pilot.press("enter")
            await wait_for(pilot, lambda: app.turn is not None and len(app.turn.text) > 20, 30)
            print("STREAMING", flush=True)
            await asyncio.sleep(60)

    asyncio.run(main())
""")


async def test_sigkill_mid_reply_then_restart(make_app) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        line = proc.stdout.readline()
        if line.strip() != "STREAMING":
            proc.wait(timeout=30)
            raise AssertionError(f"the child app did not get to streaming: {line!r} {proc.stderr.read()}")
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL

    app = make_app()  # same HEARTH_HOME: the database and state.json the killed app wrote
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: len(chat_text(app)) == 3, 30)
        assert chat_text(app) == [
            ("user", "first question"),
            ("assistant", "the first reply"),
            ("user", "second question"),
        ]
        assert app.conv.title == "first question"  # the last conversation reopened
        await pilot.press("ctrl+r")  # and the unanswered question can be answered now
        await wait_for(pilot, lambda: app.turn is None and len(chat_text(app)) == 4)
