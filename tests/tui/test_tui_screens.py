"""Text snapshots of the main screens at 80x24 and 140x40: what a person sees, without colours.

They check layout facts (what is on screen, nothing cut off) rather than comparing every cell, so a Textual
upgrade that moves a border by one column does not fail them while a missing panel does.
"""

from __future__ import annotations

import pytest

from tests.tui.conftest import screen_text, wait_for

pytestmark = pytest.mark.tui


@pytest.mark.parametrize("size", [(80, 24), (140, 40)])
async def test_main_screen(make_app, backend, size) -> None:
    backend.replies = ["Here is code:\n\n```python\nprint('hi')\n```\n\nDone."]
    app = make_app()
    async with app.run_test(size=size) as pilot:
        await wait_for(pilot, lambda: app.loaded is not None)
        app.prompt_box.load_text("show me code")
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.turn is None and len(app.query("MessageBox")) == 2)
        await pilot.pause()
        text = screen_text(app)
        lines = text.splitlines()
        assert len(lines) == size[1] and all(len(line) <= size[0] for line in lines)
        assert "show me code" in text and "print('hi')" in text and "```" not in text  # rendered Markdown
        status = lines[-1]
        assert status.lstrip().startswith("ready") and "tok/s" in status and "ctx " in status and "RAM" in status
        assert "fake-model" in lines[-2] or "fake-model" in lines[-4]  # the prompt box names the model
        assert ("search" in text) == (size[0] >= 100)  # the sidebar shows only where it fits


async def test_help_lists_every_binding(make_app) -> None:
    app = make_app()
    async with app.run_test(size=(100, 40)) as pilot:
        await pilot.press("f1")
        await pilot.pause()
        text = screen_text(app)
        for b in app.BINDINGS:
            if b.show:
                assert b.description in text, b.description
        assert "Ctrl+J" in text and "Enter" in text
        await pilot.press("escape")
        assert app.screen.__class__.__name__ != "HelpScreen"


async def test_question_mark_types_in_prompt(make_app) -> None:
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("a", "question_mark", "ctrl+j", "b")
        assert app.prompt_box.text == "a?\nb"
        assert app.screen is app.screen_stack[0]


async def test_model_picker_shows_the_plan(make_app, monkeypatch) -> None:
    from app.tui.screens import models

    class Opt:
        n_ctx, n_gpu_layers = 4096, -1

    class D:
        backend, options, plan, reasons = "llama.cpp", Opt(), None, ("all 30 layers fit on GPU 0",)

    class E:
        name, path = "tiny-q4", "/x.gguf"

    class S:
        file_size_bytes, file_type = 3 * 2**30, "Q4_K_M"

    row = models.model_row(E(), S(), D())
    assert row == ("tiny-q4", "3.00 GiB", "Q4_K_M", "llama.cpp", "4096", "all", "?")  # plan None -> "?"
    monkeypatch.setattr(models, "plan_rows", lambda settings: ([row], {"tiny-q4": list(D.reasons)}))
    app = make_app()
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press("f4")
        await wait_for(pilot, lambda: "tiny-q4" in screen_text(app))
        text = screen_text(app)
        assert "3.00 GiB" in text and "Q4_K_M" in text and "all 30 layers fit on GPU 0" in text


async def test_hardware_screen(make_app, monkeypatch) -> None:
    app = make_app()
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: app.loaded is not None)
        await pilot.press("f5")
        await wait_for(pilot, lambda: "MiB available of" in screen_text(app) or "probe failed" in screen_text(app), 20)
        text = screen_text(app)
        assert "RAM   " in text and "MiB available of" in text and "fake plan" in text


async def test_no_color_renders_monochrome(make_app, monkeypatch) -> None:
    from textual.filter import Monochrome

    monkeypatch.setenv("NO_COLOR", "1")
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: app.loaded is not None)
        assert app.no_color and any(isinstance(f, Monochrome) for f in app._filters)


async def test_markdown_list_is_compact(make_app, backend) -> None:
    backend.replies = ["Fruits:\n\n- Apple\n- Banana\n- Oat\n"]
    app = make_app()
    async with app.run_test(size=(120, 30)) as pilot:
        await wait_for(pilot, lambda: app.loaded is not None)
        app.prompt_box.load_text("fruits")
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.turn is None and len(app.query("MessageBox")) == 2)
        await pilot.pause()
        lines = screen_text(app).splitlines()
        rows = [i for i, line in enumerate(lines) if "• Apple" in line or "• Banana" in line or "• Oat" in line]
        assert len(rows) == 3 and rows[2] - rows[0] == 2  # one line per item (a bare Horizontal rule broke it)
