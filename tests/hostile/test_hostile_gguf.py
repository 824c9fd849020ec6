"""Issue 16 item 3: hostile or broken GGUF headers cost little and say what is wrong, on `run`, `show` and
`models add` alike: exit 2, one error line (plus its hint), under 1 s of CPU and 256 MiB, and `models add`
registers none of them.  Every file is generated here from a valid tiny model, edited as raw bytes."""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.hostile.clirun import assert_one_line_error, hearth
from tests.hostile.ggufraw import (
    ARRAY,
    F32,
    STRING,
    U16,
    U32,
    U64,
    RawGGUF,
    duplicate,
    nested_array,
    overlap,
    zero_size,
)


def _shift(name: str, by: int) -> Callable[[RawGGUF], RawGGUF]:
    def edit(r: RawGGUF) -> RawGGUF:
        r.tensor(name).offset += by
        return r

    return edit


def _partial_block(r: RawGGUF) -> RawGGUF:
    r.tensor("blk.0.attn_k.weight").shape[0] = 48  # Q8_0 rows come in blocks of 32 values
    return r


def _claims(n_tensors: int | None = None, n_kvs: int | None = None) -> Callable[[RawGGUF], RawGGUF]:
    def edit(r: RawGGUF) -> RawGGUF:
        r.n_tensors, r.n_kvs = n_tensors, n_kvs
        return r

    return edit


def _huge_array(r: RawGGUF) -> RawGGUF:
    return r.set_raw("general.tags", ARRAY, struct.pack("<IQ", STRING, 10**9))


# (case id, edit of the valid file, text the error line must hold)
CASES: list[tuple[str, Callable[[RawGGUF], RawGGUF], str]] = [
    # metadata of the wrong type
    (
        "block_count-string",
        lambda r: r.set("llama.block_count", STRING, "30"),
        "llama.block_count is a string, expected uint32",
    ),
    ("vocab_size-string", lambda r: r.set("llama.vocab_size", STRING, "49152"), "llama.vocab_size is a string"),
    ("split_count-string", lambda r: r.set("split.count", STRING, "2"), "split.count is a string, expected uint16"),
    (
        "rope_base-string",
        lambda r: r.set("llama.rope.freq_base", STRING, "1e4"),
        "llama.rope.freq_base is a string, expected float32",
    ),
    (
        "array-for-number",
        lambda r: r.set("llama.embedding_length", ARRAY, (U32, [64, 64])),
        "llama.embedding_length is an array[uint32], expected uint32",
    ),
    (
        "nested-5000-deep",
        lambda r: r.set_raw("llama.block_count", ARRAY, nested_array(5000)),
        "llama.block_count nests arrays more than 3 deep",
    ),
    (
        "nested-5000-deep-unread-key",
        lambda r: r.set_raw("general.junk", ARRAY, nested_array(5000)),
        "general.junk nests arrays",
    ),
    ("block_count-uint64", lambda r: r.set("llama.block_count", U64, 2), "llama.block_count is a uint64"),
    ("rope_base-inf", lambda r: r.set("llama.rope.freq_base", F32, float("inf")), "llama.rope.freq_base is inf"),
    # absurd counts and dimensions
    (
        "block_count-1e8",
        lambda r: r.set("llama.block_count", U32, 10**8),
        "llama.block_count is 100,000,000; hearth accepts 1 to 512",
    ),
    ("split_count-1e9", lambda r: r.set("split.count", U32, 10**9), "split.count is a uint32, expected uint16"),
    ("split_count-65535", lambda r: r.set("split.count", U16, 65535), "split.count is 65,535"),
    ("heads-1e6", lambda r: r.set("llama.attention.head_count", U32, 10**6), "llama.attention.head_count is 1,000,000"),
    ("heads-0", lambda r: r.set("llama.attention.head_count", U32, 0), "llama.attention.head_count is 0"),
    ("kv_heads-1e6", lambda r: r.set("llama.attention.head_count_kv", U32, 10**6), "head_count_kv is 1,000,000"),
    ("embedding-1e9", lambda r: r.set("llama.embedding_length", U32, 10**9), "llama.embedding_length is 1,000,000,000"),
    ("ffn-1e9", lambda r: r.set("llama.feed_forward_length", U32, 10**9), "llama.feed_forward_length is 1,000,000,000"),
    ("context-0", lambda r: r.set("llama.context_length", U32, 0), "llama.context_length is 0"),
    (
        "context-4e9",
        lambda r: r.set("llama.context_length", U32, 4_000_000_000),
        "llama.context_length is 4,000,000,000",
    ),
    ("tensor-count-1e9", _claims(n_tensors=10**9), "claims 1,000,000,000 tensors"),
    ("metadata-count-1e12", _claims(n_kvs=10**12), "1,000,000,000,000 metadata keys"),
    ("array-claims-1e9-strings", _huge_array, "general.tags claims 1,000,000,000 elements"),
    # counts inconsistent with the tensors' shapes
    ("block_count-3-for-2-layers", lambda r: r.set("llama.block_count", U32, 3), "no tensors for layer 2"),
    ("block_count-1-for-2-layers", lambda r: r.set("llama.block_count", U32, 1), "belongs to layer 1"),
    (
        "heads-vs-q-shape",
        lambda r: r.set("llama.attention.head_count", U32, 8).set("llama.attention.key_length", U32, 16),
        "tensor blk.0.attn_q.weight has shape [64, 64], but the metadata (llama) implies [64, 128]",
    ),
    (
        "kv_heads-vs-k-shape",
        lambda r: r.set("llama.attention.head_count_kv", U32, 1),
        "tensor blk.0.attn_k.weight has shape [64, 32], but the metadata (llama) implies [64, 16]",
    ),
    (
        "kv_heads-not-dividing",
        lambda r: r.set("llama.attention.head_count_kv", U32, 3),
        "heads must be a whole multiple of the KV heads",
    ),
    (
        "embedding-vs-shapes",
        lambda r: r.set("llama.embedding_length", U32, 128),
        "tensor token_embd.weight has shape [64, 49152], but the metadata (llama) implies [128, 49152]",
    ),
    ("ffn-vs-shapes", lambda r: r.set("llama.feed_forward_length", U32, 256), "blk.0.ffn_gate.weight has shape"),
    (
        "vocab-vs-tokenizer",
        lambda r: r.set("llama.vocab_size", U32, 1000),
        "llama.vocab_size is 1,000 but the tokenizer has 49,152 tokens",
    ),
    ("split_count-on-a-single-file", lambda r: r.set("split.count", U16, 2), "is not NAME-00001-of-0000N.gguf"),
    # tensor tables llama.cpp refuses
    ("tensor-missing", lambda r: r.drop_tensor("blk.1.attn_k.weight"), "lacks tensor blk.1.attn_k.weight"),
    ("tensor-duplicate", duplicate, "appears twice in its tensor table"),
    ("tensor-overlap", overlap, "overlaps blk.0.attn_q.weight"),
    ("tensor-unaligned", _shift("blk.0.attn_k.weight", 4), "not a multiple of the file's alignment 32"),
    ("tensor-gap", _shift("blk.0.attn_k.weight", 32), "leaving a gap after blk.0.attn_q.weight"),
    ("tensor-zero-size", zero_size("blk.0.attn_k.weight", 1), "with no elements"),
    ("tensor-partial-block", _partial_block, "not a whole number of blocks"),
    ("tensor-past-the-end", _shift("output_norm.weight", 1 << 30), "leaving a gap"),
    ("alignment-zero", lambda r: r.set("general.alignment", U32, 0), "general.alignment is 0"),
    ("alignment-string", lambda r: r.set("general.alignment", STRING, "32"), "general.alignment is a string"),
    ("no-tokenizer", lambda r: r.drop("tokenizer.ggml.model"), "has no tokenizer"),
    ("tokenizer-none", lambda r: r.set("tokenizer.ggml.model", STRING, "none"), "has no tokenizer"),
    ("no-token-list", lambda r: r.drop("tokenizer.ggml.tokens"), "has no tokenizer.ggml.tokens"),
    ("no-merges", lambda r: r.drop("tokenizer.ggml.merges"), "without tokenizer.ggml.merges"),
    (
        "eos-outside-vocab",
        lambda r: r.set("tokenizer.ggml.eos_token_id", U32, 10**6),
        "tokenizer.ggml.eos_token_id is 1,000,000 but the vocabulary has 49,152 tokens",
    ),
    ("no-architecture", lambda r: r.drop("general.architecture"), "has no general.architecture"),
]
COMMANDS = (("run", "-m", "{path}", "hi"), ("show", "{path}"), ("models", "add", "{path}"))


@pytest.mark.parametrize("case, edit, match", CASES, ids=[c[0] for c in CASES])
def test_hostile_gguf_header(case: str, edit: Callable[[RawGGUF], RawGGUF], match: str, raw, tmp_path: Path) -> None:
    from app.paths import get_paths

    path = edit(raw()).write(tmp_path / f"{case}.gguf")
    # the three commands side by side: each child's CPU time and memory are its own, and CI's cores are used
    with ThreadPoolExecutor(len(COMMANDS)) as pool:
        results = list(pool.map(lambda cmd: hearth(*(a.format(path=path) for a in cmd)), COMMANDS))
    for cmd, r in zip(COMMANDS, results):
        try:
            assert_one_line_error(r, match)
        except AssertionError as exc:
            raise AssertionError(f"hearth {cmd[0]} {cmd[1] if cmd[0] == 'models' else ''}: {exc}") from None
    registry = get_paths().registry_file
    assert not registry.exists() or path.name not in registry.read_text(), "models add registered it"


def test_the_base_file_is_valid(raw, tmp_path: Path) -> None:
    """The control: the unedited file passes every check and registers, so the cases above fail for their edit."""
    path = raw().write(tmp_path / "ok.gguf")
    r = hearth("models", "add", str(path), "--name", "ok")
    assert r.returncode == 0 and "registered ok" in r.stdout, r.stderr
    r = hearth("models", "--json")
    assert r.returncode == 0 and "ok" in {row["name"] for row in json.loads(r.stdout)}


def test_the_harness_measures_the_child_not_the_parent() -> None:
    """The memory bound above is the child's own: a parent holding 300 MiB does not lend it to the child, and
    the child's figure is a real one (a Python with hearth's CLI imported is tens of MiB)."""
    ballast = bytearray(300 << 20)
    ballast[::4096] = b"x" * len(ballast[::4096])  # touch every page: resident, not just reserved
    r = hearth("--version")
    del ballast
    assert r.returncode == 0 and r.stdout.startswith("hearth ")
    assert 5 < r.maxrss_mib < 200, r.maxrss_mib
