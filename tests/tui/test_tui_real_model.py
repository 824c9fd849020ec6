"""End to end: the real starter model through llama.cpp in the TUI, as a person would use it."""

from __future__ import annotations

import pytest

from app.conversations import ChatSettings, ConversationStore
from app.settings import Settings
from tests.tui.conftest import chat_text, wait_for

pytestmark = [pytest.mark.tui, pytest.mark.e2e]


async def test_capital_of_france_with_the_starter_model(starter_path) -> None:
    from app.tui.app import HearthApp

    store = ConversationStore.open()
    conv = store.create(ChatSettings(temperature=0.0, max_tokens=32))
    from app.store import ModelStore

    ModelStore().update_state(last_conversation=conv.id)
    app = HearthApp(Settings(ctx=1024, keep_alive="0"), conversations=store)  # default loader: app.loading.open_backend
    async with app.run_test(size=(100, 30)) as pilot:
        app.prompt_box.load_text("What is the capital of France?")
        await pilot.press("enter")
        await wait_for(pilot, lambda: len(chat_text(app)) == 2 and app.turn is None, timeout=90)
        assert app.loaded.entry.name == "smollm2-135m-instruct"  # the starter, preselected
        assert "Paris" in chat_text(app)[1][1]
        assert "tok/s" in str(app.status.render())
        backend = app.loaded.backend
        await pilot.press("f4")
        await wait_for(pilot, lambda: app.screen.__class__.__name__ == "ModelPicker")
        await pilot.press("escape")
    backend.close()
