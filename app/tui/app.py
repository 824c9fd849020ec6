"""HearthApp: the chat.  The first screen paints at once; the model loads in a thread worker meanwhile.

Ownership: the App holds the loaded backend and the ConversationStore.  Backends are touched only inside thread
workers (app.tui.engine), whose results come back as messages (app.tui.events); widgets only post messages.
A "turn" is one reply being generated: it remembers its conversation, so switching conversation mid-reply
still saves the reply where it belongs.
"""

from __future__ import annotations

import functools
import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widgets import ProgressBar

from app.conversations import ChatSettings, Conversation, ConversationStore, StoreFullError
from app.defaults import SAMPLING
from app.loaded import Loaded
from app.loading import open_backend, physical_cores
from app.model_sampling import model_defaults, pick
from app.settings import Settings
from app.store import ModelStore
from app.tui import engine, events
from app.tui.actions import ScreenActions
from app.tui.widgets.chat_log import ChatLog, MessageBox
from app.tui.widgets.prompt import PromptBox
from app.tui.widgets.sidebar import Sidebar
from app.tui.widgets.status import StatusBar
from app.unsaved_replies import RETRY_S, UnsavedReplies
from backends.sampling_defaults import SamplingDefaults
from hwprobe.errors import HearthError

Loader = Callable[..., Loaded]  # (settings, progress=...) -> Loaded

log = logging.getLogger(__name__)


@dataclass
class Turn:
    id: int
    conversation_id: int
    prompt: str  # the user's text, put back in the prompt box when the turn fails
    box: MessageBox | None  # where the reply streams (None when its conversation is not shown)
    worker: Any = None
    text: str = ""


class HearthApp(ScreenActions, App[None]):
    CSS_PATH = "hearth.tcss"
    TITLE = "hearth"
    BINDINGS = [
        Binding("f1", "help", "help (also ? outside the prompt)", priority=True),
        Binding("escape", "stop", "stop the reply (keeps what was generated)"),
        Binding("ctrl+r", "regenerate", "regenerate the last reply", priority=True),
        Binding("ctrl+g", "edit_last", "edit the last message you sent", priority=True),
        Binding("f9", "copy_reply", "copy the last reply (OSC 52)", priority=True),
        Binding("f10", "copy_code", "copy the last code block (OSC 52)", priority=True),
        Binding("ctrl+n", "new", "new conversation", priority=True),
        Binding("ctrl+b", "toggle_sidebar", "show / hide the conversations", priority=True),
        Binding("ctrl+f", "search", "search conversations", priority=True),
        Binding("f2", "rename", "rename the conversation", priority=True),
        Binding("f3", "settings", "system prompt and sampling for this conversation", priority=True),
        Binding("f4", "models", "pick a model", priority=True),
        Binding("f5", "hardware", "hardware and plan", priority=True),
        Binding("f6", "export", "export the conversation (Markdown + JSON)", priority=True),
        Binding("f8", "delete", "delete the conversation", priority=True),
        Binding("question_mark", "help", show=False),
    ]

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        loader: Loader | None = None,
        conversations: ConversationStore | None = None,
        hardware_file: str | None = None,
    ) -> None:
        super().__init__()

        self.settings = settings or Settings()
        self.model_store = ModelStore()
        if self.settings.model is None:  # preselect the last used model, else the starter
            self.settings = self.settings.merged(model=self.model_store.default_model_name())
        if self.settings.threads is None:
            # Leave one core to the UI, even with the engine in its own runner process: measured on 2 cores (AMD
            # EPYC, starter, scripts/tui_speed.py), llama.cpp decoded at 62 tok/s on both cores while Textual
            # rendered and at 90-98 tok/s on one (its worker threads spin-wait on each other when the UI takes a core).

            self.settings = self.settings.merged(threads=max(1, physical_cores() - 1))
        self.loader = loader or functools.partial(_default_loader, hardware_file=hardware_file)
        self.store = conversations or ConversationStore.open()
        self.loaded: Loaded | None = None  # once ready
        self.loading = False
        self.pending: int | None = None  # conversation id waiting for the model to answer
        self.turn: Turn | None = None
        self.edit_from: int | None = None  # position an edited message replaces
        self.unsaved = UnsavedReplies()  # replies a full disk refused, saved once there is room (unsaved_replies.py)
        self._save_timer: Any = None
        self.conv: Conversation = self._initial_conversation()
        self._turn_ids = itertools.count(1)
        self._request_id = ""  # the request in flight (set by its worker once the template rendered)

    # -- layout -------------------------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        with Horizontal(id="body"):
            yield Sidebar(id="sidebar")
            with Vertical(id="main"):
                yield ChatLog(id="chat")
                yield ProgressBar(total=1.0, show_eta=False, id="progress")
                yield PromptBox(id="prompt")
        yield StatusBar(id="status")

    async def on_mount(self) -> None:
        self.query_one(PromptBox).focus()
        if self.size.width < 100:
            self.query_one(Sidebar).display = False
        await self.show_conversation(self.conv.id)
        self.start_loading(self.settings)

    def _initial_conversation(self) -> Conversation:
        last = self.model_store.state().get("last_conversation")
        conv = self.store.get(last) if isinstance(last, int) else None
        return conv or self.store.create(self._new_chat_settings(), self.settings.model)

    def _new_chat_settings(self) -> ChatSettings:
        """A new conversation's settings: the user's where set (settings.toml, flags), else the model's defaults
        (app/model_sampling.py: what F3 last saved for it, over its recommendation), else hearth's."""
        s = self.settings
        fallback = {"temperature": SAMPLING.temperature, "top_p": SAMPLING.top_p}
        v = pick({"temperature": s.temperature, "top_p": s.top_p}, self._model_defaults(s.model), fallback)
        return ChatSettings(s.system_prompt, float(v["temperature"]), float(v["top_p"]), s.max_tokens, s.seed)

    def _model_defaults(self, name: str | None) -> SamplingDefaults:
        """The model's sampling defaults; only the user's own when its file cannot be read now (loading says why)."""
        try:
            entry, spec = self.model_store.spec(name)
        except HearthError:
            return model_defaults(None, name)
        return model_defaults(spec, entry.name)

    @property
    def status(self) -> StatusBar:
        return self.query_one(StatusBar)

    @property
    def prompt_box(self) -> PromptBox:
        return self.query_one(PromptBox)

    # -- model loading ------------------------------------------------------------------------------------
    def start_loading(self, settings: Settings) -> None:
        self.loading = True
        self.query_one(ProgressBar).display = True
        self.query_one(ProgressBar).update(progress=0)
        self.status.set(model=settings.model or "model", state="loading", stats=None)
        self._load(settings, self.loaded)
        self.loaded = None

    @work(thread=True, exclusive=True, group="load")
    def _load(self, settings: Settings, old: Loaded | None) -> None:
        if old is not None:
            engine.close_model(old)
        engine.load_model(self.loader, settings, self.post_message)

    def on_load_progress(self, msg: events.LoadProgress) -> None:
        self.query_one(ProgressBar).update(progress=msg.fraction)
        self.status.set(state=f"loading {msg.fraction:.0%}: {msg.what}")

    def on_model_ready(self, msg: events.ModelReady) -> None:
        self.loaded, self.loading = msg.loaded, False
        self.prompt_box.border_title = msg.loaded.entry.name
        self.query_one(ProgressBar).display = False
        self.status.set(model=msg.loaded.entry.name, state="ready", n_ctx=msg.describe.n_ctx, memory=msg.memory)
        if self.pending is not None:
            conv_id, self.pending = self.pending, None
            self.generate(conv_id)

    def on_runner_notice(self, msg: events.RunnerNotice) -> None:
        self.notify(msg.text, title="model runner", severity="warning", timeout=12)

    def on_model_failed(self, msg: events.ModelFailed) -> None:
        self.loading = False
        self.query_one(ProgressBar).display = False
        self.status.set(state="not loaded (F4 picks a model)")
        self.notify(f"could not load {msg.model}: {msg.error}", severity="error", timeout=15)
        if self.pending is not None:
            self._restore_failed_prompt(self.pending)
            self.pending = None

    # -- conversations ------------------------------------------------------------------------------------
    async def show_conversation(self, conversation_id: int) -> None:
        conv = self.store.get(conversation_id)
        if conv is None:
            return
        self.conv = conv
        self.edit_from = None
        self.model_store.update_state(last_conversation=conv.id)
        await self.query_one(ChatLog).show(
            [(m.role, m.content, m.position, finish_note(m.stats)) for m in conv.messages]
            + [
                (role, text, None, "not saved yet: the disk is full")
                for cid, role, text, _ in self.unsaved.waiting
                if cid == conv.id
            ]
        )
        if self.turn is not None and self.turn.conversation_id == conv.id:
            self.turn.box = await self.query_one(ChatLog).add("assistant", self.turn.text, None)
        await self.refresh_sidebar()
        self.sub_title = conv.title or "new conversation"

    async def refresh_sidebar(self, query: str = "") -> None:
        items = [(c.id, c.title) for c in self.store.list(query)]
        await self.query_one(Sidebar).show(items, self.conv.id)

    async def on_sidebar_open(self, msg: Sidebar.Open) -> None:
        await self.show_conversation(msg.conversation_id)
        self.prompt_box.focus()

    async def on_sidebar_search(self, msg: Sidebar.Search) -> None:
        await self.refresh_sidebar(msg.query)

    # -- sending ------------------------------------------------------------------------------------------
    async def on_prompt_box_submitted(self, msg: PromptBox.Submitted) -> None:
        if self.turn is not None:
            self.notify("a reply is still being written: Esc stops it", severity="warning")
            return
        try:  # a full disk refuses the message (it stays in the prompt box) and loses nothing saved before
            if not self.unsaved.flush(self.store):
                raise StoreFullError(
                    "the disk holding the conversations database is full: an earlier reply is still waiting to be "
                    "saved",
                    "free some space, then press Enter again",
                )
            if self.edit_from is not None:
                self.store.truncate(self.conv.id, self.edit_from)
                self.edit_from = None
            self.store.add_message(self.conv.id, "user", msg.text)
        except StoreFullError as exc:
            self.notify(exc.one_line(), title="not sent", severity="error", timeout=15)
            return
        self.prompt_box.clear()
        await self.show_conversation(self.conv.id)
        if self.loaded is None:
            self.pending = self.conv.id
            if not self.loading:
                self.start_loading(self.settings)
            self.status.set(state="loading; your message will be sent when the model is ready")
            return
        self.generate(self.conv.id)

    def generate(self, conversation_id: int) -> None:
        """Start the reply to the conversation's last user message."""
        conv = self.store.get(conversation_id)
        assert conv is not None and self.loaded is not None and self.turn is None
        last_user = next((m.content for m in reversed(conv.messages) if m.role == "user"), "")
        self.store.set_model(conversation_id, self.loaded.entry.name)
        self.turn = Turn(next(self._turn_ids), conversation_id, last_user, None)
        self.call_after_refresh(self._start_turn, self.turn, conv)

    async def _start_turn(self, turn: Turn, conv: Conversation) -> None:
        if turn.conversation_id == self.conv.id:
            turn.box = await self.query_one(ChatLog).add("assistant", "", None)
        self.status.set(state="writing (Esc stops)")
        turn.worker = self._drain(self.loaded, conv, turn.id)

    @work(thread=True, group="generate")
    def _drain(self, loaded: Loaded, conv: Conversation, turn_id: int) -> None:
        from textual.worker import get_current_worker  # lazy: heavy: textual

        worker = get_current_worker()
        try:  # the template renders here, off the UI thread (a slow one costs its budget, never a frozen screen)
            request = engine.build_request(loaded, conv, self.settings)
        except Exception as exc:  # noqa: BLE001 - template or sampling settings refused: say so, restore the prompt
            self.post_message(events.ReplyFailed(turn_id, engine._one_line(exc)))
            return
        self._request_id = request.request_id
        engine.drain(loaded.backend, request, turn_id, self.post_message, lambda: worker.is_cancelled)

    async def on_reply_chunk(self, msg: events.ReplyChunk) -> None:
        turn = self.turn
        if turn is None or turn.id != msg.turn_id:
            return
        turn.text += msg.text
        if turn.box is not None and turn.box.is_attached:
            await turn.box.add_text(msg.text)
            self.query_one(ChatLog).scroll_end(animate=False)

    async def on_reply_done(self, msg: events.ReplyDone) -> None:
        turn = self.turn
        if turn is None or turn.id != msg.turn_id:
            return
        self.turn = None
        if msg.error_code == "runner_crashed":
            # The model's process died mid-reply: the cut-off reply is dropped, the conversation stays as it was
            # and the message goes back to the prompt box, to send again to the new runner.
            if turn.box is not None and turn.box.is_attached:
                await turn.box.remove()
            self.on_reply_failed(
                events.ReplyFailed(
                    turn.id, f"{msg.error}. Your message is back in the prompt: press Enter to send it again"
                ),
                turn,
            )
            return
        if msg.finish_reason == "error" and not turn.text:
            self.on_reply_failed(events.ReplyFailed(turn.id, msg.error or "the backend failed"), turn)
            return
        stats = {**(msg.stats.as_dict() if msg.stats is not None else {}), "finish_reason": msg.finish_reason}
        if not self.unsaved.add(self.store, turn.conversation_id, turn.text, stats):
            self._retry_saving()
        # the status says "ready" as soon as the turn is over, not after the awaits below (a test saw "writing"
        # with the reply done: the turn had ended while the reply box was still finishing)
        self.status.set(state="ready", stats=msg.stats, memory=msg.memory)
        note = finish_note(stats)
        if turn.box is not None and turn.box.is_attached:
            await turn.box.finish(note)
        if msg.finish_reason == "error":
            self.notify(f"the backend failed mid-reply: {msg.error}", severity="error", timeout=10)
        if turn.conversation_id == self.conv.id:
            await self.show_conversation(self.conv.id)

    def on_reply_failed(self, msg: events.ReplyFailed, turn: Turn | None = None) -> None:
        turn = turn or self.turn
        if turn is None or turn.id != msg.turn_id:
            return
        self.turn = None
        self.notify(msg.error, title="the model could not answer", severity="error", timeout=15)
        self.status.set(state="ready" if self.loaded else "not loaded")
        self._restore_failed_prompt(turn.conversation_id)

    def _restore_failed_prompt(self, conversation_id: int) -> None:
        """Take the unanswered user message out of the conversation and put it back in the prompt box."""
        conv = self.store.get(conversation_id)
        if conv is None or not conv.messages or conv.messages[-1].role != "user":
            return
        last = conv.messages[-1]
        self.store.truncate(conversation_id, last.position)
        if conversation_id == self.conv.id:
            self.prompt_box.load_text(last.content)
            self.prompt_box.focus()
            self.call_later(self.show_conversation, conversation_id)

    # -- actions ------------------------------------------------------------------------------------------
    def action_stop(self) -> None:
        if self.turn is not None and self.turn.worker is not None:
            self.turn.worker.cancel()  # the worker aborts the request at its next event
            if self.loaded is not None:
                self.loaded.backend.abort(self._request_id)  # and now, if it is still in prefill
        elif self.pending is not None:
            self._restore_failed_prompt(self.pending)
            self.pending = None

    async def action_regenerate(self) -> None:
        """Replace the last reply (or answer an unanswered last message); waits for the model if it loads."""
        if self.turn is not None or self.pending is not None:
            self.notify("a reply is on its way (Esc stops it)", severity="warning")
            return
        msgs = self.store.get(self.conv.id).messages  # type: ignore[union-attr]
        if not msgs:
            return
        if msgs[-1].role == "assistant":
            self.store.truncate(self.conv.id, msgs[-1].position)
        await self.show_conversation(self.conv.id)
        if self.loaded is None:
            self.pending = self.conv.id
            if not self.loading:
                self.start_loading(self.settings)
            return
        self.generate(self.conv.id)

    def action_edit_last(self) -> None:
        user = [m for m in self.store.get(self.conv.id).messages if m.role == "user"]  # type: ignore[union-attr]
        if user:
            self.on_message_box_edit(MessageBox.Edit(user[-1].position))

    def on_prompt_box_edit_last(self, msg: PromptBox.EditLast) -> None:
        self.action_edit_last()

    def on_message_box_edit(self, msg: MessageBox.Edit) -> None:
        if self.turn is not None:
            self.notify("stop the reply first (Esc)", severity="warning")
            return
        conv = self.store.get(self.conv.id)
        m = next((m for m in conv.messages if m.position == msg.position), None)  # type: ignore[union-attr]
        if m is None:
            return
        self.edit_from = m.position
        self.prompt_box.load_text(m.content)
        self.prompt_box.focus()
        self.notify("editing: Enter resends from this message (later messages are replaced)")

    def switch_model(self, name: str) -> None:
        """Stop any reply, close the loaded backend (freeing its memory) and load `name`."""
        if self.turn is not None:
            self.action_stop()
        # the picker lists local models: picking one leaves a remote server for the plan's choice of backend
        self.settings = self.settings.merged(model=name, backend="auto" if self.settings.backend == "remote" else None)
        self.start_loading(self.settings)  # the worker closes the old backend before loading the new one

    def _retry_saving(self) -> None:
        """The disk was full: say so, and try again every RETRY_S until the waiting replies are saved."""
        self.notify(
            "the disk holding the conversations database is full: this reply is kept here and saved as soon as "
            "there is room (free some space)",
            title="not saved yet",
            severity="warning",
            timeout=15,
        )
        if self._save_timer is None:
            self._save_timer = self.set_interval(RETRY_S, self._try_saving)

    def _try_saving(self) -> None:
        if self.unsaved.flush(self.store) and self._save_timer is not None:
            self._save_timer.stop()
            self._save_timer = None
            self.notify("saved the replies that waited for room on the disk", title="saved")

    async def on_unmount(self) -> None:
        """Quitting mid-reply keeps what was written, like Esc (only a killed process loses it).  Quitting between
        replies closes the model, so that its runner stays loaded for --keep-alive (backends/runner/resident.py):
        the next `hearth` or `hearth run` with it starts at once.  Mid-reply the runner simply ends with the app."""
        turn = self.turn
        if turn is not None and self.loaded is not None:
            self.loaded.backend.abort(self._request_id)
            if turn.text:
                self.unsaved.add(self.store, turn.conversation_id, turn.text, {"finish_reason": "abort"})
        elif self.loaded is not None:
            try:
                self.loaded.backend.close()
            except Exception:
                log.debug("closing the model at exit failed", exc_info=True)


def finish_note(stats: dict[str, Any] | None) -> str:
    """The subtitle under a reply that did not end on its own."""
    reason = (stats or {}).get("finish_reason")
    return {"abort": "stopped", "length": "cut at max tokens", "error": "ended by an error"}.get(reason or "", "")


def _default_loader(settings: Settings, progress: Any = None, hardware_file: str | None = None) -> Any:
    return open_backend(settings, progress=progress, hardware_file=hardware_file, command="chat")
