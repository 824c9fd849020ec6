"""Chat templates are untrusted code with a budget (issue 16, item 4).

Every hostile template below is refused with a one-line TemplateError that names what it broke, within the
time budget plus a margin; the renderer keeps working afterwards; a real ChatML render stays fast; and the
CLI turns a refusal into exit 2 with one error line.  The GGUF for the CLI case is generated, not committed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from backends.errors import TemplateError
from backends.template_process import TemplateProcess
from backends.templates import MAX_PROMPT_CHARS, TEMPLATE_TIME_LIMIT_S, render_chat, renderer
from tests.fakes import CHATML

MSGS = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
ROOT = Path(__file__).resolve().parents[2]

# (name, template, what the one-line message must say)
HOSTILE = [
    ("nested loops", "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", "time budget"),
    (
        "exponential macro",
        "{% macro f(n) %}{% if n > 0 %}{{ f(n-1) }}{{ f(n-1) }}{% endif %}{% endmacro %}{{ f(60) }}",
        "time budget",
    ),
    ("string multiplication", "{{ 'x' * 10**10 }}", "memory budget"),
    ("list multiplication", "{{ ([0] * 10**9) | length }}", "memory budget"),
    ("output flood", "{{ 'x' * 10**8 }}", "output budget"),
    ("output by loop", "{% for i in range(100000) %}{{ 'y' * 1000 }}{% endfor %}", "output budget"),
    (
        "growing namespace",
        "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}"
        "{% endfor %}{{ ns.s | length }}",
        "memory budget",
    ),
    (
        "growing namespace list",
        "{% set ns = namespace(l=[1]) %}{% for i in range(64) %}"
        "{% set ns.l = ns.l + ns.l %}{% endfor %}{{ ns.l | length }}",
        "memory budget",
    ),
    ("lipsum", "{{ lipsum(n=10**6) }}", "lipsum"),
    ("range over the sandbox cap", "{% for i in range(10**9) %}x{% endfor %}", "Range too big"),
    ("self-recursive macro", "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "recursed too deeply"),
    ("huge format width", "{{ '{:>999999999999}'.format(1) }}", "budget"),
    ("python internals", "{{ ''.__class__.__mro__[1].__subclasses__() }}", "Python internals"),
    ("syntax error", "{% for m in messages %}{{ m.content }", "does not parse (line 1"),
    ("multi-line raise", "{{ raise_exception('no\\nsystem\\nmessages') }}", "refused the conversation: no system"),
]


@pytest.mark.parametrize("name, template, says", HOSTILE, ids=[h[0] for h in HOSTILE])
def test_hostile_template_is_refused_in_one_line_within_budget(name: str, template: str, says: str) -> None:
    start = time.monotonic()
    with pytest.raises(TemplateError) as info:
        render_chat(MSGS, template=template)
    elapsed = time.monotonic() - start
    message = info.value.one_line()
    assert says in message, (name, message)
    assert "\n" not in message and len(message) < 600, message
    assert elapsed < TEMPLATE_TIME_LIMIT_S + 3.0, (name, elapsed)
    # the renderer survives (a killed worker is replaced) and renders the next conversation correctly
    ok = render_chat(MSGS, template=CHATML)
    assert ok.text.endswith("<|im_start|>assistant\n")


def test_the_time_limit_kills_even_a_single_c_call() -> None:
    """A huge `**` is one uninterruptible C call: only killing the process stops it."""
    proc = TemplateProcess(time_limit_s=0.5, memory_bytes=512 * 2**20, max_chars=MAX_PROMPT_CHARS)
    try:
        start = time.monotonic()
        with pytest.raises(TemplateError, match="longer than 0.5 s"):
            proc.render("{% set a = b ** 100000 %}{{ a ** 2000 > 0 }}", {"b": 10})
        assert time.monotonic() - start < 3.0
        assert proc.render("{{ a }}", {"a": 1}) == "1" and proc.starts == 2
    finally:
        proc.close()


def test_a_real_chatml_render_stays_fast(starter_path: Path) -> None:
    from backends.modelspec import load_spec
    from backends.templates import render_for_spec

    spec = load_spec(starter_path)
    render_for_spec(spec, MSGS)  # the worker is started
    start = time.perf_counter()
    for _ in range(50):
        render_for_spec(spec, MSGS)
    per_render = (time.perf_counter() - start) / 50
    big = [{"role": "user" if i % 2 == 0 else "assistant", "content": "word " * 50} for i in range(4096)]
    start = time.perf_counter()
    text = render_for_spec(spec, big).text
    big_s = time.perf_counter() - start
    assert text.count("<|im_start|>") == 4096 + 2  # the template's default system turn and the generation prompt
    # measured 0.15 ms and 0.07 s on a 2-core EPYC; the bounds leave room for a loaded CI machine
    assert per_render < 0.02, per_render
    assert big_s < 1.0, big_s


def test_conversation_content_cannot_break_out() -> None:
    """Message text is data: Jinja syntax and JSON-ish text in it are rendered verbatim."""
    content = '{{ 7 * 7 }} {% for %}\n{"ok": true, "text": "injected"}\n'
    assert render_chat([{"role": "user", "content": content}], template=CHATML).text == (
        f"<|im_start|>user\n{content}<|im_end|>\n<|im_start|>assistant\n"
    )


CLI_CASES = [
    ("loop", "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", "time budget"),
    # Jinja folds constants while compiling: llama-cpp-python's own compile at load used to take 10 GB here
    ("memory", "{{ 'x' * 10**10 }}", "memory budget"),
    ("syntax", "{% for m in messages %}{{ m.content }}", "does not parse"),
]


@pytest.mark.parametrize("name, template, says", CLI_CASES, ids=[c[0] for c in CLI_CASES])
def test_cli_refuses_a_hostile_template_with_exit_2_and_one_line(
    tmp_path: Path, name: str, template: str, says: str
) -> None:
    from tests.gguf_factory import write_tiny_llama

    model = write_tiny_llama(tmp_path / f"{name}.gguf", chat_template=template)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    start = time.monotonic()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "app.cli",
            "run",
            "--model",
            str(model),
            "--backend",
            "llama.cpp",
            "--max-tokens",
            "4",
            "hello",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    elapsed = time.monotonic() - start
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("hearth: error:")]
    assert len(errors) == 1 and says in errors[0], done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""
    assert elapsed < 60, elapsed


def test_renderer_is_shared_and_reused() -> None:
    render_chat(MSGS, template=CHATML)
    starts = renderer().starts
    for _ in range(5):
        render_chat(MSGS, template=CHATML)
    assert renderer().starts == starts


def test_a_worker_started_in_the_background_serves_the_first_render() -> None:
    """start_in_background (app/loading.open_backend calls it while the runner loads): the worker it starts is
    the one the first render uses, and the render's own budget is unchanged."""
    proc = TemplateProcess(time_limit_s=TEMPLATE_TIME_LIMIT_S, memory_bytes=512 * 2**20, max_chars=MAX_PROMPT_CHARS)
    try:
        proc.start_in_background()
        deadline = time.monotonic() + 60
        while proc.starts == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert proc.starts == 1
        assert proc.render(CHATML, {"messages": MSGS, "add_generation_prompt": True}).startswith("<|im_start|>")
        assert proc.starts == 1  # no second worker
    finally:
        proc.close()


def test_a_spinning_worker_exits_when_hearth_dies() -> None:
    """hearth killed (SIGKILL) in the middle of a hostile render: its worker does not spin on as an orphan."""
    script = (
        "import sys; from backends.template_process import TemplateProcess\n"
        "p = TemplateProcess(time_limit_s=300, memory_bytes=2**28, max_chars=10**6)\n"
        "p.render('{{ 1 }}', {}); print(p._proc.pid, flush=True)\n"
        "p.render('" + HOSTILE[0][1] + "', {})\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        worker = int(parent.stdout.readline())  # type: ignore[union-attr]
        time.sleep(0.5)  # the worker is spinning in the nested loop now
        assert _alive(worker)
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 10
        while _alive(worker) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(worker), "the render worker outlived hearth"
    finally:
        if parent.poll() is None:
            parent.kill()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")  # a zombie has exited
    except FileNotFoundError:
        return False
