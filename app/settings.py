"""Settings: one frozen record merged at the edge from the settings file < environment < command-line flags.

The file is TOML at `Paths.settings_file` (HEARTH_HOME/config/settings.toml when HEARTH_HOME is set), e.g.::

    model = "smollm2-135m-instruct"
    backend = "auto"
    temperature = 0.7
    ctx = 8192
    [server]
    port = 8000

Unknown keys and wrong types are a ConfigError naming the key, never silently dropped.  Environment variables:
HEARTH_MODEL, HEARTH_BACKEND, HEARTH_CTX, HEARTH_THREADS, HEARTH_TEMPERATURE, HEARTH_SEED, HEARTH_HOST,
HEARTH_PORT, HEARTH_API_KEY, HEARTH_SPECULATIVE, HEARTH_DRAFT_MODEL,
HEARTH_REMOTE_URL, HEARTH_REMOTE_MODEL, HEARTH_REMOTE_API_KEY.  Flags win over both
HEARTH_PORT, HEARTH_API_KEY, HEARTH_REMOTE_URL, HEARTH_REMOTE_MODEL, HEARTH_REMOTE_API_KEY, HEARTH_TTFT_TARGET_MS,
HEARTH_KEEP_ALIVE.  Flags win over both
(the CLI passes only the flags the user actually gave).
"""

from __future__ import annotations

import math
import os
import stat
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from app.defaults import APP_PRIORITY, BACKEND_CHOICES, REPLY_MAX_TOKENS, SYSTEM_PROMPT, TTFT_TARGET_MS
from app.durations import duration_seconds
from app.paths import get_paths
from backends.api import PRIORITY_MAX, PRIORITY_MIN, SEED_MAX, SEED_MIN
from hwprobe.errors import ConfigError
from hwprobe.quality import DEFAULT_MAX_PPL_INCREASE_PCT

KEEP_ALIVE = "5m"  # Ollama's default keep_alive


def keep_alive_seconds(settings: Settings) -> float | None:
    """Settings.keep_alive in seconds (None: until ended; 0: none)."""
    return duration_seconds(settings.keep_alive if settings.keep_alive is not None else KEEP_ALIVE)


@dataclass(frozen=True)
class Settings:
    model: str | None = None  # registered name or path; None = the last used, else the starter model
    backend: str = "auto"  # one of BACKEND_CHOICES (app.defaults)
    ctx: int | None = None  # context tokens; None = the plan decides
    threads: int | None = None  # CPU threads; None = physical cores
    n_gpu_layers: int | None = None  # None = the plan decides; -1 = all
    kv_cache_type: str | None = None  # None = the plan decides; f16 | q8_0 | q4_0
    # the plan's quality budget (--max-ppl-increase): of the formats within this many % of the model's best
    # format's perplexity, the plan takes the fastest; 0 = the best format only (hwprobe/race.py)
    max_ppl_increase: float = DEFAULT_MAX_PPL_INCREASE_PCT
    tensor_parallel: int | None = None  # torch engine ranks; None = the plan decides, 1 = none (--tensor-parallel)
    # torch engine speculative decoding (--speculative): off | ngram (prompt lookup) | draft (--draft-model) | auto
    # (the plan decides).  Off by default, as in llama.cpp and vLLM: it changes no reply's distribution, but a
    # greedy reply may differ at a bf16 near-tie, and a user turns it on knowing that
    speculative: str = "off"
    draft_model: str | None = None  # registered name or GGUF path of the draft (--draft-model)
    # sampling: None = not set by the user: the model's own defaults (app/model_sampling.py), else hearth's
    # (app.defaults.SAMPLING)
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repeat_penalty: float | None = None
    max_tokens: int = REPLY_MAX_TOKENS
    seed: int | None = None
    system_prompt: str = SYSTEM_PROMPT  # "" sends no system message (app.defaults says why this one)
    host: str = "127.0.0.1"  # API server bind address
    port: int = 8000
    api_key: str | None = None
    max_concurrency: int = 16
    # --backend remote: the OpenAI-compatible server's base URL, the model to ask it for (None = the first it
    # lists), and its key (HEARTH_REMOTE_API_KEY or [remote] api_key in settings.toml; never a flag: ps shows flags)
    url: str | None = None
    remote_model: str | None = None
    remote_api_key: str | None = None
    # structured replies (hearth run --json / --json-schema FILE, the TUI's F3 panel): None = text, "object" = any
    # JSON object, else a JSON Schema file's path (app/structured.py)
    json_output: str | None = None
    # quality of service: the priority of `hearth run`'s and the chat app's own requests (lower runs first; the
    # API's default is 0), and the torch engine's time-to-first-token target in ms (0 = no plan)
    priority: int = APP_PRIORITY
    ttft_target_ms: float = TTFT_TARGET_MS
    # how long `hearth run` and the chat app leave their runner loaded after they end, so the next one with the
    # same model and plan starts at once (backends/runner/resident.py): a duration ("5m", "30s", seconds; 0: none;
    # negative: until `hearth stop`); None = KEEP_ALIVE.  `hearth serve --keep-alive` is the server's own (idle
    # unload while it runs)
    keep_alive: str | None = None

    def merged(self, **overrides: Any) -> Settings:
        """A copy with the given values (None values are ignored: 'flag not given')."""
        given = {k: v for k, v in overrides.items() if v is not None}
        unknown = set(given) - {f.name for f in fields(self)}
        if unknown:
            raise ConfigError(f"unknown setting(s): {', '.join(sorted(unknown))}")
        return _validated(replace(self, **given))


_ENV = {
    "HEARTH_MODEL": ("model", str),
    "HEARTH_BACKEND": ("backend", str),
    "HEARTH_CTX": ("ctx", int),
    "HEARTH_THREADS": ("threads", int),
    "HEARTH_TEMPERATURE": ("temperature", float),
    "HEARTH_SEED": ("seed", int),
    "HEARTH_HOST": ("host", str),
    "HEARTH_PORT": ("port", int),
    "HEARTH_API_KEY": ("api_key", str),
    "HEARTH_SPECULATIVE": ("speculative", str),
    "HEARTH_DRAFT_MODEL": ("draft_model", str),
    "HEARTH_REMOTE_URL": ("url", str),
    "HEARTH_REMOTE_MODEL": ("remote_model", str),
    "HEARTH_REMOTE_API_KEY": ("remote_api_key", str),
    "HEARTH_TTFT_TARGET_MS": ("ttft_target_ms", float),
    "HEARTH_KEEP_ALIVE": ("keep_alive", str),
    "HEARTH_MAX_PPL_INCREASE": ("max_ppl_increase", float),
}

# TOML sections flatten into the fields above: [server] port -> port, [sampling] temperature -> temperature,
# [remote] url / model / api_key -> url / remote_model / remote_api_key.
_SECTIONS = {
    "server": ("host", "port", "api_key", "max_concurrency"),
    "sampling": ("temperature", "top_p", "top_k", "min_p", "repeat_penalty", "max_tokens", "seed"),
    "remote": ("url", "model", "api_key"),
}
_RENAMED = {("remote", "model"): "remote_model", ("remote", "api_key"): "remote_api_key"}


def _types() -> dict[str, Any]:
    return {f.name: f.type for f in fields(Settings)}


def _check_type(key: str, value: Any, source: str) -> Any:
    if key == "keep_alive" and isinstance(value, (int, float)) and not isinstance(value, bool):
        value = str(value)  # keep_alive = 300 (seconds) as well as "5m"
    want = _types()[key]
    ok = {
        "str | None": isinstance(value, str),
        "str": isinstance(value, str),
        "int | None": isinstance(value, int) and not isinstance(value, bool),
        "int": isinstance(value, int) and not isinstance(value, bool),
        "float": isinstance(value, (int, float)) and not isinstance(value, bool),
        "float | None": isinstance(value, (int, float)) and not isinstance(value, bool),
    }.get(str(want), True)
    if not ok:
        raise ConfigError(f"{source}: {key} must be {str(want).replace(' | None', '')}, got {value!r}")
    return float(value) if str(want) in ("float", "float | None") else value


MAX_CTX = 1 << 24  # the longest context any model file may claim (backends.model_limits)
MAX_THREADS = 1024
MAX_TENSOR_PARALLEL = 64
MAX_GPU_LAYERS = 2**31 - 1  # llama.cpp's n_gpu_layers is a C int; 999 is the usual "all"


def _validated(s: Settings) -> Settings:
    """Every value a flag, the environment or settings.toml can set, checked here once, so a bad one is a
    ConfigError naming it (exit 2) before any model is read, never a C overflow or a hang later."""
    for check in (_check_placement, _check_sampling, _check_plan, _check_serving):
        check(s)
    return s


def _check_placement(s: Settings) -> None:
    """The backend and where the model runs: context, CPU threads, GPU layers."""
    if s.backend not in BACKEND_CHOICES:
        raise ConfigError(f"backend must be one of {', '.join(BACKEND_CHOICES)}, got {s.backend!r}")
    if s.ctx is not None and s.ctx < 16:
        raise ConfigError(f"ctx must be at least 16 tokens, got {s.ctx}")
    if s.ctx is not None and s.ctx > MAX_CTX:
        raise ConfigError(f"ctx must be at most {MAX_CTX:,} tokens (the longest any model trains for), got {s.ctx:,}")
    if s.threads is not None and not 1 <= s.threads <= MAX_THREADS:
        raise ConfigError(
            f"threads must be between 1 and {MAX_THREADS}, got {s.threads}", "leave it out to use one per physical core"
        )
    if s.n_gpu_layers is not None and not -1 <= s.n_gpu_layers <= MAX_GPU_LAYERS:
        raise ConfigError(
            f"n_gpu_layers must be -1 (all layers) or a count >= 0, got {s.n_gpu_layers}",
            "--n-gpu-layers 0 keeps the model on the CPU; leave it out to let the plan decide",
        )


def _check_sampling(s: Settings) -> None:
    """The sampling settings and the seed."""
    for name, low, high in (
        ("temperature", 0.0, math.inf),
        ("top_p", 0.0, 1.0),
        ("min_p", 0.0, 1.0),
        ("repeat_penalty", 0.0, math.inf),
    ):
        value = getattr(s, name)
        if value is None:
            continue
        if not (math.isfinite(value) and low <= value <= high) or (name in ("top_p", "repeat_penalty") and value == 0):
            rule = {
                "temperature": ">= 0 and finite",
                "top_p": "in (0, 1]",
                "min_p": "in [0, 1]",
                "repeat_penalty": "> 0 and finite",
            }[name]
            raise ConfigError(f"{name} must be {rule}, got {value}")
    if s.top_k is not None and s.top_k < 0:
        raise ConfigError(f"top_k must be >= 0 (0 = off), got {s.top_k}")
    if s.seed is not None and not SEED_MIN <= s.seed <= SEED_MAX:  # the API's rule: any 64-bit integer
        raise ConfigError(f"seed must be a 64-bit integer ({SEED_MIN} .. {SEED_MAX}), got {s.seed}")


def _check_plan(s: Settings) -> None:
    """What the plan may choose: KV cache type, quality budget, tensor parallelism, speculative decoding."""
    if s.kv_cache_type not in (None, "f16", "q8_0", "q4_0"):
        raise ConfigError(f"kv_cache_type must be f16, q8_0 or q4_0, got {s.kv_cache_type!r}")
    if not (math.isfinite(s.max_ppl_increase) and 0 <= s.max_ppl_increase <= 100):
        raise ConfigError(
            f"max_ppl_increase must be a percentage from 0 to 100, got {s.max_ppl_increase}",
            f"the default {DEFAULT_MAX_PPL_INCREASE_PCT:g} keeps formats within 1 % of the best one's perplexity; "
            "0 = the best format only",
        )
    if s.tensor_parallel is not None and not 1 <= s.tensor_parallel <= MAX_TENSOR_PARALLEL:
        raise ConfigError(
            f"tensor_parallel must be between 1 and {MAX_TENSOR_PARALLEL} ranks, got {s.tensor_parallel}",
            "one rank per GPU; leave it out to let the plan decide",
        )
    if s.speculative not in ("off", "ngram", "draft", "auto"):
        raise ConfigError(f"speculative must be off, ngram, draft or auto, got {s.speculative!r}")
    if s.speculative == "draft" and not s.draft_model:
        raise ConfigError("--speculative draft needs a draft model", "add --draft-model NAME|PATH")


def _check_serving(s: Settings) -> None:
    """Serving and requests: port, reply length, priority, TTFT target, keep_alive, concurrency, remote URL."""
    if not 0 < s.port < 65536:
        raise ConfigError(f"port must be 1-65535, got {s.port}")
    if not 1 <= s.max_tokens <= MAX_CTX:
        raise ConfigError(f"max_tokens must be between 1 and {MAX_CTX:,}, got {s.max_tokens}")
    if not PRIORITY_MIN <= s.priority <= PRIORITY_MAX:
        raise ConfigError(
            f"priority must be from {PRIORITY_MIN} to {PRIORITY_MAX} (lower runs first), got {s.priority}",
            f"the default {APP_PRIORITY} ranks hearth run and the chat app ahead of API requests (0)",
        )
    if not (math.isfinite(s.ttft_target_ms) and 0 <= s.ttft_target_ms <= 3_600_000):
        raise ConfigError(
            f"ttft_target_ms must be from 0 (no plan) to 3600000, got {s.ttft_target_ms}",
            f"the default is {TTFT_TARGET_MS:g} ms",
        )
    if s.keep_alive is not None:
        try:
            duration_seconds(s.keep_alive)
        except ValueError as exc:
            hint = "0 unloads the model when the command ends; -1 keeps it until `hearth stop`"
            raise ConfigError(str(exc), hint) from None
    if s.max_concurrency < 1:
        raise ConfigError(f"max_concurrency must be >= 1, got {s.max_concurrency}")
    if s.url is not None:
        parts = urlsplit(s.url)
        if parts.scheme not in ("http", "https") or not parts.hostname or any(c.isspace() for c in s.url):
            raise ConfigError(
                f"url must be an http:// or https:// URL with a host, got {s.url!r}",
                "e.g. --url http://gpu-box:8000 (the OpenAI-compatible server's base)",
            )


MAX_SETTINGS_BYTES = 1 << 20


def _settings_text(path: Path) -> str | None:
    """The file's text; None when there is no file.  A directory, FIFO or unreadable file is a ConfigError
    (a FIFO would block a plain read forever)."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ConfigError(f"the settings file {path} cannot be read: {exc.strerror}", "fix or delete it") from None
    if not stat.S_ISREG(st.st_mode):
        kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file"
        raise ConfigError(f"the settings file {path} is {kind}, not a TOML file", "remove it or make it a file")
    if st.st_size > MAX_SETTINGS_BYTES:
        raise ConfigError(
            f"the settings file {path} is {st.st_size:,} bytes; hearth reads at most {MAX_SETTINGS_BYTES:,}",
            "fix or delete the file",
        )
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"the settings file {path} is not UTF-8 text", "fix or delete the file") from None
    except OSError as exc:
        raise ConfigError(f"the settings file {path} cannot be read: {exc.strerror}", "fix or delete it") from None


def read_settings_file(path: Path) -> dict[str, Any]:
    text = _settings_text(path)
    if text is None:
        return {}
    try:
        import tomllib  # lazy: optional dependency (ImportError handled)
    except ModuleNotFoundError:  # Python 3.10
        # lazy: optional dependency (ImportError handled)
        import tomli as tomllib  # type: ignore[no-redef]
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}", "fix or delete the file") from None
    flat: dict[str, Any] = {}
    names = set(_types())
    for key, value in data.items():
        if key in _SECTIONS and isinstance(value, dict):
            for sub, v in value.items():
                if sub not in _SECTIONS[key]:
                    raise ConfigError(
                        f"{path}: unknown setting [{key}] {sub}", f"known in [{key}]: {', '.join(_SECTIONS[key])}"
                    )
                name = _RENAMED.get((key, sub), sub)
                flat[name] = _check_type(name, v, str(path))
        elif key in names:
            flat[key] = _check_type(key, value, str(path))
        else:
            raise ConfigError(f"{path}: unknown setting {key!r}", f"known settings: {', '.join(sorted(names))}")
    return flat


def load_settings(settings_file: Path | None = None, env: dict[str, str] | None = None, **flags: Any) -> Settings:
    """file < env < flags.  `flags` holds only values the user gave (None = not given)."""
    path = settings_file or get_paths().settings_file
    values = read_settings_file(path)
    env = os.environ if env is None else env
    for var, (key, cast) in _ENV.items():
        raw = env.get(var)
        if raw not in (None, ""):
            try:
                values[key] = cast(raw)
            except ValueError:
                raise ConfigError(f"environment variable {var}={raw!r} is not a valid {cast.__name__}") from None
    base = _validated(Settings(**values))
    return base.merged(**flags)
