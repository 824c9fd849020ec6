"""Write a file so that readers see the old content or the new, never half of it: a temporary file in the same
folder (a unique name, so two processes writing one path never share it), renamed over the target.

No fsync: every file written this way is a cache or small state that is rebuilt or re-remembered when lost,
and a reader already copes with a missing file.  The last writer of a path wins.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO


def write_atomically(path: str | os.PathLike[str], write: Callable[[IO[bytes]], None]) -> Path:
    """Create the folder, call `write` on a temporary binary file beside `path`, rename it to `path`.  Any error
    (OSError from the disk, whatever `write` raises) propagates and leaves no temporary file behind."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def write_text_atomically(path: str | os.PathLike[str], text: str) -> Path:
    """write_atomically for UTF-8 text."""
    data = text.encode("utf-8")
    return write_atomically(path, lambda f: f.write(data))
