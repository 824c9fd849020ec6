"""The plain-torch fast path of every op against its slow reference, on awkward shapes."""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch

from kernels import activation, attention, rmsnorm, rope
from kernels.dispatch import kernel_set, use_kernels

TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


@pytest.mark.parametrize("n", [1, 15, 16, 17, 33])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm(n: int, dtype: torch.dtype) -> None:
    x = torch.randn(n, 96).to(dtype) * 3
    w = torch.randn(96)
    ref = rmsnorm.rms_norm_reference(x, w, 1e-5).float()
    torch.testing.assert_close(rmsnorm.rms_norm_torch(x, w, 1e-5).float(), ref, atol=TOL[dtype], rtol=TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_add_rms_norm_torch_matches_the_reference(dtype: torch.dtype) -> None:
    """The residual stream is the same bits as the reference's (one rounding of x + r), the norm within TOL."""
    x, r = (torch.randn(17, 96) * 3).to(dtype), torch.randn(17, 96).to(dtype)
    w = torch.randn(96)
    out, summed = rmsnorm.fused_add_rms_norm_torch(x, r, w, 1e-5)
    want_out, want_sum = rmsnorm.fused_add_rms_norm_reference(x, r, w, 1e-5)
    assert torch.equal(summed, want_sum) and summed.dtype == dtype
    torch.testing.assert_close(out.float(), want_out.float(), atol=TOL[dtype], rtol=TOL[dtype])


def test_cpu_rms_norm_is_row_invariant_and_follows_weight_updates() -> None:
    """The CPU path (LayerNorm of [x, -x]) gives a row the same bits alone and among 512 rows, and a weight
    changed in place is not served from the padded copy it keeps."""
    torch.manual_seed(3)
    x = (torch.randn(512, 96) * 4).bfloat16()
    w = torch.randn(96)
    many = rmsnorm.rms_norm_torch(x, w, 1e-6)
    assert torch.equal(rmsnorm.rms_norm_torch(x[7:8], w, 1e-6), many[7:8])
    assert torch.equal(rmsnorm.rms_norm_torch(x[:16], w, 1e-6), many[:16])
    w.mul_(2.0)
    torch.testing.assert_close(
        rmsnorm.rms_norm_torch(x, w, 1e-6).float(), rmsnorm.rms_norm_reference(x, w, 1e-6).float(), atol=3e-2, rtol=3e-2
    )


@pytest.mark.parametrize("n", [1, 17, 33])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_silu_and_mul(n: int, dtype: torch.dtype) -> None:
    x = torch.randn(n, 2 * 40).to(dtype)
    ref = activation.silu_and_mul_reference(x).float()
    torch.testing.assert_close(activation.silu_and_mul_torch(x).float(), ref, atol=TOL[dtype], rtol=TOL[dtype])


@pytest.mark.parametrize("n", [1, 16, 17])
def test_rope_matches_reference_and_the_formula(n: int) -> None:
    positions = torch.randint(0, 5000, (n,))
    inv_freq = rope.rope_inv_freq(32, 100000.0)
    cos, sin = rope.rope_cos_sin(positions, inv_freq)
    q, k = torch.randn(n, 6, 32), torch.randn(n, 2, 32)
    rq, rk = rope.rope_reference(q, k, cos, sin)
    fq, fk = rope.rope_torch(q, k, cos, sin)
    torch.testing.assert_close(fq, rq, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(fk, rk, atol=1e-5, rtol=1e-5)
    # rotating by position p then taking the dot product with the same vector rotated by p gives |v|^2:
    # the rotation is orthogonal; and position 0 is the identity
    torch.testing.assert_close(rq.norm(dim=-1), q.norm(dim=-1), atol=1e-4, rtol=1e-4)
    z_cos, z_sin = rope.rope_cos_sin(torch.zeros(n, dtype=torch.int64), inv_freq)
    torch.testing.assert_close(rope.rope_torch(q, k, z_cos, z_sin)[0], q)


def test_llama3_rope_scaling_keeps_high_frequencies_and_divides_low_ones() -> None:
    base = rope.rope_inv_freq(128, 500000.0)
    scaled = rope.rope_inv_freq(
        128,
        500000.0,
        {
            "type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_context_length": 8192,
        },
    )
    assert torch.allclose(scaled[:8], base[:8])  # short wavelengths untouched
    assert torch.allclose(scaled[-4:], base[-4:] / 8)  # long wavelengths divided by the factor
    factors = torch.full((64,), 2.0)
    assert torch.allclose(rope.rope_inv_freq(128, 500000.0, freq_factors=factors), base / 2)


def _paged_case(
    seqs_spec: list[tuple[int, int]],
    num_heads: int,
    kv_heads: int,
    dtype: torch.dtype,
    block_size: int = 16,
    head_dim: int = 32,
    device: str = "cpu",
):
    """Random caches holding each sequence's context in shuffled blocks; seqs_spec: (start, q_len).  The numbers
    are drawn on the CPU (the same on every machine) and then moved to `device`."""
    rng = random.Random(0)
    need = sum(-(-(s + q) // block_size) for s, q in seqs_spec)
    num_blocks = need + 3
    free = list(range(num_blocks))
    rng.shuffle(free)
    seqs = []
    for start, q_len in seqs_spec:
        nb = -(-(start + q_len) // block_size)
        seqs.append((start, q_len, tuple(free.pop() for _ in range(nb))))
    k_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim).to(dtype)
    v_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim).to(dtype)
    meta = attention.build_attention_metadata(seqs, block_size)
    n = sum(q for _, q in seqs_spec)
    q = torch.randn(n, num_heads, head_dim).to(dtype)
    k_new = torch.randn(n, kv_heads, head_dim).to(dtype)
    v_new = torch.randn(n, kv_heads, head_dim).to(dtype)
    attention.write_kv(k_new, v_new, k_cache, v_cache, meta.slot_mapping)
    if device != "cpu":
        meta = attention.build_attention_metadata(seqs, block_size, device)
        q, k_cache, v_cache = q.to(device), k_cache.to(device), v_cache.to(device)
    return q, k_cache, v_cache, meta


CASES = {
    "decode-1": [(0, 1)],
    "decode-1-on-blocks": [(40, 1)],  # one sequence decoding over 41 positions, padded to 3 blocks
    "one-decode-and-a-chunk": [(40, 1), (0, 33)],  # the same, its row scattered among a chunk's
    "prefill-15": [(0, 15)],
    "prefill-16": [(0, 16)],
    "prefill-17": [(0, 17)],
    "chunk-on-prefix": [(32, 17)],  # a chunk of 17 new tokens on two cached blocks
    "mixed": [(40, 1), (0, 33), (15, 1), (16, 16), (100, 1)],
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("ratio", [1, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_paged_attention_fast_path_matches_reference(case: str, ratio: int, dtype: torch.dtype) -> None:
    q, k_cache, v_cache, meta = _paged_case(CASES[case], 2 * ratio, 2, dtype)
    ref = attention.paged_attention_reference(q, k_cache, v_cache, meta, 32**-0.5)
    out = attention.paged_attention_torch(q, k_cache, v_cache, meta, 32**-0.5)
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(out.float(), ref.float(), atol=tol, rtol=tol)


@pytest.mark.parametrize("case", ["decode-1", "chunk-on-prefix", "mixed"])
def test_head_major_cache_gives_the_same_cache_and_attention(case: str) -> None:
    """The CPU runner's head-major KV memory (allocate_kv_cache(head_major=True)) is indexed like the
    token-major one: write_kv fills the same slots, and both attention paths give the same result."""
    q, k_cache, v_cache, meta = _paged_case(CASES[case], 6, 2, torch.float32)
    hk = attention.allocate_kv_cache(*k_cache.shape, torch.float32, "cpu", head_major=True)
    hv = attention.allocate_kv_cache(*v_cache.shape, torch.float32, "cpu", head_major=True)
    assert attention.is_head_major(hk) and not attention.is_head_major(k_cache) and hk.shape == k_cache.shape
    hk.copy_(k_cache)
    hv.copy_(v_cache)
    k_new, v_new = torch.randn(len(meta.slot_mapping), 2, 32), torch.randn(len(meta.slot_mapping), 2, 32)
    attention.write_kv(k_new, v_new, k_cache, v_cache, meta.slot_mapping)
    attention.write_kv(k_new, v_new, hk, hv, meta.slot_mapping, meta.memo)
    assert torch.equal(hk, k_cache) and torch.equal(hv, v_cache)
    # the next layer of the step reuses the memory rows the first one computed, into its own caches
    assert [key[0] for key in meta.memo] == ["write_rows"]
    hk2 = attention.allocate_kv_cache(*k_cache.shape, torch.float32, "cpu", head_major=True)
    hv2 = attention.allocate_kv_cache(*v_cache.shape, torch.float32, "cpu", head_major=True)
    attention.write_kv(2 * k_new, 2 * v_new, hk2, hv2, meta.slot_mapping, meta.memo)
    slots = meta.slot_mapping
    assert torch.equal(hk2.reshape(-1, 2, 32)[slots], 2 * k_new)
    assert torch.equal(hv2.reshape(-1, 2, 32)[slots], 2 * v_new)
    ref = attention.paged_attention_reference(q, k_cache, v_cache, meta, 0.2)
    for fn in (attention.paged_attention_reference, attention.paged_attention_torch):
        torch.testing.assert_close(fn(q, hk, hv, meta, 0.2), ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fast_decode_attention_gives_a_sequence_the_same_result_alone_and_in_a_batch(dtype: torch.dtype) -> None:
    """A request's decode row is computed alone as among longer and shorter sequences (padded to the longest)
    up to one rounding of the dtype: the padded tail is masked, but the GEMMs inside see other shapes, and a
    CPU may block them differently by shape (equal bits on Zen 4; not promised on a Xeon with AMX)."""
    from tests.greedy_agreement import assert_same_up_to_rounding

    torch.manual_seed(0)
    kv_heads, num_heads, head_dim, bs = 3, 9, 64, 16
    lens = [41, 200, 17, 96]  # context after this step; sequence 0 is the one compared
    tables, nxt = [], 0
    for n in lens:
        blocks = -(-n // bs)
        tables.append(tuple(range(nxt, nxt + blocks)))
        nxt += blocks
    k_cache = attention.allocate_kv_cache(nxt, bs, kv_heads, head_dim, dtype, "cpu", head_major=True)
    v_cache = attention.allocate_kv_cache(nxt, bs, kv_heads, head_dim, dtype, "cpu", head_major=True)
    k_cache.copy_(torch.randn(k_cache.shape))
    v_cache.copy_(torch.randn(v_cache.shape))
    q = torch.randn(len(lens), num_heads, head_dim).to(dtype)
    batch = attention.build_attention_metadata([(n - 1, 1, t) for n, t in zip(lens, tables)], bs)
    alone = attention.build_attention_metadata([(lens[0] - 1, 1, tables[0])], bs)
    together = attention.paged_attention_torch(q, k_cache, v_cache, batch, 0.125)
    assert_same_up_to_rounding(
        attention.paged_attention_torch(q[:1], k_cache, v_cache, alone, 0.125),
        together[:1],
        1,
        "sequence 0 alone vs in the batch",
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("start", "q_len"), [(40, 1), (0, 33), (32, 17)])
def test_one_run_of_blocks_is_read_in_place_with_the_gathered_bits(dtype: torch.dtype, start: int, q_len: int) -> None:
    """A one-sequence group whose blocks are one run of a head-major pool (first_block) is attended in place, a
    strided view (head_major_run), with the bits of the gathered copy: the same positions, padding and mask, and
    within a head the same row stride, so SDPA's GEMMs see the same operands (only the heads' base addresses
    differ).  Blocks that are not one run, and groups of several sequences, are gathered."""
    torch.manual_seed(3)
    kv_heads, num_heads, head_dim, bs, num_blocks = 3, 9, 64, 16, 12
    k_cache = attention.allocate_kv_cache(num_blocks, bs, kv_heads, head_dim, dtype, "cpu", head_major=True)
    v_cache = attention.allocate_kv_cache(num_blocks, bs, kv_heads, head_dim, dtype, "cpu", head_major=True)
    k_cache.copy_(torch.randn(k_cache.shape))
    v_cache.copy_(torch.randn(v_cache.shape))
    blocks = -(-(start + q_len) // bs)
    run = tuple(range(4, 4 + blocks))
    meta = attention.build_attention_metadata([(start, q_len, run)], bs)
    assert [g.first_block for g in meta.groups] == [4]
    gathered = dataclasses.replace(meta, groups=tuple(dataclasses.replace(g, first_block=-1) for g in meta.groups))
    q = torch.randn(q_len, num_heads, head_dim).to(dtype)
    in_place = attention.paged_attention_torch(q, k_cache, v_cache, meta, 0.125)
    assert torch.equal(in_place, attention.paged_attention_torch(q, k_cache, v_cache, gathered, 0.125))
    ref = attention.paged_attention_reference(q, k_cache, v_cache, meta, 0.125)
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(in_place.float(), ref.float(), atol=tol, rtol=tol)
    # not one run (out of order, or a hole): gathered
    for table in (run[::-1], (0,) + run[1:]):
        assert attention.build_attention_metadata([(start, q_len, table)], bs).groups[0].first_block == -1
    # two decoding sequences share one group: gathered (a prompt chunk is a group of its own, still in place)
    groups = attention.build_attention_metadata([(start, q_len, run), (3, 1, (11,))], bs).groups
    assert [g.first_block for g in groups] == ([-1] if q_len == 1 else [11, 4])


def test_reference_attention_is_causal_on_a_cached_prefix() -> None:
    """Token i of a chunk at start s sees exactly positions <= s + i: changing a later key changes nothing."""
    q, k_cache, v_cache, meta = _paged_case([(20, 5)], 4, 2, torch.float32)
    before = attention.paged_attention_reference(q, k_cache, v_cache, meta, 0.2)
    table = meta.block_tables[0]
    last = 24  # the chunk's last position
    k_cache[table[last // 16], last % 16] += 5.0
    after = attention.paged_attention_reference(q, k_cache, v_cache, meta, 0.2)
    torch.testing.assert_close(after[:4], before[:4])
    assert not torch.allclose(after[4], before[4])


def test_dispatch_default_override_and_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HEARTH_KERNELS", raising=False)
    # the default: Triton where a CUDA GPU (and triton) is there, else the plain-torch path
    assert kernel_set().name == ("triton" if torch.cuda.is_available() else "torch")
    monkeypatch.setenv("HEARTH_KERNELS", "reference")
    assert kernel_set().name == "reference"
    with use_kernels("torch"):
        assert kernel_set().name == "torch"
    assert kernel_set("torch").name == "torch"
    with pytest.raises(ValueError, match="unknown kernel"):
        kernel_set("cuda-magic")
