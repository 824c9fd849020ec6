"""weight_cache.WeightCache on its own: plain tensors in, the same tensors out; writers that race on one key
leave one whole entry; the folder is kept under its bound, least recently used first; a folder it cannot
write to costs the cache, never the load."""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path

import torch

from backends.torch_engine.weight_cache import WeightCache, entry_key


def _tensors(seed: int, n: int = 64) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "a.packed": torch.randint(0, 255, (n, 33), generator=g, dtype=torch.uint8),
        "a.scales": torch.randn(n, 2, generator=g).to(torch.bfloat16),
        "b.weight": torch.randn(n, 7, generator=g),
    }


def test_round_trip_keeps_dtypes_shapes_and_bits(tmp_path: Path) -> None:
    cache = WeightCache(tmp_path)
    want = _tensors(0)
    assert cache.store("k1", want, {"layers": {"a": {"kind": "int4"}}}) == tmp_path / "k1.pt"
    entry = cache.load("k1")
    assert entry is not None and entry.meta["layers"] == {"a": {"kind": "int4"}}
    assert entry.tensors.keys() == want.keys()
    for name, t in want.items():
        assert entry.tensors[name].dtype == t.dtype and torch.equal(entry.tensors[name], t), name
    assert cache.load("k2") is None


def test_an_entry_under_another_key_is_a_miss(tmp_path: Path) -> None:
    cache = WeightCache(tmp_path)
    cache.store("k1", _tensors(0), {})
    (tmp_path / "k1.pt").rename(tmp_path / "k2.pt")
    assert cache.load("k2") is None
    assert not (tmp_path / "k2.pt").exists()  # dropped, so the caller's store writes it anew


def _writer(folder: str, seed: int, rounds: int) -> None:
    cache = WeightCache(folder)
    for _ in range(rounds):
        cache.store("same", _tensors(seed, n=4096), {"seed": seed})


def test_racing_writers_leave_one_whole_entry(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(str(tmp_path), seed, 5)) for seed in (1, 2, 3)]
    for p in procs:
        p.start()
    cache = WeightCache(tmp_path)
    while any(p.is_alive() for p in procs):  # read while they write: never a partial entry
        entry = cache.load("same")
        if entry is not None:
            assert all(torch.equal(entry.tensors[n], t) for n, t in _tensors(entry.meta["seed"], n=4096).items())
    for p in procs:
        p.join()
        assert p.exitcode == 0
    entry = cache.load("same")
    assert entry is not None and entry.meta["seed"] in (1, 2, 3)
    assert [p.name for p in tmp_path.iterdir()] == ["same.pt"]  # no temporary file left behind


def test_folder_is_kept_under_its_bound_least_recently_used_first(tmp_path: Path) -> None:
    one = sum(t.numel() * t.element_size() for t in _tensors(0).values())
    cache = WeightCache(tmp_path, max_bytes=int(2.5 * one) + 4096)  # room for two entries and their headers
    for i, key in enumerate(("old", "used", "new")):
        cache.store(key, _tensors(i), {})
        os.utime(tmp_path / f"{key}.pt", (1000 + i, 1000 + i))
    assert sorted(p.stem for p in cache.entries()) == ["new", "used"]
    assert cache.load("used") is not None  # touched: now the most recent
    cache.store("newest", _tensors(3), {})
    assert sorted(p.stem for p in cache.entries()) == ["newest", "used"]
    assert WeightCache(tmp_path, max_bytes=one // 2).store("huge", _tensors(4), {}) is None


def test_unwritable_folder_costs_the_cache_not_the_load(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    cache = WeightCache(blocker / "weights")
    assert cache.store("k", _tensors(0), {}) is None
    assert cache.load("k") is None


def test_key_names_file_identity_and_options(tmp_path: Path) -> None:
    f = tmp_path / "m.gguf"
    f.write_bytes(b"x" * 100)
    base = entry_key([f], {"dtype": "bf16"})
    assert entry_key([f], {"dtype": "bf16"}) == base
    assert entry_key([f], {"dtype": "f32"}) != base
    os.utime(f, ns=(0, 123))
    assert entry_key([f], {"dtype": "bf16"}) != base


def test_a_rename_between_torchs_two_opens_does_not_mix_two_entries(tmp_path: Path, monkeypatch) -> None:
    """torch.load(mmap=True) reads the zip index through one open and maps the bytes through a second: an entry
    renamed over the file in between must not pair one entry's index with the other's bytes."""
    cache = WeightCache(tmp_path / "cache")
    cache.store("same", _tensors(1, n=4096), {"seed": 1})
    newer = WeightCache(tmp_path / "other").store("same", _tensors(2, n=4096), {"seed": 2})
    real_from_file = torch.UntypedStorage.from_file

    def replace_then_map(filename, *args, **kwargs):
        if newer.exists():
            os.replace(newer, cache.path("same"))  # a writer's rename lands between the two opens
        return real_from_file(filename, *args, **kwargs)

    monkeypatch.setattr(torch.UntypedStorage, "from_file", staticmethod(replace_then_map))
    entry = cache.load("same")
    assert not newer.exists()  # the rename did happen
    assert entry is not None and entry.meta["seed"] == 1
    assert all(torch.equal(entry.tensors[n], t) for n, t in _tensors(1, n=4096).items())
