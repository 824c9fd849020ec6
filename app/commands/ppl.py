"""`hearth ppl`: perplexity of a model on a text file, optionally compared with another quant or backend."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from functools import partial
from pathlib import Path

from app.commands.common import add_model_arguments, settings_from_args
from app.defaults import LOCAL_BACKENDS
from backends.errors import InvalidRequestError

SHIPPED_TEXT = Path(__file__).resolve().parent.parent / "data" / "english.txt"  # ~1,900 tokens of plain prose
NAME = "ppl"
HELP = "perplexity of a model on a text file (and ΔPPL / KL against another quant or backend)"
ORDER = 61
DESCRIPTION = """Perplexity of a model on a text file: windows of --ctx tokens every --stride tokens.

  hearth ppl wiki.txt                          starter model, ctx 512, stride 512
  hearth ppl wiki.txt --compare my-q4          ΔPPL and mean KL divergence against another quant
  hearth ppl wiki.txt --backend llama.cpp --compare-backend torch
  hearth ppl --compare-formats -m MODEL        every format the planner may offer for MODEL (W8A16, W4A16+attn8,
                                               W4A16, FP8 on a GPU) against its best, on text shipped with hearth
                                               (or FILE), each recorded for the plan's --max-ppl-increase budget"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", metavar="FILE", nargs="?", help="UTF-8 text file (--compare-formats: optional)")
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
    g.add_argument(
        "--compare-formats",
        dest="compare_formats",
        action="store_true",
        help="measure every format the planner may offer for the model (quantized while loading by the torch "
        "engine) against its best format, and record each for the plan's quality budget",
    )
    add_model_arguments(p)


def run(args: argparse.Namespace) -> int:
    # lazy: keeps `hearth --help` light (+base64, concurrent, hashlib, 26 hearth modules)
    from app.loading import open_backend

    args.ctx = args.ctx or 512
    stride = args.stride or args.ctx
    if args.compare_formats:
        return _compare_formats(args, stride)
    if args.file is None:
        raise InvalidRequestError("hearth ppl needs a text FILE", "give a UTF-8 text file, or use --compare-formats")
    text = _read_text(args.file)
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
        res, res2 = _score(base, other, token_ids, args.ctx, stride, quiet=args.json)
    finally:
        base.backend.close()
        if other:
            other.backend.close()
    out, warning, recorded = _summary(base, other, res, res2, args.file)
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        _print_text(base, other, res, res2, recorded)
    if warning:
        print(f"warning: {warning}", file=sys.stderr)
    return 0


def _compare_formats(args: argparse.Namespace, stride: int) -> int:
    """--compare-formats (app/ppl_formats.py), on FILE or the English text shipped with hearth."""
    from app.ppl_formats import compare_formats, format_report  # lazy: keeps `hearth --help` light

    path = args.file or str(SHIPPED_TEXT)
    text = _read_text(path)
    progress = None if args.json else partial(_progress, sys.stderr.isatty())
    report = compare_formats(
        settings_from_args(args),
        lambda backend: backend.tokenize(text, add_special=True, parse_special=False),
        args.ctx,
        stride,
        path if args.file else "hearth's English sample",
        hardware_file=args.hardware,
        progress=progress,
    )
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    return 0


def _read_text(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise InvalidRequestError(f"cannot read {path}: {e}", "give a UTF-8 text file") from e


def _score(base, other, token_ids: list[int], ctx: int, stride: int, *, quiet: bool):
    """perplexity() of the base (and the compared run), with progress on stderr unless `quiet` (--json)."""
    from app.perplexity import perplexity  # lazy: keeps `hearth --help` light (+1 hearth modules)

    progress = partial(_progress, sys.stderr.isatty())
    return perplexity(
        base.backend, token_ids, ctx, stride, other.backend if other else None, progress=None if quiet else progress
    )


def _progress(tty: bool, done: int, total: int) -> None:
    """The windows scored so far: a counter on a terminal, only the last line otherwise."""
    end = "\n" if done == total or not tty else ""
    if tty or done == total:
        sys.stderr.write(f"\r  scoring windows {done}/{total}{end}")
        sys.stderr.flush()


def _summary(base, other, res, res2, file: str) -> tuple[dict, str | None, dict | None]:
    """(the --json object, the ΔPPL warning, the planner's quality record) of a run and its comparison."""
    from hwprobe.quality import delta_ppl_warning  # lazy: keeps `hearth --help` light (+1 hearth modules)

    out: dict = {
        "model": base.entry.name,
        "backend": base.backend.name,
        "perplexity": res.perplexity,
        "tokens_scored": res.tokens_scored,
        "ctx": res.ctx,
        "stride": res.stride,
    }
    warning = None
    recorded = None
    if res2 is not None and other is not None:
        warning = delta_ppl_warning(res.perplexity, res2.perplexity)
        recorded = _record(base, other, res.perplexity, res2.perplexity, res.kl_mean, file, res.tokens_scored)
        out["compare"] = {
            "model": other.entry.name,
            "backend": other.backend.name,
            "perplexity": res2.perplexity,
            "delta_ppl": res2.perplexity - res.perplexity,
            "kl_mean": res.kl_mean,
            "warning": warning,
            "recorded": recorded,
        }
    return out, warning, recorded


def _print_text(base, other, res, res2, recorded: dict | None) -> None:
    print(
        f"{base.entry.name} ({base.backend.name}): perplexity {res.perplexity:.4f} over {res.tokens_scored} tokens "
        f"(ctx {res.ctx}, stride {res.stride})"
    )
    if res2 is not None and other is not None:
        print(
            f"{other.entry.name} ({other.backend.name}): perplexity {res2.perplexity:.4f}  "
            f"ΔPPL {res2.perplexity - res.perplexity:+.4f}  mean KL {res.kl_mean:.6f} nats"
        )
    if recorded is not None:
        also = f", and as {recorded['checkpoint']}'s own format (its plan reads it)" if "checkpoint" in recorded else ""
        print(
            f"recorded for the planner: {recorded['model']} as {recorded['format']} "
            f"{recorded['ppl_increase_pct']:+.3f} % perplexity (its --max-ppl-increase budget reads it){also}"
        )


def _record(base, other, ppl: float, ppl2: float, kl: float | None, file: str, tokens: int) -> dict | None:
    """Keep the compared format's perplexity increase for the planner (app/measurements.py), when the base ran
    the model at its best (its own weights: the plan's chosen candidate costs nothing) and the other run is
    planned (not a remote model): the record is `base`'s model, in `other`'s format.  When `other` is a GPTQ /
    AWQ folder (its format a checkpoint label), the same figure is kept under its own name too: that folder is
    a model of its own, whose plan reads its records, not the 16-bit original's ("checkpoint" in the result)."""
    from app.measurements import record_quality  # lazy: keeps `hearth --help` light
    from hwprobe.quality import checkpoint_quality  # lazy: keeps `hearth --help` light (+1 hearth modules)

    plan, plan2 = base.decision.plan, other.decision.plan
    if plan is None or plan2 is None or not ppl > 0:
        return None
    if any(c.chosen and c.ppl_increase_pct > 0 for c in plan.candidates):
        return None  # the base is itself a lossy format: a difference against it is no loss against the best
    pct = 100 * (ppl2 - ppl) / ppl
    source = f"hearth ppl --compare on {file} ({tokens} tokens), against {plan.quant} on {base.backend.name}"
    record_quality(base.spec.name, plan2.quant, pct, kl, source)
    out = {"model": base.spec.name, "format": plan2.quant, "ppl_increase_pct": round(pct, 3), "source": source}
    if checkpoint_quality(plan2.quant) is not None and other.spec.name != base.spec.name:
        record_quality(other.spec.name, plan2.quant, pct, kl, source)
        out["checkpoint"] = other.spec.name
    return out
