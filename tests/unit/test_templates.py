from pathlib import Path

import pytest

from backends.errors import InvalidRequestError, TemplateError
from backends.modelspec import load_spec
from backends.templates import FALLBACK_NAME, render_chat, render_for_spec

MSGS = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]


def test_starter_template_renders_chatml(starter_path: Path) -> None:
    r = render_for_spec(load_spec(starter_path), MSGS)
    assert r.text == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    assert r.template_source == "gguf" and r.stop == ()


def test_template_default_system_prompt(starter_path: Path) -> None:
    r = render_for_spec(load_spec(starter_path), MSGS[1:])
    assert "named SmolLM" in r.text  # the template's own default applies when no system message is sent


def test_fallback_is_documented_and_visible(gemma_path: Path) -> None:
    r = render_for_spec(
        load_spec(gemma_path), MSGS + [{"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Bye"}]
    )
    assert r.template_source == FALLBACK_NAME
    assert r.text == "Be brief.\n\nUser: Hi\nAssistant: Hello.\nUser: Bye\nAssistant:"
    assert r.stop == ("\nUser:",) and r.add_special


@pytest.mark.parametrize(
    "payload",
    [
        "{{ ''.__class__.__mro__ }}",
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{% for m in messages %}{{ m.__class__.__init__.__globals__ }}{% endfor %}",
        "{{ cycler.__init__.__globals__.os.popen('id').read() }}",
        "{{ messages.append({'role': 'x'}) }}",
    ],
)
def test_sandbox_refuses_python_internals(payload: str) -> None:
    with pytest.raises(TemplateError, match="refused|failed"):
        render_chat(MSGS, template=payload)


def test_range_bomb_is_refused() -> None:
    with pytest.raises(TemplateError):
        render_chat(MSGS, template="{% for i in range(10**9) %}x{% endfor %}")


def test_bos_in_template_turns_off_add_special() -> None:
    r = render_chat(MSGS, template="{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}", bos_token="<s>")
    assert r.text == "<s>Be brief.Hi" and not r.add_special


def test_raise_exception_and_syntax_errors() -> None:
    with pytest.raises(TemplateError, match="refused the conversation: no system"):
        render_chat(MSGS, template="{{ raise_exception('no system') }}")
    with pytest.raises(TemplateError, match="does not parse"):
        render_chat(MSGS, template="{% for %}")


@pytest.mark.parametrize(
    "messages, match",
    [
        ([], "no messages"),
        ([{"role": "wizard", "content": "x"}], "role 'wizard'"),
        ([{"role": "user", "content": 3}], "needs text content"),
    ],
)
def test_bad_conversations(messages, match) -> None:
    with pytest.raises(InvalidRequestError, match=match):
        render_chat(messages, template=None)
