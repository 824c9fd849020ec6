"""scripts/spec_replay.py and scripts/profile_speculative.py keep working (issue 26's policy and profile tools).

The replay needs no model: hand-made replies, one that copies its prompt (prompt lookup proposes every token
right, so the modelled speed-up is well above 1) and one that never repeats anything (no proposal at all: exactly
plain decoding's cost).  The replay itself checks that the engine reproduced each recorded reply."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _replay(tmp_path: Path, replies: list[dict]) -> dict[str, str]:
    path = tmp_path / "replies.json"
    path.write_text(json.dumps(replies))
    p = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "spec_replay.py"), "--replay", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    return {line.split(":")[0].strip(): line for line in p.stdout.splitlines()}


def test_replay_prices_a_copying_reply_above_plain_decoding_and_a_fresh_one_at_it(tmp_path: Path) -> None:
    prompt = list(range(100, 180))
    copying = {"task": "grounded", "greedy": False, "prompt": prompt, "reply": prompt[10:70]}
    fresh = {"task": "chat", "greedy": False, "prompt": prompt, "reply": list(range(300, 360))}
    lines = _replay(tmp_path, [copying, fresh])
    grounded, chat = lines["grounded t=0.7"], lines["chat     t=0.7"]
    speedup = float(re.search(r"modelled x([0-9.]+)", grounded).group(1))
    assert speedup > 2.0, grounded
    assert float(re.search(r"acceptance ([0-9.]+)", grounded).group(1)) > 0.9, grounded
    assert "modelled x1.00" in chat and "0 verifications" in chat, chat


@pytest.mark.slow
def test_profile_speculative_reports_every_phase(starter_path: Path) -> None:
    p = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "profile_speculative.py"), "--gen", "8", "--threads", "2"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, p.stderr
    for phase in ("schedule", "forward", "sample (plain rows)", "update (bookkeeping)", "expand (proposal + k)"):
        assert phase in p.stdout, p.stdout
    assert "== grounded / off" in p.stdout and "== grounded / ngram" in p.stdout
