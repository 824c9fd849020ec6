"""The engine's kernel self-check (backends/torch_engine/kernel_check.py) with faults injected into Triton's
kernel set: the model still answers (logits of the plain-torch path), the broken kernels are replaced and the
others kept, the record says so and a second load reads it instead of checking again.  CPU under
TRITON_INTERPRET=1 (the GPU run compiles for real)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from backends.api import LoadOptions
from backends.modelspec import load_spec
from backends.torch_engine.model_runner import ModelRunner
from tests.gguf_factory import write_tiny_llama
from tests.kernels.conftest import device, skip_triton_on_cpu_without_interpreter
from tests.kernels.test_selfcheck import faulty_triton

pytest.importorskip("triton")
IDS = [5, 17, 200, 3, 99, 42, 7, 300, 12, 64, 81, 150]


@pytest.fixture(scope="module")
def spec(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    path = write_tiny_llama(tmp_path_factory.mktemp("kc") / "tiny.gguf", tokenizer="spm", chat_template=None)
    return load_spec(path)


def _runner(spec, record: Path | None, kernels: str | None = "triton") -> ModelRunner:  # type: ignore[no-untyped-def]
    skip_triton_on_cpu_without_interpreter(device())
    options = LoadOptions(
        n_ctx=64,
        max_num_seqs=2,
        dtype="float32",
        device=device(),
        n_gpu_layers=-1,
        kernel_check_record=str(record) if record else None,
    )
    return ModelRunner(spec, options, kernels)


def test_faulty_kernels_are_replaced_the_model_answers_and_the_record_remembers(
    spec, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import kernels.dispatch as dispatch
    from kernels import selfcheck

    monkeypatch.setattr(selfcheck, "BUDGET_S", 600.0)  # every kernel checked at the first load, even compiling
    real = dispatch._triton
    monkeypatch.setitem(dispatch._BUILDERS, "triton", lambda: faulty_triton(real()))
    record = tmp_path / "kernel_checks.json"
    runner = _runner(spec, record)
    check = runner.kernel_check
    assert check is not None and check.from_record == 0
    assert {v.name for v in check.replaced} >= {"rms_norm", "rope"}  # raised / wrong (speed: see below)
    assert "add_rms_norm" not in runner.ops.replaced and "paged_attention" not in runner.ops.replaced
    torch_path = _runner(spec, None, "torch")
    want = torch_path.prompt_logits(IDS)
    torch.testing.assert_close(runner.prompt_logits(IDS), want, atol=1e-4, rtol=1e-4)
    info = runner.describe()
    assert "rms_norm" in info["kernels_replaced"] and "rope" in info["kernels_replaced"]
    assert any("rms_norm replaced by the torch op: failed" in r for r in info["kernel_check_reasons"])
    saved = json.loads(record.read_text())
    (entry,) = saved.values()
    assert entry["kernels"]["rms_norm"]["verdict"] == "failed" and entry["kernels"]["rope"]["verdict"] == "wrong"
    assert entry["kernels"]["add_rms_norm"]["verdict"] == "ok" and entry["last_check_s"] > 0
    # the second load on this key checks nothing and makes the same swaps
    again = _runner(spec, record)
    assert again.kernel_check.checked_s == 0 and again.kernel_check.from_record == len(check.verdicts)
    assert set(again.ops.replaced) == set(runner.ops.replaced)
    torch.testing.assert_close(again.prompt_logits(IDS), want, atol=1e-4, rtol=1e-4)


def test_a_check_that_breaks_leaves_the_engine_running_and_says_why(
    spec, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import backends.torch_engine.model_runner as model_runner

    def broken(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise ValueError("injected: the check itself failed")

    monkeypatch.setattr(model_runner, "check_model", broken)  # the name ModelRunner calls
    runner = _runner(spec, tmp_path / "k.json")
    assert runner.kernel_check is None and runner.ops.replaced == ()
    assert runner.describe()["kernel_check"] == "could not run (ValueError: injected: the check itself failed)"
    assert runner.prompt_logits(IDS[:4]).shape[0] == 4


def test_no_record_no_check(spec) -> None:  # type: ignore[no-untyped-def]
    runner = _runner(spec, None)
    assert runner.kernel_check is None and "kernel_check" not in runner.describe()


@pytest.mark.parametrize("broken", [False, True])
def test_the_first_graph_step_is_checked_against_the_eager_one(spec, tmp_path: Path, broken: bool) -> None:  # type: ignore[no-untyped-def]
    """Issue 25, item 2: the first decode step through the graph path is compared with the eager step; a
    mismatch turns graphs off (recorded for the key) and the step's logits are the eager ones.  On CPU the
    graph path is DecodeGraphs' static buffers (the step a CUDA graph captures, run eagerly)."""
    from tests.engine.test_cuda_graphs import _static, _Steps

    record = tmp_path / "k.json"
    runner = _runner(spec, record)
    if device() == "cpu":
        graphs = runner.decode_graphs = _static(runner)
        runner._graphs_decided = True
    else:  # the runner's own CUDA graphs (captured at their first step)
        graphs = runner._decode_graphs()
        assert graphs is not None, runner.cuda_graphs_off
    if broken:
        real = graphs.run
        graphs.run = lambda rows: real(rows) + 1.0  # type: ignore[method-assign]
    eager = _runner(spec, None)
    eager._graphs_decided, eager.cuda_graphs_off = True, "off (test: the eager twin)"
    drive = _Steps([5, 9], spec.vocab_size, eager.num_blocks)
    out = drive.prefill()
    first = [r.execute(out) for r in (eager, runner)]
    drive.take(first[0].logits)
    step = drive.decode()
    want, got = eager.execute(step), runner.execute(step)
    torch.testing.assert_close(got.logits, want.logits, atol=1e-4, rtol=1e-4)
    assert runner.graph_check["verdict"] == ("mismatch" if broken else "ok")
    saved = next(iter(json.loads(record.read_text()).values()))["cuda_graphs"]
    assert saved["verdict"] == runner.graph_check["verdict"]
    if broken:
        assert runner.decode_graphs is None and "differed from the eager one" in runner.cuda_graphs_off
        assert runner.describe()["cuda_graphs"].startswith("off (the first captured decode step differed")
        # the next load on this key leaves graphs off from the start
        later = _runner(spec, record)
        assert later.kernel_check.graphs["verdict"] == "mismatch"
        assert "differed from the eager one" in later._graphs_vetoed()
    else:
        assert runner.decode_graphs is graphs and got.extra.get("cuda_graph")


def test_doctor_checks_every_format_and_prints_the_recorded_table(
    spec, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:  # type: ignore[no-untyped-def]
    """`hearth doctor --kernels`' check (every weight format the device runs, recorded) and the table `hearth
    doctor` prints from the record, both from a runner process of their own (backends/runner/oneshot.py)."""
    from app.commands import doctor
    from app.loading import kernel_check_record
    from backends.runner.oneshot import kernel_report

    skip_triton_on_cpu_without_interpreter(device())
    monkeypatch.setenv("HEARTH_HOME", str(tmp_path))
    assert doctor._kernel_section(spec, check_now=False) == 0 and capsys.readouterr().out == ""  # no record yet
    report = kernel_report(spec, "torch", kernel_check_record(), check_now=True, log_dir=tmp_path)
    assert report.checked and report.reasons[0].startswith("kernel self-check on ")
    (table,) = report.tables
    names = " ".join(table.lines)
    for name in ("rms_norm", "paged_attention.decode", "write_kv", "quant_matmul.int8", "quant_matmul.int4"):
        assert name in names
    # correct everywhere; speed verdicts are the device's (a GPU shared with 7 other test workers may time a
    # microsecond kernel slow)
    verdicts = {line.split()[0]: line for line in table.lines[1:] if not line.startswith(("last ", "cuda graphs"))}
    assert all(" wrong" not in line and " failed" not in line for line in verdicts.values())
    assert all("slow -> torch" in verdicts[name] for name in report.replaced)
    assert doctor._kernel_section(spec, check_now=False) == 0  # the record, read again by a fresh runner
    out = capsys.readouterr().out
    assert "kernel self-check: " in out and "max error" in out and "verdict" in out
    assert "quant_matmul.int4" in out and "last check took" in out
