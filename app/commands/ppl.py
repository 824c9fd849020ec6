"""`hearth ppl`: perplexity of a model on a text file, optionally compared with another quant or backend."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from app.commands.common import add_model_arguments, settings_from_args
from app.defaults import LOCAL_BACKENDS
from backends.errors import InvalidRequestError

NAME = "ppl"
HELP = "perplexity of a model on a text file (and ΔPPL / KL against another quant or backend)"
ORDER = 61
DESCRIPTION = """Perplexity of a model on a text file: windows of --ctx tokens every --stride tokens.

  hearth ppl wiki.txt                          starter model, ctx 512, stride 512
  hearth ppl wiki.txt --compare my-q4          ΔPPL and mean KL divergence against another quant
  hearth ppl wiki.txt --backend llama.cpp --compare-backend torch"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", metavar="FILE", help="UTF-8 text file")
    p.add_argument("--stride", type=int, metavar="S", help="window step in tokens (default: --ctx)")
    p.add_argument("--json", action="store_true", help="print a JSON object instead of text")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--compare", metavar="MODEL2", help="compare with another model (e.g. another quant)")
    g.add_argument(
        "--compare-backend",
        dest="compare_backend",
        metavar="B2",
        choices=LOCAL_BACKENDS,
        help="compare with the same model on another backend",
    )
    add_model_arguments(p)


def run(args: argparse.Namespace) -> int:
    # lazy: keeps `hearth --help` light (+base64, concurrent, hashlib, 26 hearth modules)
    from app.loading import open_backend
    from app.perplexity import perplexity  # lazy: keeps `hearth --help` light (+1 hearth modules)
    from hwprobe.quality import delta_ppl_warning  # lazy: keeps `hearth --help` light (+1 hearth modules)

    args.ctx = args.ctx or 512
    stride = args.stride or args.ctx
    try:
        with open(args.file, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise InvalidRequestError(f"cannot read {args.file}: {e}", "give a UTF-8 text file") from e
    settings = settings_from_args(args)
    base = open_backend(settings, hardware_file=args.hardware, logits_all=True, command="ppl")
    other = None
    try:
        token_ids = base.backend.tokenize(text, add_special=True, parse_special=False)
        if args.compare or args.compare_backend:
            s2 = dataclasses.replace(
                settings, model=args.compare or settings.model, backend=args.compare_backend or settings.backend
            )
            other = open_backend(s2, hardware_file=args.hardware, logits_all=True, command="ppl")
        tty = sys.stderr.isatty()

        def progress(done: int, total: int) -> None:
            end = "\n" if done == total or not tty else ""
            if tty or done == total:
                sys.stderr.write(f"\r  scoring windows {done}/{total}{end}")
                sys.stderr.flush()

        res, res2 = perplexity(
            base.backend,
            token_ids,
            args.ctx,
            stride,
            other.backend if other else None,
            progress=None if args.json else progress,
        )
    finally:
        base.backend.close()
        if other:
            other.backend.close()
    label = f"{base.entry.name} ({base.backend.name})"
    out: dict = {
        "model": base.entry.name,
        "backend": base.backend.name,
        "perplexity": res.perplexity,
        "tokens_scored": res.tokens_scored,
        "ctx": res.ctx,
        "stride": res.stride,
    }
    warning = None
    if res2 is not None and other is not None:
        warning = delta_ppl_warning(res.perplexity, res2.perplexity)
        out["compare"] = {
            "model": other.entry.name,
            "backend": other.backend.name,
            "perplexity": res2.perplexity,
            "delta_ppl": res2.perplexity - res.perplexity,
            "kl_mean": res.kl_mean,
            "warning": warning,
        }
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(
            f"{label}: perplexity {res.perplexity:.4f} over {res.tokens_scored} tokens "
            f"(ctx {res.ctx}, stride {res.stride})"
        )
        if res2 is not None and other is not None:
            print(
                f"{other.entry.name} ({other.backend.name}): perplexity {res2.perplexity:.4f}  "
                f"ΔPPL {res2.perplexity - res.perplexity:+.4f}  mean KL {res.kl_mean:.6f} nats"
            )
    if warning:
        print(f"warning: {warning}", file=sys.stderr)
    return 0
