"""hearth bench: a tiny workload on the starter model for each installed backend; its JSON has every figure."""

import json

import pytest

from app.bench import FIGURES, add_ratios, percentile, synthetic_prompts
from backends.registry import get_backend_info


def _installed():
    out = []
    for name in ("llama.cpp", "torch"):
        try:
            if get_backend_info(name).is_installed():
                out.append(name)
        except Exception:  # noqa: BLE001 - a missing backend is simply not benchmarked
            pass
    return out


def test_synthetic_prompts_are_deterministic_exact_length_and_avoid_specials():
    a = synthetic_prompts(100, {0, 1, 2}, 3, 16, seed=7)
    assert a == synthetic_prompts(100, {0, 1, 2}, 3, 16, seed=7)
    assert a != synthetic_prompts(100, {0, 1, 2}, 3, 16, seed=8)
    assert all(len(p) == 16 and not {0, 1, 2} & set(p) for p in a)


def test_percentile_and_ratios():
    assert percentile([1.0, 2.0, 3.0, 4.0, 5.0], 50) == 3.0
    assert percentile([1.0, 2.0], 95) == pytest.approx(1.95)
    rows = [
        {"backend": "a", "concurrency": 1, "load_s": 2.0},
        {"backend": "b", "concurrency": 1, "load_s": 5.0},
        {"backend": "b", "concurrency": 2, "error": "x"},
    ]
    add_ratios(rows)
    assert rows[1]["ratio_load_s"] == 2.5 and rows[2]["ratio_load_s"] is None


@pytest.mark.slow
def test_bench_json_has_every_figure_for_each_installed_backend(capsys):
    from app.cli import main

    backends = _installed()
    assert "llama.cpp" in backends
    assert (
        main(
            [
                "bench",
                "--backends",
                ",".join([*backends, "nope"]),
                "--concurrency",
                "1,2",
                "--prompt-tokens",
                "16",
                "--gen-tokens",
                "8",
                "--requests",
                "2",
                "--json",
            ]
        )
        == 0
    )
    data = json.loads(capsys.readouterr().out)
    results = data["results"]
    # the torch engine's worker imports torch and the CLI too, so its peak holds the baseline (llama.cpp's not)
    torch_rows = [r["peak_rss_mib"] for r in results if r["backend"] == "torch" and "peak_rss_mib" in r]
    assert 50 < data["runtime_baseline_mib"] < min(torch_rows, default=float("inf"))
    good = [r for r in results if r["backend"] != "nope"]
    assert [(r["backend"], r["concurrency"]) for r in good] == [(b, c) for b in backends for c in (1, 2)]
    for r in good:
        assert "error" not in r, r
        for f in FIGURES:
            assert f in r
            if f != "peak_gpu_mib":
                assert r[f] > 0, (f, r)
        assert r["gen_tokens"] == 8
    bad = [r for r in results if r["backend"] == "nope"]
    assert len(bad) == 2 and all(r["error"] for r in bad)


@pytest.fixture
def fake_loaded(monkeypatch):
    """The bench worker's open_backend returns a loaded FakeBackend (three-token replies)."""
    import app.bench
    import app.bench_qos
    from tests.fakes import FakeBackend, fake_spec

    backend = FakeBackend(replies=["a b c"])
    backend.load()

    from app.loaded import Decision
    from backends.api import LoadOptions

    class Loaded:
        spec = fake_spec()
        decision = Decision("torch", LoadOptions())  # no plan: nothing for the decode records

    Loaded.backend = backend
    for module in (app.bench, app.bench_qos):  # where bench looks the loader up
        monkeypatch.setattr(module, "open_backend", lambda *a, **k: Loaded)
    return backend


def test_each_concurrency_level_gets_fresh_prompts(fake_loaded, capsys):
    """A prefix-caching backend must not see the previous level's prompts again (it would skip their prefill)."""
    from app.bench import Workload, worker

    backend = fake_loaded
    worker(Workload(model=None, backend="torch", concurrency=[1, 2], prompt_tokens=8, gen_tokens=3, requests=3))
    prompts = [r.prompt_token_ids for r in backend.requests]
    assert len(prompts) == 6 and all(len(p) == 8 for p in prompts)
    assert set(prompts[:3]).isdisjoint(prompts[3:])
    assert '"concurrency": 2' in capsys.readouterr().out


def test_http_rows_go_through_the_server_with_token_id_prompts(fake_loaded, capsys):
    import json

    from app.bench import Workload, worker

    backend = fake_loaded
    worker(
        Workload(
            model=None,
            backend="torch",
            concurrency=[2],
            prompt_tokens=8,
            gen_tokens=3,
            requests=2,
            extra={"http": True},
        )
    )
    results = [json.loads(line)["result"] for line in capsys.readouterr().out.splitlines() if '"result"' in line]
    assert [r["backend"] for r in results] == ["torch", "torch+http"], results
    http = results[1]
    assert "error" not in http, http
    assert http["aggregate_tokens_per_s"] > 0 and http["http_vs_in_process"] > 0
    sent = [r.prompt_token_ids for r in backend.requests[2:]]  # the server passed the ids through as they are
    assert len(sent) == 2 and all(len(p) == 8 for p in sent)
    assert all(r.sampling.ignore_eos and r.sampling.max_tokens == 3 for r in backend.requests[2:])


def test_runtime_baseline_is_a_fresh_process_importing_torch_and_the_cli():
    """The baseline is its own process's peak: more than an interpreter that imports nothing, and it names what
    it measured in the table's line."""
    import subprocess
    import sys

    from app.commands.bench import format_baseline, runtime_baseline_mib

    code = "from app.memory_check import peak_rss_bytes; print(peak_rss_bytes())"
    bare = int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    baseline = runtime_baseline_mib()
    assert baseline is not None and baseline * 2**20 > bare + 50 * 2**20  # torch's libraries are in it
    assert format_baseline(baseline).startswith(f"runtime baseline: {baseline:.0f} MiB peak RSS of")
    assert "import torch, app.cli" in format_baseline(baseline)


def test_chat_rows_send_one_user_message_through_the_template_and_the_chat_endpoint(fake_loaded, capsys):
    import json

    from app.bench import Workload, worker

    backend = fake_loaded
    worker(
        Workload(
            model=None,
            backend="torch",
            concurrency=[2],
            prompt_tokens=8,
            gen_tokens=3,
            requests=2,
            extra={"http": True, "chat": True},
        )
    )
    results = [json.loads(line)["result"] for line in capsys.readouterr().out.splitlines() if '"result"' in line]
    assert [r["backend"] for r in results] == ["torch", "torch+http"], results
    assert all("error" not in r and r["aggregate_tokens_per_s"] > 0 for r in results), results
    assert len(backend.requests) == 4
    for r in backend.requests:  # both paths: the chat template's prompt text with 8 common words, not token ids
        assert r.prompt_token_ids is None and r.messages and len(r.messages[-1].content.split()) == 8
        assert r.sampling.ignore_eos and r.sampling.max_tokens == 3


def test_busy_processes_each_take_a_core_while_the_block_runs_and_are_gone_after():
    import time

    import psutil

    from app.bench import busy_processes

    with busy_processes(2) as procs:
        assert len(procs) == 2
        ps = [psutil.Process(p.pid) for p in procs]
        start = [p.cpu_times().user for p in ps]
        time.sleep(1.0)
        # each spins: CPU time grows (a loaded machine still gives each a good share of a second)
        assert all(p.cpu_times().user - s > 0.1 for p, s in zip(ps, start))
    assert all(p.poll() is not None for p in procs)
    with busy_processes(0) as procs:
        assert procs == []


def test_busy_cores_is_passed_on_reported_and_checked(monkeypatch, capsys):
    import os

    import app.bench
    from app.cli import main
    from app.commands.bench import format_busy

    seen = {}

    def fake_run_bench(workload, backends, progress=None):
        seen["busy"] = workload.busy_cores
        return [
            {"backend": "llama.cpp", "concurrency": 1, "decode_tokens_per_s": 9.0, "cpu_threads": 1},
            {"backend": "torch", "concurrency": 1, "decode_tokens_per_s": 9.0, "cpu_threads": 1},
            {"backend": "torch", "concurrency": 16, "decode_tokens_per_s": 9.0, "cpu_threads": 2},
        ]

    monkeypatch.setattr(app.bench, "run_bench", fake_run_bench)
    monkeypatch.setattr("app.commands.bench.runtime_baseline_mib", lambda: 100.0)
    assert main(["bench", "--backends", "torch", "--concurrency", "1", "--busy-cores", "1"]) == 0
    out = capsys.readouterr().out
    assert seen["busy"] == 1
    assert "busy CPU: 1 other process kept a core busy" in out
    assert "CPU threads at the end of the runs: llama.cpp 1, torch 1/2" in out
    assert main(["bench", "--backends", "torch", "--busy-cores", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["workload"]["busy_cores"] == 1
    too_many = (os.cpu_count() or 1) + 1
    assert main(["bench", "--busy-cores", str(too_many)]) == 2
    assert f"--busy-cores {too_many}: this machine has" in capsys.readouterr().err
    assert main(["bench", "--busy-cores", "-1"]) == 2
    assert format_busy(2, []) == "busy CPU: 2 other processes kept 2 cores busy (a spinning loop each) during every run"


def test_priorities_reach_the_backend_and_ttft_is_reported_per_priority(fake_loaded, capsys):
    import json

    from app.bench import Workload, worker
    from app.commands.bench import format_priorities

    backend = fake_loaded
    extra = {"http": True, "priorities": [0, -1], "ttft_target_ms": 250.0}
    worker(
        Workload(model=None, backend="torch", concurrency=[2], prompt_tokens=8, gen_tokens=3, requests=4, extra=extra)
    )
    results = [json.loads(line)["result"] for line in capsys.readouterr().out.splitlines() if '"result"' in line]
    sent = [r.priority for r in backend.requests]  # in process, then through the server (two threads: any order)
    assert sorted(sent[:4]) == sorted(sent[4:]) == [-1, -1, 0, 0]
    for r in results:
        assert r["ttft_target_ms"] == 250.0 and 0 <= r["ttft_met_pct"] <= 100
        assert set(r["ttft_by_priority"]) == {"0", "-1"}
        assert all(g["requests"] == 2 and g["p95_ms"] >= g["p50_ms"] for g in r["ttft_by_priority"].values())
    assert "priority -1: 2 requests, TTFT p50" in format_priorities(results)


@pytest.mark.slow
def test_bench_qos_runs_tiny_on_the_starter(capsys):
    """The issue-27 benchmark (scripts/bench_qos.py) kept working: a few seconds, two background clients."""
    pytest.importorskip("backends.torch_engine.model_runner")
    from app.bench_qos import main

    argv = ["--duration", "3", "--warmup", "2", "--bg-clients", "2", "--bg-tokens", "24", "--chat-tokens", "4"]
    assert main([*argv, "--interval", "1", "--ctx", "256", "--threads", "1", "--json"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["errors"] == [] and result["chat_requests"] >= 1
    assert result["chat_ttft_ms_p95"] > 0 and result["bg_tokens_per_s_alone"] > 0
    assert 0 <= result["chat_met_target"] <= 1 and result["bg_throughput_kept"] is not None


def test_bench_qos_refuses_bad_arguments(capsys):
    from app.bench_qos import main

    assert main(["--bg-clients", "0"]) == 2
    assert "--bg-clients must be at least 1" in capsys.readouterr().err


def test_sampled_rows_carry_the_temperature_and_a_seed_per_request_on_both_paths(fake_loaded, capsys):
    """--temperature T (issue 24): every request samples at T with seed --seed + its index, in process and over
    HTTP (there as an OpenAI client sends it: temperature and seed, no top-k or min-p)."""
    from app.bench import Workload, worker

    backend = fake_loaded
    worker(
        Workload(
            model=None,
            backend="torch",
            concurrency=[2],
            prompt_tokens=8,
            gen_tokens=3,
            requests=2,
            seed=40,
            temperature=0.8,
            extra={"http": True, "chat": True},
        )
    )
    assert '"error"' not in capsys.readouterr().out
    assert [r.sampling.temperature for r in backend.requests] == [0.8] * 4
    assert sorted(r.sampling.seed for r in backend.requests) == [40, 40, 41, 41]
    in_process, http = backend.requests[:2], backend.requests[2:]
    assert all(r.sampling.top_k == 40 for r in in_process)  # hearth's defaults
    assert all(r.sampling.top_k == 0 and r.sampling.min_p == 0 for r in http)  # OpenAI's


def test_a_negative_temperature_is_refused_before_anything_loads(capsys):
    from app.cli import main

    assert main(["bench", "--temperature", "-1"]) == 2
    assert "--temperature must be >= 0" in capsys.readouterr().err


def test_a_gpu_run_is_kept_as_that_cards_decode_record(monkeypatch, capsys):
    """What `hearth bench` measured on a GPU is kept for the next plan (app/measurements.py); a failure to keep it
    is said and never fails the bench."""
    import sys
    from pathlib import Path

    import app.bench
    from app.loaded import Decision
    from app.measurements import with_decode_records
    from backends.api import LoadOptions
    from hwprobe import plan
    from hwprobe.report import load_report

    sys.path.insert(0, str(Path(__file__).parent.parent / "hwprobe"))
    from hw_shapes import llama3_8b_q4_k_m

    report = load_report(Path(__file__).parent.parent / "hwprobe" / "fixtures" / "rtx4090_24gb.json")
    spec = llama3_8b_q4_k_m()

    class Loaded:
        decision = Decision("llama.cpp", LoadOptions(), plan(report, spec.to_shape()))

    Loaded.spec = spec
    monkeypatch.setattr(app.bench, "hardware_report", lambda *a: report)
    app.bench._record_decode(Loaded, 120.0, None)
    (rec,) = with_decode_records(report).gpus[0].decode_records
    assert (rec.engine, rec.kind) == ("llama.cpp", "ggml") and rec.source.startswith("hearth bench, Llama-3-8B")

    def broken(*a):
        raise RuntimeError("NVML went away")

    monkeypatch.setattr(app.bench, "hardware_report", broken)
    app.bench._record_decode(Loaded, 120.0, None)
    assert "decode speed not recorded: RuntimeError: NVML went away" in capsys.readouterr().err
