"""The chat app survives its model's runner: a SIGSEGV mid-reply costs that reply, nothing else."""

from __future__ import annotations

import pytest

from backends.runner.client import RunnerBackend
from tests.fakes import fake_spec
from tests.tui.conftest import chat_text, fake_loader, wait_for

pytestmark = pytest.mark.tui


async def test_runner_sigsegv_mid_reply_keeps_app_conversation_and_prompt(make_app, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HEARTH_FAKE_TOKEN_DELAY", "0.05")
    backend = RunnerBackend(fake_spec(), backend="tests.runner_fakes:CrashingFake", log_dir=tmp_path)
    app = make_app(loader=fake_loader(backend))  # type: ignore[arg-type]
    try:
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_for(pilot, lambda: app.loaded is not None)
            first_pid = backend.pid
            app.prompt_box.load_text("hello")
            await pilot.press("enter")
            await wait_for(pilot, lambda: app.turn is None and len(chat_text(app)) == 2)
            before = [(m.role, m.content) for m in app.store.get(app.conv.id).messages]

            app.prompt_box.load_text("please CRASH now")
            await pilot.press("enter")
            await wait_for(pilot, lambda: app.turn is None, timeout=20)
            await pilot.pause(0.1)
            # the app is up, the conversation is what it was, the prompt is back
            assert [(m.role, m.content) for m in app.store.get(app.conv.id).messages] == before
            assert app.prompt_box.text == "please CRASH now"
            said = [str(n.message) for n in app._notifications]
            assert any("SIGSEGV" in s and "back in the prompt" in s for s in said), said
            await wait_for(pilot, lambda: backend.pid not in (None, first_pid), timeout=20)
            await wait_for(pilot, lambda: any("is ready" in str(n.message) for n in app._notifications), timeout=20)

            app.prompt_box.load_text("and again")  # the next message is answered by the new runner
            await pilot.press("enter")
            await wait_for(pilot, lambda: app.turn is None and len(chat_text(app)) == 4, timeout=20)
            assert chat_text(app)[-1] == ("assistant", "one two three four five six seven eight")
    finally:
        backend.close()


async def test_switching_models_ends_the_old_runner_and_frees_its_memory(make_app, tmp_path) -> None:
    import psutil

    from app.loading import Decision, Loaded
    from app.store import ModelEntry
    from backends.api import LoadOptions

    made: list[RunnerBackend] = []

    def loader(settings, progress=None):  # type: ignore[no-untyped-def]
        backend = RunnerBackend(
            fake_spec(name=settings.model), backend="tests.runner_fakes:CrashingFake", log_dir=tmp_path
        )
        made.append(backend)
        backend.load(progress)
        entry = ModelEntry(settings.model, backend.spec.path, source="builtin")
        return Loaded(backend, entry, backend.spec, Decision("fake", LoadOptions(n_ctx=2048)))

    app = make_app(loader=loader)
    try:
        async with app.run_test(size=(100, 30)) as pilot:
            await wait_for(pilot, lambda: app.loaded is not None)
            old = psutil.Process(made[0].pid)
            assert old.memory_info().rss > 10 * 2**20  # the runner holds the model's memory, not the app
            app.switch_model("second-model")
            await wait_for(pilot, lambda: app.loaded is not None and len(made) == 2, timeout=20)
            assert not old.is_running() or old.status() == psutil.STATUS_ZOMBIE  # its memory went back
            assert psutil.Process(made[1].pid).is_running()
    finally:
        for backend in made:
            backend.close()
