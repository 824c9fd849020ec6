"""The first paint imports no engine: torch and llama_cpp load only in the worker, after the screen is up."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.tui

CHILD = textwrap.dedent("""
    import asyncio, sys, threading
    from app.conversations import ConversationStore
    from app.settings import Settings
    from app.tui.app import HearthApp
    gate = threading.Event()

    def loader(settings, progress=None):  # never finishes before the check below
        gate.wait(30)
        raise RuntimeError("not loading in this test")

    async def main():
        app = HearthApp(Settings(), loader=loader, conversations=ConversationStore.open())
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot.pause()
            assert app.focused is app.prompt_box
            assert app.settings.model == "smollm2-135m-instruct"  # preselected before any load
            heavy = sorted(m for m in ("torch", "llama_cpp", "triton") if m in sys.modules)
            print("HEAVY", heavy, flush=True)
            gate.set()

    asyncio.run(main())
""")


def test_first_paint_imports_no_engine() -> None:
    root = Path(__file__).resolve().parents[2]
    r = subprocess.run([sys.executable, "-c", CHILD], cwd=root, capture_output=True, text=True, timeout=60)
    assert "HEAVY []" in r.stdout, r.stdout + r.stderr
