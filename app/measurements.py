"""What this machine measured, kept for the planner: decode speeds per GPU and quality per model and format.

The plan's speed and quality figures come from measurements (hwprobe/decode_speed.py, hwprobe/quality.py); the
best measurements are the user's own, on their card and their model.  They live in one JSON file,
`<cache>/measurements.json`:

    {"decode": {"NVIDIA GeForce RTX 4090|8.9": [{"engine": "torch", "kind": "int4", "share": 0.41,
                                                "batch16": 9.8, "source": "hearth bench 2026-12-07 ..."}]},
     "quality": {"Llama-3-8B": {"W8A16": {"pct": 0.3, "kl": 0.002, "source": "hearth ppl --compare ..."}}}}

- `hearth bench` on a GPU records the decode it measured (`record_decode`: tokens/s turned into the share of
  the card's bandwidth, by the plan's bytes read per token); `hardware_report()` hands a probed GPU its
  records (`with_decode_records`), newest first, and the planner prefers them to its table.
- `hearth ppl --compare` records the perplexity increase of the compared format against the base
  (`record_quality`); `quality_records_for(model)` gives the planner a model's figures.

A record replaces an older one of the same key.  An unreadable or malformed file counts as empty (and is
rewritten whole on the next record): these are caches of measurements, never the user's data.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from app.paths import get_paths
from backends.modelspec import ModelSpec
from hwprobe.decode_speed import ENGINE_KINDS, Measured
from hwprobe.errors import HardwareReportError
from hwprobe.memory import TORCH_GGUF, decode_bytes_per_token, gguf_repacked_shares, weights
from hwprobe.placement import TORCH_KIND
from hwprobe.plan_types import Plan
from hwprobe.report import DecodeRecord, GpuInfo, HardwareReport, decode_records_from
from hwprobe.shape import ModelShape


def measurements_path() -> Path:
    return get_paths().cache_dir / "measurements.json"


def _load(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _save(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".measurements-", suffix=".json")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1)
    os.replace(tmp, path)


def gpu_key(gpu: GpuInfo) -> str:
    """A GPU model as the records know it: its name and compute capability (a driver update keeps the records)."""
    return f"{gpu.name}|{gpu.compute_capability or '?'}"


def record_decode(
    gpu: GpuInfo,
    engine: str,
    kind: str,
    tokens_per_s: float,
    bytes_per_token: float,
    n_layers: int,
    *,
    tokens_per_s_16: float | None = None,
    source: str,
    path: Path | None = None,
) -> DecodeRecord:
    """Keep a decode measured on `gpu`: `engine` running weights of `kind` at `tokens_per_s` one stream (and
    `tokens_per_s_16` at 16), a step reading `bytes_per_token` over `n_layers` blocks.  The share is computed as
    the table's rows are (hwprobe.decode_speed.Measured: the launch cost per layer taken out first)."""
    if kind not in ENGINE_KINDS.get(engine, ()):
        raise ValueError(f"no kind {kind!r} for {engine}: one of {ENGINE_KINDS.get(engine)}")
    if tokens_per_s <= 0 or bytes_per_token <= 0 or not gpu.memory_bandwidth_gbps:
        raise ValueError("a decode record needs tokens/s, bytes per token and the GPU's bandwidth")
    run = Measured(tokens_per_s, bytes_per_token, n_layers, gpu.memory_bandwidth_gbps, source, tokens_per_s_16)
    when = time.strftime("%Y-%m-%d")
    rec = DecodeRecord(engine, kind, round(run.share, 4), round(max(run.batch16, 1.0), 2), f"{source} ({when})")
    path = path or measurements_path()
    data = _load(path)
    rows = data.setdefault("decode", {}).get(gpu_key(gpu), [])
    rows = [r for r in rows if isinstance(r, dict) and (r.get("engine"), r.get("kind")) != (engine, kind)]
    data["decode"][gpu_key(gpu)] = [dataclasses.asdict(rec), *rows]
    _save(path, data)
    return rec


def with_decode_records(report: HardwareReport, path: Path | None = None) -> HardwareReport:
    """`report` with each GPU's own decode records (none added where the file has none or is unreadable)."""
    decode = _load(path or measurements_path()).get("decode", {})
    if not isinstance(decode, dict) or not report.gpus:
        return report
    gpus = []
    for g in report.gpus:
        try:
            kept = decode_records_from(decode.get(gpu_key(g)) or [], gpu_key(g))
        except HardwareReportError:  # a hand-edited file: its records for this GPU are not used
            kept = ()
        gpus.append(dataclasses.replace(g, decode_records=tuple(kept) + g.decode_records) if kept else g)
    return dataclasses.replace(report, gpus=tuple(gpus))


def record_quality(model: str, fmt: str, pct: float, kl: float | None, source: str, path: Path | None = None) -> None:
    """Keep `model`'s perplexity increase running as `fmt` (a plan's quant: "W8A16", "Q5_K_M" ...) against its
    best format, measured by `source`."""
    path = path or measurements_path()
    data = _load(path)
    row = {"pct": round(pct, 3), "kl": kl, "source": f"{source} ({time.strftime('%Y-%m-%d')})"}
    data.setdefault("quality", {}).setdefault(model, {})[fmt] = row
    _save(path, data)


def quality_records_for(model: str, path: Path | None = None) -> tuple[tuple[str, float, str], ...]:
    """(format, pct, source) of every quality record of `model` (hwprobe Prefs.quality_records)."""
    rows = _load(path or measurements_path()).get("quality", {})
    rows = rows.get(model, {}) if isinstance(rows, dict) else {}
    out = []
    for fmt, r in rows.items() if isinstance(rows, dict) else ():
        try:
            out.append((str(fmt), float(r["pct"]), str(r.get("source", ""))))
        except (KeyError, TypeError, ValueError):
            continue
    return tuple(sorted(out))


def plan_decode_kind(shape: ModelShape, backend: str, quant: str) -> str | None:
    """What kind of weights a plan reads, as the decode records name them; None where the plan mixes kinds (a
    GGUF layout with int4 and int8 blocks: no one kernel's speed to record)."""
    if backend != "torch":
        return "ggml"
    if quant == TORCH_GGUF:
        int4, int8 = gguf_repacked_shares(shape)
        return "int4" if int4 > 0.99 else "int8" if int8 > 0.99 else None
    return TORCH_KIND.get(quant)


def record_bench_decode(
    report: HardwareReport,
    spec: ModelSpec,
    plan: Plan,
    tokens_per_s: float,
    tokens_per_s_16: float | None,
    path: Path | None = None,
) -> DecodeRecord | None:
    """What `hearth bench` measured on a GPU, kept for the plans after it: a plan with every layer on one GPU
    (the only case where the tokens/s are that card's and that kind's alone); None where there is nothing to
    record (CPU, offload, several GPUs, a mixed layout)."""
    gpus = [d.index for d in plan.devices if d.kind == "gpu" and d.used]
    if len(gpus) != 1 or plan.n_gpu_layers < plan.n_layers or plan.cpu_expert_layers or tokens_per_s <= 0:
        return None
    shape = spec.to_shape()
    kind = plan_decode_kind(shape, plan.backend, plan.quant)
    gpu = next((g for g in report.gpus if g.index == gpus[0]), None)
    if kind is None or gpu is None or not gpu.memory_bandwidth_gbps:
        return None
    layout = weights(shape, None if plan.backend != "torch" else plan.quant)
    source = f"hearth bench, {spec.name} {plan.quant} on {plan.backend}"
    return record_decode(
        gpu,
        plan.backend,
        kind,
        tokens_per_s,
        decode_bytes_per_token(layout, shape),
        shape.n_layers,
        tokens_per_s_16=tokens_per_s_16,
        source=source,
        path=path,
    )
