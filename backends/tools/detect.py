"""Which tool-call format a model uses, read from its chat template (and architecture), and whether the
template renders tools itself.

The template is the best witness: a family's template writes its own markers (`<tool_call>` for Hermes/Qwen,
`[TOOL_CALLS]` for Mistral, `<|python_tag|>` or Llama 3's header tokens with a `tools` variable for Llama 3.x).
A template that names none of them, or does not use `tools` at all, or no template (base models, the starter's
plain ChatML), gets hearth's Hermes-style block in the system message (hermes.fallback_system_block): `native`
is then False, the template is never passed `tools`, and the reply is read as Hermes calls.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from backends.tools.base import ToolFormat
from backends.tools.hermes import HermesFormat
from backends.tools.llama3 import Llama3Format
from backends.tools.mistral import MistralFormat

FORMATS: dict[str, type[ToolFormat]] = {"hermes": HermesFormat, "llama3": Llama3Format, "mistral": MistralFormat}
_USES_TOOLS = re.compile(r"\btools\b")


@dataclass(frozen=True)
class ToolStyle:
    format: ToolFormat
    native: bool  # True: the model's template renders the tools and calls (it is passed `tools=`)


def detect(template: str | None, architecture: str = "") -> ToolStyle:
    """The family's format when the template renders tools itself (it uses a `tools` variable and writes a
    family's markers); otherwise hearth's Hermes-style block, whose format is then the one to read back.
    `architecture` settles a template with Llama 3's header tokens but no `<|python_tag|>` (Llama 3.2 / 3.3)."""
    fallback = ToolStyle(HermesFormat(), native=False)
    if template is None or not _USES_TOOLS.search(template):
        return fallback
    if "[TOOL_CALLS]" in template:
        return ToolStyle(MistralFormat(), native=True)
    if "<tool_call>" in template:
        return ToolStyle(HermesFormat(), native=True)
    if "<|python_tag|>" in template or ("<|start_header_id|>" in template and architecture in ("llama", "")):
        return ToolStyle(Llama3Format(), native=True)
    return fallback  # a tool format hearth does not read: the template is not given the tools
