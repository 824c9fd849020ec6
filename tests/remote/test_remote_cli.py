"""`hearth run --backend remote` as a person types it: a reply on stdout, the key from the environment or
settings.toml, and a wrong key or an unreachable URL as one error line (plus its hint) and exit 2."""

from __future__ import annotations

import pytest

from app.cli import main
from app.paths import get_paths
from app.server.background import free_port
from tests.fakes import loaded_fake

REPLY = "The capital of France is Paris."


def error_lines(err: str) -> list[str]:
    lines = err.strip().splitlines()
    assert lines[0].startswith("hearth: error: ") and "Traceback" not in err
    assert len(lines) == 1 or (len(lines) == 2 and lines[1].startswith("  hint: "))
    return lines


def test_run_streams_the_remote_reply_with_hearths_system_prompt(served, capsys):
    fake = loaded_fake(replies=(REPLY,))
    server = served(fake, "big-model")
    assert (
        main(
            [
                "run",
                "--backend",
                "remote",
                "--url",
                server.url,
                "-t",
                "0",
                "--verbose",
                "What is the capital of France?",
            ]
        )
        == 0
    )
    out, err = capsys.readouterr()
    assert out.strip() == REPLY
    assert "big-model on remote" in err and server.url in err and "tok/s" in err
    roles = [(m.role, m.content) for m in fake.requests[-1].messages]
    assert roles == [("system", "You are a helpful assistant."), ("user", "What is the capital of France?")]


def test_the_key_comes_from_the_environment_or_settings_toml(served, capsys, monkeypatch):
    server = served(loaded_fake(replies=(REPLY,)), api_key="sesame")
    monkeypatch.setenv("HEARTH_REMOTE_API_KEY", "sesame")
    assert main(["run", "-b", "remote", "--url", server.url, "Hi"]) == 0
    assert capsys.readouterr().out.strip() == REPLY
    monkeypatch.delenv("HEARTH_REMOTE_API_KEY")
    settings = get_paths().settings_file
    settings.parent.mkdir(parents=True, exist_ok=True)
    settings.write_text(f'backend = "remote"\n[remote]\nurl = "{server.url}"\napi_key = "wrong"\n')
    assert main(["run", "Hi"]) == 2
    out, err = capsys.readouterr()
    lines = error_lines(err)
    assert "refused the API key (401, key from [remote] api_key in" in lines[0] and out == ""
    settings.write_text(
        f'backend = "remote"\n[remote]\nurl = "{server.url}"\napi_key = "sesame"\nmodel = "fake-model"\n'
    )
    assert main(["run", "Hi"]) == 0
    assert capsys.readouterr().out.strip() == REPLY


def test_an_unreachable_url_is_one_line_and_exit_2_never_a_local_model(capsys):
    url = f"http://127.0.0.1:{free_port()}"
    assert main(["run", "--backend", "remote", "--url", url, "Hi"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and f"cannot reach {url}/v1" in error_lines(err)[0]


@pytest.mark.parametrize(
    "args,match",
    [
        (["--backend", "remote"], "--backend remote needs the server's URL"),
        (["--backend", "remote", "--url", "gpu-box:8000"], "url must be an http:// or https:// URL"),
    ],
)
def test_bad_remote_settings_are_config_errors(args, match, capsys):
    assert main(["run", *args, "Hi"]) == 2
    assert match in error_lines(capsys.readouterr().err)[0]


def test_plan_suggests_a_remote_server_when_nothing_fits_here(tmp_path, capsys):
    import json
    from pathlib import Path

    config = tmp_path / "llama-2-70b" / "config.json"
    config.parent.mkdir()
    config.write_text(
        json.dumps(
            {
                "architectures": ["LlamaForCausalLM"],
                "model_type": "llama",
                "hidden_size": 8192,
                "num_hidden_layers": 80,
                "num_attention_heads": 64,
                "num_key_value_heads": 8,
                "intermediate_size": 28672,
                "vocab_size": 32000,
                "max_position_embeddings": 4096,
                "rms_norm_eps": 1e-5,
                "rope_theta": 10000.0,
            }
        )
    )
    laptop = Path(__file__).parent.parent / "hwprobe" / "fixtures" / "no_gpu_laptop.json"  # 16 GB, no GPU
    assert main(["plan", str(config), "--hardware", str(laptop)]) == 2
    lines = error_lines(capsys.readouterr().err)
    assert "needs" in lines[0] and "hearth run --backend remote --url http://HOST:PORT" in lines[1]


def test_bench_measures_a_remote_model(served, capsys):
    import json

    fake = loaded_fake(replies=(" ".join(f"w{i}" for i in range(64)),))
    server = served(fake, "bench-model")
    assert (
        main(
            [
                "bench",
                "--backends",
                "remote",
                "--url",
                server.url,
                "--concurrency",
                "1,2",
                "--requests",
                "2",
                "--prompt-tokens",
                "16",
                "--gen-tokens",
                "8",
                "--json",
            ]
        )
        == 0
    )
    results = json.loads(capsys.readouterr().out)["results"]
    assert [(r["backend"], r["concurrency"]) for r in results] == [("remote", 1), ("remote", 2)]
    assert all("error" not in r and r["aggregate_tokens_per_s"] > 0 and r["peak_rss_mib"] is None for r in results)
    prompt = fake.requests[-1].messages[-1].content
    assert len(prompt.split()) == 16 and fake.requests[-1].sampling.ignore_eos


def test_bench_with_an_unreachable_remote_is_one_line_and_exit_2(capsys):
    url = f"http://127.0.0.1:{free_port()}"
    assert main(["bench", "--backends", "remote", "--url", url]) == 2
    assert f"cannot reach {url}/v1" in error_lines(capsys.readouterr().err)[0]


@pytest.mark.parametrize("command", [["serve"], ["ppl", "english.txt"]])
def test_commands_that_need_a_local_model_refuse_a_remote_one_from_the_settings(command, capsys, monkeypatch):
    from pathlib import Path

    monkeypatch.chdir(Path(__file__).parent.parent / "data")  # english.txt: a text ppl can read
    monkeypatch.setenv("HEARTH_BACKEND", "remote")
    monkeypatch.setenv("HEARTH_REMOTE_URL", "http://gpu-box:8000")
    assert main(command) == 2
    assert "local model" in error_lines(capsys.readouterr().err)[0]
