"""The chat app through --backend remote: it loads the remote model (named by the server), shows its name, and
a conversation goes to the server as messages with the conversation's system prompt."""

from __future__ import annotations

import pytest

from app.conversations import ConversationStore
from app.settings import Settings
from tests.fakes import loaded_fake
from tests.tui.conftest import chat_text, wait_for

pytestmark = pytest.mark.tui


async def test_the_tui_chats_through_a_remote_server_and_shows_its_model(served) -> None:
    from app.tui.app import HearthApp

    fake = loaded_fake(replies=("Paris, of course.",))
    server = served(fake, "cluster-model-70b")
    app = HearthApp(Settings(backend="remote", url=server.url), conversations=ConversationStore.open())
    async with app.run_test(size=(110, 30)) as pilot:
        await wait_for(pilot, lambda: app.loaded is not None)
        assert app.loaded.entry.name == "cluster-model-70b" and app.loaded.backend.name == "remote"
        assert "cluster-model-70b" in str(app.status.render())
        assert app.prompt_box.border_title == "cluster-model-70b"
        app.prompt_box.load_text("Capital of France?")
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.turn is None and len(chat_text(app)) == 2)
        assert chat_text(app) == [("user", "Capital of France?"), ("assistant", "Paris, of course.")]
        sent = fake.requests[-1].messages
        assert [(m.role, m.content) for m in sent] == [
            ("system", "You are a helpful assistant."),
            ("user", "Capital of France?"),
        ]
        assert "tok/s" in str(app.status.render())
        await pilot.pause(0.2)


def test_the_hardware_screen_and_the_model_picker_know_a_remote_model(served) -> None:
    from app.remote import open_remote
    from app.tui.screens.hardware import format_plan

    server = served(loaded_fake(), "cluster-model-70b")
    loaded = open_remote(Settings(backend="remote", url=server.url))
    text = format_plan(loaded.decision)
    assert text.startswith("Backend remote: the model runs on its server") and server.url in text
    assert "GPU layers" not in text
    loaded.backend.close()


def test_picking_a_local_model_leaves_the_remote_server() -> None:
    from app.tui.app import HearthApp

    app = HearthApp(Settings(backend="remote", url="http://gpu-box:8000"), conversations=ConversationStore.open())
    loads: list[Settings] = []
    app.start_loading = loads.append  # the settings the next load gets are what this test checks
    app.switch_model("smollm2-135m-instruct")
    assert loads == [app.settings]
    assert app.settings.backend == "auto" and app.settings.model == "smollm2-135m-instruct"
