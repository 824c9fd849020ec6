"""`hearth pull / show / rm / models` in-process through app.cli.main, against the FakeHub server."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.cli import main
from app.store import ModelStore
from tests.hub.hubserver import FakeRepo


@pytest.fixture
def repo(hub, tiny_ggufs):
    hub.repos["acme/Tiny-GGUF"] = FakeRepo({f"Tiny-{q}.gguf": d for q, d in tiny_ggufs.items()})
    return hub.repos["acme/Tiny-GGUF"]


def test_pull_show_models_rm(repo, capsys):
    assert main(["pull", "acme/Tiny-GGUF", "--quant", "Q8_0"]) == 0
    captured = capsys.readouterr()
    out = captured.out
    assert "fetching Tiny-Q8_0.gguf (3.3 MiB) [1/1]" in captured.err  # not a terminal: one line per file
    assert "choosing Q8_0: --quant Q8_0 asked for it" in out and "pulled tiny-gguf:q8_0" in out
    assert main(["models", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    row = rows["tiny-gguf:q8_0"]
    assert row["repo"] == "acme/Tiny-GGUF" and row["revision"] == repo.commit
    assert row["size_on_disk"] == len(repo.files["Tiny-Q8_0.gguf"]) and row["quant"] == "Q8_0"
    assert "llama.cpp" in row["backends"]
    assert main(["models"]) == 0
    table = capsys.readouterr().out
    assert "BACKENDS" in table and "acme/Tiny-GGUF@0123456" in table
    assert main(["show", "tiny-gguf:q8_0"]) == 0
    shown = capsys.readouterr().out
    assert "acme/Tiny-GGUF@0123456789ab" in shown and "llama.cpp" in shown and "why:" in shown
    path = Path(ModelStore().get("tiny-gguf:q8_0").path)
    assert main(["rm", "tiny-gguf:q8_0", "--yes"]) == 0
    assert not path.exists() and ModelStore().get("tiny-gguf:q8_0") is None
    assert "deleted 1 file(s)" in capsys.readouterr().out


def test_rm_never_deletes_a_registered_only_file(tmp_path, tiny_ggufs, capsys, monkeypatch):
    f = tmp_path / "mine-Q8_0.gguf"
    f.write_bytes(tiny_ggufs["Q8_0"])
    ModelStore().add(f, "mine")
    monkeypatch.setattr("sys.stdin.isatty", lambda: False)
    assert main(["rm", "mine"]) == 1  # not confirmed: nothing happens
    assert ModelStore().get("mine") is not None
    assert main(["rm", "mine", "--yes"]) == 0
    assert f.exists() and f.read_bytes() == tiny_ggufs["Q8_0"]
    assert ModelStore().get("mine") is None and "file kept" in capsys.readouterr().out


def test_rm_ignores_owned_files_outside_the_models_dir(tmp_path, tiny_ggufs):
    from app.commands.rm import owned_files

    f = tmp_path / "x-Q8_0.gguf"
    f.write_bytes(tiny_ggufs["Q8_0"])
    entry, _ = ModelStore().add(f, "x", source="hf", repo="a/b", owned=True, files=[str(f)])
    assert owned_files(entry) == []  # a tampered registry cannot make rm delete a file elsewhere
    assert main(["rm", "x", "--yes"]) == 0 and f.exists()


def test_pull_errors_are_one_line_with_exit_2(hub, capsys, monkeypatch):
    assert main(["pull", "acme/Missing"]) == 2
    err = capsys.readouterr().err
    assert "hearth: error: no model repo 'acme/Missing'" in err and "Traceback" not in err
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(["pull", "acme/Missing"]) == 2
    assert "needs the network" in capsys.readouterr().err


def test_safetensors_repo_with_include(hub, tmp_path):
    import numpy as np
    from safetensors.numpy import save_file

    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "num_hidden_layers": 1,
        "hidden_size": 8,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "intermediate_size": 16,
        "vocab_size": 32,
        "max_position_embeddings": 64,
        "torch_dtype": "float32",
    }
    st = tmp_path / "model.safetensors"
    save_file({"model.embed_tokens.weight": np.zeros((32, 8), np.float32)}, str(st))
    hub.repos["acme/Tiny-HF"] = FakeRepo(
        {
            "config.json": json.dumps(cfg).encode(),
            "model.safetensors": st.read_bytes(),
            "tokenizer.json": b"{}",
            "extra.txt": b"x",
            "pytorch_model.bin": b"not fetched",
        }
    )
    from app.hub import pull

    entry = pull("acme/Tiny-HF", include=["extra.txt"])
    folder = Path(entry.path)
    assert folder.is_dir() and entry.name == "tiny-hf"
    assert sorted(p.name for p in folder.iterdir() if not p.name.startswith(".")) == [
        "config.json",
        "extra.txt",
        "model.safetensors",
        "tokenizer.json",
    ]


@pytest.mark.parametrize(
    "method, side_file, side_config, label",
    [
        ("gptq", "quantize_config.json", None, "GPTQ-4bit-g32"),  # AutoGPTQ's file: the Variant's own config
        (  # AutoAWQ's file and keys
            "awq",
            "quant_config.json",
            {"zero_point": True, "q_group_size": 32, "w_bit": 4, "version": "GEMM"},
            "AWQ-4bit-g32",
        ),
    ],
)
def test_pull_gptq_awq_repo_fetches_its_side_config(hub, tmp_path, capsys, method, side_file, side_config, label):
    """A GPTQ / AWQ repo whose quantization lives in a side file (not config.json): the pull fetches it, so
    the pulled folder reads as its packed format in `hearth models` and `hearth show`, and runs."""
    pytest.importorskip("safetensors")
    from tests.gptq_awq_factory import Variant, write_byte_tokenizer, write_quantized

    folder, _ = write_quantized(tmp_path / "q", Variant(method=method), side_file=True)
    if side_config is not None:
        (folder / "quantize_config.json").unlink()
        (folder / side_file).write_text(json.dumps(side_config))
    write_byte_tokenizer(folder)
    files = {p.name: p.read_bytes() for p in folder.iterdir()}
    assert "quantization_config" not in json.loads(files["config.json"]) and side_file in files
    hub.repos["acme/Tiny-Quant"] = FakeRepo({**files, "README.md": b"not fetched"})
    assert main(["pull", "acme/Tiny-Quant"]) == 0
    assert f"fetching {side_file}" in capsys.readouterr().err
    pulled = Path(ModelStore().get("tiny-quant").path)
    assert sorted(p.name for p in pulled.iterdir() if not p.name.startswith(".")) == sorted(
        ["config.json", "model.safetensors", "tokenizer.json", side_file]
    )
    assert main(["models", "--json"]) == 0
    row = {r["name"]: r for r in json.loads(capsys.readouterr().out)}["tiny-quant"]
    assert (row["quant"], row["format"], row["backends"]) == (label, "safetensors", ["torch"])
    assert main(["show", "tiny-quant"]) == 0
    shown = capsys.readouterr().out
    assert f"quant         {label}" in shown and "the folder's own packed integers" in shown, shown
    assert main(["run", "--model", "tiny-quant", "--max-tokens", "2", "hello"]) == 0
