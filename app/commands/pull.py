"""`hearth pull REPO_ID`: download a model from the Hugging Face Hub, with the quant this machine should run."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from app.commands.models import human_bytes

NAME = "pull"
HELP = "download a model from the Hugging Face Hub (picks the quant for this machine)"
ORDER = 31
DESCRIPTION = """Download a GGUF (or safetensors) model from the Hugging Face Hub into hearth's store,
verify its size and sha256 against the hub, and register it.  Without --quant/--file the quant is chosen for
this machine: the hardware plan when the repo has a config.json, else the biggest file that fits the GPU (or
RAM) budget, never below Q4_K_M unless nothing else fits.  An interrupted pull resumes when run again.
Needs the network; everything already pulled works offline.  A file the hub lists without a sha256 (LFS) or
git blob id is refused, never registered unverified.

  hearth pull bartowski/Qwen2.5-7B-Instruct-GGUF
  hearth pull bartowski/Qwen2.5-7B-Instruct-GGUF --quant Q5_K_M
  hearth pull Qwen/Qwen2.5-0.5B-Instruct               (safetensors, for --backend torch)"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("repo_id", metavar="REPO_ID", help="owner/name on the Hugging Face Hub")
    p.add_argument("--quant", "-q", metavar="Q", help="the GGUF quant to fetch (Q4_K_M, Q8_0, IQ4_XS, F16, ...)")
    p.add_argument("--file", metavar="NAME", help="the exact GGUF file to fetch (first shard of a split one)")
    p.add_argument("--revision", metavar="R", help="branch, tag or commit (default: main)")
    p.add_argument(
        "--include",
        metavar="PATTERN",
        action="append",
        help="only files matching this glob (repeatable); for safetensors repos, extra files to fetch",
    )
    p.add_argument("--name", metavar="NAME", help="register under this name (default: repo name:quant)")


class _Bar:
    """A one-line progress bar on stderr (only when it is a terminal, else a line per file)."""

    def __init__(self) -> None:
        self.tty = sys.stderr.isatty()
        self.current: str | None = None
        self.last = 0.0
        self.start = time.monotonic()

    def __call__(self, p: object) -> None:
        name, done, total = p.filename, p.done, p.total  # type: ignore[attr-defined]
        if name != self.current:
            if self.current is not None and self.tty:
                sys.stderr.write("\n")
            self.current, self.start = name, time.monotonic()
            if not self.tty:
                print(f"fetching {name} ({human_bytes(total)}) [{p.index}/{p.count}]", file=sys.stderr)  # type: ignore[attr-defined]
        now = time.monotonic()
        if not self.tty or (now - self.last < 0.1 and done < total):
            return
        self.last = now
        frac = done / total if total else 1.0
        rate = done / max(now - self.start, 1e-3)
        bar = "#" * int(frac * 30)
        sys.stderr.write(
            f"\r[{p.index}/{p.count}] {name[-40:]} [{bar:<30}] {frac * 100:5.1f}% "  # type: ignore[attr-defined]
            f"{human_bytes(done)}/{human_bytes(total)} {human_bytes(int(rate))}/s "
        )
        sys.stderr.flush()

    def close(self) -> None:
        if self.current is not None and self.tty:
            sys.stderr.write("\n")


def run(args: argparse.Namespace) -> int:
    from app.hub import pull  # lazy: keeps `hearth --help` light (+base64, concurrent, hashlib, 30 hearth modules)

    bar = _Bar()
    try:
        entry = pull(
            args.repo_id,
            quant=args.quant,
            file=args.file,
            revision=args.revision,
            include=args.include,
            name=args.name,
            progress=bar,
            on_choice=lambda why: print(f"choosing {why}"),
        )
    except KeyboardInterrupt:
        bar.close()
        bar.current = None  # the finally below must not end the line twice
        print(
            "hearth: pull interrupted; the partial file is kept and the same command resumes it "
            "(nothing was registered)",
            file=sys.stderr,
        )
        return 130
    finally:
        bar.close()

    size = sum(Path(f).stat().st_size for f in entry.files if Path(f).is_file())
    print(
        f"pulled {entry.name}: {args.repo_id}@{(entry.revision or '')[:12]}, {human_bytes(size)} "
        f"({entry.path})\nrun it: hearth run -m {entry.name}"
    )
    return 0
