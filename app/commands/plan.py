"""`hearth plan MODEL`: how hearth would run a model on this machine (or on a saved one), and why."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from app.commands.common import (
    CTX,
    DRAFT_MODEL,
    HARDWARE,
    KV_CACHE_TYPE,
    MAX_PPL_INCREASE,
    N_GPU_LAYERS,
    SPECULATIVE,
    TENSOR_PARALLEL,
)
from app.defaults import LOCAL_BACKENDS
from backends.errors import ModelFormatError
from hwprobe import plan as make_plan
from hwprobe.errors import ConfigError, PlanError
from hwprobe.memory import QUANT_BPW
from hwprobe.plan_types import Prefs
from hwprobe.shape import ModelShape

NAME = "plan"
HELP = "show how a model would run here: backend, quant, GPU layers, context, KV type, memory, speed"
ORDER = 61
DESCRIPTION = """Plan a model without loading it.  MODEL is a registered name, a GGUF file, a Hugging Face
model folder, or a Hugging Face config.json (then the plan also picks the GGUF quant: F16 ... Q4_K_M).

  hearth plan smollm2-135m-instruct
  hearth plan ~/models/Qwen2.5-14B/config.json --hardware 4090.json --json
  hearth plan config.json --quant Q3_K_M      (below Q4_K_M only when asked)
  hearth plan --for run                        as `hearth run` plans it: KV for one sequence
  hearth plan --serve --max-concurrency 8      as `hearth serve` plans it: batching for 8 concurrent clients

The plan reserves the KV the command will use: `hearth run` one full-context sequence, the chat app 4 (the
default here: plain `hearth` opens it), `hearth serve` its --max-concurrency.  The plan is the allocation: the
torch engine's KV pool is exactly the plan's KV (at most that many full-context sequences, fewer where the
device's budget after weights, compute buffers and overhead is tighter, at least one); in host RAM the engine
commits it in blocks as sequences grow.  --json gives it as kv_pool_tokens (and per device), with max_num_seqs.

Which engine: the torch engine runs dense Llama, Mistral, Qwen2, Qwen3, Gemma 3 and Phi-3/4 models and is
chosen where one of its formats fits a GPU; llama.cpp runs everything else (mixture-of-experts, other
architectures and tokenizers) and single streams on a CPU.  The "backend" reason says which, and why."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "model",
        nargs="?",
        metavar="MODEL",
        help="name, GGUF path, HF folder or config.json (default: the last used model, else the starter)",
    )
    HARDWARE.add(p)
    SPECULATIVE.add(p)
    DRAFT_MODEL.add(p)
    CTX.add(p, help="context length in tokens (fixed)")
    p.add_argument("--backend", "-b", choices=("auto", *LOCAL_BACKENDS), default="auto")
    KV_CACHE_TYPE.add(p)
    MAX_PPL_INCREASE.add(p)
    N_GPU_LAYERS.add(p)
    p.add_argument("--quant", metavar="Q", help="GGUF quant to plan for a config.json (F16, Q8_0, ... Q2_K)")
    p.add_argument(
        "--for",
        dest="for_command",
        choices=("run", "chat", "serve"),
        metavar="COMMAND",
        help="plan as this command loads the model: run (KV for 1 sequence), chat (4; the default), serve "
        "(--max-concurrency, like --serve)",
    )
    p.add_argument(
        "--max-concurrency",
        dest="max_concurrency",
        type=int,
        metavar="N",
        help="torch engine: sequences batched at once, the KV pool's cap in full-context sequences "
        "(default: what --for's command runs; for serve the settings' max_concurrency, 16)",
    )
    TENSOR_PARALLEL.add(
        p,
        help="torch engine ranks, one per GPU (1 = none; default: the plan decides, tensor parallelism "
        "over NVLink/P2P-joined GPUs when a better torch format fits them than one)",
    )
    p.add_argument(
        "--serve",
        action="store_true",
        help="plan as `hearth serve` does: concurrent clients expected, so the engine that batches "
        'them (the torch engine) wherever it runs the model; JSON adds "serving": true',
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print the plan as JSON (tensor_parallel: the torch engine's rank count, 1 when none)",
    )


def _config_shape(path: Path) -> Any:
    # lazy: keeps `hearth --help` light (+mmap, struct, 5 hearth modules)
    from backends.hf_folder import hf_config_shape

    try:
        values = hf_config_shape(json.loads(path.read_text(encoding="utf-8")), path.parent.name or path.stem)
    except (OSError, json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise ModelFormatError(
            f"{path} is not a usable Hugging Face config.json: {exc!r}", "give the config.json of a transformers model"
        ) from None
    keep = {k: v for k, v in values.items() if k in ModelShape.__dataclass_fields__}
    if keep.get("sliding_window"):
        n = keep["n_layers"]
        keep["sliding_window_layers"] = n - n // 6 if str(keep["architecture"]).startswith("gemma3") else n
    return ModelShape(**keep)


def run(args: argparse.Namespace) -> int:
    # lazy: keeps `hearth --help` light (+base64, concurrent, hashlib, 26 hearth modules)
    from app.loading import hardware_report, sequences_for
    from app.measurements import quality_records_for  # lazy: keeps `hearth --help` light
    from app.settings import load_settings  # lazy: keeps `hearth --help` light (+platformdirs, 2 hearth modules)
    from app.store import ModelStore  # lazy: keeps `hearth --help` light (+base64, hashlib, mmap, 10 hearth modules)
    from hwprobe.render import plan_text  # lazy: keeps `hearth --help` light (+1 hearth modules)

    if args.ctx is not None and args.ctx < 16:
        raise ConfigError(f"--ctx must be at least 16 tokens, got {args.ctx}")
    quant = args.quant.upper() if args.quant else None
    if quant and quant not in QUANT_BPW:
        raise ConfigError(f"unknown quant {args.quant!r}", f"use one of {', '.join(QUANT_BPW)}")
    ref = args.model
    if ref and ref.endswith(".json") and Path(ref).expanduser().is_file():
        shape = _config_shape(Path(ref).expanduser())
    else:
        _, spec = ModelStore().spec(ref)
        shape = spec.to_shape()
    report = hardware_report(args.hardware)
    if args.serve and args.for_command not in (None, "serve"):
        raise ConfigError(f"--serve plans for `hearth serve`, but --for says {args.for_command}", "give one of the two")
    command = "serve" if args.serve else args.for_command or "chat"
    # checked as `serve` checks them
    settings = load_settings(max_concurrency=args.max_concurrency, max_ppl_increase=args.max_ppl_increase)
    max_num_seqs, why = sequences_for(command, settings)  # as `run`, the chat app and `serve` load
    if args.max_concurrency is not None and command != "serve":  # an explicit count wins, as before --for
        max_num_seqs, why = args.max_concurrency, f"--max-concurrency {args.max_concurrency}"
    tp = load_settings(tensor_parallel=args.tensor_parallel).tensor_parallel  # checked as `run` checks it
    torch_asked = (tp and tp > 1) or args.speculative in ("ngram", "draft")
    backend = "torch" if torch_asked and args.backend == "auto" else args.backend  # as app.loading.decide
    prefs = Prefs(
        backend=backend,
        ctx=args.ctx,
        kv_cache_type=args.kv_cache_type,
        n_gpu_layers=args.n_gpu_layers,
        quant=quant,
        max_num_seqs=max_num_seqs,
        sequences_for=why,
        tensor_parallel=tp,
        prefer_batching=command == "serve",
        max_ppl_increase_pct=settings.max_ppl_increase,
        quality_records=quality_records_for(shape.name),
    )
    try:
        p = make_plan(report, shape, prefs)
    except PlanError as exc:  # nothing fits here: a bigger machine's server can run it (--backend remote)
        # lazy: keeps `hearth --help` light (+base64, hashlib, mmap, 13 hearth modules)
        from app.remote import remote_hint

        raise PlanError(exc.message, f"{exc.hint}; {remote_hint()}" if exc.hint else remote_hint()) from None
    if ref and ref.endswith(".json") and Path(ref).expanduser().is_file():
        from hwprobe.speculative import plan_speculative  # lazy: keeps `hearth --help` light (+1 hearth modules)

        p = plan_speculative(p, "ngram" if args.speculative == "auto" else args.speculative or "off")
    else:
        # lazy: keeps `hearth --help` light (+base64, hashlib, mmap, 13 hearth modules)
        from app.speculative import decide_speculative

        p, _ = decide_speculative(p, spec, load_settings(speculative=args.speculative, draft_model=args.draft_model))
    print(json.dumps(p.as_dict(), indent=2) if args.json else plan_text(p, shape.name))
    return 0
