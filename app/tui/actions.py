"""The App's actions that open a screen or act on the whole conversation (help, rename, delete, settings,
models, hardware, export, copy, sidebar).  A mixin of HearthApp, kept apart so app.py stays about the turn
loop: each action here only reads the ConversationStore and pushes a screen; none touches a backend."""

from __future__ import annotations

import dataclasses
import re
from typing import TYPE_CHECKING, Any

from textual.binding import Binding

from app.model_sampling import save_user_override
from app.tui.widgets.chat_log import MessageBox
from app.tui.widgets.sidebar import Sidebar

if TYPE_CHECKING:  # pragma: no cover
    from textual.app import App

    _Base = App[None]
else:
    _Base = object


class ScreenActions(_Base):
    """Needs from the App: store, conv, settings, loaded, turn, prompt_box, show_conversation, switch_model,
    action_stop, _new_chat_settings, BINDINGS and Textual's App methods."""

    store: Any
    conv: Any
    settings: Any
    loaded: Any
    turn: Any
    BINDINGS: Any

    def on_message_box_copy(self, msg: MessageBox.Copy) -> None:
        self._copy(msg.text, "message")

    def _last_reply(self) -> str:
        msgs = self.store.get(self.conv.id).messages  # type: ignore[union-attr]
        return next((m.content for m in reversed(msgs) if m.role == "assistant"), "")

    def _copy(self, text: str, what: str) -> None:
        if not text:
            self.notify(f"no {what} to copy", severity="warning")
            return
        self.copy_to_clipboard(text)
        self.notify(f"copied the {what} ({len(text)} characters)")

    def action_copy_reply(self) -> None:
        self._copy(self._last_reply(), "last reply")

    def action_copy_code(self) -> None:
        blocks = re.findall(r"```[^\n]*\n(.*?)```", self._last_reply(), flags=re.S)
        self._copy(blocks[-1] if blocks else "", "code block")

    async def action_new(self) -> None:
        conv = self.store.create(self._new_chat_settings(), self.settings.model)
        await self.show_conversation(conv.id)
        self.prompt_box.focus()

    def action_toggle_sidebar(self) -> None:
        bar = self.query_one(Sidebar)
        bar.display = not bar.display

    def action_search(self) -> None:
        self.query_one(Sidebar).display = True
        self.query_one("#search").focus()

    def action_help(self) -> None:
        from app.tui.screens.help import HelpScreen  # lazy: heavy: textual

        self.push_screen(HelpScreen([b for b in self.BINDINGS if isinstance(b, Binding) and b.show]))

    def action_rename(self) -> None:
        from app.tui.screens.ask import AskText  # lazy: heavy: textual

        async def done(title: str | None) -> None:
            if title and title.strip():
                self.store.rename(self.conv.id, title)
                await self.show_conversation(self.conv.id)

        self.push_screen(AskText("Rename the conversation", self.conv.title), done)

    def action_delete(self) -> None:
        from app.tui.screens.ask import Confirm  # lazy: heavy: textual

        async def done(yes: bool | None) -> None:
            if not yes:
                return
            if self.turn is not None and self.turn.conversation_id == self.conv.id:
                self.action_stop()
            self.store.delete(self.conv.id)
            rest = self.store.list()
            conv = rest[0] if rest else self.store.create(self._new_chat_settings(), self.settings.model)
            await self.show_conversation(conv.id)

        self.push_screen(Confirm(f"Delete {self.conv.title or 'this conversation'!r}?"), done)

    def action_settings(self) -> None:
        from app.tui.screens.settings import SettingsResult, SettingsScreen  # lazy: heavy: textual

        async def done(result: SettingsResult | None) -> None:
            if result is not None:
                before = self.conv.settings
                self.store.update_settings(self.conv.id, result.chat)
                self.settings = dataclasses.replace(self.settings, json_output=result.json_output)
                changed = {
                    k: getattr(result.chat, k)
                    for k in ("temperature", "top_p")
                    if getattr(result.chat, k) != getattr(before, k)
                }
                model = self.conv.model or self.settings.model
                if changed and model:  # the model's defaults from now on (app/model_sampling.py)
                    save_user_override(model, changed)
                await self.show_conversation(self.conv.id)
                also = f"; new conversations with {model} start with them too" if changed and model else ""
                self.notify(f"settings saved for this conversation{also}")

        self.push_screen(SettingsScreen(self.conv.settings, self.settings.json_output), done)

    def action_models(self) -> None:
        from app.tui.screens.models import ModelPicker  # lazy: heavy: textual

        def done(name: str | None) -> None:
            if name and not (self.loaded is not None and name == self.loaded.entry.name):
                self.switch_model(name)

        self.push_screen(ModelPicker(self.settings, self.settings.model), done)

    def action_hardware(self) -> None:
        from app.tui.screens.hardware import HardwareScreen  # lazy: heavy: textual

        self.push_screen(HardwareScreen(self.loaded.decision if self.loaded is not None else None))

    def action_export(self) -> None:
        out = self.store.path.parent / "exports"
        out.mkdir(parents=True, exist_ok=True)
        stem = out / f"conversation-{self.conv.id}"
        stem.with_suffix(".md").write_text(self.store.export_markdown(self.conv.id), encoding="utf-8")
        stem.with_suffix(".json").write_text(self.store.export_json(self.conv.id), encoding="utf-8")
        self.notify(f"exported to {stem}.md and .json", timeout=10)
