"""llama.cpp's extra weight-buffer types (CPU repack, AMX): whether they are on by default on this machine.

Its own module, free of llama_cpp, so that hearth's front end can decide LoadOptions.extra_bufts before a
runner starts (through backends.registry: BackendInfo.extra_bufts_default) without importing the engine."""

from __future__ import annotations

import os
from collections.abc import Callable

from hwprobe.cpu import has_amx


def extra_bufts_default(checked_safe: Callable[[], bool] | None = None) -> tuple[bool, str]:
    """Whether llama.cpp may use its extra weight-buffer types (CPU repack, AMX) on this machine, and why.

    Off on CPUs with AMX: the native build of llama-cpp-python 0.3.x segfaults at the first decode in the AMX
    repack path there (llama.cpp #20824), while the same build with use_extra_bufts=False answers correctly.
    On there when `checked_safe()` says this build ran with them on this machine (`hearth doctor` records it);
    HEARTH_LLAMA_EXTRA_BUFTS=0|1 overrides both."""
    forced = os.environ.get("HEARTH_LLAMA_EXTRA_BUFTS", "")
    if forced in ("0", "1"):
        return forced == "1", "set by HEARTH_LLAMA_EXTRA_BUFTS"
    if has_amx():
        if checked_safe is not None and checked_safe():
            return True, "on: this CPU has AMX, and `hearth doctor` ran this build with them here"
        return False, "off: this CPU has AMX, where llama.cpp's repack path crashes in some builds (#20824)"
    return True, "on"
