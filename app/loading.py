"""From Settings to a loaded Backend: resolve the model, decide placement, load lazily.

This is the one path every command (run, chat, serve, bench, ppl) and the TUI use, so a model behaves the same
wherever it is opened.  The engine itself runs in a runner process (backends/runner), unless HEARTH_IN_PROCESS=1.
`decide()` is where the hardware plan (hwprobe.plan) turns into LoadOptions; flags the user gave always win over
the plan.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable

import psutil

from app.loaded import Decision, Loaded
from app.measurements import quality_records_for, with_decode_records
from app.paths import get_paths
from app.plan_options import TORCH_QUANTS, kernel_check_record, physical_cores, plan_options
from app.remote import open_remote
from app.runner_start import in_process, prestart
from app.settings import Settings, keep_alive_seconds
from app.speculative import decide_speculative
from app.store import ModelEntry, ModelStore
from backends.api import Backend, LoadOptions, ProgressCallback
from backends.embeddings import is_embedding_model
from backends.modelspec import ModelSpec
from backends.registry import LOCAL_BACKENDS, backend_class, get_backend_info
from backends.runner.client import ConfigMemory, Prestarted, RunnerBackend, config_memory_at
from backends.runner.resident import evict_all, resident_dir, residents
from backends.templates import renderer
from hwprobe import plan as make_plan
from hwprobe import probe
from hwprobe.errors import ConfigError, HearthError
from hwprobe.plan_types import Prefs
from hwprobe.report import HardwareReport, load_report, with_memory_back
from hwprobe.support import torch_engine_refusal

# kernel_check_record and physical_cores live in app/plan_options.py; doctor and the TUI import them from here
__all__ = [
    "Decision",
    "Loaded",
    "decide",
    "kernel_check_record",
    "make_backend",
    "open_backend",
    "physical_cores",
    "sequences_for",
]

# What each command runs at once, so the plan reserves KV for that and no more (issue 24: `hearth run` had a
# 16 x 8192-token pool, 2.8 GiB, for one reply of a 135 M model).  `hearth serve` and `hearth bench` reserve
# their concurrency (Settings.max_concurrency, --concurrency).
RUN_SEQUENCES = 1  # `hearth run`, its terminal chat and `hearth ppl`: one reply (or one text) at a time
# The chat app writes one reply at a time too, but a pool of four contexts keeps the prefixes of the last few
# conversations in the prefix cache, so going back to one (the sidebar, a regenerate, an edit) reuses its KV
# instead of computing the whole conversation again; and a reply stopped with Esc can still be finishing in the
# engine while the next one starts.  On the CPU the pool costs RAM only as it fills (the engine commits its
# blocks on first use), on a GPU it is allocated at load: four 8192-token contexts of a 7-8 B model are 4 GiB
# (Llama 3 8B at f16), which the plan shrinks to what the card has left.
CHAT_SEQUENCES = 4
SEQUENCES_FOR = {
    "run": (RUN_SEQUENCES, "hearth run, which answers one prompt at a time"),
    "chat": (CHAT_SEQUENCES, "the chat app: one reply at a time, the last few conversations kept in the prefix cache"),
    "ppl": (RUN_SEQUENCES, "hearth ppl, which scores one window at a time"),
}


def sequences_for(command: str, settings: Settings) -> tuple[int, str]:
    """(sequences, why) the plan reserves KV for when `command` runs: "run", "chat", else (serve, bench) the
    settings' max_concurrency."""
    if command in SEQUENCES_FOR:
        return SEQUENCES_FOR[command]
    n = settings.max_concurrency
    return n, f"hearth {command} with max concurrency {n}"


def hardware_report(hardware_file: str | None = None, reused: frozenset[int] = frozenset()) -> HardwareReport:
    """The HardwareReport to plan for: the saved one in `hardware_file`, else a probe of this machine, with the
    memory of `reused` (runners an earlier command left loaded with this model, which this one may take over)
    counted as free: their memory is this model's, and the plan must come out as theirs did."""
    if hardware_file:
        return load_report(hardware_file)
    report = with_decode_records(probe(get_paths().models_dir))  # the decode speeds this machine's GPUs measured
    if not reused:
        return report
    ram = 0
    for pid in reused:
        try:
            info = psutil.Process(pid).memory_info()
        except psutil.Error:
            continue
        ram += max(0, info.rss - getattr(info, "shared", 0)) >> 20  # its own pages, not the mapped model file
    return with_memory_back(report, reused, ram)


def decide(
    spec: ModelSpec,
    settings: Settings,
    hardware_file: str | None = None,
    *,
    serving: bool = False,
    command: str | None = None,
    reused: frozenset[int] = frozenset(),
    report: HardwareReport | None = None,
) -> Decision:
    """Choose backend and LoadOptions for this model on this machine: hwprobe.plan() decides, and the flags the
    user gave in `settings` (backend, ctx, n_gpu_layers, kv_cache_type, threads) always override it.
    `serving` (`hearth serve`): concurrent clients are expected, so with backend auto and max_concurrency > 1
    the plan prefers the engine that batches them (hwprobe.planner.serving).  `command` ("run", "chat",
    "serve", ...): what will run, which sets the sequences the KV pool is planned for (sequences_for); None =
    the settings' max_concurrency.  `reused`: pids of runners this command may take over (hardware_report).
    `report`: plan for this report instead (a server loading a model beside others: app/server/pool.py)."""
    report = report if report is not None else hardware_report(hardware_file, reused)
    sequences, why = sequences_for(command, settings) if command else (settings.max_concurrency, "")
    # an embedding model is planned small: one sequence (an embedding is one forward, with no KV kept after it),
    # never a KV pool for concurrent chats it will not have
    embedding = is_embedding_model(spec)
    seqs = 1 if embedding else sequences
    if embedding:
        why = "an embedding model: one forward per input, no KV kept after it"
    prefs = _prefs(spec, settings, seqs, why, prefer_batching=serving and not embedding)
    plan = make_plan(report, spec.to_shape(), prefs)
    plan, draft_path = decide_speculative(plan, spec, settings)
    backend = prefs.backend if prefs.backend != "auto" else plan.backend
    options = plan_options(plan, report, settings, backend=backend, seqs=seqs, draft_path=draft_path)
    reasons = tuple(plan.reasons)
    if embedding:
        reasons = (
            f"embedding model ({spec.architecture}): planned for one sequence, it serves embeddings only",
            *reasons,
        )
    if hardware_file:
        reasons = (f"planned for the machine in {hardware_file}", *reasons)
    return Decision(backend, options, plan, reasons)


def _prefs(spec: ModelSpec, settings: Settings, seqs: int, why: str, *, prefer_batching: bool) -> Prefs:
    """What the planner is asked for: the user's choices in `settings`, `seqs` sequences at once (`why`)."""
    tp = settings.tensor_parallel
    # --tensor-parallel N > 1 is the torch engine's: with --backend auto it asks for the torch engine
    return Prefs(
        # and so are --speculative ngram / draft (the torch engine's feature)
        backend="torch"
        if ((tp and tp > 1) or settings.speculative in ("ngram", "draft")) and settings.backend == "auto"
        else settings.backend,
        ctx=settings.ctx,
        kv_cache_type=settings.kv_cache_type,
        n_gpu_layers=settings.n_gpu_layers,
        max_num_seqs=seqs,
        sequences_for=why,
        tensor_parallel=tp,
        prefer_batching=prefer_batching,
        max_ppl_increase_pct=settings.max_ppl_increase,
        quality_records=quality_records_for(spec.name),
    )


def runs_model(backend: str, spec: ModelSpec) -> bool:
    """Whether `backend` is installed and can run this model at all (the ladder's last rung asks)."""
    info = get_backend_info(backend)
    if not info.is_installed():
        return False
    if backend == "llama.cpp":
        return spec.format == "gguf"
    return torch_engine_refusal(spec.to_shape()) is None


def _fallback(
    spec: ModelSpec,
    settings: Settings,
    hardware_file: str | None,
    logits_all: bool,
    memory: ConfigMemory,
    command: str | None = None,
) -> Callable[[str], LoadOptions | None]:
    """LoadOptions of another backend for this model, or None where it cannot run it."""

    def options_for(backend: str) -> LoadOptions | None:
        if backend not in LOCAL_BACKENDS or not runs_model(backend, spec):
            return None
        try:
            options = decide(spec, settings.merged(backend=backend), hardware_file, command=command).options
            get_backend_info(backend).check_options(options)
        except HearthError:
            return None
        return _with_extra_bufts(backend, dataclasses.replace(options, logits_all=logits_all), memory)

    return options_for


def make_backend(
    spec: ModelSpec,
    decision: Decision,
    settings: Settings,
    *,
    hardware_file: str | None = None,
    logits_all: bool = False,
    command: str | None = None,
    prestarted: Prestarted | None = None,
    model_name: str | None = None,
) -> Backend:
    """The Backend for a decision: in a runner process (the default), or in this process (HEARTH_IN_PROCESS=1).
    HEARTH_BACKEND_CLASS=module:Class loads that Backend class instead of the planned one (tests, plugins).
    `command`: as decide's, for the fallback's plans.  `prestarted`: a runner started early (prestart); the
    backend owns it from here (uses or ends it)."""
    name = os.environ.get("HEARTH_BACKEND_CLASS") or decision.backend
    try:
        if ":" not in name:  # a registry engine: a value it does not take is a one-line error here, not in the child
            get_backend_info(name).check_options(decision.options)
        memory = config_memory()
        options = _with_extra_bufts(name, decision.options, memory)
    except BaseException:
        if prestarted is not None:
            prestarted.discard()
        raise
    if in_process():
        if prestarted is not None:
            prestarted.discard()
        return backend_class(name)(spec, options)
    # no fallback: a remembered configuration on the other backend is ignored too (RunnerBackend._apply_memory)
    pinned = command in MEASURING_COMMANDS or settings.backend != "auto"
    fallback = None if pinned else _fallback(spec, settings, hardware_file, logits_all, memory, command)
    return RunnerBackend(
        spec,
        options,
        backend=name,
        memory=memory,
        log_dir=get_paths().log_dir / "runners",
        fallback=fallback,
        prestarted=prestarted,
        resident_dir=resident_dir(get_paths().data_dir),
        keep_alive_s=keep_alive_for(command, settings),
        model_name=model_name,
    )


# What measures the backend it names (`hearth bench`: each row is one engine's figures), and any command whose
# backend the user named (--backend, the settings' backend, HEARTH_BACKEND: the user's choice wins): the runner never
# moves to the other backend, neither by the ladder after a crash nor by a remembered configuration
# (backends/runner/memory.py).  Pinning every named backend once failed the soak test: a pinned torch server under
# its kills on a loaded machine gave up (with no rung left, a crash while a restart loaded ended it at once).  Since,
# a runner stopped or killed from outside (SIGSTOP, SIGTERM, a SIGKILL that was no OOM kill) restarts as it was and
# counts as no crash, and a configuration that has finished replies is loaded again after a crash at its restart
# (backends/runner/client.py), so a pinned server keeps restarting what it knows works.
# One torch runner that crashed before its first reply left the starter remembered "on the llama.cpp backend instead
# of torch", and every later `hearth bench --backends torch` row was llama.cpp's figures under torch's name (TTFT
# 1,070 ms, prefill 120 tok/s, RSS 180 MiB on the loaded 2-core machine: no torch in that runner at all).
MEASURING_COMMANDS = ("bench",)
LINGERING_COMMANDS = ("run", "chat")  # what a person types again and again; serve, bench and ppl never linger


def keep_alive_for(command: str | None, settings: Settings) -> float | None:
    """How long the runner of `command` stays loaded after it ends (backends/runner/resident.py): the settings'
    keep_alive for `hearth run` and the chat app, none for the rest (a server has its own keep_alive; a
    benchmark must measure its own load; ppl is run once)."""
    return keep_alive_seconds(settings) if command in LINGERING_COMMANDS else 0.0


EXTRA_BUFTS_CHECK = "llama.cpp extra_bufts"


def config_memory() -> ConfigMemory:
    """The per-machine memory of what worked (backends/runner/memory.py), in hearth's cache dir.  The machine is
    its CPU and engine library versions (not its GPUs: a remembered configuration only ever asks for less)."""
    return config_memory_at(get_paths().cache_dir / "runner-configs.json")


def _with_extra_bufts(backend: str, options: LoadOptions, memory: ConfigMemory) -> LoadOptions:
    if backend == "llama.cpp" and options.extra_bufts is None:
        return dataclasses.replace(options, extra_bufts=llama_extra_bufts(memory))
    return options


def llama_extra_bufts(memory: ConfigMemory) -> bool:
    """llama.cpp's extra weight-buffer types on this machine: the backend's rule (off on CPUs with AMX, where
    some builds crash in the repack path), with what `hearth doctor` recorded for this build here."""
    rule = get_backend_info("llama.cpp").extra_bufts_default
    return rule(lambda: memory.check_passed(EXTRA_BUFTS_CHECK) is True)[0]


def _decide(
    spec: ModelSpec,
    settings: Settings,
    hardware_file: str | None,
    serving: bool,
    command: str | None,
    logits_all: bool,
    reused: frozenset[int] = frozenset(),
    report: HardwareReport | None = None,
    weight_format: str | None = None,
) -> Decision:
    decision = decide(spec, settings, hardware_file, serving=serving, command=command, reused=reused, report=report)
    if logits_all:
        decision.options = dataclasses.replace(decision.options, logits_all=True)
    if weight_format is not None:
        decision.options = _forced_weights(decision, weight_format)
    return decision


def _forced_weights(decision: Decision, weight_format: str) -> LoadOptions:
    """The torch engine's weights in `weight_format` (a plan's torch format: "W8A16", "W4A16+attn8" ...) whatever
    the plan chose: `hearth ppl --compare-formats` measures each format the planner may offer, on any machine."""
    quant = TORCH_QUANTS.get(weight_format)
    if decision.backend != "torch" or quant is None:
        raise ConfigError(
            f"{weight_format} weights are made by the torch engine while loading; this plan runs {decision.backend}",
            "use --backend torch, and one of " + ", ".join(TORCH_QUANTS),
        )
    return dataclasses.replace(decision.options, weight_quant=quant)


def open_backend(
    settings: Settings,
    *,
    hardware_file: str | None = None,
    progress: ProgressCallback | None = None,
    store: ModelStore | None = None,
    load: bool = True,
    logits_all: bool = False,
    serving: bool = False,
    command: str | None = None,
    prestarted: Prestarted | None = None,
    report: HardwareReport | None = None,
    weight_format: str | None = None,
) -> Loaded:
    """`logits_all` keeps the logits of every prompt position (only `hearth ppl` needs it: it costs memory);
    `serving`: plan for concurrent clients (`hearth serve`, see decide); `command`: what will run, which sizes
    the KV pool (decide); `prestarted`: the command's runner, started before it imported this module
    (app/runner_start.py); without it one is started here, before the model is resolved and planned.  `report`:
    plan for it instead of probing (decide).  `weight_format`: the torch engine's weights in that format whatever
    the plan chose (_forced_weights)."""
    if settings.backend == "remote":
        return _open_remote(settings, progress=progress, load=load, logits_all=logits_all, prestarted=prestarted)
    # the runner starts first: its imports overlap resolving and planning the model here (prestart)
    started = prestarted
    if started is None and load:
        started = prestart(settings, command in LINGERING_COMMANDS)
    try:
        store = store or ModelStore()
        entry, spec = store.spec(settings.model)
        reused = _take_over_residents(spec, settings, command) if load else frozenset()
        decision = _decide(spec, settings, hardware_file, serving, command, logits_all, reused, report, weight_format)
        if load and spec.chat_template and not logits_all:
            # the chat template renders in a worker process (backends/template_process.py): start it now, on the
            # core the runner's start leaves idle, instead of after the load, before the first prompt
            renderer().start_in_background()
    except BaseException:
        if started is not None:
            started.discard()
        raise
    build = functools.partial(
        make_backend,
        spec,
        settings=settings,
        hardware_file=hardware_file,
        logits_all=logits_all,
        command=command,
        model_name=entry.name,
    )
    backend = build(decision, prestarted=started)
    if load and isinstance(backend, RunnerBackend) and backend.end_other_residents():
        # an earlier command's runner held this model with another plan (engine, context, sequences): the plan
        # counted its memory as taken; that memory is free now, so plan again (backends/runner/resident.py)
        decision = _decide(
            spec, settings, hardware_file, serving, command, logits_all, report=report, weight_format=weight_format
        )
        backend = build(decision, prestarted=backend.release_prestarted())
    if load:
        backend.load(progress)
        _remember_last_model(store, entry)
    return Loaded(backend, entry, spec, decision)


def _open_remote(
    settings: Settings,
    *,
    progress: ProgressCallback | None,
    load: bool,
    logits_all: bool,
    prestarted: Prestarted | None,
) -> Loaded:
    """--backend remote: the model is on an OpenAI-compatible server (app/remote.py); no runner of ours."""
    if logits_all:
        raise ConfigError(
            "hearth ppl needs a local model: OpenAI-compatible servers return no logits of the prompt",
            "pass --backend auto (settings.toml or HEARTH_BACKEND say remote)",
        )

    if prestarted is not None:
        prestarted.discard()
    return open_remote(settings, progress=progress, load=load)


def _take_over_residents(spec: ModelSpec, settings: Settings, command: str | None) -> frozenset[int]:
    """Runners left loaded by earlier commands hold memory the plan would count as taken: end those this
    command cannot use (another model, or any when it keeps no runner) before the probe; the pids of those it
    may take over, whose memory counts as this model's."""
    keep = spec.path if keep_alive_for(command, settings) != 0 else None
    folder = resident_dir(get_paths().data_dir)
    evict_all(folder, keep_model=keep)
    return frozenset(r.pid for r in residents(folder) if r.pid)


def _remember_last_model(store: ModelStore, entry: ModelEntry) -> None:
    """The model just loaded is the next command's default (a model given by path is not)."""
    if entry.source != "path":
        try:
            store.update_state(last_model=entry.name)
        except OSError:
            pass
