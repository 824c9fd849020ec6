"""Options several commands take are defined once (app/commands/common.py), so their flags, types and choices
cannot drift apart between commands (as --tensor-parallel, --ctx and --model once did)."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.cli import build_parser
from app.commands import common

COMMANDS = Path(common.__file__).parent
SHARED = {
    "--model": common.MODEL,
    "--ctx": common.CTX,
    "--n-gpu-layers": common.N_GPU_LAYERS,
    "--kv-cache-type": common.KV_CACHE_TYPE,
    "--threads": common.THREADS,
    "--tensor-parallel": common.TENSOR_PARALLEL,
    "--hardware": common.HARDWARE,
    "--speculative": common.SPECULATIVE,
    "--draft-model": common.DRAFT_MODEL,
}


@pytest.mark.parametrize("flag", sorted(SHARED))
def test_a_shared_option_is_declared_only_in_common(flag: str) -> None:
    files = [p for p in sorted(COMMANDS.glob("*.py")) if p.name != "common.py"]
    offenders = [p.name for p in files if f'"{flag}"' in p.read_text()]
    assert not offenders, f"{flag} declared again in {offenders}: add it with common's Option"


def test_every_command_taking_a_shared_option_takes_it_the_same_way() -> None:
    parser, _ = build_parser()
    subparsers = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    seen = 0
    for name, sub in subparsers.choices.items():
        for action in sub._actions:
            for flag, option in SHARED.items():
                if flag in action.option_strings:
                    seen += 1
                    assert tuple(action.option_strings) == option.flags, (name, flag)
                    for key in ("type", "choices", "metavar"):
                        if key in option.kwargs:
                            assert getattr(action, key) == option.kwargs[key], (name, flag, key)
    assert seen >= 10  # run, chat, serve, bench, ppl, plan, doctor, ... take them
