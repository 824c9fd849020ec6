"""backends/atomic_write.py: readers see the old content or the new, a failed write leaves the old file and no
temporary file, and two writers of one path never share a temporary file."""

from __future__ import annotations

import pytest

from backends.atomic_write import write_atomically, write_text_atomically


def test_writes_creating_the_folder_and_replaces_the_old_content(tmp_path) -> None:
    target = tmp_path / "a" / "b" / "state.json"
    assert write_text_atomically(target, "old") == target
    write_text_atomically(target, "new ü")
    assert target.read_text(encoding="utf-8") == "new ü"
    assert [p.name for p in target.parent.iterdir()] == ["state.json"]


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path) -> None:
    target = tmp_path / "entry.pt"
    write_text_atomically(target, "complete")

    def half(f) -> None:
        f.write(b"half of it")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        write_atomically(target, half)
    assert target.read_text() == "complete"
    assert [p.name for p in tmp_path.iterdir()] == ["entry.pt"]


def test_two_writers_of_one_path_each_rename_a_complete_file(tmp_path) -> None:
    target = tmp_path / "record.json"

    def outer(f) -> None:  # another writer of the same path finishes while this one is half written
        f.write(b"first ")
        write_text_atomically(target, "second")
        f.write(b"writer")

    write_atomically(target, outer)
    assert target.read_text() == "first writer"  # the last rename wins, and neither file was mixed
    assert [p.name for p in tmp_path.iterdir()] == ["record.json"]
