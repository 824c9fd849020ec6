"""Issue 16 item 6: pull verifies or refuses.  A listing without a sha256 (LFS) or blob id is never registered
unverified; a listing that is not JSON, a NUL byte in a file name and malformed repo ids are one line, exit 2.
In-process through app.cli.main against tests/hub's FakeHub."""

from __future__ import annotations

import pytest

from app.cli import main
from app.store import ModelStore
from tests.hub.conftest import hub, tiny_ggufs  # noqa: F401 - fixtures
from tests.hub.hubserver import FakeRepo


def _one_line(capsys: pytest.CaptureFixture[str], match: str) -> None:
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines and lines[0].startswith("hearth: error: ") and match in lines[0], lines
    assert len(lines) == 1 or (len(lines) == 2 and lines[1].startswith("  hint: ")), lines


@pytest.mark.parametrize(
    "repo_id",
    [
        "a/b/c",
        "../etc",
        "owner/has space",
        "a b/c",
        "owner/name\x00x",
        "owner/",
        "/name",
        "owner/--x",
        "owner/a..b",
        "just-a-name",
        "owner/" + "x" * 97,
    ],
)
def test_malformed_repo_ids_touch_nothing(repo_id: str, hub, capsys: pytest.CaptureFixture[str]) -> None:  # noqa: F811
    assert main(["pull", repo_id]) == 2
    _one_line(capsys, "is not a Hugging Face repo id")
    assert hub.log.requests == []  # refused before any network


def test_listing_that_is_not_json(hub, tiny_ggufs, capsys: pytest.CaptureFixture[str]) -> None:  # noqa: F811
    hub.repos["acme/Tiny-GGUF"] = FakeRepo(
        {"Tiny-Q8_0.gguf": tiny_ggufs["Q8_0"]}, listing_body=b"<html>Service Unavailable</html>"
    )
    assert main(["pull", "acme/Tiny-GGUF"]) == 2
    _one_line(capsys, "answered the listing of acme/Tiny-GGUF with something that is not JSON")


def test_listing_that_is_json_but_not_a_listing(hub, capsys: pytest.CaptureFixture[str]) -> None:  # noqa: F811
    hub.repos["acme/Tiny-GGUF"] = FakeRepo({}, listing_body=b'{"siblings": [{"size": 3}]}')
    assert main(["pull", "acme/Tiny-GGUF"]) == 2
    _one_line(capsys, "listing of acme/Tiny-GGUF is malformed")


@pytest.mark.parametrize(
    "name",
    [
        "evil\x00.gguf",
        "../escape-Q8_0.gguf",
        "/abs/Tiny-Q8_0.gguf",
        "sub//x.gguf",
        "bell\x07-Q8_0.gguf",
        "back\\slash-Q8_0.gguf",
    ],
)
def test_listed_file_names_that_cannot_be_files(
    name: str,
    hub,  # noqa: F811
    tiny_ggufs,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:
    hub.repos["acme/Tiny-GGUF"] = FakeRepo({"Tiny-Q8_0.gguf": tiny_ggufs["Q8_0"], name: b"x"})
    assert main(["pull", "acme/Tiny-GGUF", "--quant", "Q8_0"]) == 2
    _one_line(capsys, "is malformed: the file name")
    assert not [r for r in hub.log.requests if "/resolve/" in r[1]]  # nothing downloaded


def test_lfs_file_without_sha256_is_never_registered(
    hub,  # noqa: F811
    tiny_ggufs,  # noqa: F811
    capsys: pytest.CaptureFixture[str],
) -> None:
    hub.repos["acme/Tiny-GGUF"] = FakeRepo({"Tiny-Q8_0.gguf": tiny_ggufs["Q8_0"]}, no_hash={"Tiny-Q8_0.gguf"})
    assert main(["pull", "acme/Tiny-GGUF", "--quant", "Q8_0"]) == 2
    _one_line(capsys, "listing of acme/Tiny-GGUF is malformed: an entry lacks 'sha256'")
    assert not [r for r in hub.log.requests if "/resolve/" in r[1]]
    assert ModelStore().get("tiny-gguf:q8_0") is None


def test_small_file_without_blob_id_is_refused_before_downloading(hub, capsys: pytest.CaptureFixture[str]) -> None:  # noqa: F811
    config = (
        b'{"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "num_hidden_layers": 1, '
        b'"num_attention_heads": 4, "vocab_size": 256}'
    )
    hub.repos["acme/Tiny"] = FakeRepo({"config.json": config, "model.safetensors": b"\0" * 64}, no_hash={"config.json"})
    assert main(["pull", "acme/Tiny"]) == 2
    _one_line(capsys, "lists no sha256 (LFS) or git blob id for 'config.json' of acme/Tiny")
    assert not [r for r in hub.log.requests if "/resolve/" in r[1]]
    assert ModelStore().get("tiny") is None


def test_verify_refuses_a_file_with_no_hash() -> None:
    """Defence in depth: verify() itself never passes a file it has nothing to check against."""
    from pathlib import Path
    from tempfile import TemporaryDirectory

    from app.hub.pull import PullError, verify
    from app.hub.select import RemoteFile

    with TemporaryDirectory() as d:
        p = Path(d) / "f.bin"
        p.write_bytes(b"data")
        with pytest.raises(PullError, match="no sha256 or git blob id"):
            verify(p, RemoteFile("f.bin", 4, None, None))
        assert not p.exists()
