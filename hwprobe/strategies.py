"""The planner as a table (issue 41 item 5): plan() tries STRATEGIES in order and takes the first that applies and
finds something; the first of them races RACERS, one row per engine, in hwprobe/race.py's one typed speed race.

STRATEGIES, in order (hwprobe/planner.py's docstring has the policy in words):
  1. "whole on the GPUs": every RACERS row that applies proposes what fits entirely on the GPUs (candidates.py
     sizes them), and the race takes the fastest within the quality budget for the command;
  2. "the torch engine alone": nothing fits whole, and only the torch engine may run the model (a safetensors
     folder, --backend torch, --tensor-parallel): it streams blocks from host RAM, else runs on the CPU;
  3. "partial offload and the CPU": llama.cpp's partial offload against the torch engine streaming blocks (the
     faster by estimate; serving takes the batching engine), the CPU when no GPU takes a layer, and for a
     mixture-of-experts model the expert placement against the layer offload.

Adding an engine or a weight format that runs whole on GPUs is adding a RACERS row (or a format in
candidates.torch_formats); a new way to place a model that fits no GPU whole is a STRATEGIES row.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hwprobe import race
from hwprobe.candidates import (
    expert_placement,
    llama_cpu,
    llama_full,
    llama_partial,
    torch_cpu,
    torch_full,
    torch_offload,
)
from hwprobe.fit_search import fits
from hwprobe.placement import Candidate, expected_tokens_per_s, price
from hwprobe.plan_types import PlanCandidate, Prefs
from hwprobe.report import HardwareReport
from hwprobe.shape import ModelShape
from hwprobe.support import torch_engine_refusal
from hwprobe.tensor_parallel import no_tp_error


@dataclass(frozen=True)
class Ask:
    """One plan() call: the machine, the model, the user's preferences, the context range and llama.cpp's quants."""

    report: HardwareReport
    shape: ModelShape
    prefs: Prefs
    lo: int  # the smallest context the plan may take (the target's floor, or the fixed --ctx)
    hi: int  # the context it aims for
    quants: Any  # candidates.llama_quants: ((quant, layout), ...) llama.cpp may run

    @property
    def serving(self) -> bool:
        return serving(self.prefs)

    @property
    def file_format(self) -> str | None:
        return self.shape.extra.get("file_format") if self.shape.extra else None

    @property
    def tp_asked(self) -> bool:
        return self.prefs.tensor_parallel is not None and self.prefs.tensor_parallel > 1

    @property
    def whole_layers(self) -> bool:
        """No --n-gpu-layers below the model's count (a fixed partial offload is planned by step 3)."""
        return self.prefs.n_gpu_layers in (None, -1, self.shape.n_layers)


@dataclass(frozen=True)
class Choice:
    """What plan() chose (before the user's flags are applied) and what it weighed on the way, for the reasons."""

    chosen: Candidate
    raced: tuple[PlanCandidate, ...] = ()  # what the speed race weighed (hwprobe.race), the chosen one marked
    race_why: str | None = None  # the race's own reason, when more than one candidate ran
    rival: tuple[Candidate, float] | None = None  # the partial offload that lost the race (step 3)
    expert_race: tuple[Candidate, float, Candidate, float] | None = None  # (experts, tps, layer offload, tps)
    single: tuple[Candidate, float] | None = None  # serving: the one-at-a-time plan the batching one replaced


@dataclass(frozen=True)
class Racer:
    """A row of the race among what fits whole on the GPUs: one engine's candidates."""

    name: str
    applies: Callable[[Ask], bool]
    build: Callable[[Ask], list[Candidate]]


@dataclass(frozen=True)
class Strategy:
    """A row of the planner's table: a way to place the model, tried in order."""

    name: str
    applies: Callable[[Ask], bool]
    build: Callable[[Ask], Choice | None]  # None: nothing of this kind (the next row is tried)


def serving(prefs: Prefs) -> bool:
    """Concurrent clients are expected (`hearth serve`, more than one at once) and the backend is the plan's."""
    return prefs.prefer_batching and prefs.backend == "auto" and prefs.max_num_seqs > 1


def _llama_quants(a: Ask) -> list[Candidate]:
    return [c for q, layout in a.quants if (c := llama_full(a.report, a.shape, a.prefs, a.lo, a.hi, q, layout))]


RACERS = (
    Racer(
        "the torch engine's weight formats (candidates.torch_formats), on one GPU or NVLink/P2P-joined ones",
        lambda a: a.whole_layers and a.prefs.backend in ("auto", "torch"),
        lambda a: torch_full(a.report, a.shape, a.prefs, a.lo, a.hi),
    ),
    Racer(
        "llama.cpp's quants (the file's own, or the ladder's for a config.json)",
        lambda a: a.file_format != "safetensors" and not a.tp_asked and a.prefs.backend in ("auto", "llama.cpp"),
        _llama_quants,
    ),
)


def whole_on_gpus(a: Ask) -> Choice | None:
    """The speed race (hwprobe.race) among every RACERS row's candidates; None when nothing fits whole."""
    cands = [c for row in RACERS if row.applies(a) for c in row.build(a)]
    if not cands:
        return None
    entries = [race.entry(a.report, a.shape, c, a.prefs, a.serving) for c in cands]
    win = race.winner(entries, a.serving, a.hi)
    why = race.race_reason(entries, win, a.serving, a.prefs.max_ppl_increase_pct) if len(entries) > 1 else None
    return Choice(win.candidate, race.summaries(entries, win), why)


def torch_alone(a: Ask) -> Choice | None:
    """Only the torch engine may run the model (a safetensors folder, --backend torch, --tensor-parallel): it
    streams blocks from host RAM, else runs on the CPU; None: llama.cpp's offload is next."""
    report, shape, prefs = a.report, a.shape, a.prefs
    fixed = prefs.n_gpu_layers if prefs.n_gpu_layers is not None and 0 < prefs.n_gpu_layers < shape.n_layers else None
    torch_only = prefs.backend == "torch" or (prefs.backend == "auto" and a.file_format == "safetensors")
    chosen = None
    if torch_only and (prefs.n_gpu_layers is None or fixed is not None):
        chosen = torch_offload(report, shape, prefs, a.lo, a.hi, fixed)
    if a.tp_asked and chosen is None:
        if report.gpus:
            raise no_tp_error(report, shape, prefs.tensor_parallel)  # type: ignore[arg-type]
        return Choice(torch_cpu(report, shape, prefs, a.lo, a.hi))  # ranks on the CPU's cores (tests, CI)
    if chosen is None and (prefs.backend == "torch" or a.file_format == "safetensors"):
        return Choice(torch_cpu(report, shape, prefs, a.lo, a.hi))
    return None if chosen is None else Choice(chosen)


def offload_or_cpu(a: Ask) -> Choice:
    """llama.cpp's partial offload (or the CPU) against the torch engine streaming blocks, then a MoE model's
    expert placement (the race tried every llama.cpp quant whole on the GPUs already)."""
    report, shape, prefs = a.report, a.shape, a.prefs
    chosen = llama_partial(report, shape, prefs, a.lo, a.quants)
    rival: tuple[Candidate, float] | None = None
    single: tuple[Candidate, float] | None = None
    if not chosen.gpus:  # CPU only: RAM is cheap, so the best quant at the target context if it fits
        chosen = llama_cpu(report, shape, prefs, a.lo, a.hi, a.quants) or chosen
    if prefs.backend == "auto" and prefs.n_gpu_layers is None:
        streamed = torch_offload(report, shape, prefs, a.lo, a.hi)
        chosen, rival = faster(report, shape, chosen, streamed, batching=a.serving)
        if not chosen.gpus and a.serving:
            chosen, single = _serve_on_cpu(a, chosen)
    return _with_expert_race(a, Choice(chosen, rival=rival, single=single))


STRATEGIES = (
    Strategy("whole on the GPUs: the engine race", lambda a: True, whole_on_gpus),
    Strategy(
        "the torch engine alone (a safetensors folder, --backend torch, --tensor-parallel)",
        lambda a: a.prefs.backend == "torch" or a.file_format == "safetensors" or a.tp_asked,
        torch_alone,
    ),
    Strategy("partial offload and the CPU", lambda a: True, offload_or_cpu),
)


def choose(a: Ask) -> Choice:
    """The first STRATEGIES row that applies and finds something (the last always does)."""
    for row in STRATEGIES:
        if row.applies(a) and (found := row.build(a)) is not None:
            return found
    raise AssertionError("the last strategy always plans")  # offload_or_cpu never returns None


def score(report: HardwareReport, shape: ModelShape, c: Candidate) -> tuple[bool, float]:
    return fits(report, shape, c), expected_tokens_per_s(report, shape, c, price(report, shape, c))


def faster(
    report: HardwareReport, shape: ModelShape, llama: Candidate, streamed: Candidate | None, *, batching: bool = False
) -> tuple[Candidate, tuple[Candidate, float] | None]:
    """The faster of llama.cpp's partial offload and the torch engine streaming blocks (a candidate that does
    not fit loses to one that does; a tie goes to llama.cpp), and the loser with its tokens/s for the reasons.
    `batching` (serving): the torch engine wins whenever it fits, since each step streams the blocks once for
    every request in the batch while llama.cpp answers one request at a time."""
    if streamed is None:
        return llama, None
    by_llama, by_torch = score(report, shape, llama), score(report, shape, streamed)
    if by_torch > by_llama or (batching and by_torch[0]):
        return streamed, (llama, by_llama[1])
    return llama, (streamed, by_torch[1])


def _serve_on_cpu(a: Ask, llama: Candidate) -> tuple[Candidate, tuple[Candidate, float] | None]:
    """Serving from host RAM: the torch engine (continuous batching) instead of llama.cpp's one request at a
    time, where it runs the model and its batch's KV pool fits RAM; else llama.cpp.  Returns the chosen plan and
    llama.cpp's single-stream candidate with its tokens/s (for the reasons), or None when llama.cpp stays."""
    report, shape = a.report, a.shape
    if torch_engine_refusal(shape) is not None:
        return llama, None
    torch = torch_cpu(report, shape, a.prefs, a.lo, a.hi)
    if not fits(report, shape, torch):
        return llama, None
    return torch, (llama, expected_tokens_per_s(report, shape, llama, price(report, shape, llama)))


def _with_expert_race(a: Ask, choice: Choice) -> Choice:
    """Expert placement (step 3's third contender) races the layer offload chosen, and wins when its estimate is
    higher; serving keeps the batching torch engine it chose."""
    chosen, prefs = choice.chosen, a.prefs
    experts = (
        expert_placement(a.report, a.shape, prefs, a.lo, a.quants)
        if chosen.gpus
        and prefs.backend in ("auto", "llama.cpp")
        and prefs.n_gpu_layers is None
        and not (a.serving and chosen.backend == "torch")
        else None
    )
    if experts is None:
        return choice
    by_experts, by_layers = score(a.report, a.shape, experts), score(a.report, a.shape, chosen)
    expert_race = (experts, by_experts[1], chosen, by_layers[1])
    if by_experts > by_layers:
        return dataclasses.replace(choice, chosen=experts, rival=None, expert_race=expert_race)
    return dataclasses.replace(choice, expert_race=expert_race)
