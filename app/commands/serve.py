"""`hearth serve`: an OpenAI-compatible HTTP API for one local model."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.commands.common import add_model_arguments, settings_from_args
from app.commands.models import size_on_disk
from backends.errors import ConfigError, HearthError

if TYPE_CHECKING:
    from fastapi import FastAPI

    from app.loaded import Loaded
    from app.server.app import ServerConfig
    from app.settings import Settings
    from backends.api import Backend

NAME = "serve"
HELP = "serve a model over an OpenAI-compatible HTTP API"
ORDER = 30
DESCRIPTION = """Serve one model over the OpenAI API (/v1/chat/completions, /v1/completions, /v1/models),
plus /health and /metrics (Prometheus).

  hearth serve                                 the default model on http://127.0.0.1:8000/v1
  hearth serve --api-key KEY --host 0.0.0.0    reachable from the network, Bearer KEY required

Safe by default: binds 127.0.0.1; with --api-key (or HEARTH_API_KEY) every path but /health needs
'Authorization: Bearer KEY'.  Limits: request body 1 MiB, at most 4096 messages per chat request, JSON
nested at most 64 deep; the model's chat template renders within 2 s, 512 MiB and 8M characters (else 400);
max_tokens <= context; --max-concurrency requests run at once (default 16; a backend without batching, e.g.
llama.cpp, runs one at a time and the rest queue); at most --queue-limit (default 64) wait, beyond that 429
with Retry-After.  SIGINT/SIGTERM: stop accepting, give running requests --shutdown-grace seconds (default
10), abort the rest, exit 0.  Sampling: logprobs/top_logprobs (chat), logprobs/echo (completions), n <= 16,
presence/frequency penalty, logit_bias, and top_k/min_p/repeat_penalty/ignore_eos; any other field is a 400
naming it (README: "Sampling fields").  priority (vLLM's: -100..100, lower runs first, default 0; `hearth run` and
the chat app send -1): the torch engine admits and preempts by it, llama.cpp's queue is ordered by it;
--ttft-target-ms plans the torch engine's steps for a first token within it (README: "Priorities").

Ollama's API on the same server, for clients built for Ollama (Open WebUI, Continue, LangChain's ChatOllama,
the ollama Python package): /api/chat, /api/generate, /api/embed, /api/embeddings, /api/tags, /api/show,
/api/ps, /api/version, /api/pull.  --ollama-port 11434 listens on Ollama's port too, where those clients look
without settings (README "Use it from other tools").  --keep-alive 5m unloads the model after 5 idle minutes
(its runner ends, so its memory goes back) and loads it at the next request, as Ollama's keep_alive does;
a request's own keep_alive wins.  Embeddings: /v1/embeddings (OpenAI) and /api/embed.

Tool calling: tools (at most 128), tool_choice and tool messages, in the model's own template format
(Hermes/Qwen, Llama 3.x, Mistral) or, for a template without tool support, hearth's Hermes-style block in the
system message; tool_choice "required" or a named function forces one call valid for the function's schema
(constrained decoding).  README "Tool calling" has the formats.


Planned for serving: concurrent clients are expected, so with --backend auto the plan prefers the engine that
batches them, the torch engine, wherever it runs the model (GPU, streaming blocks from RAM, or the CPU),
over llama.cpp's one request at a time; the start-up lines say why, with the planner's numbers (see them
before starting with `hearth plan --serve`).  --single-user (or --max-concurrency 1) plans for the fastest
single stream instead; --backend still wins."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", metavar="ADDR", help="bind address (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, metavar="N", help="port (default 8000)")
    p.add_argument(
        "--ollama-port",
        dest="ollama_port",
        type=int,
        metavar="N",
        help="also listen on port N (11434 is Ollama's: Ollama clients find hearth there without settings)",
    )
    p.add_argument(
        "--keep-alive",
        dest="keep_alive",
        metavar="DURATION",
        help="unload the model after it has been idle this long (5m, 30s, 1h, or seconds; 0 at once; default: "
        "never); the next request loads it again.  Ollama's keep_alive in a request wins for that request",
    )
    p.add_argument("--api-key", dest="api_key", metavar="KEY", help="require 'Authorization: Bearer KEY'")
    _add_limit_arguments(p)
    p.add_argument(
        "--max-loaded-models",
        dest="max_loaded_models",
        type=int,
        metavar="N",
        help="models kept loaded at once; a request naming another local model loads it, unloading the least "
        "recently used idle one first (default: as many as fit in memory, as Ollama's OLLAMA_MAX_LOADED_MODELS)",
    )
    p.add_argument(
        "--log-level",
        dest="log_level",
        choices=("debug", "info", "warning", "error"),
        default="warning",
        help="what the server logs on stderr (default warning: errors with their ids; debug also names the fields "
        "and options of Ollama requests that were ignored)",
    )
    add_model_arguments(p)


def _add_limit_arguments(p: argparse.ArgumentParser) -> None:
    """The server's limits: concurrency, queue, body size, shutdown grace."""
    p.add_argument(
        "--max-concurrency",
        dest="max_concurrency",
        type=int,
        metavar="N",
        help="requests generating at once (default 16)",
    )
    p.add_argument(
        "--single-user",
        dest="single_user",
        action="store_true",
        help="one client at a time: plan for the fastest single stream, not for batching (implies --max-concurrency 1)",
    )
    p.add_argument(
        "--queue-limit",
        dest="queue_limit",
        type=int,
        default=64,
        metavar="N",
        help="requests waiting for a slot before 429 (default 64)",
    )
    p.add_argument(
        "--max-body-bytes",
        dest="max_body_bytes",
        type=int,
        default=1 << 20,
        metavar="N",
        help="largest request body (default 1 MiB)",
    )
    p.add_argument(
        "--shutdown-grace",
        dest="shutdown_grace",
        type=float,
        default=10.0,
        metavar="S",
        help="seconds running requests get to finish on shutdown (default 10)",
    )


def run(args: argparse.Namespace) -> int:
    # lazy: keeps `hearth --help` light (+base64, concurrent, hashlib, 26 hearth modules)
    from app.loading import hardware_report, open_backend
    from app.model_opener import ServeOpener  # lazy: heavy: fastapi, pydantic, starlette
    from app.server.app import create_app  # lazy: heavy: fastapi, pydantic, starlette

    keep_alive_s = _check_arguments(args)
    settings = _serving_settings(args)
    # the machine as the server starts: every model it loads is planned for it, less what the loaded ones hold
    # (app/server/pool.py)
    report = hardware_report(args.hardware)
    # serving: the plan prefers the engine that batches (with max_concurrency 1 it says "single user")
    loaded = open_backend(settings, hardware_file=args.hardware, serving=True, command="serve", report=report)
    backend = loaded.backend
    app = None
    try:
        err = sys.stderr
        _log_server_errors(err, getattr(args, "log_level", "warning"))
        why = _print_plan(loaded, err)
        config = _server_config(args, settings, loaded.entry.name, keep_alive_s)
        # model switching: any other local model a request names loads on demand (app/server/pool.py)
        config.opener, config.report = ServeOpener(settings, args.hardware), report
        config.first_plan, config.max_loaded_models = loaded.decision.plan, args.max_loaded_models
        app = create_app(backend, config)
        _announce(app, backend, config, settings, args.ollama_port, why, err)
        _serve(app, settings, args)
        app.state.pool.abort_all()  # past the grace period: abort what still runs
        return 0
    finally:
        if app is not None:
            app.state.pool.close()  # every model it loaded, the first one included
        backend.close()


def _check_arguments(args: argparse.Namespace) -> float | None:
    """Refuse bad serving flags with a ConfigError naming them; --single-user sets --max-concurrency 1.  Returns
    --keep-alive in seconds (None: never unload)."""
    keep_alive_s = None
    if args.keep_alive is not None:
        from app.server.ollama_schemas import keep_alive_seconds  # lazy: heavy: pydantic

        try:
            keep_alive_s = keep_alive_seconds(args.keep_alive)
        except ValueError as exc:
            raise ConfigError(f"--keep-alive: {exc}") from None
    if args.ollama_port is not None and not 1 <= args.ollama_port <= 65535:
        raise ConfigError(f"--ollama-port must be a port from 1 to 65535, got {args.ollama_port}")
    if args.max_loaded_models is not None and args.max_loaded_models < 1:
        raise ConfigError(f"--max-loaded-models must be at least 1, got {args.max_loaded_models}")
    if args.queue_limit < 0 or args.max_body_bytes < 1 or args.shutdown_grace < 0:
        raise ConfigError("--queue-limit must be >= 0, --max-body-bytes >= 1 and --shutdown-grace >= 0")
    if args.single_user:
        if args.max_concurrency not in (None, 1):
            raise ConfigError(
                f"--single-user runs one request at a time, but --max-concurrency is {args.max_concurrency}",
                "give one of the two",
            )
        args.max_concurrency = 1
    return keep_alive_s


def _serving_settings(args: argparse.Namespace) -> Settings:
    """The merged settings (file < env < flags); a ConfigError when they name the remote backend."""
    settings = settings_from_args(args)
    if settings.backend == "remote":  # from settings.toml or HEARTH_BACKEND: a proxy would only add a hop
        raise ConfigError(
            f"hearth serve runs a local model, and the settings say backend = remote ({settings.url})",
            "point your clients at that server directly, or pass --backend auto",
        )
    return settings


def _print_plan(loaded: Loaded, err: Any) -> list[str]:
    """Print the plan's reasons and the loaded backend on `err`; returns the reasons that say why this engine
    serves (printed later, under the serving line)."""
    why = [r for r in loaded.decision.reasons if r.startswith(("serving", "single user"))]
    for reason in loaded.decision.reasons:
        if reason not in why:
            print(f"plan: {reason}", file=err)
    print("loaded: " + ", ".join(f"{k}={v}" for k, v in loaded.backend.describe().items()), file=err)
    return why


def _server_config(
    args: argparse.Namespace, settings: Settings, model_name: str, keep_alive_s: float | None
) -> ServerConfig:
    """The app's ServerConfig: the served name, auth, the request limits, the store's catalog and keep-alive."""
    from app.server.app import ServerConfig  # lazy: heavy: fastapi, pydantic, starlette

    # lazy: keeps `hearth --help` light (+asyncio, prometheus_client, 5 hearth modules)
    from app.server.runner import Limits

    limits = Limits(
        max_concurrency=settings.max_concurrency,
        queue_limit=args.queue_limit,
        max_body_bytes=args.max_body_bytes,
        shutdown_grace_s=args.shutdown_grace,
    )
    return ServerConfig(
        model_name=model_name,
        api_key=settings.api_key or None,
        limits=limits,
        catalog=_store_catalog,
        keep_alive_s=keep_alive_s,
    )


def _announce(
    app: FastAPI,
    backend: Backend,
    config: ServerConfig,
    settings: Settings,
    ollama_port: int | None,
    why: list[str],
    err: Any,
) -> None:
    """The start-up lines on `err`: where it serves and how, Ollama's port, and the planner's reasons."""
    slots = app.state.runner.slots
    mode = (
        f"{backend.name}, up to {slots} requests batched"
        if slots > 1
        else f"{backend.name}, one request at a time (others queue)"
    )
    print(
        f"serving {config.model_name!r} on http://{settings.host}:{settings.port}/v1 "
        f"({mode}; auth {'on' if config.api_key else 'off'})",
        file=err,
    )
    if ollama_port is not None:
        print(f"  Ollama's API: http://{settings.host}:{ollama_port}/api (and on port {settings.port})", file=err)
    if config.opener is not None:
        most = config.max_loaded_models
        print(
            f"  other registered models load on demand ({f'at most {most} loaded' if most else 'as many as fit'})",
            file=err,
        )
    for reason in why:  # the planner's reason for this engine, with its numbers
        print(f"  why: {reason}", file=err)
    err.flush()


def _serve(app: FastAPI, settings: Settings, args: argparse.Namespace) -> None:
    """Run uvicorn until SIGINT/SIGTERM and its graceful shutdown (--shutdown-grace seconds, at least 1)."""
    import uvicorn  # lazy: heavy: uvicorn

    uv_config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=getattr(args, "log_level", "warning"),
        timeout_graceful_shutdown=max(int(args.shutdown_grace), 1),
    )
    server = _graceful_server(uv_config)
    server.run(sockets=_sockets(uv_config, settings.host, args.ollama_port))


def _graceful_server(config: Any) -> Any:
    """A uvicorn.Server whose shutdown by a signal ends with exit 0."""
    import uvicorn  # lazy: heavy: uvicorn

    class _GracefulServer(uvicorn.Server):
        """uvicorn re-raises a captured SIGTERM/SIGINT after its graceful shutdown, so the process would die by
        the signal (exit -15); here a signal is the ordinary way to stop, so shutdown ends with exit 0."""

        def handle_exit(self, sig: int, frame: object) -> None:
            super().handle_exit(sig, frame)  # type: ignore[arg-type]
            captured = getattr(self, "_captured_signals", None)
            if isinstance(captured, list):
                captured.clear()

    return _GracefulServer(config)


def _log_server_errors(err: Any, level: str = "warning") -> None:
    """The server's own log (app/server/errors.py: an unexpected error's id and traceback; at debug, the ignored
    fields of Ollama requests) on stderr, with the time, beside uvicorn's; `level`: --log-level."""
    import logging  # lazy: keeps `hearth --help` light (logging is only needed once serving)

    log = logging.getLogger("hearth.server")
    log.setLevel(level.upper())
    if not log.handlers:
        handler = logging.StreamHandler(err)
        handler.setFormatter(logging.Formatter("%(asctime)s hearth serve %(levelname)s: %(message)s"))
        log.addHandler(handler)


def _sockets(config: Any, host: str, ollama_port: int | None) -> list:
    """The listening sockets: hearth's port, and --ollama-port beside it (one app, one event loop)."""
    import uvicorn  # lazy: heavy: uvicorn

    configs = [config]
    if ollama_port is not None and ollama_port != config.port:
        configs.append(uvicorn.Config(config.app, host=host, port=ollama_port))
    out = []
    for c in configs:
        try:
            out.append(c.bind_socket())  # type: ignore[attr-defined]
        except (OSError, SystemExit) as exc:  # uvicorn logs and exits when the address is taken
            for s in out:
                s.close()
            port = getattr(c, "port", "?")
            raise ConfigError(
                f"cannot listen on {host}:{port}: {exc if isinstance(exc, OSError) else 'the address is in use'}",
                "pick another port (is Ollama itself running on 11434?)",
            ) from None
    return out


def _store_catalog() -> list:
    """Every registered model whose header reads, for Ollama's /api/tags and /api/show."""
    # lazy: keeps `hearth --help` light (+hashlib, mmap, struct, 10 hearth modules)
    from app.server.ollama_models import CatalogEntry
    from app.store import ModelStore  # lazy: keeps `hearth --help` light (+base64, hashlib, mmap, 10 hearth modules)

    store = ModelStore()
    out = []
    for entry in store.entries():
        try:
            spec = store.spec_for_path(Path(entry.path))
            modified = Path(entry.path).stat().st_mtime
        except (HearthError, OSError):  # a file gone or refused: `hearth models` warns about it
            continue
        out.append(CatalogEntry(entry.name, spec, size_on_disk(entry, spec), modified))
    return out
