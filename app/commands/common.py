"""Arguments shared by the commands that load a model (run, chat, serve, bench, ppl, plan, show)."""

from __future__ import annotations

import argparse
from typing import Any


def add_model_arguments(p: argparse.ArgumentParser, *, backend: bool = True) -> None:
    g = p.add_argument_group("model and placement (the plan decides what you leave out)")
    g.add_argument("--model", "-m", metavar="NAME|PATH",
                   help="registered model name, GGUF file or HF folder (default: last used, else the starter model)")
    if backend:
        g.add_argument("--backend", "-b", metavar="B", choices=("auto", "llama.cpp", "torch"),
                       help="auto (default: the plan chooses), llama.cpp or torch")
    g.add_argument("--ctx", type=int, metavar="N", help="context length in tokens")
    g.add_argument("--n-gpu-layers", "--ngl", dest="n_gpu_layers", type=int, metavar="N",
                   help="transformer layers to put on GPUs (-1 = all)")
    g.add_argument("--kv-cache-type", dest="kv_cache_type", choices=("f16", "q8_0", "q4_0"),
                   help="KV cache precision")
    g.add_argument("--threads", type=int, metavar="N", help="CPU threads (default: physical cores)")
    g.add_argument("--hardware", metavar="FILE",
                   help="plan for the machine described by this HardwareReport JSON (from `hearth probe --json`)")


def add_sampling_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("sampling")
    g.add_argument("--temperature", "-t", type=float, metavar="T", help="0 = greedy (default 0.8)")
    g.add_argument("--top-p", dest="top_p", type=float, metavar="P", help="nucleus sampling (default 0.95)")
    g.add_argument("--top-k", dest="top_k", type=int, metavar="K", help="0 = off (default 40)")
    g.add_argument("--min-p", dest="min_p", type=float, metavar="P", help="0 = off (default 0.05)")
    g.add_argument("--repeat-penalty", dest="repeat_penalty", type=float, metavar="R", help="1 = off (default)")
    g.add_argument("--seed", type=int, metavar="S", help="same seed, same reply")
    g.add_argument("--max-tokens", "-n", dest="max_tokens", type=int, metavar="N", help="most tokens to generate")


def settings_from_args(args: argparse.Namespace) -> Any:
    """Settings merged from file < env < the flags present on args."""
    from app.settings import Settings, load_settings

    names = Settings.__dataclass_fields__.keys()
    flags = {k: getattr(args, k) for k in names if hasattr(args, k)}
    return load_settings(**flags)
