"""Pilot tests of the chat with a scripted FakeBackend."""

from __future__ import annotations

import pytest

from backends.errors import ContextOverflowError, OutOfMemoryError
from tests.tui.conftest import chat_text, wait_for

pytestmark = pytest.mark.tui


async def send(pilot, text: str) -> None:
    app = pilot.app
    app.prompt_box.load_text(text)
    await pilot.press("enter")


async def test_send_streams_markdown_reply_and_saves(make_app, backend) -> None:
    app = make_app()
    async with app.run_test(size=(100, 30)) as pilot:
        assert app.focused is app.prompt_box
        await wait_for(pilot, lambda: app.loaded is not None)
        await send(pilot, "Hi there")
        await wait_for(pilot, lambda: app.turn is None and len(chat_text(app)) == 2)
        assert chat_text(app) == [("user", "Hi there"), ("assistant", "Hello **there**, this is a reply.")]
        assert app.prompt_box.text == ""
        conv = app.store.get(app.conv.id)
        assert [m.role for m in conv.messages] == ["user", "assistant"]
        assert conv.title == "Hi there"
        assert "<|im_start|>user\nHi there<|im_end|>" in backend.requests[-1].prompt  # the model's template
        assert "tok/s" in str(app.status.render())


async def test_prompt_sent_before_model_ready_waits(make_app, backend) -> None:
    backend.load_delay_s = 0.5
    app = make_app()
    async with app.run_test(size=(100, 30)) as pilot:
        await send(pilot, "early bird")
        assert app.loaded is None and app.pending is not None
        await wait_for(pilot, lambda: len(chat_text(app)) == 2 and app.turn is None)
        assert chat_text(app)[1][1].startswith("Hello")
        await wait_for(pilot, lambda: "ready" in str(app.status.render()))
        await pilot.pause(0.2)  # let the reply's last UI updates finish before the app closes


async def test_escape_stops_and_keeps_partial_reply(make_app, backend) -> None:
    backend.replies = ["one two three four five six seven eight"]
    backend.token_delay_s = 0.15
    app = make_app()
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: app.loaded is not None)
        await send(pilot, "count")
        await wait_for(pilot, lambda: app.turn is not None and app.turn.text)
        await pilot.press("escape")
        await wait_for(pilot, lambda: app.turn is None)
        reply = app.store.get(app.conv.id).messages[-1]
        assert reply.role == "assistant" and reply.content and len(reply.content) < len(backend.replies[0])
        assert reply.stats["finish_reason"] == "abort"
        await pilot.pause()
        assert app.query("MessageBox").last().border_subtitle == "stopped"


async def test_regenerate_replaces_last_reply(make_app, backend) -> None:
    backend.replies = ["first answer", "second answer"]
    app = make_app()
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: app.loaded is not None)
        await send(pilot, "q")
        await wait_for(pilot, lambda: app.turn is None and len(chat_text(app)) == 2)
        await pilot.press("ctrl+r")
        await wait_for(pilot, lambda: app.turn is None and chat_text(app)[-1][1] == "second answer")
        assert [m.content for m in app.store.get(app.conv.id).messages] == ["q", "second answer"]


async def test_edit_and_resend_from_earlier_message(make_app, backend) -> None:
    backend.replies = ["a1", "a2", "a3"]
    app = make_app()
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: app.loaded is not None)
        for q in ("q1", "q2"):
            await send(pilot, q)
            await wait_for(pilot, lambda: app.turn is None and chat_text(app)[-1][0] == "assistant")
        first = app.query("MessageBox.user").first()
        first.focus()
        await pilot.press("e")
        assert app.prompt_box.text == "q1" and app.edit_from == 0
        app.prompt_box.load_text("q1 edited")
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.turn is None and chat_text(app)[-1] == ("assistant", "a3"))
        assert [m.content for m in app.store.get(app.conv.id).messages] == ["q1 edited", "a3"]


async def test_switch_conversation(make_app, backend) -> None:
    backend.replies = ["r1", "r2"]
    app = make_app()
    async with app.run_test(size=(120, 30)) as pilot:
        await wait_for(pilot, lambda: app.loaded is not None)
        await send(pilot, "first chat")
        await wait_for(pilot, lambda: app.turn is None and len(chat_text(app)) == 2)
        first_id = app.conv.id
        await pilot.press("ctrl+n")
        assert chat_text(app) == []
        await send(pilot, "second chat")
        await wait_for(pilot, lambda: app.turn is None and len(chat_text(app)) == 2)
        from app.tui.widgets.sidebar import Sidebar

        app.post_message(Sidebar.Open(first_id))
        await wait_for(pilot, lambda: app.conv.id == first_id)
        await pilot.pause()
        assert chat_text(app) == [("user", "first chat"), ("assistant", "r1")]
        assert {c.title for c in app.store.list()} == {"first chat", "second chat"}
        assert [c.title for c in app.store.list("second")] == ["second chat"]


@pytest.mark.parametrize(
    "error",
    [
        ContextOverflowError("prompt is 5000 tokens, context 4096", "start a new chat"),
        OutOfMemoryError("needs 9.8 GiB, 8.0 GiB free", "try --ctx 2048"),
    ],
)
async def test_backend_errors_notify_and_restore_prompt(make_app, backend, error) -> None:
    app = make_app()
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: app.loaded is not None)
        backend.fail_next = error
        await send(pilot, "a long question")
        await wait_for(pilot, lambda: app.turn is None and app.prompt_box.text == "a long question")
        assert any(error.message in n.message for n in app._notifications)
        assert app.store.get(app.conv.id).messages == ()
        backend.replies = ["fine now"]
        await pilot.press("enter")  # the app keeps working
        await wait_for(pilot, lambda: app.turn is None and chat_text(app)[-1] == ("assistant", "fine now"))


async def test_load_failure_notifies_and_keeps_running(make_app, backend) -> None:
    backend.fail_load = OutOfMemoryError("needs 9.8 GiB, 8.0 GiB free", "try a smaller quant")
    app = make_app()
    async with app.run_test(size=(80, 24)) as pilot:
        await send(pilot, "hello?")
        await wait_for(pilot, lambda: not app.loading and app.prompt_box.text == "hello?")
        assert any("9.8 GiB" in n.message for n in app._notifications)
        await pilot.press("f1")
        assert app.screen.__class__.__name__ == "HelpScreen"


async def test_switching_model_closes_the_old_one(make_app, backend) -> None:
    from tests.fakes import FakeBackend
    from tests.tui.conftest import fake_loader

    made: list[FakeBackend] = []

    def loader(settings, progress=None):
        made.append(backend if not made else FakeBackend(replies=["from the new model"]))
        return fake_loader(made[-1])(settings, progress)

    app = make_app(loader=loader)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: app.loaded is not None)
        app.switch_model("other-model")
        await wait_for(pilot, lambda: app.loaded is not None and app.loaded.entry.name == "other-model")
        assert backend.closed and not made[-1].closed
        await send(pilot, "hi")
        await wait_for(pilot, lambda: app.turn is None and chat_text(app)[-1] == ("assistant", "from the new model"))


async def test_copy_last_reply_and_code_block(make_app, backend) -> None:
    backend.replies = ["Try:\n\n```sh\nls -la\n```\n"]
    app = make_app()
    copied: list[str] = []
    app.copy_to_clipboard = copied.append  # OSC 52 goes to the terminal; record it instead
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: app.loaded is not None)
        await send(pilot, "list files")
        await wait_for(pilot, lambda: app.turn is None and len(chat_text(app)) == 2)
        await pilot.press("f10")
        await pilot.press("f9")
        assert copied == ["ls -la\n", backend.replies[0]]


async def test_quitting_mid_reply_keeps_what_was_written(make_app, backend) -> None:
    backend.replies = ["word " * 200]
    backend.token_delay_s = 0.02
    app = make_app()
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: app.loaded is not None)
        await send(pilot, "talk")
        await wait_for(pilot, lambda: app.turn is not None and len(app.turn.text) > 10)
        conv_id = app.conv.id
    reply = app.store.get(conv_id).messages[-1]
    assert reply.role == "assistant" and reply.content.startswith("word") and reply.stats["finish_reason"] == "abort"
    assert not backend.closed  # mid-reply the model is not closed: its runner ends with the app


async def test_quitting_between_replies_closes_the_model(make_app, backend) -> None:
    """So that a runner stays loaded for --keep-alive (backends/runner/resident.py) and the next start is quick."""
    app = make_app()
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: app.loaded is not None)
        await send(pilot, "hi")
        await wait_for(pilot, lambda: app.turn is None and len(chat_text(app)) == 2)
        assert not backend.closed
    assert backend.closed
