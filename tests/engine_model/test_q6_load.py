"""Issue 42 item 2: on a GPU the loader keeps a GGUF's Q6_K tensors as they are (kind "q6", loader.native_q6:
6.5625 bits, the file's weights) instead of requantizing them to int8 (8.5 bits, within half a level).

Checked on the CPU with native_q6 forced on (the q6 layout runs its torch reference there), on a tiny random-block
Q4_K_M (scripts/make_random_gguf.py --tiny: layer 1's V and down, and the head, are Q6_K): the modules are q6 where
the file is Q6_K and int4 elsewhere, a merged Q/K/V keeps Q4_K Q and K beside a q6 V, the logits are the dense
model's (closer than the int8 requantization's), the planner prices exactly the bytes a GPU load holds, and the
prepared-weight cache stores and restores the layout."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from backends.api import LoadOptions
from backends.modelspec import ModelSpec, load_spec
from backends.torch_engine import loader
from backends.torch_engine.model_runner import ModelRunner
from backends.torch_engine.quant_embedding import QuantEmbedding
from backends.torch_engine.quantize import QuantLinear
from backends.torch_engine.split_linear import SplitLinear
from hwprobe import memory
from kernels.dispatch import kernel_set
from tests.script_module import load_script

IDS = [5, 17, 256, 300, 3, 77, 42, 500, 12, 260, 31, 4]


@pytest.fixture(scope="module")
def q4_k_m(tmp_path_factory: pytest.TempPathFactory) -> ModelSpec:
    maker = load_script("scripts/make_random_gguf.py")
    return load_spec(maker.write_random_q4_k_m(tmp_path_factory.mktemp("q6") / "tiny-q4_k_m.gguf", maker.TINY))


@pytest.fixture
def as_on_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loader, "native_q6", lambda device: True)


def _runner(spec: ModelSpec, weight_quant: str, cache: Path | None = None) -> ModelRunner:
    options = LoadOptions(
        n_ctx=64,
        max_num_seqs=1,
        dtype="float32",
        weight_quant=weight_quant,
        weight_cache_dir=None if cache is None else str(cache),
    )
    return ModelRunner(spec, options)


def _logits(r: ModelRunner) -> torch.Tensor:
    return torch.cat([r.prompt_logits(IDS), r.forward([(IDS[:1], 0, [0])], num_decodes=1)])


def _held_bytes(module: nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in (*module.parameters(), *module.buffers()))


def test_q6_is_the_layout_on_cuda_only() -> None:
    assert loader.native_q6(torch.device("cuda"))
    assert not loader.native_q6(torch.device("cpu")) and not loader.native_q6(torch.device("meta"))


def test_q6_tensors_keep_their_kind_and_the_files_weights(q4_k_m: ModelSpec, as_on_a_gpu: None) -> None:
    model = loader.load_model(q4_k_m, kernel_set("torch"), torch.float32, torch.device("cpu"), weight_quant="gguf")
    first, second = model.layers
    assert first.attn.qkv_proj.kind == "int4" and first.mlp.down_proj.kind == "int4"
    qkv = second.attn.qkv_proj
    assert isinstance(qkv, SplitLinear) and [p.kind for p in qkv.parts] == ["int4", "q6"]  # Q4_K Q, K | Q6_K V
    assert second.mlp.down_proj.kind == "q6" and second.mlp.gate_up_proj.kind == "int4"
    assert isinstance(model.lm_head, QuantLinear) and model.lm_head.kind == "q6"
    assert isinstance(model.embed, QuantEmbedding) and model.embed.kind == "int4"

    q6, dense = _logits(_runner(q4_k_m, "gguf")), _logits(_runner(q4_k_m, "none"))
    torch.testing.assert_close(q6, dense, rtol=1e-4, atol=1e-4)  # the file's weights; only sums' order differs


def test_q6_is_closer_to_the_file_than_int8(q4_k_m: ModelSpec, monkeypatch: pytest.MonkeyPatch) -> None:
    dense = _logits(_runner(q4_k_m, "none"))
    int8 = _logits(_runner(q4_k_m, "gguf"))  # the CPU's layout: Q6_K requantized
    monkeypatch.setattr(loader, "native_q6", lambda device: True)
    q6 = _logits(_runner(q4_k_m, "gguf"))
    assert (q6 - dense).abs().max() < (int8 - dense).abs().max() / 10


def test_the_planner_prices_what_a_gpu_load_holds(q4_k_m: ModelSpec, as_on_a_gpu: None) -> None:
    """torch_gguf_weights over ModelSpec.to_shape is what load_model holds on a GPU ('meta', bf16), byte for
    byte: the q6 V, down and head at 6.5625 bits."""
    model = loader.load_model(q4_k_m, kernel_set("torch"), torch.bfloat16, torch.device("meta"), weight_quant="gguf")
    shape = q4_k_m.to_shape()
    layout = memory.torch_gguf_weights(shape)
    assert layout is not None and not layout.tied
    assert list(layout.layer_bytes) == [_held_bytes(b) for b in model.layers]
    assert layout.head_bytes == _held_bytes(model.lm_head) == int(shape.vocab_size * 256 * memory.GGUF_Q6_BYTES)
    assert layout.embedding_bytes == _held_bytes(model.embed)
    assert shape.extra["gguf_head_gpu_kind"] == "q6" and shape.extra["gguf_head_kind"] == "int8"
    assert memory.torch_gguf_kind_bytes(shape)["q6"] == pytest.approx(
        _held_bytes(model.lm_head) + _held_bytes(model.layers[1].mlp.down_proj) + 256 * 128 * memory.GGUF_Q6_BYTES
    )


def test_the_weight_cache_keeps_the_layout(q4_k_m: ModelSpec, as_on_a_gpu: None, tmp_path: Path) -> None:
    fresh = _runner(q4_k_m, "gguf")
    first, second = _runner(q4_k_m, "gguf", tmp_path), _runner(q4_k_m, "gguf", tmp_path)
    assert (first.weight_cache, second.weight_cache) == ("stored", "hit")
    assert second.model.lm_head.kind == "q6" and second.model.lm_head.qhigh is not None
    assert torch.equal(_logits(second), _logits(fresh))


def test_a_tensor_parallel_ffn_split_falls_on_whole_q6_blocks(q4_k_m: ModelSpec) -> None:
    """loader._down_group: a rank's share of down_proj's inputs starts on a whole 256-weight block where a down
    projection is Q6_K kept as q6 (QuantWeight.column_unit), on a 32-group otherwise."""
    from backends.weight_map import names

    gguf_names = names(q4_k_m.architecture, "gguf")
    assert loader._down_group(q4_k_m, gguf_names, True, None, q4_k_m.ffn_size, q6=True) == 256
    assert loader._down_group(q4_k_m, gguf_names, True, None, q4_k_m.ffn_size, q6=False) == 32


def test_a_q6_lookup_copies_nothing_from_the_host(q4_k_m: ModelSpec, monkeypatch: pytest.MonkeyPatch) -> None:
    """A q6 embedding's lookup runs inside the decode step's CUDA graph, whose capture refuses a host-to-device
    copy: it makes no tensor from host data (torch.tensor / as_tensor), and gives the dense lookup's rows."""
    from backends.torch_engine.gguf_q6 import repack_q6k

    gen = torch.Generator().manual_seed(0)
    blocks = torch.randint(0, 256, (64, 210), dtype=torch.uint8, generator=gen)
    blocks[:, 208:210] = torch.tensor([0x00, 0x14], dtype=torch.uint8)  # d = 2**-10 (fp16 0x1400)
    weight = repack_q6k(blocks, 64, 256)
    embed = QuantEmbedding(weight, torch.float32)
    ids = torch.tensor([[3, 0, 63], [17, 17, 8]])
    want = loader.dequantize(weight)[ids]

    def refused(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise AssertionError("a tensor made from host data inside the lookup")

    monkeypatch.setattr(torch, "tensor", refused)
    monkeypatch.setattr(torch, "as_tensor", refused)
    assert torch.equal(embed(ids), want)
