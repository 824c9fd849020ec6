"""F3: this conversation's system prompt and sampling settings, and this session's structured output (JSON).

The JSON output setting is the app's `json_output` (app/structured.py): it holds for every conversation until
the TUI closes; `json_output` in settings.toml sets it at start."""

from __future__ import annotations

from dataclasses import dataclass

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Static, TextArea

from app.conversations import ChatSettings
from app.structured import constraint_for
from backends.api import SamplingParams
from hwprobe.errors import HearthError


def parse_settings(system: str, temperature: str, top_p: str, max_tokens: str, seed: str) -> ChatSettings:
    """ChatSettings from the form's text, or a HearthError naming the bad field."""
    try:
        t, p, n = float(temperature), float(top_p), int(max_tokens)
        s = int(seed) if seed.strip() else None
    except ValueError as exc:
        raise HearthError(
            f"not a number: {exc}", "temperature/top-p are decimals, max tokens and seed integers"
        ) from None
    SamplingParams(temperature=t, top_p=p, max_tokens=n, seed=s)  # validates (InvalidRequestError)
    return ChatSettings(system.strip(), t, p, n, s)


@dataclass(frozen=True)
class SettingsResult:
    chat: ChatSettings  # this conversation's, saved with it
    json_output: str | None  # this session's structured output: None = text, "object", or a schema file


class SettingsScreen(ModalScreen[SettingsResult | None]):
    BINDINGS = [Binding("escape", "dismiss(None)", "cancel"), Binding("ctrl+s", "save", "save")]

    def __init__(self, current: ChatSettings, json_output: str | None = None) -> None:
        super().__init__()
        self.current = current
        self.json_output = json_output

    def compose(self) -> ComposeResult:
        c = self.current
        with VerticalScroll(id="dialog"):
            yield Static("Conversation settings  (Ctrl+S saves, Esc cancels)", classes="title")
            yield Label("System prompt")
            yield TextArea(c.system_prompt, id="system")
            yield Label("Temperature (0 = greedy)")
            yield Input(str(c.temperature), id="temperature")
            yield Label("Top-p")
            yield Input(str(c.top_p), id="top_p")
            yield Label("Max tokens per reply")
            yield Input(str(c.max_tokens), id="max_tokens")
            yield Label("Seed (empty = random)")
            yield Input("" if c.seed is None else str(c.seed), id="seed")
            yield Label("JSON output, this session (empty = text, object = any JSON object, or a JSON Schema file)")
            yield Input(self.json_output or "", id="json_output")
            yield Button("Save", id="save", variant="primary")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.action_save()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.action_save()

    def action_save(self) -> None:
        v = {i: self.query_one(f"#{i}", Input).value for i in ("temperature", "top_p", "max_tokens", "seed")}
        try:
            s = parse_settings(self.query_one("#system", TextArea).text, **v)
            json_output = self.query_one("#json_output", Input).value.strip() or None

            constraint_for(json_output)  # a missing or bad schema file is refused here, with the reason
        except HearthError as exc:
            self.notify(exc.one_line(), severity="error")
            return
        self.dismiss(SettingsResult(s, json_output))
