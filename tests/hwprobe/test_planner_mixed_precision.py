"""The planner's per-layer mixed precision, W4A16+attn8 (issue 41 item 4): the attention projections as W8A16, the
MLP's as W4A16 (the torch engine's weight_quant "int4+attn8"), a candidate wherever W4A16 is, priced part by part.

Hand arithmetic, Llama-3-8B (hidden 4096, 32 query / 8 KV heads of 128, FFN 14336, vocabulary 128256, untied):
a block's attention 2 x 4096^2 + 2 x 4096 x 1024 = 41,943,040 weights at 1 byte, its MLP 3 x 4096 x 14336 =
176,160,768 at 4.25 bits = 93,585,408 bytes, norms 2 x 4096 float32 = 32,768: 135,561,216 bytes a block, 32 blocks
4,337,958,912; embedding and head 2 x 128256 x 4096 x 2 = 2,101,346,304; the output norm 16,384: 6,439,321,600
bytes = 6.0 GiB, between W8A16's 8.5 and W4A16's 5.4.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from hw_shapes import LLAMA2_7B, LLAMA3_8B

from hwprobe import memory as m
from hwprobe import plan
from hwprobe.plan_types import Prefs
from hwprobe.quality import format_quality
from hwprobe.report import DecodeRecord, load_report

FIXTURES = Path(__file__).parent / "fixtures"
MIXED = m.TORCH_MIXED
ST_8B = dataclasses.replace(LLAMA3_8B, tokenizer="hf", extra={"file_format": "safetensors"})


def rtx4090(*records: DecodeRecord):
    report = load_report(FIXTURES / "rtx4090_24gb.json")
    return dataclasses.replace(report, gpus=tuple(dataclasses.replace(g, decode_records=records) for g in report.gpus))


def test_the_mixed_format_is_priced_part_by_part() -> None:
    assert MIXED == "W4A16+attn8"
    assert m.torch_mixed_bytes(ST_8B) == (41_943_040, 93_585_408)
    layout = m.weights(ST_8B, MIXED)
    assert layout.layer_bytes == (135_561_216,) * 32 and layout.total_bytes == 6_439_321_600
    assert m.weights(ST_8B, "W4A16").total_bytes < layout.total_bytes < m.weights(ST_8B, "W8A16").total_bytes
    # Llama-2-7B (no GQA): attention is a third of the projections, so the mixed format sits nearer W8A16
    assert m.torch_mixed_bytes(LLAMA2_7B) == (4 * 4096 * 4096, 3 * 4096 * 11008 * 17 // 32)
    assert m.torch_format_lowest_bpw(MIXED) == 4.25  # a GGUF's bits are checked against its MLP's


def test_its_quality_default_is_the_starters_measurement() -> None:
    q = format_quality(MIXED, "torch", None)
    assert q.pct == 15.3 and "16.83 -> 19.40" in q.source and "test_quantized_perplexity" in q.source
    assert format_quality("W8A16", "torch", None).pct < q.pct < format_quality("W4A16", "torch", None).pct


def test_a_safetensors_8b_on_a_4090_lists_it_between_w8a16_and_w4a16() -> None:
    p = plan(rtx4090(), ST_8B)
    quants = [c.quant for c in p.candidates]
    assert {"bf16", "W8A16", MIXED, "W4A16"} <= set(quants)
    mixed = next(c for c in p.candidates if c.quant == MIXED)
    w8 = next(c for c in p.candidates if c.quant == "W8A16")
    w4 = next(c for c in p.candidates if c.quant == "W4A16")
    assert (mixed.ppl_increase_pct, mixed.backend, mixed.ctx) == (15.3, "torch", 8192)
    assert not mixed.within_budget  # +15.3 % against the default +1 %
    # on today's table: its int8 attention at int8's share, its int4 MLP at int4's, so between the two in speed
    assert w4.efficiency < mixed.efficiency < w8.efficiency
    assert w4.expected_tokens_per_s < mixed.expected_tokens_per_s < w8.expected_tokens_per_s
    assert "table: " in mixed.efficiency_source and mixed.quality_source.startswith("default: ")


# a card whose int8 and int4 kernels read at its bf16 kernel's share: speed then follows the bytes
EQUAL_KERNELS = (
    DecodeRecord("torch", "int8", 0.6, 12.0, "a faster int8 kernel"),
    DecodeRecord("torch", "int4", 0.6, 12.0, "a faster int4 kernel"),
)


@pytest.mark.parametrize(
    "budget,want", [(0.0, "bf16"), (1.0, "W8A16"), (15.3, MIXED), (20.0, MIXED), (33.8, "W4A16"), (50.0, "W4A16")]
)
def test_the_budget_decides_whether_it_wins(budget: float, want: str) -> None:
    p = plan(rtx4090(*EQUAL_KERNELS), ST_8B, Prefs(max_ppl_increase_pct=budget))
    assert (p.backend, p.quant) == ("torch", want)
    speeds = {c.quant: c.expected_tokens_per_s for c in p.candidates}
    assert speeds["W4A16"] > speeds[MIXED] > speeds["W8A16"] > speeds["bf16"]
    if want == MIXED:  # the reasons name it, its figure and where the figure came from
        race = next(r for r in p.reasons if r.startswith("engine race: "))
        assert race.startswith(f"engine race: torch {MIXED} ~") and "+15.3 % perplexity (default)" in race
        assert any(r.startswith(f"weights {MIXED} (precision per layer") for r in p.reasons)
        assert 6_100 < p.devices[0].weights_mib < 6_200  # 6,439,321,600 bytes


def test_a_mixed_plan_loads_as_int4_with_int8_attention() -> None:
    from app.plan_options import plan_options
    from app.settings import Settings

    report = rtx4090(*EQUAL_KERNELS)
    p = plan(report, ST_8B, Prefs(max_ppl_increase_pct=20.0))
    o = plan_options(p, report, Settings(), backend="torch", seqs=1, draft_path=None)
    assert (o.weight_quant, o.dtype, o.device) == ("int4+attn8", "bfloat16", "cuda:0")


def test_only_where_w4a16_is() -> None:
    report = rtx4090()
    # a config.json: llama.cpp's Q4_K_M and better come before 4-bit round-to-nearest, so neither 4-bit format
    assert not {MIXED, "W4A16"} & {c.quant for c in plan(report, LLAMA3_8B).candidates}
    assert MIXED in {c.quant for c in plan(report, LLAMA3_8B, Prefs(backend="torch")).candidates}
