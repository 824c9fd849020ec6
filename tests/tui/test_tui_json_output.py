"""The TUI's structured-output setting (F3 panel, this session) reaches the request as a Constraint, and a bad
schema file is refused in the panel with its reason."""

from __future__ import annotations

import dataclasses
import json

import pytest

from backends.api import Constraint
from tests.tui.conftest import wait_for
from tests.tui.test_tui_sidebar_settings import send

pytestmark = pytest.mark.tui


async def test_json_output_setting_reaches_the_request(make_app, backend, tmp_path) -> None:
    schema = tmp_path / "person.json"
    schema.write_text(json.dumps({"type": "object", "properties": {"name": {"type": "string"}}}))
    # the fake records the constraint it is given; it must say it takes one, or it refuses the request
    backend.capabilities = dataclasses.replace(backend.capabilities, constraints=True)
    app = make_app()
    async with app.run_test(size=(100, 40)) as pilot:
        await wait_for(pilot, lambda: app.loaded is not None)
        await pilot.press("f3")
        screen = app.screen
        screen.query_one("#json_output").value = str(tmp_path / "missing.json")
        await pilot.press("ctrl+s")
        assert app.screen is screen and any("missing.json" in n.message for n in app._notifications)
        screen.query_one("#json_output").value = str(schema)
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: app.screen is not screen)
        await send(pilot, "who?")
        assert backend.requests[-1].constraint == Constraint("json_schema", schema.read_text())
        await pilot.press("f3")
        screen = app.screen
        screen.query_one("#json_output").value = ""
        await pilot.press("ctrl+s")
        await wait_for(pilot, lambda: app.screen is not screen)
        await send(pilot, "free text now")
        assert backend.requests[-1].constraint is None
