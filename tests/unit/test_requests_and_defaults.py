"""The one request builder (app/requests.py) and the one place for defaults (app/defaults.py)."""

from __future__ import annotations

import argparse

from app.conversations import ChatSettings
from app.defaults import BACKEND_CHOICES, LOCAL_BACKENDS, SAMPLING, SYSTEM_PROMPT
from app.model_sampling import model_defaults, overrides_path, save_user_override
from app.requests import chat_request, sampling_from
from app.settings import Settings
from backends.api import ChatMessage, SamplingParams
from backends.registry import BACKENDS
from backends.remote.spec import remote_spec
from backends.templates import FALLBACK_NAME, FALLBACK_STOP
from hwprobe.plan_types import PLANNED_BACKENDS
from tests.fakes import fake_spec

MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "Hi"}]


def test_the_planner_plans_for_exactly_the_registrys_local_backends():
    assert LOCAL_BACKENDS == PLANNED_BACKENDS
    assert BACKEND_CHOICES == ("auto", *BACKENDS) and "remote" in BACKEND_CHOICES and "remote" not in LOCAL_BACKENDS


def test_settings_and_new_conversations_take_the_contracts_sampling_defaults():
    """Settings leave sampling unset (None: the model's defaults, else hearth's); a request built from them for a
    model that recommends nothing, and a new conversation's settings, take the contract's (app.defaults)."""
    s, c = Settings(), ChatSettings()
    assert (s.temperature, s.top_p, s.top_k, s.min_p, s.repeat_penalty) == (None,) * 5
    sp = sampling_from(s)
    assert (sp.temperature, sp.top_p, sp.top_k, sp.min_p, sp.repeat_penalty) == (
        SAMPLING.temperature,
        SAMPLING.top_p,
        SAMPLING.top_k,
        SAMPLING.min_p,
        SAMPLING.repeat_penalty,
    )
    assert (c.temperature, c.top_p, c.max_tokens, c.system_prompt) == (
        SAMPLING.temperature,
        SAMPLING.top_p,
        s.max_tokens,
        s.system_prompt,
    )
    assert s.system_prompt == SYSTEM_PROMPT != ""


def test_the_user_wins_over_the_model_which_wins_over_hearth():
    """sampling_from: the conversation's values, else the user's settings, else the model's defaults (its own
    and the user's saved ones for it, app/model_sampling.py), else hearth's."""
    smol = fake_spec(name="SmolLM2 135M Instruct")
    defaults = model_defaults(smol, "smol")
    sp = sampling_from(Settings(), defaults=defaults)
    assert (sp.temperature, sp.top_p, sp.top_k) == (0.2, 0.9, SAMPLING.top_k)
    sp = sampling_from(Settings(temperature=0.5), defaults=defaults)
    assert (sp.temperature, sp.top_p) == (0.5, 0.9)
    sp = sampling_from(Settings(temperature=0.5), ChatSettings(temperature=1.1, top_p=0.7), defaults=defaults)
    assert (sp.temperature, sp.top_p) == (1.1, 0.7)
    save_user_override("smol", {"temperature": 0.4})  # what the chat app's F3 saves for the model
    mine = model_defaults(smol, "smol")
    assert mine.values() == {"temperature": 0.4, "top_p": 0.9} and mine.source.startswith("your settings for smol")
    assert sampling_from(Settings(), defaults=mine).temperature == 0.4
    assert model_defaults(smol, "other").values() == {"temperature": 0.2, "top_p": 0.9}  # per model
    overrides_path().write_text("{broken")  # a broken file costs the user's values, never the chat
    assert model_defaults(smol, "smol").values() == {"temperature": 0.2, "top_p": 0.9}


def test_help_shows_the_defaults_from_the_one_place():
    from app.commands.common import add_sampling_arguments

    p = argparse.ArgumentParser()
    add_sampling_arguments(p)
    text = p.format_help()
    assert f"(default {SAMPLING.top_p})" in text and f"(default {SAMPLING.min_p})" in text


def test_a_chat_request_carries_its_messages_and_puts_the_callers_stops_first():
    built = chat_request(fake_spec(), MESSAGES, SamplingParams(temperature=0, stop=("END",)), request_id="r-1")
    r = built.request
    assert built.template_source == "gguf" and r.request_id == "r-1"
    assert r.prompt.startswith("<|im_start|>system\nbe brief<|im_end|>") and r.sampling.stop == ("END",)
    assert r.messages == (ChatMessage("system", "be brief"), ChatMessage("user", "Hi"))
    plain = chat_request(fake_spec(chat_template=None), MESSAGES, SamplingParams(stop=("END",)))
    assert plain.template_source == FALLBACK_NAME and plain.request.sampling.stop == ("END", *FALLBACK_STOP)


def test_a_remote_model_gets_the_messages_without_the_plain_formats_stops():
    built = chat_request(remote_spec("m", "http://h"), MESSAGES, SamplingParams())
    assert built.template_source == "server" and built.request.sampling.stop == ()
    assert [m.content for m in built.request.messages] == ["be brief", "Hi"]


def test_sampling_from_takes_a_conversations_own_settings_over_the_apps():
    s = Settings(temperature=0.3, top_k=7, max_tokens=99)
    assert sampling_from(s) == SamplingParams(temperature=0.3, top_k=7, max_tokens=99)
    chat = ChatSettings("x", temperature=0.0, top_p=0.5, max_tokens=12, seed=4)
    assert sampling_from(s, chat, ("S",)) == SamplingParams(
        temperature=0.0, top_p=0.5, top_k=7, max_tokens=12, seed=4, stop=("S",)
    )
