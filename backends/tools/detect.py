"""Which tool-call format a model uses, read from its chat template (and architecture), and whether the
template renders tools itself.

The template is the best witness: a family's template writes its own markers (`<tool_call>` for Hermes/Qwen,
`[TOOL_CALLS]` for Mistral, `<|python_tag|>` or Llama 3's header tokens with a `tools` variable for Llama 3.x).
A template that names none of them, or no template at all (base models, the starter's plain ChatML), gets
hearth's Hermes-style block in the system message (hermes.fallback_system_block): `native` is then False and
the template is never passed `tools`.
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

    @property
    def name(self) -> str:
        return self.format.name if self.native else f"{self.format.name} (hearth system block)"


def detect(template: str | None, architecture: str = "") -> ToolStyle:
    if template is None:
        return ToolStyle(HermesFormat(), native=False)
    uses_tools = bool(_USES_TOOLS.search(template))
    if "[TOOL_CALLS]" in template:
        return ToolStyle(MistralFormat(), native=uses_tools)
    if "<tool_call>" in template:
        return ToolStyle(HermesFormat(), native=uses_tools)
    llama3_markers = "<|python_tag|>" in template or "<|start_header_id|>" in template
    if llama3_markers and (uses_tools or architecture == "llama"):
        return ToolStyle(Llama3Format(), native=uses_tools)
    return ToolStyle(HermesFormat(), native=False)
