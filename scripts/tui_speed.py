"""Decode speed in the chat app against `hearth run`, on the same model and prompt (issue: the engine no longer
shares the UI's process).  Prints one line per run and a JSON summary.

    .venv/bin/python scripts/tui_speed.py [--model M] [--threads N ...] [--max-tokens 200] [--repeat 3]

The TUI runs headless under Textual's pilot, as in the tests, but with the real loader (a runner process);
`hearth run -v` runs as a subprocess.  Both answer the same prompt greedily; the figure is the reply's decode
tokens/s as the backend measured it (RequestStats.decode_tokens_per_s).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

PROMPT = "Write a long story about a dragon who learns to cook. Use many paragraphs."


async def tui_once(model: str | None, threads: int | None, max_tokens: int) -> float:
    from app.conversations import ConversationStore
    from app.settings import Settings
    from app.tui.app import HearthApp

    settings = Settings(model=model, temperature=0.0, max_tokens=max_tokens, threads=threads)
    app = HearthApp(settings, conversations=ConversationStore.open())
    async with app.run_test(size=(120, 40)) as pilot:
        while app.loaded is None:
            await pilot.pause(0.1)
        app.prompt_box.load_text(PROMPT)
        await pilot.press("enter")
        await pilot.pause(0.2)
        while app.turn is not None:
            await pilot.pause(0.05)
        stats = app.store.get(app.conv.id).messages[-1].stats or {}
        app.loaded.backend.close()
    return float(stats.get("decode_tokens_per_s", 0.0))


def run_once(model: str | None, threads: int | None, max_tokens: int) -> float:
    args = [sys.executable, "-m", "app", "run", "-v", "--temperature", "0", "--max-tokens", str(max_tokens), PROMPT]
    if model:
        args += ["--model", model]
    if threads:
        args += ["--threads", str(threads)]
    out = subprocess.run(args, capture_output=True, text=True, timeout=600)
    m = re.search(r"decode ([0-9.]+) tok/s", out.stderr)
    if not m:
        raise SystemExit(f"hearth run printed no stats: {out.stderr[-500:]}")
    return float(m.group(1))


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--model")
    p.add_argument("--threads", type=int, nargs="*", default=[0], help="0 = hearth's default for each")
    p.add_argument("--max-tokens", type=int, default=200)
    p.add_argument("--repeat", type=int, default=3)
    a = p.parse_args()
    os.environ.setdefault("HEARTH_HOME", tempfile.mkdtemp(prefix="hearth-tui-speed-"))
    summary: dict[str, float] = {}
    for threads in a.threads:
        t = threads or None
        for name, fn in (
            ("tui", lambda: asyncio.run(tui_once(a.model, t, a.max_tokens))),
            ("run", lambda: run_once(a.model, t, a.max_tokens)),
        ):
            rates = []
            for _ in range(a.repeat):
                rates.append(fn())
                print(f"{name} threads={threads or 'default'}: {rates[-1]:.1f} tok/s", flush=True)
            summary[f"{name} threads={threads or 'default'}"] = round(statistics.median(rates), 1)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
