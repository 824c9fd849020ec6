"""Does the plan hold?  Load a model under its plan in a fresh process and compare that process's peak memory
with what the plan promised (issue 16 item 1: the plan is the allocation).

The bound: the peak of the process that holds the model (VmHWM, the kernel's high-water mark of its resident
set, loader transients included; on CUDA also torch.cuda.max_memory_reserved) stays within
    plan total + runtime baseline + max(3 %, 128 MiB)
where the plan total is the device's row of the plan (host RAM for a CPU plan, the GPU for a CUDA one) and the
runtime baseline is the peak RSS of a process that only imports torch and hearth's CLI
(`python -c "import torch, app.cli"`): the interpreter, torch's libraries and hearth's code, which no plan
counts because they do not depend on the model.  `hearth bench` reports the baseline on its own line.

The load runs in a fresh subprocess (`python -m app.memory_check JSON`) through app.loading.make_backend, as every
command loads: the model is then in a runner process, and the peak measured is the runner's own VmHWM
(EngineStats.peak_rss_bytes); with HEARTH_IN_PROCESS=1 it is that subprocess's.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict, dataclass
from typing import Any

from app.loading import decide, make_backend
from app.settings import load_settings
from app.store import ModelStore
from backends.api import (
    Request,
    SamplingParams,
    peak_rss_bytes,  # noqa: F401 - VmHWM of this process (runtime_baseline_bytes's child uses it)
)

MIB = 1024 * 1024
BASELINE_CODE = "import torch, app.cli"
MARGIN_FRACTION = 0.03
MARGIN_MIN_BYTES = 128 * MIB


def runtime_baseline_bytes(python: str | None = None) -> int:
    """Peak RSS of a fresh `python -c "import torch, app.cli"`: what any hearth process that runs the torch
    engine holds before a model is loaded."""
    code = f"{BASELINE_CODE}\nfrom app.memory_check import peak_rss_bytes\nprint(peak_rss_bytes())"
    out = subprocess.run([python or sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return int(out.stdout.strip().splitlines()[-1])


def bound_bytes(plan_total_bytes: int, baseline_bytes: int) -> int:
    """The most the measured peak may be: plan total + baseline + max(3 % of both, 128 MiB)."""
    base = plan_total_bytes + baseline_bytes
    return base + max(int(MARGIN_FRACTION * base), MARGIN_MIN_BYTES)


@dataclass(frozen=True)
class LoadRequest:
    model: str | None  # registered name or path; None = the default model
    backend: str  # "torch" | "llama.cpp"
    ctx: int | None = None  # None = the plan's
    max_num_seqs: int | None = None  # None = the settings' max_concurrency
    generate_tokens: int = 8  # a short greedy generation after loading (compute buffers in use); 0 = none
    hardware_file: str | None = None  # plan for a saved HardwareReport (the measurement still runs here)


@dataclass(frozen=True)
class LoadPeak:
    backend: str
    device: str  # "cpu" | "cuda:N": where the plan puts the model
    plan_total_bytes: int  # the plan's total on that device
    plan_kv_bytes: int  # the plan's KV on that device
    kv_pool_tokens: int  # the plan's KV pool in tokens on that device
    peak_rss_bytes: int  # VmHWM of the process that loaded the model
    peak_gpu_reserved_bytes: int | None  # torch.cuda.max_memory_reserved, when the model ran on CUDA
    kv_cache_bytes: int | None  # what the engine says its KV pool holds (torch engine)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _plan_row(plan: Any) -> Any:
    """The plan's device row that holds the model: the GPU for a plan on one, else host RAM."""
    gpus = [d for d in plan.devices if d.kind == "gpu" and d.used]
    return gpus[0] if gpus else next(d for d in plan.devices if d.kind == "cpu")


def _load_here(req: LoadRequest) -> LoadPeak:
    """Runs in the child: plan, load (in a runner), generate, measure the process that holds the model."""
    flags = {"model": req.model, "backend": req.backend, "ctx": req.ctx, "max_concurrency": req.max_num_seqs}
    settings = load_settings(**flags)
    _, spec = ModelStore().spec(settings.model)
    decision = decide(spec, settings, req.hardware_file)
    backend = make_backend(spec, decision, settings, hardware_file=req.hardware_file)
    backend.load()
    try:
        if req.generate_tokens:
            prompt = "The plan is the allocation: every byte the engine holds was counted before it loaded"
            backend.generate(
                Request(
                    prompt=prompt,
                    sampling=SamplingParams(temperature=0, max_tokens=req.generate_tokens, ignore_eos=True),
                )
            )
        info = backend.describe()
        stats = backend.stats()  # the runner's figures (this process's own with HEARTH_IN_PROCESS=1)
        gpu = stats.gpu_bytes or None  # torch.cuda.memory_reserved after the generation: the caching allocator
        #                                keeps what it reserved, so this is its high-water mark
        row = _plan_row(decision.plan)
        return LoadPeak(
            decision.backend,
            decision.plan.device,
            row.total_mib * MIB,
            row.kv_mib * MIB,
            getattr(row, "kv_pool_tokens", 0),
            stats.peak_rss_bytes,
            gpu,
            info.get("kv_cache_bytes"),
        )
    finally:
        backend.close()


def measure_load(req: LoadRequest, python: str | None = None, timeout_s: float = 600) -> LoadPeak:
    """Plan and load `req` in a fresh process; its peak memory and the plan's figures."""
    proc = subprocess.run(
        [python or sys.executable, "-m", "app.memory_check", json.dumps(asdict(req))],
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
        raise RuntimeError(f"measuring {req.backend} failed: {tail}")
    return LoadPeak(**json.loads(lines[-1]))


if __name__ == "__main__":
    result = _load_here(LoadRequest(**json.loads(sys.argv[1])))
    sys.stdout.write(json.dumps(result.as_dict()) + "\n")
