"""What to fetch from a repo: group its GGUF files into models (split shards together), read each one's quant
from its file name, and choose the one this machine should run.

How the choice is made (`choose_gguf`), in order:
  1. `--file NAME` or `--quant Q` asked for one: that one (an unknown quant is a ConfigError listing the repo's).
  2. The repo has a config.json: its shape goes to the planner (`hwprobe.plan`, with the quant ladder F16 ...
     Q4_K_M) and the quant the plan recommends is taken; when the repo lacks that exact quant, the best one the
     repo has with no more bits per weight than the recommendation (hwprobe.memory.QUANT_BPW).
  3. No config.json (most GGUF-only repos): by size.  The budget is the largest GPU's plan budget (free VRAM
     minus the planner's margin) or, without a GPU, available RAM minus the margin; a file may use 85 % of it
     (the rest is for the KV cache and compute buffers).  The highest-bits quant that fits and is not below
     Q4_K_M; else the biggest that fits; else a PlanError naming the smallest file and the budget.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from hwprobe import memory, plan
from hwprobe.errors import ConfigError, PlanError
from hwprobe.memory import LOWEST_DEFAULT_QUANT, QUANT_BPW

SHARD_RE = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)
# Quant tags as they appear in GGUF file names: Q4_K_M, Q8_0, IQ4_XS, IQ2_XXS, Q4_0_4_4, F16, BF16, F32.
QUANT_RE = re.compile(r"(?:^|[-._])((?:I?Q\d(?:_[A-Z0-9]+)*)|BF16|F16|F32|FP16)(?=$|[-._])", re.IGNORECASE)
FIT_FRACTION = 0.85  # of the budget a weights file may take; the rest is KV cache and compute buffers
MIB = 1024 * 1024


@dataclass(frozen=True)
class RemoteFile:
    name: str  # path inside the repo ("sub/model-Q4_K_M.gguf")
    size: int  # bytes, from the hub's metadata
    sha256: str | None  # LFS sha256 (hex); None for small files kept in git
    blob_id: str | None = None  # git blob sha1 (hex), checks the small files that have no LFS sha256


@dataclass(frozen=True)
class GgufChoice:
    """One model in a repo: a single GGUF file, or every shard of a split one (first shard first)."""

    quant: str  # "Q4_K_M"; "unknown" when the file name says nothing
    files: tuple[RemoteFile, ...]

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def first(self) -> RemoteFile:
        return self.files[0]

    @property
    def label(self) -> str:
        n = len(self.files)
        return self.first.name + (f" (+{n - 1} more shards)" if n > 1 else "")


def parse_quant(filename: str) -> str:
    """The quant tag in a GGUF file name, upper-cased ("model.q4_k_m.gguf" -> "Q4_K_M"); "unknown" if none."""
    base = filename.rsplit("/", 1)[-1]
    base = SHARD_RE.sub(".gguf", base)
    base = re.sub(r"\.gguf$", "", base, flags=re.IGNORECASE)
    found = QUANT_RE.findall(base)
    if not found:
        return "unknown"
    q = found[-1].upper()
    return "F16" if q == "FP16" else q


def group_ggufs(files: list[RemoteFile]) -> list[GgufChoice]:
    """The repo's GGUF models; shards of one split model become one choice.  mmproj (vision) files are skipped."""
    singles: list[GgufChoice] = []
    splits: dict[str, list[tuple[int, int, RemoteFile]]] = {}
    for f in files:
        base = f.name.rsplit("/", 1)[-1].lower()
        if not base.endswith(".gguf") or "mmproj" in base:
            continue
        m = SHARD_RE.search(f.name)
        if m:
            splits.setdefault(f.name[: m.start()], []).append((int(m.group(1)), int(m.group(2)), f))
        else:
            singles.append(GgufChoice(parse_quant(f.name), (f,)))
    for _, shards in sorted(splits.items()):
        shards.sort(key=lambda s: s[0])
        total = shards[0][1]
        if [s[0] for s in shards] != list(range(1, total + 1)):
            continue  # an incomplete split (a shard missing from the repo) cannot load
        singles.append(GgufChoice(parse_quant(shards[0][2].name), tuple(s[2] for s in shards)))
    return sorted(singles, key=lambda c: (-_bpw(c.quant), c.first.name))


def _bpw(quant: str) -> float:
    if quant in QUANT_BPW:
        return QUANT_BPW[quant]
    m = re.match(r"I?Q(\d)", quant)  # IQ4_XS and friends: about their digit's bits
    return float(m.group(1)) + 0.3 if m else 0.0


@dataclass(frozen=True)
class Choice:
    gguf: GgufChoice
    reason: str  # one sentence: why this file


def choose_gguf(
    choices: list[GgufChoice],
    report: Any,
    shape: Any | None = None,
    *,
    quant: str | None = None,
    file: str | None = None,
) -> Choice:
    """Pick the GGUF to pull (see the module docstring).  `report` is a hwprobe HardwareReport, `shape` a
    ModelShape from the repo's config.json (or None)."""
    assert choices, "the caller checks that the repo has GGUF files"
    have = ", ".join(c.quant for c in choices)
    if file is not None:
        for c in choices:
            if file in (c.first.name, c.first.name.rsplit("/", 1)[-1]) or any(file == f.name for f in c.files):
                return Choice(c, f"--file {file} asked for it")
        raise ConfigError(
            f"the repo has no GGUF file {file!r}", "its GGUF files: " + ", ".join(c.first.name for c in choices)
        )
    if quant is not None:
        want = quant.upper()
        for c in choices:
            if c.quant == want:
                return Choice(c, f"--quant {want} asked for it")
        raise ConfigError(f"the repo has no {want} GGUF", f"it has: {have}; pick one with --quant")
    if shape is not None:
        picked = _by_plan(choices, report, shape)
        if picked is not None:
            return picked
    return _by_size(choices, report)


def _by_plan(choices: list[GgufChoice], report: Any, shape: Any) -> Choice | None:
    try:
        p = plan(report, shape)
    except PlanError:
        return None  # nothing on the ladder fits: the size rule below says so with the numbers
    if p.backend != "llama.cpp":  # the torch engine at bf16 & co.: the best GGUF the plan's bits allow
        target = 16.0 if p.quant in ("bf16", "fp16", "fp32") else 8.5 if p.quant in ("FP8", "W8A16") else 4.89
    else:
        target = _bpw(p.quant)
    below = [c for c in choices if _bpw(c.quant) <= target + 1e-6 and c.quant != "unknown"]
    if not below:
        return None
    c = below[0]
    exact = "" if c.quant == p.quant else f" (the plan recommends {p.quant}; the repo's best at or below it)"
    return Choice(
        c,
        f"the plan for this machine recommends {p.quant} for {shape.name} "
        f"({p.backend}, {p.n_gpu_layers}/{p.n_layers} layers on GPU, context {p.ctx}){exact}",
    )


def budget_bytes(report: Any) -> tuple[int, str]:
    """The bytes one model may use and where: the largest GPU's plan budget, else available RAM."""
    if report.gpus:
        g = max(report.gpus, key=lambda g: g.memory_free_mib)
        return memory.gpu_budget_bytes(g.memory_free_mib, g.memory_total_mib), f"GPU {g.index} ({g.name})"
    return max(0, report.ram_available_mib * MIB - memory.RAM_MARGIN_BYTES), "RAM"


def _by_size(choices: list[GgufChoice], report: Any) -> Choice:
    budget, where = budget_bytes(report)
    room = int(budget * FIT_FRACTION)
    fits = [c for c in choices if c.size <= room]
    floor = _bpw(LOWEST_DEFAULT_QUANT)
    good = [c for c in fits if _bpw(c.quant) >= floor - 1e-6]
    gib = 1024**3
    if good:
        c = good[0]
        return Choice(
            c,
            f"{c.quant} is the highest-quality file that fits {where}: {c.size / gib:.2f} GiB of "
            f"{room / gib:.1f} GiB ({int(FIT_FRACTION * 100)}% of the {budget / gib:.1f} GiB budget)",
        )
    if fits:
        c = max(fits, key=lambda c: c.size)
        return Choice(
            c,
            f"warning: only quants below {LOWEST_DEFAULT_QUANT} fit {where}; {c.quant} is "
            f"{c.size / gib:.2f} GiB of {room / gib:.1f} GiB (quality drops below {LOWEST_DEFAULT_QUANT})",
        )
    small = min(choices, key=lambda c: c.size)
    raise PlanError(
        f"no GGUF in the repo fits {where}: the smallest ({small.quant}) is {small.size / gib:.2f} GiB, "
        f"the budget {room / gib:.2f} GiB",
        "pick one anyway with --quant or --file (it may run slowly with partial offload)",
    )
