"""A model that fits no GPU whole: the planner races the torch engine streaming blocks over PCIe against
llama.cpp computing the other layers on the CPU, and keeps the faster (hwprobe.planner step 3).

Hand arithmetic (MB = 1e6 bytes, GB/s = 1e9 bytes/s):
- Llama-2-13B as a Q4_0 GGUF: a block holds 4 x 5120^2 + 3 x 5120 x 13824 = 317.2 M projection weights, 178.4 MB
  in the file (4.5 bits) and 198.3 MB as the torch engine's repacked int4 (0.625 B a weight + 40 kB of float32
  norms).  Its f16 KV cache at 4096 tokens: 2 x 40 x 5120 x 2 B x 4096 = 3200 MiB, 80 MiB a layer.
- On an 8 GB Ada laptop card (7380 MiB budget, 272 GB/s), the torch engine holds every layer's KV (3200 MiB),
  the embedding and head as the file's blocks (int4 97.7 MiB, the Q6_K head int8 166 MiB), 900 MiB of runtime and
  two 189 MiB buffers: room for 13 blocks, so 27 stream.  llama.cpp keeps the CPU layers' KV in host RAM and
  holds 27 layers, computing 13 on the CPU.
- The laptop's GPU carries decode records (LAPTOP_TORCH_RECORDS) saying the torch engine's kernels reach 75 % of
  its bandwidth there; llama.cpp's share is the table's for Ada, 65 % (hwprobe.decode_speed).
- Host RAM at 20 GB/s: the torch engine's copies run at min(PCIe 4.0 x16's 25.2, 20) = 20 GB/s, 26 x 9.9 ms +
  ~20 ms for the resident part = ~0.28 s a token (~3.6 tokens/s); llama.cpp's CPU reads its 13 layers (2.2 GiB)
  and their KV (1.0 GiB) at 20 x 0.6 = 12 GB/s (~0.30 s) after the GPU's ~0.04 s (27 layers and their KV, 6.6
  GiB, at 272 GB/s x 0.65): ~3.0 tokens/s.  Torch wins.
- Host RAM at 30 GB/s behind PCIe 3.0 x16 (12.6 GB/s): streaming costs 26 x 15.7 ms + ~20 ms = ~0.43 s (~2.3
  tokens/s); llama.cpp's CPU part runs at 18 GB/s (~0.20 s + 0.04 s: ~4.2 tokens/s).  llama.cpp wins.
- With the table's figures instead (the torch engine's int4 kernel measured at ~7 % of an H200's bandwidth) a
  streamed block's compute (~14 ms: 198 MB and 84 MB of KV at ~20 GB/s) outlasts its copy, and llama.cpp wins
  on either link.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from hw_shapes import LLAMA2_13B, LLAMA2_70B, MIXTRAL_8X7B, q4_0_llama_spec

from hwprobe import memory as m
from hwprobe import plan
from hwprobe.placement import TORCH_OFFLOAD_BUFFERS, Candidate, expected_tokens_per_s, price, torch_offload_tokens_per_s
from hwprobe.plan_types import Prefs
from hwprobe.report import DecodeRecord, GpuInfo, HardwareReport, load_report

FIXTURES = Path(__file__).parent / "fixtures"
PROJ_13B = 4 * 5120 * 5120 + 3 * 5120 * 13824
KV_13B_4096_MIB = 2 * 40 * 5120 * 2 * 4096 // m.MIB  # 3200


def _q4_0_13b():
    """Llama-2-13B as a Q4_0 GGUF whose every projection the torch engine keeps as int4 blocks."""
    params = LLAMA2_13B.estimated_param_count
    return dataclasses.replace(
        LLAMA2_13B,
        quant="Q4_0",
        weight_bytes=int(params * 4.5 / 8),
        param_count=params,
        layer_bytes=(int(PROJ_13B * 4.5 / 8),) * 40,
        embedding_bytes=int(32000 * 5120 * 4.5 / 8),
        output_bytes=int(32000 * 5120 * 6.56 / 8),
        tokenizer="llama/default",
        extra={"file_format": "gguf", "gguf_repacked": ((PROJ_13B, 0),) * 40},
    )


Q4_0_13B = _q4_0_13b()

# These tests are about the link and host RAM deciding the race between streaming blocks and computing layers on
# the CPU, which needs a GPU whose kernels keep up with the copies.  The table's figures for the torch engine's
# int4 kernel (~7 % of the bandwidth, measured on an H200) make every streamed block compute-bound, so the laptop
# says its torch kernels measured as fast as the 75 % once assumed for every engine (what `hearth bench` would
# record on a card where they are).
LAPTOP_TORCH_RECORDS = tuple(
    DecodeRecord("torch", kind, 0.75, source="as fast as the 75 % once assumed") for kind in ("16bit", "int8", "int4")
)


def _laptop(pcie_gen: int, ram_gbps: float) -> HardwareReport:
    gpu = GpuInfo(
        0,
        "NVIDIA GeForce RTX 4060 Laptop GPU",
        8192,
        7892,
        compute_capability="8.9",
        pcie_generation=pcie_gen,
        pcie_width=16,
        memory_bandwidth_gbps=272.0,
        decode_records=LAPTOP_TORCH_RECORDS,
    )
    return HardwareReport((gpu,), "Intel Core i7-13700H", 6, 12, True, False, 65536, 60000, ram_gbps)


def _table_shares(report: HardwareReport) -> HardwareReport:
    """`report` without the GPU's decode records: the speed model's table decides."""
    return dataclasses.replace(report, gpus=tuple(dataclasses.replace(g, decode_records=()) for g in report.gpus))


FAST_LINK_SLOW_RAM = _laptop(4, 20.0)
OLD_LINK = _laptop(3, 30.0)


def _race_line(p) -> str:
    lines = [r for r in p.reasons if r.startswith("partial offload:")]
    assert len(lines) == 1, p.reasons
    return lines[0]


def test_a_fast_link_and_slow_ram_stream_the_blocks_on_the_torch_engine() -> None:
    p = plan(FAST_LINK_SLOW_RAM, Q4_0_13B)
    assert (p.backend, p.quant, p.n_gpu_layers, p.ctx, p.device) == ("torch", "GGUF", 13, 4096, "cuda:0")
    assert p.fits
    llama = plan(FAST_LINK_SLOW_RAM, Q4_0_13B, Prefs(backend="llama.cpp"))
    assert (llama.backend, llama.n_gpu_layers) == ("llama.cpp", 27)
    assert p.expected_tokens_per_s == pytest.approx(3.6, abs=0.1)
    assert llama.expected_tokens_per_s == pytest.approx(3.0, abs=0.1)
    race = _race_line(p)
    assert "streaming 27 of 40 layers (GGUF) over PCIe 4.0 x16 (~20 GB/s, host RAM being slower" in race
    assert f"~{p.expected_tokens_per_s:.1f} tokens/s" in race and f"~{llama.expected_tokens_per_s:.1f} tokens/s" in race
    assert "computing 13 of them on the CPU" in race and race.split(": ")[-1].startswith("the torch engine is faster")
    assert any(
        r.startswith(
            "13 of 40 layers on GPU 0, the first 27 streamed from pinned host RAM through 2 GPU buffers of 190 MiB"
        )
        for r in p.reasons
    )


def test_an_old_link_leaves_the_cpu_layers_to_llama_cpp() -> None:
    p = plan(OLD_LINK, Q4_0_13B)
    assert (p.backend, p.quant, p.n_gpu_layers) == ("llama.cpp", "Q4_0", 27)
    streamed = plan(OLD_LINK, Q4_0_13B, Prefs(backend="torch"))
    assert (streamed.backend, streamed.n_gpu_layers) == ("torch", 13)
    assert streamed.expected_tokens_per_s == pytest.approx(2.3, abs=0.1)
    # 4.3 when llama.cpp was assumed at 75 %: its GPU part takes 0.041 s at the measured 65 %, not 0.035 s
    assert p.expected_tokens_per_s == pytest.approx(4.2, abs=0.1)
    race = _race_line(p)
    assert "over PCIe 3.0 x16 (~13 GB/s)" in race and race.split(": ")[-1].startswith("llama.cpp is faster")
    assert f"~{streamed.expected_tokens_per_s:.1f} tokens/s" in race


def test_with_the_tables_shares_llama_cpp_wins_on_the_fast_link_too() -> None:
    """The torch engine's measured int4 kernel is too slow to keep up with the copies: its blocks' compute, not the
    link, bounds the streamed estimate, below llama.cpp's."""
    report = _table_shares(FAST_LINK_SLOW_RAM)
    p = plan(report, Q4_0_13B)
    streamed = plan(report, Q4_0_13B, Prefs(backend="torch"))
    assert (p.backend, p.quant, p.n_gpu_layers) == ("llama.cpp", "Q4_0", 27)
    assert (streamed.backend, streamed.n_gpu_layers) == ("torch", 13)
    # slower than with 75 % kernels (~3.6 tokens/s, copy-bound), and slower than llama.cpp
    assert streamed.expected_tokens_per_s < plan(FAST_LINK_SLOW_RAM, Q4_0_13B).expected_tokens_per_s
    assert streamed.expected_tokens_per_s < p.expected_tokens_per_s
    assert _race_line(p).split(": ")[-1].startswith("llama.cpp is faster")


def test_the_streamed_plan_prices_all_layers_kv_and_two_buffers_on_the_gpu() -> None:
    p = plan(FAST_LINK_SLOW_RAM, Q4_0_13B)
    gpu, host = p.devices
    lay = m.weights(Q4_0_13B, "GGUF")
    block = lay.layer_bytes[0]
    assert block == pytest.approx(PROJ_13B * 0.625 + 2 * 5120 * 4, abs=1)  # 198.3 MB
    want = 13 * block + lay.embedding_bytes + lay.head_bytes + lay.other_bytes + TORCH_OFFLOAD_BUFFERS * block
    assert gpu.weights_mib == m.mib(want)
    # all 40 layers' KV, not the 13 resident ones: at least one sequence, the pool taking what the budget leaves
    assert gpu.kv_mib >= KV_13B_4096_MIB and gpu.kv_pool_tokens >= 4096 and gpu.headroom_mib >= 0
    assert p.kv_pool_bytes == gpu.kv_pool_tokens * 2 * 40 * 40 * 128 * 2
    assert gpu.overhead_mib == m.TORCH_GPU_OVERHEAD_BYTES // m.MIB
    assert (host.weights_mib, host.kv_mib, host.compute_mib) == (m.mib(27 * block), 0, 0)
    # llama.cpp with as many layers on the GPU keeps only theirs there: 11 of 40 x 3200 MiB
    llama = Candidate("llama.cpp", "Q4_0", m.weights(Q4_0_13B), 4096, "f16", True, (0,), "none", 11)
    assert price(FAST_LINK_SLOW_RAM, Q4_0_13B, llama)[0].kv_mib == 880


def _offload(shape, layout: m.WeightLayout, n_gpu_layers: int) -> Candidate:
    return Candidate("torch", "bf16", layout, 4096, "f16", True, (0,), "none", n_gpu_layers)


def test_the_buffers_are_sized_to_the_largest_streamed_block_and_no_more_than_the_blocks() -> None:
    base = m.weights(LLAMA2_13B, "bf16")
    block = base.layer_bytes[0]
    # the last (resident) block is the largest: the buffers hold the first ones, the largest of which is 2nd
    layout = dataclasses.replace(base, layer_bytes=(block, 2 * block) + (block,) * 37 + (5 * block,))
    report = load_report(FIXTURES / "rtx3090_24gb.json")

    def gpu_weights(n: int) -> int:
        return price(report, LLAMA2_13B, _offload(LLAMA2_13B, layout, n))[0].weights_mib

    heads = layout.embedding_bytes + layout.head_bytes + layout.other_bytes
    assert gpu_weights(30) == m.mib(sum(layout.layer_bytes[10:]) + heads + 2 * 2 * block)
    # one streamed block needs one buffer of its size: no saving at all
    assert gpu_weights(39) == m.mib(sum(layout.layer_bytes) + heads)
    assert price(report, LLAMA2_13B, _offload(LLAMA2_13B, layout, 39))[1].weights_mib == m.mib(block)
    # two streamed blocks (b, 2b) take two buffers of 2b: b more than keeping both resident
    assert gpu_weights(38) == m.mib(sum(layout.layer_bytes) + heads + block)


def test_streaming_estimate_is_the_plans_speed() -> None:
    p = plan(FAST_LINK_SLOW_RAM, Q4_0_13B)
    c = Candidate("torch", "GGUF", m.weights(Q4_0_13B, "GGUF"), 4096, "f16", True, (0,), "none", 13, max_num_seqs=16)
    devices = price(FAST_LINK_SLOW_RAM, Q4_0_13B, c)
    assert devices == tuple(dataclasses.replace(d, swap_mib=0) for d in p.devices)  # the plan adds swap space
    assert (
        p.expected_tokens_per_s
        == expected_tokens_per_s(FAST_LINK_SLOW_RAM, Q4_0_13B, c, devices)
        == torch_offload_tokens_per_s(FAST_LINK_SLOW_RAM, Q4_0_13B, c)
    )


@pytest.mark.parametrize(
    "shape,prefs",
    [
        (MIXTRAL_8X7B, Prefs()),  # the torch engine runs no MoE
        (Q4_0_13B, Prefs(kv_cache_type="q8_0")),
    ],  # nor a quantized KV cache
    ids=["moe", "q8_0-kv"],
)
def test_no_race_where_the_torch_engine_cannot_run_the_model(shape, prefs) -> None:
    p = plan(FAST_LINK_SLOW_RAM, shape, prefs)
    # a MoE model may keep every layer on the GPU with some experts in host RAM (hwprobe.experts)
    assert p.backend == "llama.cpp" and (0 < p.n_gpu_layers < p.n_layers or p.cpu_expert_layers > 0)
    assert not any(r.startswith("partial offload:") for r in p.reasons)


def test_backend_torch_with_n_gpu_layers_is_planned_as_streaming() -> None:
    report = load_report(FIXTURES / "rtx3090_24gb.json")
    p = plan(report, LLAMA2_70B, Prefs(backend="torch", n_gpu_layers=30))
    # 30 W8A16 blocks (0.8 GB each) alone exceed the 22.6 GiB budget; 30 W4A16 ones (0.43 GB) fit
    assert (p.backend, p.quant, p.n_gpu_layers, p.device, p.ctx) == ("torch", "W4A16", 30, "cuda:0", 4096)
    lay = m.weights(LLAMA2_70B, "W4A16")
    gpu, host = p.devices
    assert gpu.weights_mib == m.mib(
        sum(lay.layer_bytes[50:]) + lay.embedding_bytes + lay.head_bytes + lay.other_bytes + 2 * lay.layer_bytes[0]
    )
    assert gpu.kv_mib >= 2 * 80 * 8 * 128 * 2 * 4096 // m.MIB  # 1280: all 80 layers, at least one sequence
    assert host.weights_mib == m.mib(50 * lay.layer_bytes[0]) and p.fits
    c = Candidate("torch", "W4A16", lay, 4096, "f16", True, (0,), "none", 30)
    assert p.expected_tokens_per_s == torch_offload_tokens_per_s(report, LLAMA2_70B, c) > 0
    assert any("30 blocks resident on GPU 0 (--n-gpu-layers), the first 50 streamed" in r for r in p.reasons)


def test_a_safetensors_model_too_big_for_the_card_streams_rather_than_running_on_the_cpu() -> None:
    shape = dataclasses.replace(LLAMA2_70B, tokenizer="hf", extra={"file_format": "safetensors"})
    p = plan(load_report(FIXTURES / "rtx3090_24gb.json"), shape)
    assert (p.backend, p.device, p.quant) == ("torch", "cuda:0", "W4A16")  # the fastest to stream
    assert 30 < p.n_gpu_layers < 80 and p.fits
    assert any(
        r.startswith(
            "backend torch: the torch engine supports llama but none of its formats fits entirely "
            "on GPU 0 (bf16 128.5 GiB, W8A16 64.7 GiB, W4A16+attn8 40.1 GiB, W4A16 34.8 GiB)"
        )
        for r in p.reasons
    )


# ---- app.loading.decide: a streaming plan becomes LoadOptions ---------------------------------------------------


def _hardware_file(tmp_path: Path, pcie_gen: int, ram_gbps: float) -> str:
    report = {
        "gpus": [
            {
                "index": 0,
                "name": "NVIDIA GeForce RTX 4060 Laptop GPU",
                "memory_total_mib": 8192,
                "memory_free_mib": 7892,
                "compute_capability": "8.9",
                "pcie_generation": pcie_gen,
                "pcie_width": 16,
                "memory_bandwidth_gbps": 272.0,
                # the torch engine's kernels as fast as the copies need (LAPTOP_TORCH_RECORDS)
                "decode_records": [
                    {"engine": r.engine, "kind": r.kind, "share": r.share, "source": r.source}
                    for r in LAPTOP_TORCH_RECORDS
                ],
            }
        ],
        "ram_total_mib": 65536,
        "ram_available_mib": 60000,
        "cpu_cores": 6,
        "ram_bandwidth_gbps": ram_gbps,
    }
    path = tmp_path / f"laptop_gen{pcie_gen}.json"
    path.write_text(json.dumps(report))
    return str(path)


def test_decide_loads_a_streaming_plan_on_the_gpu_with_the_resident_count(tmp_path: Path) -> None:
    from app.loading import decide
    from app.settings import Settings

    spec = q4_0_llama_spec("Llama-2-13B-Q4_0", 40, 5120, 13824)
    d = decide(spec, Settings(), _hardware_file(tmp_path, 4, 20.0))
    assert (d.backend, d.plan.quant, d.plan.n_gpu_layers) == ("torch", "GGUF", 13)
    o = d.options
    assert (o.device, o.n_gpu_layers, o.weight_quant, o.dtype, o.n_ctx) == ("cuda:0", 13, "gguf", "bfloat16", 4096)
    assert any(r.startswith("partial offload:") for r in d.reasons)
    # the same model behind an old link: llama.cpp's partial offload, its layer count in the options
    d = decide(spec, Settings(), _hardware_file(tmp_path, 3, 30.0))
    assert (d.backend, d.options.n_gpu_layers, d.options.device) == ("llama.cpp", d.plan.n_gpu_layers, "auto")
    assert 0 < d.plan.n_gpu_layers < 40


def test_decide_with_backend_torch_and_n_gpu_layers_streams_the_rest(tmp_path: Path) -> None:
    from app.loading import decide
    from app.settings import Settings

    spec = q4_0_llama_spec("Llama-2-13B-Q4_0", 40, 5120, 13824)
    d = decide(spec, Settings(backend="torch", n_gpu_layers=8), _hardware_file(tmp_path, 3, 30.0))
    o = d.options
    assert (d.backend, d.plan.quant, o.device, o.n_gpu_layers, o.weight_quant) == ("torch", "GGUF", "cuda:0", 8, "gguf")
    assert d.plan.devices[0].kv_mib >= KV_13B_4096_MIB and d.plan.fits
    assert o.kv_cache_bytes == d.plan.kv_pool_bytes == d.plan.devices[0].kv_pool_tokens * 2 * 40 * 40 * 128 * 2
