"""The CPU decode head as int8 rows (backends/torch_engine/cpu_head.py) in a real runner on a tiny GGUF: installed
on the bf16 CPU path, decode rows through it and prompt rows through the dense weight, close to the dense head,
counted in the weight bytes; left out on the reference kernels."""

from __future__ import annotations

import pytest
import torch

from backends.api import LoadOptions
from backends.modelspec import load_spec
from backends.torch_engine.cpu_head import Int8RowsHead, install_int8_head
from backends.torch_engine.model_runner import ModelRunner
from kernels.int8_rows_cpu import available
from tests.gguf_factory import write_tiny_llama

pytestmark = pytest.mark.skipif(not available(), reason="this torch has no fbgemm dynamic quantized linear")
IDS = [5, 17, 200, 3, 99, 42, 7, 300, 12, 64, 81, 150]


@pytest.fixture(scope="module")
def spec(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    path = write_tiny_llama(tmp_path_factory.mktemp("head") / "tiny.gguf", weight_type="Q8_0", hidden=128, ffn=256)
    return load_spec(path)


def _runner(spec, kernels: str | None = None) -> ModelRunner:  # type: ignore[no-untyped-def]
    options = LoadOptions(n_ctx=64, max_num_seqs=2, dtype="bfloat16", device="cpu", adaptive_threads=False)
    return ModelRunner(spec, options, kernels)


def test_decode_rows_take_the_int8_head_and_prompt_rows_the_dense_one(spec) -> None:  # type: ignore[no-untyped-def]
    runner = _runner(spec)
    head = runner.model.lm_head
    assert isinstance(head, Int8RowsHead) and runner.describe()["int8_head"] == "on"
    assert head.weight is runner.model.embed.weight  # tied: the dense rows read the embedding, no copy
    prompt = runner.forward([(IDS, 0, [0, 1])], "all", num_decodes=0)
    step = runner.forward([([IDS[-1]], len(IDS) - 1, [0, 1])], "last", num_decodes=1)
    # the prompt's last row and the decode step score the same position (its K/V written again, same values)
    dense, int8 = prompt[-1], step[0]
    assert not torch.equal(dense, int8)  # a different kernel really ran
    assert (dense - int8).abs().max() <= 5e-2 * dense.abs().max()
    assert int(dense.argmax()) == int(int8.argmax())
    weight_bytes = runner.weight_bytes
    assert runner.int8_head_bytes == head.nbytes >= head.in_features * head.out_features
    runner.close()
    plain = _runner(spec, "reference")
    assert not isinstance(plain.model.lm_head, Int8RowsHead) and plain.describe()["int8_head"].startswith("off")
    assert weight_bytes - plain.weight_bytes >= head.nbytes  # the int8 copy is counted
    plain.close()


def test_a_decode_row_gets_the_same_logits_alone_and_in_a_batch(spec) -> None:  # type: ignore[no-untyped-def]
    runner = _runner(spec)
    runner.forward([(IDS, 0, [0, 1]), (IDS[::-1], 0, [2, 3])], "last", num_decodes=0)
    alone = runner.forward([([7], len(IDS), [0, 1])], "last", num_decodes=1)
    both = runner.forward([([7], len(IDS), [0, 1]), ([9], len(IDS), [2, 3])], "last", num_decodes=2)
    # the head adds no batch dependence of its own: the same head input gives the same bits in either step
    h = torch.randn(2, runner.model.lm_head.in_features).bfloat16()
    head = runner.model.lm_head
    assert torch.equal(head(h[:1]), head(h)[:1])
    assert int(alone[0].argmax()) == int(both[0].argmax())
    runner.close()


def test_install_refuses_a_head_with_a_bias() -> None:
    model = torch.nn.Module()
    model.lm_head = torch.nn.Linear(8, 16, bias=True)
    assert install_int8_head(model) == (0, "the head is not a plain dense linear")
    model.lm_head = torch.nn.Linear(32, 16, bias=False)
    added, why = install_int8_head(model)
    assert why is None and isinstance(model.lm_head, Int8RowsHead) and added >= 32 * 16


def test_the_head_packs_at_its_first_int8_call_and_cached_rows_give_the_same_bits(spec) -> None:  # type: ignore[no-untyped-def]
    from kernels.int8_rows_cpu import quantize_int8_rows

    runner = _runner(spec)
    head = runner.model.lm_head
    assert isinstance(head, Int8RowsHead) and head._rows is not None  # the load checked a sample, packed nothing
    runner.forward([(IDS, 0, [0, 1])], "all", num_decodes=0)
    assert head._rows is not None  # prompt rows take the dense weight: still not packed
    h = torch.randn(3, head.in_features).bfloat16()
    fresh = head(h)
    assert head._rows is None and head.packed() is not None
    # rows handed in (as the prepared-weight cache does) give the head the same bits as rows quantized here
    model = torch.nn.Module()
    model.lm_head = torch.nn.Linear(head.in_features, head.out_features, bias=False)
    model.lm_head.weight = head.weight
    rows = quantize_int8_rows(head.weight.detach())
    added, why = install_int8_head(model, rows)
    assert why is None and added == head.nbytes and model.lm_head._rows[0] is rows[0]
    assert torch.equal(model.lm_head(h), fresh)
    runner.close()


def test_a_failed_prepack_leaves_every_row_on_the_dense_weight(spec, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import backends.torch_engine.cpu_head as cpu_head

    runner = _runner(spec)
    head = runner.model.lm_head

    def refuse(*args: object) -> None:
        raise RuntimeError("fbgemm: no")

    monkeypatch.setattr(cpu_head, "pack_int8_rows", refuse)
    h = torch.randn(2, head.in_features).bfloat16()
    dense = torch.nn.functional.linear(h, head.weight.to(h.dtype)).float()
    assert torch.equal(head(h), dense)
    assert head.packed() is None and runner.describe()["int8_head"].startswith("off (the int8 head could not be packed")
    runner.close()
