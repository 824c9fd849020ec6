"""hwprobe: what this machine has (`probe()`) and what to do with it (`plan()`).

`probe` and `plan` are bound here eagerly on purpose: the submodule hwprobe/probe.py would otherwise shadow the
function the first time someone imports it.  Both import only the standard library at module level (psutil and
pynvml are imported inside probe()), so `import hwprobe.errors` stays cheap.
"""

from __future__ import annotations

from hwprobe.planner import plan
from hwprobe.probe import probe

__all__ = ["plan", "probe"]
