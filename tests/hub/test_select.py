"""Quant parsing, shard grouping and the size/plan rules of app.hub.select (pure, no server)."""

from __future__ import annotations

import pytest

from app.hub.select import RemoteFile, choose_gguf, group_ggufs, parse_quant
from hwprobe.report import report_from_dict

GIB = 1024**3


@pytest.mark.parametrize(
    ("name", "quant"),
    [
        ("Qwen2.5-7B-Instruct-Q4_K_M.gguf", "Q4_K_M"),
        ("llama-2-7b.Q8_0.gguf", "Q8_0"),
        ("model-IQ4_XS.gguf", "IQ4_XS"),
        ("Mistral-7B-v0.3-F16.gguf", "F16"),
        ("x.bf16.gguf", "BF16"),
        ("Meta-Llama-3.1-70B-Instruct-Q5_K_S-00001-of-00002.gguf", "Q5_K_S"),
        ("sub/phi-3-mini-q4.gguf", "Q4"),
        ("gemma-2-9b-it-IQ2_XXS.gguf", "IQ2_XXS"),
        ("tiny.gguf", "unknown"),
    ],
)
def test_parse_quant(name, quant):
    assert parse_quant(name) == quant


def test_split_shards_group_into_one_choice_and_incomplete_splits_are_dropped():
    files = [RemoteFile(f"big-Q4_K_M-0000{i}-of-00003.gguf", 10, None) for i in (2, 1, 3)]
    files += [
        RemoteFile("half-Q8_0-00001-of-00002.gguf", 10, None),
        RemoteFile("mmproj-F16.gguf", 5, None),
        RemoteFile("small-Q8_0.gguf", 7, None),
        RemoteFile("README.md", 1, None),
    ]
    choices = group_ggufs(files)
    assert [c.quant for c in choices] == ["Q8_0", "Q4_K_M"]  # best bits first; mmproj and half split skipped
    split = choices[1]
    assert [f.name[-19:] for f in split.files] == [
        "00001-of-00003.gguf",
        "00002-of-00003.gguf",
        "00003-of-00003.gguf",
    ] and split.size == 30


def _report(gpu_free_gib: float | None, ram_gib: int = 32):
    gpus = (
        []
        if gpu_free_gib is None
        else [
            {
                "index": 0,
                "name": "NVIDIA GeForce RTX 4090",
                "memory_total_mib": 24564,
                "memory_free_mib": int(gpu_free_gib * 1024),
                "compute_capability": "8.9",
            }
        ]
    )
    return report_from_dict(
        {"gpus": gpus, "ram_total_mib": ram_gib * 1024, "ram_available_mib": ram_gib * 768, "cpu_cores": 8}
    )


def _repo(sizes_gib: dict[str, float]):
    return group_ggufs([RemoteFile(f"m-{q}.gguf", int(s * GIB), None) for q, s in sizes_gib.items()])


SIZES_8B = {"F16": 16.1, "Q8_0": 8.5, "Q6_K": 6.6, "Q5_K_M": 5.7, "Q4_K_M": 4.9, "Q3_K_M": 4.0, "Q2_K": 3.2}


@pytest.mark.parametrize(
    ("free", "want"), [(23.5, "F16"), (12.0, "Q8_0"), (9.0, "Q6_K"), (6.5, "Q4_K_M"), (5.0, "Q2_K")]
)
def test_size_rule_on_a_gpu(free, want):
    choice = choose_gguf(_repo(SIZES_8B), _report(free))
    assert choice.gguf.quant == want
    assert ("warning" in choice.reason) == (want in ("Q3_K_M", "Q2_K"))


def test_size_rule_on_cpu_uses_ram_and_explicit_choices_win():
    assert choose_gguf(_repo(SIZES_8B), _report(None, ram_gib=32)).gguf.quant == "F16"
    assert choose_gguf(_repo(SIZES_8B), _report(None, ram_gib=10)).gguf.quant == "Q4_K_M"
    assert choose_gguf(_repo(SIZES_8B), _report(None, ram_gib=8), quant="f16").gguf.quant == "F16"
    assert choose_gguf(_repo(SIZES_8B), _report(None), file="m-Q6_K.gguf").gguf.quant == "Q6_K"


def test_plan_rule_with_a_config_shape():
    from hwprobe.shape import ModelShape

    shape = ModelShape("Llama-3.1-8B", "llama", 32, 4096, 32, 8, 128, 14336, 128256, 131072)
    c = choose_gguf(_repo({q: s for q, s in SIZES_8B.items() if q != "Q8_0"}), _report(10.0), shape)
    assert "the plan for this machine recommends" in c.reason
    assert c.gguf.quant in ("Q6_K", "Q5_K_M", "Q4_K_M")
