"""The engine's side of the kernel self-check (kernels/selfcheck.py): which kernels a loaded model calls, the
record of verdicts per device key, and the swap of the rejected kernels for the torch ops.

When: at load, in the runner, on a model whose KernelSet is Triton's (CUDA; on CPU only under
TRITON_INTERPRET=1, as tests and `hearth doctor --kernels` run it), when LoadOptions.kernel_check_record names
the record file (the app passes hearth's cache dir; library users and tests that do not ask are not checked).
Once per key: the record maps the device key (GPU name and compute capability, driver, torch, Triton, hearth,
dtype) to each kernel's verdict; a load checks only the kernels not in it yet (a first int4 model after an
fp16 one checks the int4 matmul alone).  Verdicts "unchecked" (budget ran out) are not recorded.

The CUDA-graph check (item 2 of issue 25) records here too: the first captured decode step's logits against
the eager step's (model_runner._graph_step); a mismatch turns graphs off for the key.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from backends.atomic_write import write_text_atomically
from backends.modelspec import ModelSpec
from backends.torch_engine.quantize import QuantLinear
from kernels import selfcheck
from kernels.dispatch import KernelSet, kernel_set
from kernels.quant_matmul import fp8_supported

_lock = threading.Lock()
# kernels whose torch replacement reads step data on the host: a CUDA graph cannot replay them
GRAPH_BLOCKERS = ("paged_attention", "write_kv", "moe_experts")


@dataclass
class KernelCheck:
    """The outcome for one load: the verdicts of the kernels this model calls and how they were reached."""

    key: dict[str, str]
    verdicts: list[selfcheck.KernelVerdict]
    checked_s: float = 0.0  # time spent checking in this load (0 when every verdict came from the record)
    budget_s: float = selfcheck.BUDGET_S
    from_record: int = 0  # verdicts reused from the record
    graphs: dict[str, Any] = field(default_factory=dict)  # the record's CUDA-graph verdict for the key, if any

    @property
    def replaced(self) -> list[selfcheck.KernelVerdict]:
        return [v for v in self.verdicts if not v.kept]

    def reasons(self) -> list[str]:
        """Lines for the plan's reasons / --verbose: one per replaced kernel, and a summary."""
        out = [
            f"kernel self-check on {self.key['device']}: {len(self.verdicts)} kernels, "
            f"{len(self.replaced)} replaced by torch ops ("
            + (f"checked in {self.checked_s:.1f} s of a {self.budget_s:g} s budget" if self.checked_s else "")
            + (", " if self.checked_s and self.from_record else "")
            + (f"{self.from_record} from the record" if self.from_record else "")
            + ")"
        ]
        return out + [f"  {v.line()}" for v in self.replaced]

    def describe(self) -> dict[str, Any]:
        return {
            "kernel_check": f"{len(self.verdicts)} checked, {len(self.replaced)} replaced",
            "kernels_replaced": ", ".join(v.name for v in self.replaced) or "none",
        }


def check_shape(spec: ModelSpec, model: torch.nn.Module) -> selfcheck.CheckShape:
    """What of this model the check exercises; the weight formats are read off the loaded QuantLinears."""
    kinds = sorted({m.kind for m in model.modules() if isinstance(m, QuantLinear)})
    return dataclasses.replace(spec_shape(spec), quant_kinds=tuple(kinds))


def spec_shape(spec: ModelSpec) -> selfcheck.CheckShape:
    return selfcheck.CheckShape(
        hidden=spec.hidden_size,
        num_heads=spec.n_heads,
        num_kv_heads=spec.n_kv_heads,
        head_dim=spec.head_dim,
        ffn=spec.ffn_size,
        window=spec.sliding_window if spec.architecture != "phi3" else 0,
        n_experts=spec.n_experts,
        top_k=spec.n_experts_used,
        activation="gelu" if spec.architecture.startswith("gemma") else "silu",
    )


def _hearth_version() -> str:
    try:
        return importlib.metadata.version("hearth-llm")
    except importlib.metadata.PackageNotFoundError:
        return "-"


def applies(ops: KernelSet, device: torch.device) -> bool:
    """Only Triton's set has kernels to check: on CUDA, or on CPU under the interpreter."""
    return ops.name == "triton" and (device.type == "cuda" or selfcheck.interpreted())


def key_string(key: dict[str, str]) -> str:
    return "|".join(f"{k}={v}" for k, v in sorted(key.items()))


def read_record(path: str | os.PathLike[str]) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write_record(path: str | os.PathLike[str], key: dict[str, str], update: dict[str, Any]) -> None:
    """Merge `update` into the key's entry (kernels merge by name)."""
    with _lock:
        data = read_record(path)
        entry = data.get(key_string(key))
        entry = entry if isinstance(entry, dict) else {"key": key, "kernels": {}}
        entry.setdefault("kernels", {}).update(update.pop("kernels", {}))
        entry.update(update, when=time.strftime("%Y-%m-%d %H:%M:%S"))
        data[key_string(key)] = entry
        try:  # a unique temporary name: two runners (tensor-parallel ranks) may record at once
            write_text_atomically(path, json.dumps(data, indent=1))
        except OSError:
            pass  # a read-only cache: the check runs again at the next load


def check_model(
    spec: ModelSpec,
    model: torch.nn.Module,
    ops: KernelSet,
    device: torch.device,
    dtype: torch.dtype,
    record: str | os.PathLike[str] | None,
    budget_s: float | None = None,
    *,
    judge_speed: bool | None = None,
) -> KernelCheck:
    """Check (or recall) every kernel `model` calls; record new verdicts.  Does not change the model."""
    shape = check_shape(spec, model)
    return check_kernels(shape, ops, device, dtype, record, budget_s, judge_speed=judge_speed)


def check_kernels(
    shape: selfcheck.CheckShape,
    ops: KernelSet,
    device: torch.device,
    dtype: torch.dtype,
    record: str | os.PathLike[str] | None,
    budget_s: float | None = None,
    *,
    judge_speed: bool | None = None,
    again: bool = False,
) -> KernelCheck:
    """The verdicts for `shape`'s kernels: recalled from the record, the missing ones checked (all of them with
    `again`, as `hearth doctor --kernels` does) and recorded."""
    budget_s = selfcheck.BUDGET_S if budget_s is None else budget_s
    key = selfcheck.device_key(device, dtype, {"hearth": _hearth_version()})
    entry = read_record(record).get(key_string(key), {}) if record else {}
    known = entry.get("kernels", {}) if isinstance(entry, dict) and not again else {}
    cases = selfcheck.plan_checks(shape, ops, kernel_set("torch"), kernel_set("reference"), device, dtype)
    todo = [c for c in cases if c.name not in known]
    start = time.perf_counter()
    fresh = selfcheck.run_checks(todo, device, dtype, budget_s=budget_s, judge_speed=judge_speed) if todo else []
    checked_s = time.perf_counter() - start if todo else 0.0
    by_name = {v.name: v for v in fresh}
    verdicts = []
    for c in cases:
        if c.name in by_name:
            verdicts.append(by_name[c.name])
        else:
            verdicts.append(selfcheck.KernelVerdict(**known[c.name]))
    if record and fresh:
        new = {v.name: dataclasses.asdict(v) for v in fresh if v.verdict != "unchecked"}
        _write_record(record, key, {"kernels": new, "last_check_s": round(checked_s, 3), "budget_s": budget_s})
    graphs = entry.get("cuda_graphs", {}) if isinstance(entry, dict) else {}
    return KernelCheck(key, verdicts, checked_s, budget_s, len(cases) - len(todo), graphs)


def apply_to_model(model: torch.nn.Module, ops: KernelSet, check: KernelCheck) -> KernelSet:
    """Swap the rejected kernels out of `model` (a named transform after loading): modules that call through
    `ops` get the patched set, quantized layers of a rejected format the plain-torch matmul.  Returns the set."""
    patched = selfcheck.apply(ops, kernel_set("torch"), check.verdicts)
    if patched is not ops:
        for m in model.modules():
            if getattr(m, "ops", None) is ops:
                m.ops = patched
        if getattr(model, "ops", None) is ops:
            model.ops = patched  # type: ignore[assignment]
    kinds = selfcheck.replaced_quant_kinds(check.verdicts)
    for m in model.modules():
        if isinstance(m, QuantLinear) and m.kind in kinds:
            m.impl = "torch"
    return patched


def record_graph_check(record: str | os.PathLike[str] | None, key: dict[str, str], verdict: dict[str, Any]) -> None:
    if record:
        _write_record(record, key, {"cuda_graphs": verdict})


def doctor_check(spec: ModelSpec, record: str | os.PathLike[str] | None, budget_s: float = 300.0) -> KernelCheck:
    """`hearth doctor --kernels`: every Triton kernel `spec`'s model could call, in every weight format this
    device runs (int8, int4, q6, and fp8 from compute capability 8.9), checked again now and recorded: on the GPU,
    or on CPU under the Triton interpreter (the caller sets TRITON_INTERPRET=1 before anything imports the
    kernels)."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda":
        dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    else:
        dtype = torch.float32  # the interpreter does no bf16 arithmetic
    kinds = ("int8", "int4", "q6") + (("fp8",) if fp8_supported(device) else ())
    shape = dataclasses.replace(spec_shape(spec), quant_kinds=kinds)
    return check_kernels(shape, kernel_set("triton"), device, dtype, record, budget_s, again=True)


def recorded_tables(record: str | os.PathLike[str]) -> list[tuple[dict[str, str], list[str]]]:
    """(device key, table lines) of every device in the record, for `hearth doctor`."""
    out = []
    for entry in read_record(record).values():
        if not isinstance(entry, dict) or not isinstance(entry.get("kernels"), dict):
            continue
        verdicts = [selfcheck.KernelVerdict(**v) for v in entry["kernels"].values()]
        lines = selfcheck.table(verdicts)
        graphs = entry.get("cuda_graphs")
        if isinstance(graphs, dict) and graphs.get("verdict"):
            lines.append(f"cuda graphs: {graphs['verdict']} (max logit error {graphs.get('max_error', 0):.3g})")
        if entry.get("last_check_s") is not None:
            lines.append(f"last check took {entry['last_check_s']:.2f} s (budget {entry.get('budget_s', '-')} s)")
        out.append((entry.get("key", {}), lines))
    return out
