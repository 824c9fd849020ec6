"""The decode kernel for 1-16 rows of int4 / int8 weights (kernels/quant_gemv_triton.py): against the torch
reference on awkward shapes under the Triton interpreter (the integer decode exactly), the dispatch that sends
decode rows to it, and its code compiled for sm_86, sm_89 and sm_90 (no GPU needed) checked for what makes a
decode kernel fast (issue 42 item 3): 128-bit loads of the weights, no integer-to-float conversion per weight, no
register spills, and at one row no shared memory at all."""

from __future__ import annotations

import re
import subprocess
import tempfile
from pathlib import Path

import pytest
import torch

from kernels import quant_gemv_triton as gemv
from kernels.quant_matmul import QuantWeight, quant_matmul_reference, quantize_int4, quantize_int8
from tests.kernels.conftest import device

pytestmark = pytest.mark.kernels

TOL = {torch.float16: 2e-2, torch.float32: 2e-5}


def _weight(kind: str, n: int, k: int, group: int | None, dtype: torch.dtype) -> QuantWeight:
    torch.manual_seed(n * 1000 + k)
    w = torch.randn(n, k)
    qw = quantize_int4(w, group, dtype) if kind == "int4" else quantize_int8(w, group, dtype)
    return qw.to(device())


def _close(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> None:
    scale = b.float().abs().max().clamp(min=1.0)
    err = ((a.float() - b.float()).abs().max() / scale).item()
    assert err <= TOL[dtype], f"max rel err {err:.3g} > {TOL[dtype]}"


# (M, N, K, group): one row and several, N off the 16-row tile (1, 17, 33), K one chunk, odd chunk counts,
# groups of 32 (GGUF blocks), 128 (the loader's int4) and per channel (int8, None)
CASES = [(1, 1, 32, 32), (1, 17, 96, 32), (1, 33, 256, 128), (2, 17, 128, 32), (5, 40, 160, 32), (16, 16, 256, 128)]


@pytest.mark.parametrize("kind", ["int4", "int8"])
@pytest.mark.parametrize("m,n,k,group", CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_matches_the_reference(kind: str, m: int, n: int, k: int, group: int, dtype: torch.dtype) -> None:
    if kind == "int8" and group == 128:
        group = None  # int8 per output channel
    if kind == "int4" and k % group:
        pytest.skip("the group does not divide K")
    qw = _weight(kind, n, k, group, dtype)
    x = torch.randn(m, k, device=device()).to(dtype)
    _close(gemv.quant_gemv_triton(x, qw), quant_matmul_reference(x, qw), dtype)


@pytest.mark.parametrize("kind", ["int4", "int8"])
@pytest.mark.parametrize("m", [1, 3])
def test_split_k_and_edge_tiles(kind: str, m: int) -> None:
    qw = _weight(kind, 19, 320, 32, torch.float32)
    x = torch.randn(m, 320, device=device())
    want = quant_matmul_reference(x, qw)
    gpu = (*gemv.gpu_blocks(m, kind == "int4")[:3], 1, 1)  # the GPU's own tiles, and edge cases around them
    for blocks in [
        gpu,
        (1 if m == 1 else 4, 16, 2, 3, 1),
        (1 if m == 1 else 4, 8, 1, 4, 1),
        (1 if m == 1 else 4, 16, 4, 1, 2),
    ]:
        _close(gemv.quant_gemv_triton(x, qw, blocks=blocks), want, torch.float32)


@pytest.mark.parametrize("kind", ["int4", "int8"])
def test_the_integer_decode_is_exact(kind: str) -> None:
    """One-hot rows pick single weights out: every decoded value equals the layout's own, bit for bit (the bit
    tricks that replace the integer-to-float conversion lose nothing)."""
    n, k = 24, 64
    qw = _weight(kind, n, k, 32, torch.float32)
    picks = [0, 1, 7, 8, 31, 32, 33, 62, 63]
    for start in range(0, len(picks), 4):
        rows = picks[start : start + 4]
        x = torch.zeros(len(rows), k, device=device())
        x[torch.arange(len(rows)), torch.tensor(rows)] = 1.0
        want = quant_matmul_reference(x, qw)
        assert torch.equal(gemv.quant_gemv_triton(x, qw), want), rows


def test_decode_rows_are_dispatched_to_it_and_the_rest_to_the_tile_kernel(monkeypatch) -> None:
    from kernels import quant_matmul_triton as qmt

    calls: list[int] = []
    real = gemv.quant_gemv_triton

    def counting(x2, w, **kw):  # type: ignore[no-untyped-def]
        calls.append(x2.shape[0])
        return real(x2, w, **kw)

    monkeypatch.setattr(gemv, "quant_gemv_triton", counting)
    qw = _weight("int4", 16, 64, 32, torch.float32)
    bias = torch.randn(16, device=device())
    for m in (1, 16, 17):
        x = torch.randn(2, m, 64, device=device()) if m == 1 else torch.randn(m, 64, device=device())
        got = qmt.quant_matmul_triton(x, qw, bias)
        _close(got, quant_matmul_reference(x, qw, bias), torch.float32)
    assert calls == [2, 16]  # (2, 1, K) is two rows; 17 rows take the tl.dot kernel
    odd = _weight("int4", 16, 64, 16, torch.float32)  # groups of 16: not 32-multiples
    assert not gemv.supports(odd, 1)
    qmt.quant_matmul_triton(torch.randn(1, 64, device=device()), odd)
    assert calls == [2, 16]


# ---- compiled for real GPUs, no GPU needed -------------------------------------------------------------------

# Compiling needs the real @triton.jit (this suite runs under TRITON_INTERPRET=1): a child process without it
# compiles every case once and hands back the PTX (compile_ptx; tests/kernels/test_q6_gemv.py uses it too).
_COMPILE = r"""
import importlib, inspect, json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

module = importlib.import_module(sys.argv[1])
TYPES = json.loads(sys.argv[2])  # pointer arguments' types; every other non-constexpr argument is an i32
out = {}
for key, (name, consts, cc, warps) in json.loads(sys.argv[3]).items():
    fn = getattr(module, name)
    names = list(inspect.signature(fn.fn).parameters)
    sig = {a: "constexpr" if a in consts else TYPES.get(a, "i32") for a in names}
    # what Triton specializes at launch: 16-byte aligned pointers, K, groups and strides multiples of 16 (true
    # of every model's widths)
    aligned = [i for i, a in enumerate(names) if a in TYPES or a in ("K", "group_size") or a.startswith("stride")]
    attrs = {(i,): [["tt.divisibility", 16]] for i in aligned}
    src = ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs)
    out[key] = triton.compile(src, target=GPUTarget("cuda", cc, 32), options={"num_warps": warps}).asm["ptx"]
print(json.dumps(out))
"""


def _cases() -> dict[str, tuple[str, dict, int, int]]:
    cases = {}
    for kind in ("int4", "int8"):
        int4 = kind == "int4"
        _, block_n, block_c, warps = gemv.gpu_blocks(1, int4)
        for cc in (86, 89, 90):
            consts = {"INT4": int4, "SPLIT_K": 1, "BLOCK_N": block_n, "BLOCK_C": block_c}
            cases[f"row-{kind}-{cc}"] = ("_gemv_row_kernel", consts, cc, warps)
        block_m, block_n, block_c, warps = gemv.gpu_blocks(16, int4)
        for cc in (86, 90):
            consts = {"INT4": int4, "SPLIT_K": 1, "BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_C": block_c}
            cases[f"rows-{kind}-{cc}"] = ("_gemv_kernel", consts, cc, warps)
    return cases


def compile_ptx(module: str, types: dict[str, str], cases: dict[str, tuple[str, dict, int, int]]) -> dict[str, str]:
    """{case: PTX} for cases {key: (kernel name in `module`, constexprs, compute capability, num_warps)}."""
    import json
    import os
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run(
        [sys.executable, "-c", _COMPILE, module, json.dumps(types), json.dumps(cases)],
        capture_output=True,
        text=True,
        env=env,
        cwd=Path(__file__).resolve().parents[2],
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout)


@pytest.fixture(scope="module")
def ptx() -> dict[str, str]:
    types = {"x_ptr": "*fp16", "w_ptr": "*i32", "s_ptr": "*fp16", "o_ptr": "*fp16", "out_ptr": "*fp16"}
    return compile_ptx("kernels.quant_gemv_triton", types, _cases())


def _spills(ptx: str, cc: int) -> tuple[int, int]:
    """(spill store bytes, spill load bytes) by ptxas -v, the assembler Triton ships."""
    from triton.backends.nvidia.compiler import get_ptxas

    target = re.search(r"^\.target\s+(sm_\w+)", ptx, re.M).group(1)  # sm_90a for Hopper
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "k.ptx"
        src.write_text(ptx)
        res = subprocess.run(
            [get_ptxas(cc).path, "-v", f"--gpu-name={target}", str(src), "-o", str(Path(tmp) / "k.cubin")],
            capture_output=True,
            text=True,
            check=True,
        )
    found = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", res.stderr)
    assert found, res.stderr
    return int(found.group(1)), int(found.group(2))


@pytest.mark.parametrize("cc", [86, 89, 90])
@pytest.mark.parametrize("kind", ["int4", "int8"])
def test_one_row_compiles_to_wide_loads_no_conversions_no_shared_memory_no_spills(ptx, cc: int, kind: str) -> None:
    code = ptx[f"row-{kind}-{cc}"]
    assert re.search(r"ld\.global(?:\.\w+)*\.v4\.b32", code), sorted(set(re.findall(r"ld\.global[\.\w]*", code)))
    assert not re.search(r"cvt\.rn\.f32\.[su](8|16|32)", code)  # weights become floats by bit tricks
    assert not re.search(r"(ld|st)\.shared", code)  # nothing through shared memory
    assert _spills(code, cc) == (0, 0)


@pytest.mark.parametrize("cc", [86, 90])
@pytest.mark.parametrize("kind", ["int4", "int8"])
def test_sixteen_rows_compile_without_conversions_or_spills(ptx, cc: int, kind: str) -> None:
    code = ptx[f"rows-{kind}-{cc}"]
    assert re.search(r"ld\.global(?:\.\w+)*\.v[24]\.b32", code)  # vector loads of the weights
    assert not re.search(r"cvt\.rn\.f32\.[su](8|16|32)", code)
    assert _spills(code, cc) == (0, 0)


@pytest.mark.parametrize("cc", [89, 90])
def test_bf16_activations_compile_the_same_way(cc: int) -> None:
    """The engine's activations on these cards are bf16 (the fixture above compiles fp16): the one-row kernels still
    load 16 bytes of weights at a time, convert no integer and spill nothing."""
    types = {"x_ptr": "*bf16", "w_ptr": "*i32", "s_ptr": "*bf16", "o_ptr": "*bf16", "out_ptr": "*bf16"}
    cases = {}
    for kind in ("int4", "int8"):
        _, block_n, block_c, warps = gemv.gpu_blocks(1, kind == "int4")
        consts = {"INT4": kind == "int4", "SPLIT_K": 1, "BLOCK_N": block_n, "BLOCK_C": block_c}
        cases[kind] = ("_gemv_row_kernel", consts, cc, warps)
    for kind, code in compile_ptx("kernels.quant_gemv_triton", types, cases).items():
        assert re.search(r"ld\.global(?:\.\w+)*\.v4\.b32", code), kind
        assert not re.search(r"cvt\.rn\.f32\.[su](8|16|32)", code), kind
        assert _spills(code, cc) == (0, 0), kind
