"""Arguments shared by the commands that load a model (run, chat, serve, bench, ppl, plan, show)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Any

from app.defaults import BACKEND_CHOICES, LOCAL_BACKENDS, REPLY_MAX_TOKENS
from app.defaults import SAMPLING as S


@dataclass(frozen=True)
class Option:
    """One command-line option, defined once: every command that takes it adds it from here, so its flags,
    type and help agree everywhere (`help` may say what the option means for one command)."""

    flags: tuple[str, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)

    def add(self, group: argparse.ArgumentParser | argparse._ArgumentGroup, *, help: str | None = None) -> None:
        kwargs = dict(self.kwargs) if help is None else {**self.kwargs, "help": help}
        group.add_argument(*self.flags, **kwargs)


MODEL = Option(
    ("--model", "-m"),
    {
        "metavar": "NAME|PATH",
        "help": "registered model name, GGUF file or HF folder (default: last used, else the starter model)",
    },
)
CTX = Option(("--ctx",), {"type": int, "metavar": "N", "help": "context length in tokens"})
N_GPU_LAYERS = Option(
    ("--n-gpu-layers", "--ngl"),
    {"dest": "n_gpu_layers", "type": int, "metavar": "N", "help": "transformer layers to put on GPUs (-1 = all)"},
)
KV_CACHE_TYPE = Option(
    ("--kv-cache-type",),
    {"dest": "kv_cache_type", "choices": ("f16", "q8_0", "q4_0"), "help": "KV cache precision"},
)
THREADS = Option(
    ("--threads",),
    {
        "type": int,
        "metavar": "N",
        "help": "CPU threads, exactly (default: physical cores, and the torch engine then adapts its count to the "
        "load: fewer while other programs take cores)",
    },
)
TENSOR_PARALLEL = Option(
    ("--tensor-parallel", "--tp"),
    {
        "dest": "tensor_parallel",
        "type": int,
        "metavar": "N",
        "help": "torch engine: split every layer over N processes, one per GPU (NVLink/P2P-joined cards; "
        "without GPUs, N processes share the CPU cores); 1 = never; default: the plan decides",
    },
)
SPECULATIVE = Option(
    ("--speculative",),
    {
        "choices": ("off", "ngram", "draft", "auto"),
        "help": "torch engine speculative decoding: ngram = prompt lookup (guesses copied from the prompt and the "
        "reply so far; pays on summarise / quote / edit tasks), draft = a smaller model with the same vocabulary "
        "proposes (--draft-model), auto = the plan decides; lossless either way (default off)",
    },
)
DRAFT_MODEL = Option(
    ("--draft-model",),
    {
        "dest": "draft_model",
        "metavar": "NAME|PATH",
        "help": "the draft model for --speculative draft (or a candidate for auto): registered name or GGUF path",
    },
)
TTFT_TARGET = Option(
    ("--ttft-target-ms",),
    {
        "dest": "ttft_target_ms",
        "type": float,
        "metavar": "MS",
        "help": "torch engine: the time-to-first-token target each step is planned for: the best-ranked request "
        "waiting for its first token gets it within MS whenever its prompt alone fits, other work is held back "
        "as needed (default 500; 0 = no plan)",
    },
)
KEEP_ALIVE = Option(
    ("--keep-alive",),
    {
        "dest": "keep_alive",
        "metavar": "DURATION",
        "help": "leave the model loaded this long after the command ends (5m, 30s, 1h, or seconds; default 5m; 0: "
        "unload at exit; -1: until `hearth stop`), so the next run or chat with the same model and plan starts at "
        "once; `hearth ps` lists what stays loaded",
    },
)
MAX_PPL_INCREASE = Option(
    ("--max-ppl-increase",),
    {
        "dest": "max_ppl_increase",
        "type": float,
        "metavar": "PCT",
        "help": "the plan's quality budget: of the engines and formats within PCT %% of the best format's "
        "perplexity (measured with `hearth ppl --compare`, else documented figures), the fastest (default 1.0; "
        "0 = the best format only; settings key max_ppl_increase)",
    },
)
HARDWARE = Option(
    ("--hardware",),
    {
        "metavar": "FILE",
        "help": "plan for the machine described by this HardwareReport JSON (from `hearth probe --json`)",
    },
)


def add_model_arguments(p: argparse.ArgumentParser, *, backend: bool = True, remote: bool = False) -> None:
    """`remote`: the command also takes --backend remote (run, chat, bench), with --url and --remote-model."""
    choices = BACKEND_CHOICES if remote else ("auto", *LOCAL_BACKENDS)
    g = p.add_argument_group("model and placement (the plan decides what you leave out)")
    MODEL.add(g)
    if backend:
        g.add_argument(
            "--backend",
            "-b",
            metavar="B",
            choices=choices,
            help=f"{', '.join(choices)} (default auto: the plan chooses)",
        )
    CTX.add(g)
    N_GPU_LAYERS.add(g)
    KV_CACHE_TYPE.add(g)
    MAX_PPL_INCREASE.add(g)
    THREADS.add(g)
    TENSOR_PARALLEL.add(g)
    SPECULATIVE.add(g)
    DRAFT_MODEL.add(g)
    TTFT_TARGET.add(g)
    HARDWARE.add(g)
    if remote:
        r = p.add_argument_group("remote model (--backend remote: any OpenAI-compatible server)")
        r.add_argument("--url", metavar="URL", help="the server's base URL, e.g. http://gpu-box:8000 (or .../v1)")
        r.add_argument(
            "--remote-model",
            dest="remote_model",
            metavar="NAME",
            help="the model to ask the server for (default: the first it lists at /v1/models); the key "
            "comes from HEARTH_REMOTE_API_KEY or [remote] api_key in settings.toml",
        )


def add_sampling_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group(
        "sampling",
        "a value not given here or in settings.toml is the model's own default (`hearth show NAME` lists them and "
        "where they come from), else hearth's default below",
    )
    g.add_argument("--temperature", "-t", type=float, metavar="T", help=f"0 = greedy (default {S.temperature})")
    g.add_argument("--top-p", dest="top_p", type=float, metavar="P", help=f"nucleus sampling (default {S.top_p})")
    g.add_argument("--top-k", dest="top_k", type=int, metavar="K", help=f"0 = off (default {S.top_k})")
    g.add_argument("--min-p", dest="min_p", type=float, metavar="P", help=f"0 = off (default {S.min_p})")
    g.add_argument(
        "--repeat-penalty",
        dest="repeat_penalty",
        type=float,
        metavar="R",
        help=f"1 = off (default {S.repeat_penalty:g})",
    )
    g.add_argument("--seed", type=int, metavar="S", help="same seed, same reply")
    g.add_argument(
        "--priority",
        type=int,
        metavar="P",
        help="scheduling priority of this request, lower runs first (default -1: ahead of the API's 0, e.g. a "
        "`hearth serve` sharing the engine's runner)",
    )
    g.add_argument(
        "--max-tokens",
        "-n",
        dest="max_tokens",
        type=int,
        metavar="N",
        help=f"most tokens to generate (default {REPLY_MAX_TOKENS})",
    )


def settings_from_args(args: argparse.Namespace) -> Any:
    """Settings merged from file < env < the flags present on args."""
    # lazy: keeps `hearth --help` light (+platformdirs, 2 hearth modules)
    from app.settings import Settings, load_settings

    names = Settings.__dataclass_fields__.keys()
    flags = {k: getattr(args, k) for k in names if hasattr(args, k)}
    return load_settings(**flags)
