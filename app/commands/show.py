"""`hearth show NAME`: a model's metadata and how it would run on this machine."""

from __future__ import annotations

import argparse
import json

from app.commands.common import HARDWARE
from app.commands.models import human_bytes, human_count, model_row
from hwprobe import plan
from hwprobe.errors import PlanError

NAME = "show"
HELP = "show a model's metadata, where it came from, and its plan on this machine"
ORDER = 33


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", nargs="?", metavar="NAME", help="registered name or path (default: the last used model)")
    HARDWARE.add(p)
    p.add_argument("--json", action="store_true", help="print JSON")


def run(args: argparse.Namespace) -> int:
    # lazy: keeps `hearth --help` light (+base64, concurrent, hashlib, 26 hearth modules)
    from app.loading import hardware_report
    from app.model_sampling import model_defaults  # lazy: keeps `hearth --help` light (+1 hearth module)
    from app.store import ModelStore  # lazy: keeps `hearth --help` light (+base64, hashlib, mmap, 10 hearth modules)
    from hwprobe.render import plan_text  # lazy: keeps `hearth --help` light (+1 hearth modules)

    entry, spec = ModelStore().spec(args.name)
    row = model_row(entry, spec)
    recommended = model_defaults(spec, entry.name)  # the user's own for it over the model's
    row["sampling_defaults"] = {"values": recommended.values(), "source": recommended.source or None}
    try:
        p = plan(hardware_report(args.hardware), spec.to_shape())
        plan_out, plan_err = p, None
    except PlanError as exc:
        plan_out, plan_err = None, exc.one_line()
    if args.json:
        print(json.dumps({**row, "plan": plan_out.as_dict() if plan_out else None, "plan_error": plan_err}, indent=2))
        return 0
    lines = [
        ("name", row["name"]),
        ("path", row["path"]),
        ("source", row["source"] + (f" {row['repo']}@{(row['revision'] or '')[:12]}" if row["repo"] else "")),
        ("size on disk", human_bytes(row["size_on_disk"])),
        ("format", row["format"]),
        ("kind", row["kind"] + (f" ({row['pooling']} pooling; not for chat)" if row["kind"] == "embedding" else "")),
        ("architecture", row["architecture"]),
        ("parameters", human_count(row["parameters"])),
        ("quant", row["quant"]),
        ("context", str(row["context_length"])),
        ("backends", ", ".join(row["backends"]) or "none installed can run it"),
        ("sampling", recommended.describe()),
    ]
    width = max(len(k) for k, _ in lines)
    for k, v in lines:
        print(f"{k:<{width}}  {v}")
    print()
    print(plan_text(plan_out, row["name"]) if plan_out else f"plan: {plan_err}")
    return 0
