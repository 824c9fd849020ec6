"""hwprobe.placement's speed estimate for the torch engine streaming offloaded blocks over PCIe.

Hand arithmetic: a Llama-2-7B block holds 202.4 M parameters (4 x 4096^2 attention + 3 x 4096 x 11008 MLP + two
norms): 404.8 MB in bf16.  Over PCIe 4.0 x16 at 80 % (25.2 GB/s) one block takes 16.1 ms to cross, while an
RTX 3090 (936 GB/s x 0.60, the torch engine's measured bf16 share: hwprobe.decode_speed) reads it in 0.72 ms:
streaming 16 blocks is copy-bound at ~16 x 16.1 ms = 0.257 s per token, ~3.9 tokens/s, whatever the GPU.
"""

from __future__ import annotations

import dataclasses

import pytest
from hw_shapes import LLAMA2_7B, MIXTRAL_8X7B

from hwprobe import memory as m
from hwprobe.decode_speed import efficiency
from hwprobe.placement import Candidate, pcie_gbps, torch_offload_tokens_per_s
from hwprobe.report import GpuInfo, HardwareReport

BLOCK_7B_BF16 = 2 * (4 * 4096 * 4096 + 3 * 4096 * 11008 + 2 * 4096)


def _gpu(gen: int | None = 4, width: int | None = 16, bandwidth: float | None = 936.0) -> GpuInfo:
    return GpuInfo(
        0,
        "NVIDIA GeForce RTX 3090",
        24576,
        23900,
        compute_capability="8.6",
        pcie_generation=gen,
        pcie_width=width,
        memory_bandwidth_gbps=bandwidth,
    )


def _report(gpu: GpuInfo, ram_gbps: float = 60.0) -> HardwareReport:
    return HardwareReport((gpu,), "AMD Ryzen 9 7950X", 16, 32, True, True, 65536, 60000, ram_gbps)


def _candidate(shape, n_gpu_layers: int, fmt: str = "bf16", ctx: int = 4096) -> Candidate:
    return Candidate("torch", fmt, m.weights(shape, fmt), ctx, "f16", True, (0,), "none", n_gpu_layers)


@pytest.mark.parametrize(
    "gen,width,gbps",
    [
        (4, 16, 25.2),
        (3, 16, 12.6),
        (5, 16, 50.4),
        (5, 8, 25.2),
        (4, 8, 12.6),
        (None, None, 25.2),  # unknown link: PCIe 4.0 x16
        (1, 16, 25.2),  # an idle GPU's power-saving Gen1 link is not what a copy gets
        (None, 8, 12.6),  # unknown generation, known width
        (9, 16, 96.8),  # a generation newer than the table: the newest known
    ],
)
def test_pcie_bandwidth_from_the_reported_link(gen, width, gbps) -> None:
    assert pcie_gbps(_gpu(gen, width)) == pytest.approx(gbps, rel=0.01)


def test_no_gpu_info_means_the_default_link() -> None:
    assert pcie_gbps(None) == pytest.approx(25.2, rel=0.01)


def test_streaming_half_of_a_7b_is_bound_by_the_link() -> None:
    assert m.weights(LLAMA2_7B, "bf16").layer_bytes[0] == pytest.approx(BLOCK_7B_BF16, rel=0.01)
    tps = torch_offload_tokens_per_s(_report(_gpu()), LLAMA2_7B, _candidate(LLAMA2_7B, 16))
    assert tps == pytest.approx(1 / (16 * BLOCK_7B_BF16 / 25.2e9), rel=0.02)  # ~3.9 tokens/s
    slower_link = torch_offload_tokens_per_s(_report(_gpu(gen=3)), LLAMA2_7B, _candidate(LLAMA2_7B, 16))
    assert slower_link == pytest.approx(tps / 2, rel=0.03)


def test_host_ram_slower_than_the_link_bounds_the_copies() -> None:
    """PCIe 5.0 x16 (50.4 GB/s) fed by 25.2 GB/s of RAM streams like PCIe 4.0 x16 fed by 60."""
    gen5_slow_ram = torch_offload_tokens_per_s(
        _report(_gpu(gen=5), ram_gbps=25.2), LLAMA2_7B, _candidate(LLAMA2_7B, 16)
    )
    gen5 = torch_offload_tokens_per_s(_report(_gpu(gen=5)), LLAMA2_7B, _candidate(LLAMA2_7B, 16))
    assert gen5_slow_ram == torch_offload_tokens_per_s(_report(_gpu(gen=4)), LLAMA2_7B, _candidate(LLAMA2_7B, 16))
    assert gen5 > 1.8 * gen5_slow_ram


def test_more_streamed_blocks_are_slower_and_few_stay_in_the_buffers() -> None:
    report = _report(_gpu())
    speeds = [torch_offload_tokens_per_s(report, LLAMA2_7B, _candidate(LLAMA2_7B, n)) for n in (32, 30, 29, 24, 16, 0)]
    resident = speeds[0]
    # 1-2 streamed blocks fit the two device buffers: copied once, then resident speed
    assert speeds[1] == resident
    assert all(a > b for a, b in zip(speeds[1:], speeds[2:]))
    # three blocks crossing cost ~58 ms a token (two copies of 16.1 ms, then the resident 30 blocks' ~26 ms outlast
    # the third), against ~28 ms for the whole resident model (15.4 GB of weights, head and KV at 936 GB/s x 0.60)
    assert speeds[2] < resident / 2
    assert -1 not in speeds and speeds[-1] > 0


def test_a_gpu_slower_than_the_link_hides_the_copies_entirely() -> None:
    """Compute longer than the copy for every block: the overlap makes streaming free."""
    slow = _gpu(gen=5, bandwidth=20.0)  # 15 GB/s effective, below PCIe 5.0 x16's 50
    report = _report(slow)
    resident = torch_offload_tokens_per_s(report, LLAMA2_7B, _candidate(LLAMA2_7B, 32))
    assert torch_offload_tokens_per_s(report, LLAMA2_7B, _candidate(LLAMA2_7B, 8)) == resident


def test_moe_copies_every_expert_but_computes_with_the_routed_ones() -> None:
    """Mixtral's blocks cross whole (8 experts) but a token reads 2 of them: each copy is the whole block (~31 ms),
    each block's compute only its attention, 2 of its 8 experts and its KV (~3 ms)."""
    report = _report(_gpu())
    c = _candidate(MIXTRAL_8X7B, 16, fmt="W4A16")
    lay = c.layout
    block = lay.layer_bytes[0]
    copy = block / 25.2e9
    # the GPU reads the int4 blocks at the torch engine's measured int4 share and the 16-bit head at its bf16 one
    # (hwprobe.decode_speed's table; an RTX 3090 takes the nearest generation's figures): their bytes-weighted mix
    layers, rest = sum(lay.layer_bytes), lay.head_bytes + lay.other_bytes
    int4, bf16 = efficiency("torch", "int4", (8, 6)).share, efficiency("torch", "16bit", (8, 6)).share
    hbm = 936e9 * (layers + rest) / (layers / int4 + rest / bf16)
    kv = 2 * 8 * 128 * 2 * 4096  # a layer's f16 KV at 4096 tokens: 8 KV heads of 128
    read = block * (1 - m.routed_expert_share(MIXTRAL_8X7B) * 6 / 8) + kv  # 6 of 8 routed experts are not read
    compute = read / hbm + 20e-6
    assert copy > 5 * compute  # each of the 15 overlapped pairs costs its copy
    # the last streamed block and the 16 resident ones compute while the next step's first block crosses: at the
    # int4 kernel's ~7 % of the bandwidth (not the 75 % once assumed) they outlast that copy
    t = 15 * copy + max(copy, 17 * compute + rest / hbm)
    assert torch_offload_tokens_per_s(report, MIXTRAL_8X7B, c) == pytest.approx(1 / t, abs=0.05)


def test_a_candidate_without_a_gpu_has_no_streaming_speed() -> None:
    c = dataclasses.replace(_candidate(LLAMA2_7B, 0), gpus=())
    assert torch_offload_tokens_per_s(_report(_gpu()), LLAMA2_7B, c) == 0.0
