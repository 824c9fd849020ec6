"""Pilot helpers: a HearthApp wired to a FakeBackend, and waiting for it without fixed sleeps."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from app.conversations import ConversationStore
from app.loading import Decision, Loaded
from app.settings import Settings
from app.store import ModelEntry
from backends.api import LoadOptions
from tests.fakes import FakeBackend


def fake_loader(backend: FakeBackend) -> Callable[..., Loaded]:
    def load(settings: Settings, progress: Any = None) -> Loaded:
        backend.load(progress)
        entry = ModelEntry(settings.model or "fake-model", backend.spec.path, source="builtin")
        return Loaded(backend, entry, backend.spec, Decision("fake", LoadOptions(n_ctx=2048), None, ("fake plan",)))

    return load


@pytest.fixture
def backend() -> FakeBackend:
    return FakeBackend(replies=["Hello **there**, this is a reply."])


@pytest.fixture
def make_app(backend: FakeBackend) -> Callable[..., Any]:
    from app.tui.app import HearthApp

    def make(**kw: Any) -> HearthApp:
        settings = kw.pop("settings", Settings(model="fake-model"))
        return HearthApp(
            settings, loader=kw.pop("loader", fake_loader(backend)), conversations=ConversationStore.open()
        )

    return make


async def wait_for(pilot: Any, cond: Callable[[], bool], timeout: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not cond():
        if loop.time() > end:
            raise AssertionError("timed out waiting for the app")
        await pilot.pause(0.02)


def chat_text(app: Any) -> list[tuple[str, str]]:
    from app.tui.widgets.chat_log import MessageBox

    return [(b.role, b.text) for b in app.query(MessageBox)]


def screen_text(app: Any) -> str:
    """What the terminal shows, as plain text lines (a snapshot without colours)."""
    strips = app.screen._compositor.render_strips()
    return "\n".join(strip.text.rstrip() for strip in strips)
