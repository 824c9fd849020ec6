"""Rename, delete and search conversations; the per-conversation settings panel reaches the request."""

from __future__ import annotations

import pytest

from app.defaults import SAMPLING
from app.model_sampling import model_defaults
from tests.tui.conftest import chat_text, screen_text, wait_for

pytestmark = pytest.mark.tui


async def send(pilot, text: str) -> None:
    pilot.app.prompt_box.load_text(text)
    await pilot.press("enter")
    await wait_for(pilot, lambda: pilot.app.turn is None and chat_text(pilot.app)[-1][0] == "assistant")


async def test_rename_search_delete(make_app, backend) -> None:
    app = make_app()
    async with app.run_test(size=(120, 30)) as pilot:
        await wait_for(pilot, lambda: app.loaded is not None)
        await send(pilot, "about cats")
        await pilot.press("ctrl+n")
        await send(pilot, "about dogs")
        await pilot.press("f2")
        inp = app.screen.query_one("#answer")
        inp.value = "Dog notes"
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.store.get(app.conv.id).title == "Dog notes")
        assert "Dog notes" in screen_text(app)
        await pilot.press("ctrl+f")
        await pilot.press(*"cats")
        await wait_for(pilot, lambda: len(app.query("ConversationItem")) == 1)
        assert app.query_one("ConversationItem").conversation_id != app.conv.id  # only the cat chat matches
        await pilot.press("f8")
        await pilot.press("y")
        await wait_for(pilot, lambda: len(app.store.list()) == 1)
        assert app.store.list()[0].title == "about cats" and chat_text(app)[0] == ("user", "about cats")


async def test_settings_panel_changes_sampling(make_app, backend) -> None:
    app = make_app()
    async with app.run_test(size=(100, 40)) as pilot:
        await wait_for(pilot, lambda: app.loaded is not None)
        await pilot.press("f3")
        screen = app.screen
        screen.query_one("#temperature").value = "0"
        screen.query_one("#max_tokens").value = "3"
        screen.query_one("#seed").value = "42"
        screen.query_one("#system").load_text("Answer in French.")
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: app.screen is not screen)
        backend.replies = ["un deux trois quatre"]
        await send(pilot, "count")
        s = backend.requests[-1].sampling
        assert (s.temperature, s.max_tokens, s.seed) == (0.0, 3, 42)
        assert "Answer in French." in backend.requests[-1].prompt
        assert chat_text(app)[-1][1] == "un deux trois"
        await pilot.press("f3")
        app.screen.query_one("#temperature").value = "-1"
        await pilot.press("ctrl+s")
        assert app.screen.__class__.__name__ == "SettingsScreen"  # refused with a notification
        assert any("temperature" in n.message for n in app._notifications)


async def test_the_panels_sampling_becomes_the_models_default(make_app, backend) -> None:
    """Issue 45 item 3: F3's temperature and top-p, once changed, are the model's defaults from then on (saved
    per model, app/model_sampling.py): a new conversation with it starts with them, and `hearth show` lists them."""
    app = make_app()
    async with app.run_test(size=(100, 40)) as pilot:
        await wait_for(pilot, lambda: app.loaded is not None)
        first = app.conv.settings
        assert (first.temperature, first.top_p) == (SAMPLING.temperature, SAMPLING.top_p)  # nothing recommended
        await pilot.press("f3")
        screen = app.screen
        screen.query_one("#temperature").value = "0.3"
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: app.screen is not screen)
        assert any("new conversations with fake-model" in n.message for n in app._notifications)
        old = app.conv.id
        await pilot.press("ctrl+n")
        await wait_for(pilot, lambda: app.conv.id != old)
        assert (app.conv.settings.temperature, app.conv.settings.top_p) == (0.3, SAMPLING.top_p)
        await send(pilot, "hi")
        assert backend.requests[-1].sampling.temperature == 0.3
    assert model_defaults(None, "fake-model").values() == {"temperature": 0.3}


async def test_mouse_click_switches_and_export_writes_files(make_app, backend) -> None:
    app = make_app()
    async with app.run_test(size=(120, 30)) as pilot:
        await wait_for(pilot, lambda: app.loaded is not None)
        await send(pilot, "older chat")
        first = app.conv.id
        await pilot.press("ctrl+n")
        await send(pilot, "newer chat")
        items = list(app.query("ConversationItem"))
        target = next(i for i in items if i.conversation_id == first)
        await pilot.click(target)
        await wait_for(pilot, lambda: app.conv.id == first)
        await pilot.press("f6")
        out = app.store.path.parent / "exports" / f"conversation-{first}"
        assert "## You\n\nolder chat" in out.with_suffix(".md").read_text()
        assert '"older chat"' in out.with_suffix(".json").read_text()
