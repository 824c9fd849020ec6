"""Load a GGUF with llama-cpp-python without letting it compile the file's chat templates.

`llama_cpp.Llama()` compiles every `tokenizer.chat_template*` in the file with Jinja, in this process and
outside any budget, for chat handlers hearth never calls (hearth renders templates itself, in the budgeted
worker of backends/templates.py).  Jinja folds constant expressions while compiling, so a template holding
`{{ 'x' * 10**10 }}` exhausted memory at load, and a syntax error crashed the load with a traceback.  Inside
`templates_skipped()` the formatter llama-cpp-python builds is a stand-in that compiles nothing; the swap is
module-wide, so it is made under a lock and undone on the way out.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NoReturn

from backends.errors import TemplateError

_lock = threading.Lock()


class _NotCompiled:
    """Takes Jinja2ChatFormatter's arguments; its chat handler refuses to run."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def to_chat_handler(self) -> Any:
        return _refuse


def _refuse(*args: Any, **kwargs: Any) -> NoReturn:
    raise TemplateError(
        "llama-cpp-python's own chat handler is not used by hearth", "render with backends.templates.render_for_spec"
    )


@contextmanager
def templates_skipped() -> Iterator[None]:
    import llama_cpp.llama_chat_format as chat_format  # lazy: heavy: llama_cpp

    with _lock:
        real = chat_format.Jinja2ChatFormatter
        chat_format.Jinja2ChatFormatter = _NotCompiled  # type: ignore[misc,assignment]
        try:
            yield
        finally:
            chat_format.Jinja2ChatFormatter = real  # type: ignore[misc]
