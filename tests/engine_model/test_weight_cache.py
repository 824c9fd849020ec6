"""The prepared-weight cache (backends/torch_engine/weight_cache.py, prepared.py, cpu_load.py) on tiny GGUFs:
a hit gives the very bits a fresh preparation gives; a corrupt or cut entry is rebuilt, never a crash; a changed
file or format version misses."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from backends.api import LoadOptions
from backends.modelspec import ModelSpec, load_spec
from backends.torch_engine import weight_cache
from backends.torch_engine.model_runner import ModelRunner
from backends.torch_engine.quantize import QuantLinear
from tests.gguf_factory import write_tiny_llama

IDS = [5, 17, 256, 1000, 3, 77, 42, 9000, 12, 600, 31, 4]


def _spec(tmp_path: Path, name: str = "tiny.gguf", seed: int = 0, **kw) -> ModelSpec:
    # Q4_1 projections and an untied Q8_0 head: every prepared kind (packed int4, Q8_0 as two int4 halves,
    # dense prefill copies, the dequantized embedding) is in the entry
    defaults = dict(weight_type="Q4_1", tied=False, n_heads=4, n_kv_heads=2, hidden=64, ffn=128, seed=seed)
    return load_spec(write_tiny_llama(tmp_path / name, **(defaults | kw)))


def _runner(spec: ModelSpec, cache: Path | None) -> ModelRunner:
    options = LoadOptions(
        n_ctx=64, max_num_seqs=1, dtype="bfloat16", weight_quant="gguf", weight_cache_dir=str(cache) if cache else None
    )
    return ModelRunner(spec, options)


def _logits(r: ModelRunner) -> torch.Tensor:
    """Prompt logits (the dense prefill copies) and one decode row (the packed kernels)."""
    prompt = r.prompt_logits(IDS)
    decode = r.forward([(IDS[:1], 0, [0])], num_decodes=1)
    return torch.cat([prompt, decode])


def _entries(cache: Path) -> list[Path]:
    return sorted(cache.glob("*.pt"))


def test_hit_gives_the_bits_of_a_fresh_preparation(tmp_path: Path) -> None:
    spec, cache = _spec(tmp_path), tmp_path / "cache"
    fresh = _runner(spec, None)
    first = _runner(spec, cache)
    second = _runner(spec, cache)
    assert (fresh.weight_cache, first.weight_cache, second.weight_cache) == ("off", "stored", "hit")
    assert len(_entries(cache)) == 1
    assert second.cpu_packed_layers == fresh.cpu_packed_layers == 4 * spec.n_layers + 1
    assert second.dense_copy_bytes == fresh.dense_copy_bytes > 0
    assert second.weight_bytes == fresh.weight_bytes
    assert isinstance(second.model.lm_head, QuantLinear)
    assert second.model.lm_head.dense_min_rows == fresh.model.lm_head.dense_min_rows
    want = _logits(fresh)
    assert torch.equal(_logits(first), want)
    assert torch.equal(_logits(second), want)


def test_tied_head_shares_the_restored_embedding(tmp_path: Path) -> None:
    spec, cache = _spec(tmp_path, tied=True, weight_type="Q8_0"), tmp_path / "cache"
    _runner(spec, cache)
    hit = _runner(spec, cache)
    assert hit.weight_cache == "hit"
    assert hit.model.lm_head.weight is hit.model.embed.weight
    assert torch.equal(_logits(hit), _logits(_runner(spec, None)))


@pytest.mark.parametrize("damage", ["truncate", "garbage", "empty"])
def test_corrupt_entry_is_rebuilt(tmp_path: Path, damage: str) -> None:
    spec, cache = _spec(tmp_path), tmp_path / "cache"
    want = _logits(_runner(spec, cache))
    (entry,) = _entries(cache)
    data = entry.read_bytes()
    entry.write_bytes({"truncate": data[: len(data) // 2], "garbage": os.urandom(4096), "empty": b""}[damage])
    again = _runner(spec, cache)
    assert again.weight_cache == "stored"  # the damaged entry was dropped and written anew
    assert torch.equal(_logits(again), want)
    assert _runner(spec, cache).weight_cache == "hit"


def test_entry_of_another_model_shape_is_refused_and_rebuilt(tmp_path: Path, monkeypatch) -> None:
    """An entry that loads but does not fit the model (here: another model's tensors under this key) is a
    miss, rebuilt; never a half-filled model."""
    spec, other, cache = _spec(tmp_path), _spec(tmp_path, "other.gguf", hidden=96, n_heads=6), tmp_path / "cache"
    _runner(other, cache)
    (entry,) = _entries(cache)
    key = weight_cache.entry_key([spec.path], {"x": 1})
    monkeypatch.setattr(weight_cache, "entry_key", lambda files, options: key)
    entry.rename(cache / f"{key}.pt")
    blob = torch.load(cache / f"{key}.pt", weights_only=True)
    import json

    meta = json.loads(blob["meta"]) | {"key": key}
    torch.save({"meta": json.dumps(meta), "tensors": blob["tensors"]}, cache / f"{key}.pt")
    rebuilt = _runner(spec, cache)
    assert rebuilt.weight_cache == "stored"
    assert torch.equal(_logits(rebuilt), _logits(_runner(spec, None)))


def test_changed_file_and_format_version_miss(tmp_path: Path, monkeypatch) -> None:
    spec, cache = _spec(tmp_path), tmp_path / "cache"
    assert _runner(spec, cache).weight_cache == "stored"
    assert _runner(spec, cache).weight_cache == "hit"
    # the same path rewritten with other weights (size equal, mtime moved): a miss, and the new weights' logits
    before = _logits(_runner(spec, None))
    write_tiny_llama(spec.path, weight_type="Q4_1", tied=False, n_heads=4, n_kv_heads=2, hidden=64, ffn=128, seed=1)
    os.utime(spec.path, ns=(os.stat(spec.path).st_atime_ns, os.stat(spec.path).st_mtime_ns + 10**9))
    changed = load_spec(spec.path)
    fresh = _runner(changed, cache)
    assert fresh.weight_cache == "stored"
    assert not torch.equal(_logits(fresh), before)
    assert torch.equal(_logits(fresh), _logits(_runner(changed, None)))
    monkeypatch.setattr(weight_cache, "PREPARE_FORMAT", weight_cache.PREPARE_FORMAT + 1)
    assert _runner(changed, cache).weight_cache == "stored"
    assert len(_entries(cache)) == 3  # three keys; the bound is far away


def test_options_that_change_the_result_are_in_the_key(tmp_path: Path) -> None:
    spec, cache = _spec(tmp_path), tmp_path / "cache"
    _runner(spec, cache)
    opts = LoadOptions(n_ctx=64, max_num_seqs=1, dtype="bfloat16", weight_quant="none", weight_cache_dir=str(cache))
    dense = ModelRunner(spec, opts)
    assert dense.weight_cache == "stored" and dense.cpu_packed_layers == 0
    assert ModelRunner(spec, opts).weight_cache == "hit"


def test_int8_head_rows_are_kept_in_the_entry(tmp_path: Path) -> None:
    """A tied bf16 head's int8 rows and scales are stored with the prepared weights and a hit uses them: the
    very bits quantize_int8_rows gives, and the same logits (prompt rows dense, decode rows int8) as a fresh
    load's head."""
    from backends.torch_engine.cpu_head import Int8RowsHead
    from backends.torch_engine.cpu_load import HEAD_ROWS
    from kernels.int8_rows_cpu import available, quantize_int8_rows

    if not available():
        pytest.skip("this torch has no fbgemm dynamic quantized linear")
    spec, cache = _spec(tmp_path, tied=True, weight_type="Q8_0"), tmp_path / "cache"
    fresh = _runner(spec, None)
    assert _runner(spec, cache).weight_cache == "stored"
    (entry,) = _entries(cache)
    assert set(HEAD_ROWS) <= set(torch.load(entry, mmap=True, weights_only=True)["tensors"])
    hit = _runner(spec, cache)
    head = hit.model.lm_head
    assert hit.weight_cache == "hit" and isinstance(head, Int8RowsHead) and hit.describe()["int8_head"] == "on"
    assert head._rows is not None  # not packed before its first int8 call
    qweight, scales = head._rows
    want_q, want_s = quantize_int8_rows(fresh.model.lm_head.weight.detach())
    assert torch.equal(qweight, want_q) and torch.equal(scales, want_s)
    assert torch.equal(_logits(hit), _logits(fresh))
    assert head._rows is None and head.packed() is not None  # the decode row packed it


@pytest.mark.parametrize("variant", ["gptq-actorder", "awq"])
def test_a_gptq_or_awq_folder_is_cached_and_its_config_is_in_the_key(tmp_path: Path, variant: str) -> None:
    """A GPTQ / AWQ folder's packed integers are unpacked and re-laid for the CPU kernels at every load, as a
    GGUF's blocks are: a hit gives the fresh load's bits (an act-order input order, an AWQ input scale
    included), and a changed quantization config (the folder's JSON) is another entry."""
    import json

    from tests.gptq_awq_factory import Variant, write_quantized

    v = Variant(act_order=True) if variant == "gptq-actorder" else Variant(method="awq")
    folder, _ = write_quantized(tmp_path / variant, v)
    spec, cache = load_spec(folder), tmp_path / "cache"
    fresh = _runner(spec, None)
    first, second = _runner(spec, cache), _runner(spec, cache)
    assert (fresh.weight_cache, first.weight_cache, second.weight_cache) == ("off", "stored", "hit")
    assert second.weight_quant == fresh.weight_quant == spec.to_shape().extra["checkpoint_quant"]["label"]
    ids = [5, 17, 200, 3, 77, 42]  # the tiny checkpoint's vocabulary is 256

    def logits(r: ModelRunner) -> torch.Tensor:
        return torch.cat([r.prompt_logits(ids), r.forward([(ids[:1], 0, [0])], num_decodes=1)])

    assert torch.equal(logits(second), logits(fresh))
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"]["damp_percent" if v.method == "gptq" else "version"] = (
        0.02 if v.method == "gptq" else "GEMM"
    )
    (folder / "config.json").write_text(json.dumps(config))
    assert _runner(load_spec(folder), cache).weight_cache == "stored"
