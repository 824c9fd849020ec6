"""`app.hub.pull` through the real huggingface_hub download path against the local FakeHub server."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from app.hub import PullError, pull
from app.store import ModelStore
from tests.hub.hubserver import FakeRepo

MIB = 1024 * 1024


def _report(ram_available_mib: int):
    from hwprobe.report import report_from_dict

    return report_from_dict(
        {"gpus": [], "ram_total_mib": ram_available_mib * 2, "ram_available_mib": ram_available_mib, "cpu_cores": 2}
    )


def _ram_for_room(room_bytes: int) -> int:
    """The available RAM (MiB) whose size-rule room (85 % of RAM minus the 1 GiB margin) is room_bytes."""
    return 1024 + int(room_bytes / 0.85 / MIB) + 1


@pytest.fixture
def repo(hub, tiny_ggufs):
    files = {f"Tiny-{q}.gguf": data for q, data in tiny_ggufs.items()}
    files["README.md"] = b"# tiny\n"
    hub.repos["acme/Tiny-GGUF"] = FakeRepo(files)
    return hub.repos["acme/Tiny-GGUF"]


def test_pick_by_plan_takes_the_best_quant_that_fits(repo, tiny_ggufs):
    # Room between the Q8_0 and the F16 file: F16 does not fit, Q8_0 does (Q4_K_M is lower quality).
    room = (len(tiny_ggufs["Q8_0"]) + len(tiny_ggufs["F16"])) // 2
    said: list[str] = []
    entry = pull("acme/Tiny-GGUF", report=_report(_ram_for_room(room)), on_choice=said.append)
    assert entry.name == "tiny-gguf:q8_0"
    assert Path(entry.path).name == "Tiny-Q8_0.gguf"
    assert said and said[0].startswith("Q8_0: ") and "fits RAM" in said[0]
    assert entry.source == "hf" and entry.owned and entry.repo == "acme/Tiny-GGUF"
    assert entry.revision == repo.commit
    assert Path(entry.path).read_bytes() == tiny_ggufs["Q8_0"]
    assert ModelStore().get("tiny-gguf:q8_0") is not None


def test_pick_by_plan_with_plenty_of_room_takes_f16(repo):
    entry = pull("acme/Tiny-GGUF", report=_report(64 * 1024))
    assert entry.name == "tiny-gguf:f16"


def test_nothing_fits_is_a_plan_error_and_downloads_nothing(repo, hub):
    from hwprobe.errors import PlanError

    with pytest.raises(PlanError, match="no GGUF in the repo fits RAM"):
        pull("acme/Tiny-GGUF", report=_report(1025))
    assert not [r for r in hub.log.requests if "/resolve/" in r[1]]
    assert ModelStore().get("tiny-gguf:q4_k_m") is None


def test_explicit_quant_and_file(repo):
    e1 = pull("acme/Tiny-GGUF", quant="q4_k_m", report=_report(1025))  # asked for: no size rule
    assert Path(e1.path).name == "Tiny-Q4_K_M.gguf"
    e2 = pull("acme/Tiny-GGUF", file="Tiny-F16.gguf", report=_report(1025))
    assert Path(e2.path).name == "Tiny-F16.gguf"
    from hwprobe.errors import ConfigError

    with pytest.raises(ConfigError, match="no IQ2_XS GGUF"):
        pull("acme/Tiny-GGUF", quant="IQ2_XS")


def test_resume_after_a_dropped_connection(repo, hub, tiny_ggufs):
    repo.drop_once.add("Tiny-Q8_0.gguf")
    seen = []
    entry = pull("acme/Tiny-GGUF", quant="Q8_0", progress=seen.append)
    assert Path(entry.path).read_bytes() == tiny_ggufs["Q8_0"]
    gets = [r for r in hub.log.requests if r[0] == "GET" and r[1].endswith("Tiny-Q8_0.gguf")]
    assert gets[0][2] is None and gets[-1][2] is not None and gets[-1][2].startswith("bytes=")
    assert int(gets[-1][2][6:].rstrip("-")) > 0  # the second request asked only for the rest
    assert seen and seen[-1].done == seen[-1].total == len(tiny_ggufs["Q8_0"])


def test_interrupted_download_keeps_the_partial_file_and_registers_nothing(repo, hub, monkeypatch, tiny_ggufs):
    from huggingface_hub import file_download

    real = file_download.http_get
    calls = {"n": 0}

    def interrupted(*args, **kwargs):  # a Ctrl-C after the first chunk of the first attempt
        calls["n"] += 1
        if calls["n"] == 1:
            temp = kwargs.get("temp_file") or args[1]
            temp.write(tiny_ggufs["Q8_0"][:1000])
            temp.flush()
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(file_download, "http_get", interrupted)
    with pytest.raises(KeyboardInterrupt):
        pull("acme/Tiny-GGUF", quant="Q8_0")
    assert ModelStore().get("tiny-gguf:q8_0") is None
    from app.hub.pull import model_folder, partial_path

    part = partial_path(model_folder("acme/Tiny-GGUF"), "Tiny-Q8_0.gguf")
    assert part.stat().st_size == 1000
    entry = pull("acme/Tiny-GGUF", quant="Q8_0")
    assert Path(entry.path).read_bytes() == tiny_ggufs["Q8_0"]
    gets = [r for r in hub.log.requests if r[0] == "GET" and r[1].endswith("Tiny-Q8_0.gguf")]
    assert gets[-1][2] == "bytes=1000-"


def test_checksum_mismatch_deletes_the_file_and_registers_nothing(repo):
    repo.corrupt.add("Tiny-Q8_0.gguf")
    with pytest.raises(PullError, match="sha256 .* corrupt and was deleted"):
        pull("acme/Tiny-GGUF", quant="Q8_0")
    from app.hub.pull import model_folder

    assert not (model_folder("acme/Tiny-GGUF") / "Tiny-Q8_0.gguf").exists()
    assert ModelStore().get("tiny-gguf:q8_0") is None


def test_split_gguf_is_fetched_together_and_loads_as_one_model(hub, tiny_split):
    hub.repos["acme/Split-GGUF"] = FakeRepo(dict(tiny_split))
    entry = pull("acme/Split-GGUF")
    assert Path(entry.path).name.endswith("-00001-of-00005.gguf")
    assert len(entry.files) == 5 and all(Path(f).exists() for f in entry.files)
    _, spec = ModelStore().spec(entry.name)
    assert spec.n_layers == 2 and spec.architecture == "llama"
    assert spec.file_type == "Q8_0"
    pytest.importorskip("llama_cpp")
    from backends.llama_cpp.backend import open_llama

    model = open_llama(entry.path, n_ctx=64, verbose=False)  # llama.cpp finds the other shards itself
    assert model.n_vocab() == 49152 and model.tokenize(b"hello")
    model.close()


def test_offline_mode_refuses_clearly_without_touching_the_network(repo, hub, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(PullError, match="needs the network"):
        pull("acme/Tiny-GGUF")
    assert hub.log.requests == []


def test_unreachable_hub_says_it_needs_the_network(monkeypatch):
    from huggingface_hub import constants

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # discard port: connection refused
    with pytest.raises(PullError, match="cannot reach the hub.*"):
        pull("acme/Tiny-GGUF")


def test_pulled_model_still_resolves_offline(repo, monkeypatch):
    entry = pull("acme/Tiny-GGUF", quant="Q8_0")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    e, spec = ModelStore().spec(entry.name)
    assert spec.file_type == "Q8_0" and e.path == entry.path


def test_disk_space_is_checked_before_downloading(repo, hub, monkeypatch):
    import shutil
    from collections import namedtuple

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(10 * MIB, 10 * MIB - 100, 100))
    with pytest.raises(PullError, match="not enough disk space"):
        pull("acme/Tiny-GGUF", quant="Q8_0")
    assert not [r for r in hub.log.requests if "/resolve/" in r[1]]
    assert ModelStore().get("tiny-gguf:q8_0") is None


@pytest.mark.parametrize(
    ("repo_id", "kwargs", "pattern"),
    [
        ("acme/Gated-GGUF", {}, "gated repo"),
        ("acme/Nope", {}, "no model repo 'acme/Nope'"),
        ("acme/Tiny-GGUF", {"revision": "v9"}, "no revision 'v9'"),
        ("acme/NoGGUF", {}, "no GGUF file and no safetensors"),
    ],
)
def test_repo_errors_are_clear_and_register_nothing(repo, hub, tiny_ggufs, repo_id, kwargs, pattern):
    hub.repos["acme/Gated-GGUF"] = FakeRepo({"m-Q8_0.gguf": tiny_ggufs["Q8_0"]}, gated=True)
    hub.repos["acme/NoGGUF"] = FakeRepo({"README.md": b"hi"})
    before = [e.name for e in ModelStore().entries()]
    with pytest.raises(PullError, match=pattern):
        pull(repo_id, quant="Q8_0" if "Gated" in repo_id else None, report=_report(64 * 1024), **kwargs)
    assert [e.name for e in ModelStore().entries()] == before


def test_config_json_repo_uses_the_planner(hub, tiny_ggufs):
    import json

    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "num_hidden_layers": 1,
        "hidden_size": 32,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "intermediate_size": 64,
        "vocab_size": 49152,
        "max_position_embeddings": 256,
        "tie_word_embeddings": True,
    }
    files = {f"Tiny-{q}.gguf": d for q, d in tiny_ggufs.items()}
    files["config.json"] = json.dumps(config).encode()
    hub.repos["acme/Cfg-GGUF"] = FakeRepo(files)
    said: list[str] = []
    entry = pull("acme/Cfg-GGUF", report=_report(16 * 1024), on_choice=said.append)
    assert "the plan for this machine recommends F16" in said[0]
    assert entry.name == "cfg-gguf:f16"
    assert any(f.endswith("config.json") for f in entry.files)  # fetched for the plan, so `rm` deletes it too
    from app.cli import main

    assert main(["rm", entry.name, "--yes"]) == 0
    assert not Path(entry.path).parent.exists()


def test_sha256_of_served_files_matches_listing(hub, repo):
    from app.hub.pull import list_repo

    listing = list_repo("acme/Tiny-GGUF")
    by_name = {f.name: f for f in listing.files}
    data = repo.files["Tiny-F16.gguf"]
    assert by_name["Tiny-F16.gguf"].sha256 == hashlib.sha256(data).hexdigest()
    assert by_name["README.md"].sha256 is None and by_name["README.md"].blob_id


def test_pulling_again_reuses_the_verified_file(repo, hub):
    first = pull("acme/Tiny-GGUF", quant="Q8_0")
    n_gets = len([r for r in hub.log.requests if r[0] == "GET" and "/resolve/" in r[1]])
    again = pull("acme/Tiny-GGUF", quant="Q8_0")
    assert again.path == first.path and again.files == first.files
    assert len([r for r in hub.log.requests if r[0] == "GET" and "/resolve/" in r[1]]) == n_gets
    assert [e.name for e in ModelStore().entries()].count("tiny-gguf:q8_0") == 1


def test_a_taken_name_is_refused_before_downloading(repo, hub, tmp_path, tiny_ggufs):
    from hwprobe.errors import ConfigError

    mine = tmp_path / "mine.gguf"
    mine.write_bytes(tiny_ggufs["Q8_0"])
    ModelStore().add(mine, "tiny-gguf:q8_0")
    with pytest.raises(ConfigError, match="already registered"):
        pull("acme/Tiny-GGUF", quant="Q8_0")
    assert not [r for r in hub.log.requests if "/resolve/" in r[1]]
    assert ModelStore().get("tiny-gguf:q8_0").path == str(mine.resolve())
