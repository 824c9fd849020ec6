"""`hearth doctor`: check that the engines really run on this machine, each in a runner of its own."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time

from app.commands.common import MODEL
from backends.api import Request, SamplingParams
from backends.errors import HearthError

NAME = "doctor"
HELP = "check that each engine runs a model on this machine (a crash is a finding, not a crash of hearth)"
ORDER = 62
DESCRIPTION = """Load a model (default: the starter) on each engine in a runner process and generate a few
tokens, so a build that crashes on this CPU or GPU is found before a chat needs it:

  llama.cpp, extra buffer types on   the CPU repack / AMX weight paths (use_extra_bufts)
  llama.cpp, extra buffer types off
  torch engine

On a CPU with AMX hearth starts llama.cpp without extra buffer types, because some llama.cpp builds crash in
the AMX repack path (llama.cpp #20824); when the first check passes here, hearth remembers that this build is
safe on this machine and uses them from then on (a new llama-cpp-python build is checked again).

Kernels: the torch engine checks each Triton kernel a model calls the first time it loads on a GPU (GPU,
driver, torch, Triton and hearth versions are the key): against its torch reference (max error within the
tests' tolerance) and against the torch op that would replace it (time).  A kernel that fails to compile,
errs or is slower is replaced by that op on this device; the first CUDA-graph decode step is compared with
the eager one the same way.  `hearth doctor` prints the recorded table (kernel, max error, time vs the torch
op, verdict); `hearth doctor --kernels` checks every kernel now (on CPU under TRITON_INTERPRET=1, slow but
the same code) and records it.
Exit 0 when every check passed, 1 otherwise."""

TOKENS = 16


def add_arguments(p: argparse.ArgumentParser) -> None:
    MODEL.add(p, help="the model to check with (default: the starter)")
    p.add_argument(
        "--kernels",
        action="store_true",
        help="check the torch engine's Triton kernels now (GPU; else interpreted on CPU) and print the table",
    )


def _check(spec, backend: str, options) -> tuple[bool, str]:  # type: ignore[no-untyped-def]
    from app.paths import get_paths  # lazy: keeps `hearth --help` light (+platformdirs, 1 hearth modules)

    # lazy: keeps `hearth --help` light (+concurrent, hashlib, logging, 16 hearth modules)
    from backends.runner.client import RunnerBackend

    # No fallback and no memory: the check is of this configuration alone, so the ladder must not rescue it.
    runner = RunnerBackend(spec, options, backend=backend, log_dir=get_paths().log_dir / "runners")
    start = time.perf_counter()
    try:
        runner.load()
        result = runner.generate(
            Request(
                prompt="The capital of France is",
                sampling=SamplingParams(temperature=0, max_tokens=TOKENS, ignore_eos=True),
            )
        )
        if result.finish_reason.value == "error":
            return False, result.error or "the reply ended with an error"
        rate = result.stats.decode_tokens_per_s
        return True, f"{result.stats.completion_tokens} tokens, {rate:.1f} tok/s, {time.perf_counter() - start:.1f} s"
    except HearthError as exc:
        return False, exc.one_line()
    finally:
        runner.close()


def run(args: argparse.Namespace) -> int:
    # lazy: keeps `hearth --help` light (+base64, concurrent, hashlib, 26 hearth modules)
    from app.loading import EXTRA_BUFTS_CHECK, config_memory, decide, runs_model
    from app.settings import load_settings  # lazy: keeps `hearth --help` light (+platformdirs, 2 hearth modules)
    from app.store import ModelStore  # lazy: keeps `hearth --help` light (+base64, hashlib, mmap, 10 hearth modules)
    from hwprobe.cpu import cpu_identity, has_amx  # lazy: keeps `hearth --help` light (+1 hearth modules)

    settings = load_settings(model=args.model)
    _, spec = ModelStore().spec(settings.model)
    memory = config_memory()
    cpu, _ = cpu_identity()
    print(f"hearth doctor: {spec.name} on {cpu}{' (AMX)' if has_amx() else ''}")
    failed = 0
    checks = []
    if runs_model("llama.cpp", spec):
        options = decide(spec, settings.merged(backend="llama.cpp")).options
        checks += [
            ("llama.cpp", dataclasses.replace(options, extra_bufts=True), "llama.cpp, extra buffer types on"),
            ("llama.cpp", dataclasses.replace(options, extra_bufts=False), "llama.cpp, extra buffer types off"),
        ]
    if runs_model("torch", spec):
        checks.append(("torch", decide(spec, settings.merged(backend="torch")).options, "torch engine"))
    for backend, options, label in checks:
        ok, detail = _check(spec, backend, options)
        failed += not ok
        print(f"  {'ok  ' if ok else 'FAIL'} {label}: {detail}")
        if options.extra_bufts is True:
            memory.record_check(EXTRA_BUFTS_CHECK, ok, detail)
    failed += _kernel_section(spec, args.kernels)
    sys.stdout.flush()
    return 0 if failed == 0 else 1


def _kernel_section(spec, check_now: bool) -> int:  # type: ignore[no-untyped-def]
    """The torch engine's kernel self-check, from a runner of its own (torch and Triton never load in hearth's
    process): run now when `check_now` (`--kernels`), then the recorded table of every device.  1 when the check
    replaced some kernel (a finding), else 0."""
    # lazy: keeps `hearth --help` light (+base64, concurrent, hashlib, 26 hearth modules)
    from app.loading import kernel_check_record
    from app.paths import get_paths  # lazy: keeps `hearth --help` light (+platformdirs, 1 hearth modules)

    # lazy: keeps `hearth --help` light (+msgspec, socket, subprocess, 17 hearth modules)
    from backends.runner.oneshot import kernel_report

    record = kernel_check_record()
    if not check_now and not record.exists():
        return 0
    report = kernel_report(spec, "torch", record, check_now, log_dir=get_paths().log_dir / "runners")
    if report.checked:
        print(f"  {'ok  ' if not report.replaced else 'FAIL'} torch engine kernels: {report.reasons[0]}")
        for line in report.reasons[1:]:
            print(f"    {line.strip()}")
    for table in report.tables:
        key = table.key
        print(
            f"\nkernel self-check: {key.get('device')} (cc {key.get('cc')}, driver {key.get('driver')}, "
            f"torch {key.get('torch')}, triton {key.get('triton')}, hearth {key.get('hearth')}, {key.get('dtype')}"
            + (", interpreted" if key.get("interpreter") == "True" else "")
            + ")"
        )
        for line in table.lines:
            print(f"  {line}")
    return 1 if report.replaced else 0
