"""`pull(repo_id, ...)`: fetch a model from the Hugging Face Hub into hearth's store and register it.

Order of work, so that a failure anywhere leaves no half-registered model:
  1. refuse at once when offline (HF_HUB_OFFLINE=1): pulling is the one thing that needs the network;
  2. list the repo at one commit with sizes and LFS sha256 (HfApi.model_info(files_metadata=True));
  3. choose the files (app.hub.select: the quant the plan recommends, or --quant / --file; safetensors repos:
     config, weights and tokenizer, plus --include patterns);
  4. check the free disk space against the bytes still to fetch (shutil.disk_usage) BEFORE downloading;
  5. download each file into models_dir/<owner>--<name>/ with huggingface_hub's own calls (hf_hub_url,
     get_hf_file_metadata: the HEAD with X-Repo-Commit / ETag / X-Linked-Size, and http_get, which retries a
     dropped connection with a Range request); an interrupted run leaves `.partial/<file>.part`, and the next
     run resumes it with a Range request (hf_hub_download would delete its temp file on Ctrl-C);
  6. verify each file's size and sha256 (git blob sha1 for small non-LFS files) against the listing; a mismatch
     deletes the file;
  7. only then register it (ModelStore.add, source="hf", owned=True, the files hearth wrote).
HF_ENDPOINT is read at each call (not only when huggingface_hub was imported), so a mirror or a test server works.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.hub.pull_http import http_module
from app.hub.select import Choice, RemoteFile, choose_gguf, group_ggufs
from app.loading import hardware_report
from app.paths import get_paths
from app.store import ModelEntry, ModelStore
from backends.errors import ModelFormatError
from backends.hf_folder import hf_config_shape
from hwprobe.errors import ConfigError, HearthError
from hwprobe.shape import ModelShape

SAFETENSORS_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "*.safetensors",
    "model.safetensors.index.json",
    "quantize_config.json",  # a GPTQ folder's quantization (AutoGPTQ, GPTQModel): backends/quant_config.py
    "quant_config.json",  # an AWQ folder's (AutoAWQ)
)
DISK_SLACK_BYTES = 256 * 1024 * 1024  # never fill the disk to the last byte


class PullError(HearthError):
    """`hearth pull` could not fetch or verify a model (network, repo access, disk, checksum)."""


@dataclass(frozen=True)
class PullProgress:
    filename: str  # the file being fetched
    done: int  # bytes of this file on disk so far
    total: int  # bytes of this file
    index: int  # 1-based position of this file in the pull
    count: int  # files in the pull


ProgressCallback = Callable[[PullProgress], None]


@dataclass(frozen=True)
class Listing:
    repo_id: str
    revision: str  # the commit sha every download is pinned to
    files: tuple[RemoteFile, ...]
    gated: bool = False


def _endpoint() -> str | None:
    return os.environ.get("HF_ENDPOINT", "").rstrip("/") or None


def is_offline() -> bool:
    from huggingface_hub import constants  # lazy: heavy: huggingface_hub

    env = os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "on", "yes", "true")
    return env or bool(constants.HF_HUB_OFFLINE)


def _hub_error(exc: Exception, repo_id: str, revision: str | None) -> HearthError:
    """huggingface_hub's errors as one-line PullErrors with a way out."""
    from huggingface_hub import errors as e  # lazy: heavy: huggingface_hub

    if isinstance(exc, e.GatedRepoError):
        return PullError(
            f"{repo_id} is a gated repo: its files need accepted terms and a token",
            f"accept them on https://huggingface.co/{repo_id}, then `hf auth login` (or set HF_TOKEN)",
        )
    if isinstance(exc, e.RevisionNotFoundError):
        return PullError(f"{repo_id} has no revision {revision!r}", "check --revision (a branch, tag or commit)")
    if isinstance(exc, e.EntryNotFoundError):
        return PullError(
            f"a file of {repo_id} disappeared from the hub while pulling: {exc}",
            "run the pull again; the repo may have changed",
        )
    if isinstance(exc, e.RepositoryNotFoundError):
        return PullError(
            f"no model repo {repo_id!r} on the hub (or it is private)",
            "check the id (owner/name); for a private repo log in with `hf auth login`",
        )
    if isinstance(exc, e.OfflineModeIsEnabled):
        return _offline_error()
    return PullError(
        f"cannot reach the hub at {_endpoint() or 'https://huggingface.co'}: {type(exc).__name__}: "
        f"{str(exc).splitlines()[0] if str(exc) else ''}".rstrip(": "),
        "`hearth pull` needs the network; models already pulled keep working offline",
    )


def _offline_error() -> PullError:
    return PullError(
        "`hearth pull` needs the network, and offline mode is on (HF_HUB_OFFLINE=1)",
        "unset HF_HUB_OFFLINE on a connected machine; models already pulled work offline",
    )


def list_repo(repo_id: str, revision: str | None = None) -> Listing:
    """The repo's files at one commit, with sizes and LFS sha256."""
    if is_offline():
        raise _offline_error()

    httpx = http_module()
    from huggingface_hub import HfApi  # lazy: heavy: huggingface_hub
    from huggingface_hub import errors as e  # lazy: heavy: huggingface_hub

    try:
        info = HfApi(endpoint=_endpoint()).model_info(repo_id, revision=revision, files_metadata=True)
    except (e.HfHubHTTPError, e.OfflineModeIsEnabled, httpx.HTTPError, OSError) as exc:
        raise _hub_error(exc, repo_id, revision) from None
    except ValueError:  # json.JSONDecodeError and friends: an HTML error page, a captive portal, a broken mirror
        raise PullError(
            f"the hub at {_endpoint() or 'https://huggingface.co'} answered the listing of {repo_id} "
            "with something that is not JSON",
            _MIRROR_HINT,
        ) from None
    except KeyError as exc:  # JSON, but an entry lacks a field (an LFS file without its sha256, ...)
        raise PullError(
            f"the hub's listing of {repo_id} is malformed: an entry lacks {str(exc.args[0])[:40]!r}", _MIRROR_HINT
        ) from None
    except (TypeError, AttributeError) as exc:  # JSON, but not a model listing
        raise PullError(
            f"the hub's listing of {repo_id} is malformed: a field has the wrong type ({str(exc)[:60]})", _MIRROR_HINT
        ) from None
    try:
        files = tuple(_remote_file(s) for s in (info.siblings or []))
    except (TypeError, ValueError, AttributeError) as exc:
        raise PullError(f"the hub's listing of {repo_id} is malformed: {exc}", _MIRROR_HINT) from None
    return Listing(repo_id, str(info.sha or revision or "main"), files, bool(info.gated))


_MIRROR_HINT = "nothing was downloaded; check HF_ENDPOINT (a mirror or proxy may be broken) and try again"
_HEX = frozenset("0123456789abcdef")


def _remote_file(s: Any) -> RemoteFile:
    """One listed file, refused when its name could not be a file in a folder (NUL or control characters,
    absolute, `..`) or its size or hashes are not what the hub writes.  An LFS file is checked by its sha256
    only: its git blob id is the pointer file's, not the content's."""
    name = s.rfilename
    if not isinstance(name, str) or not name or len(name) > 1024:
        raise ValueError(f"a file name is {str(name)[:60]!r}")
    if any(ord(c) < 32 or c == "\x7f" for c in name) or "\\" in name:
        raise ValueError(f"the file name {name[:80]!r} holds a NUL, control character or backslash")
    parts = name.split("/")
    if name.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"the file name {name[:80]!r} is absolute or has an empty, . or .. part")
    size = s.lfs.size if s.lfs else s.size
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise ValueError(f"{name} has size {size!r}")
    sha256 = s.lfs.sha256 if s.lfs else None
    blob_id = None if s.lfs else s.blob_id
    for value, length, what in ((sha256, 64, "sha256"), (blob_id, 40, "blob id")):
        if value is not None and not (isinstance(value, str) and len(value) == length and set(value.lower()) <= _HEX):
            raise ValueError(f"{name} has {what} {str(value)[:70]!r}, not {length} hex digits")
    return RemoteFile(name, size, sha256.lower() if sha256 else None, blob_id.lower() if blob_id else None)


def require_hashes(files: list[RemoteFile], repo_id: str) -> None:
    """Refuse, before downloading, files the hub gives no hash for: nothing is registered unverified."""
    bare = [f.name for f in files if not (f.sha256 or f.blob_id)]
    if bare:
        raise PullError(
            f"the hub lists no sha256 (LFS) or git blob id for {bare[0]!r} of {repo_id}"
            + (f" (and {len(bare) - 1} more)" if len(bare) > 1 else "")
            + ", so hearth cannot verify it",
            _MIRROR_HINT,
        )


def _config_shape(listing: Listing, folder: Path) -> Any | None:
    """The planner's ModelShape from the repo's config.json (fetched, small), or None without one."""
    if not any(f.name == "config.json" for f in listing.files):
        return None

    try:
        cfg = next(f for f in listing.files if f.name == "config.json")
        path = _download(listing, cfg, folder, None, 1, 1)
        verify(Path(path), cfg)
        values = hf_config_shape(json.loads(Path(path).read_text(encoding="utf-8")), listing.repo_id)
        return ModelShape(**{k: v for k, v in values.items() if k in ModelShape.__dataclass_fields__})
    except (KeyError, TypeError, ValueError, ModelFormatError):
        return None  # a config.json the planner cannot read: the size rule decides


def model_folder(repo_id: str) -> Path:
    return get_paths().models_dir / repo_id.replace("/", "--")


def _remaining_bytes(files: list[RemoteFile], folder: Path) -> int:
    """Bytes still to fetch: complete files count 0, partial ones what they still lack."""
    total = 0
    for f in files:
        if (folder / f.name).exists() and (folder / f.name).stat().st_size == f.size:
            continue
        part = partial_path(folder, f.name)
        total += max(0, f.size - (part.stat().st_size if part.exists() else 0))
    return total


def check_disk(files: list[RemoteFile], folder: Path) -> None:
    need = _remaining_bytes(files, folder)
    probe = folder
    while not probe.exists():
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    if free < need + DISK_SLACK_BYTES:
        gib = 1024**3
        raise PullError(
            f"not enough disk space in {probe}: the download needs {need / gib:.2f} GiB "
            f"(+{DISK_SLACK_BYTES // 2**20} MiB slack), {free / gib:.2f} GiB is free",
            "free some space (`hearth rm NAME` deletes pulled models), or set HEARTH_HOME to a "
            "bigger disk; nothing was downloaded",
        )


def _tqdm_for(cb: ProgressCallback | None, name: str, index: int, count: int) -> Any:
    """A tqdm class that forwards hf's byte counts to `cb` and prints nothing itself."""
    from tqdm.auto import tqdm  # lazy: heavy: tqdm

    class _Forward(tqdm):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["disable"] = True
            super().__init__(*args, **kwargs)
            self._done = int(kwargs.get("initial") or 0)
            self._total = int(kwargs.get("total") or 0)
            if cb:
                cb(PullProgress(name, self._done, self._total, index, count))

        def update(self, n: float | None = 1) -> bool | None:
            self._done += int(n or 0)
            if cb:
                cb(PullProgress(name, self._done, self._total, index, count))
            return None

    return _Forward


def partial_path(folder: Path, name: str) -> Path:
    """Where an unfinished download waits to be resumed (hf_hub_download itself deletes its temp file on any
    error, so resuming across runs is done here, with huggingface_hub's own metadata call and http_get)."""
    return folder / ".partial" / (name + ".part")


def _download(
    listing: Listing, f: RemoteFile, folder: Path, cb: ProgressCallback | None, index: int, count: int
) -> str:
    """Fetch one file to folder/f.name, resuming a `.part` file left by an interrupted run (Range request)."""
    httpx = http_module()
    from huggingface_hub import errors as e  # lazy: heavy: huggingface_hub

    # lazy: heavy: huggingface_hub
    from huggingface_hub.file_download import get_hf_file_metadata, hf_hub_url, http_get
    from huggingface_hub.utils import build_hf_headers  # lazy: heavy: huggingface_hub

    target = folder / f.name
    if target.exists() and target.stat().st_size == f.size:
        if cb:
            cb(PullProgress(f.name, f.size, f.size, index, count))
        return str(target)
    part = partial_path(folder, f.name)
    part.parent.mkdir(parents=True, exist_ok=True)
    if part.exists() and part.stat().st_size > f.size:
        part.unlink()  # longer than the file can be: not ours to resume
    endpoint = _endpoint()
    try:
        url = hf_hub_url(listing.repo_id, f.name, revision=listing.revision, endpoint=endpoint)
        meta = get_hf_file_metadata(url, endpoint=endpoint)
        headers = build_hf_headers()
        location = meta.location or url
        if httpx.URL(location).host != httpx.URL(url).host:
            headers.pop("authorization", None)  # a signed CDN url: the token stays with the hub
        with part.open("ab") as fh:
            http_get(
                location,
                fh,
                resume_size=fh.tell(),
                headers=headers,
                expected_size=meta.size or f.size,
                tqdm_class=_tqdm_for(cb, f.name, index, count),
            )
    except (e.HfHubHTTPError, e.OfflineModeIsEnabled) as exc:
        raise _hub_error(exc, listing.repo_id, listing.revision) from None
    except (httpx.HTTPError, OSError) as exc:
        raise PullError(
            f"the download of {f.name} was interrupted after {part.stat().st_size} of {f.size} bytes "
            f"({type(exc).__name__})",
            "run the same `hearth pull` again: it resumes where it stopped; nothing was registered",
        ) from None
    target.parent.mkdir(parents=True, exist_ok=True)
    os.replace(part, target)
    return str(target)


def verify(path: Path, f: RemoteFile) -> None:
    """Size and sha256 (LFS) or git blob sha1 against the hub's listing; a bad file is deleted."""
    size = path.stat().st_size
    problem = None
    if not (f.sha256 or f.blob_id):
        problem = "has no sha256 or git blob id in the hub's listing to check it against"
    elif size != f.size:
        problem = f"is {size} bytes, the hub says {f.size}"
    else:
        h = hashlib.sha256() if f.sha256 else hashlib.sha1(f"blob {size}\0".encode())
        with path.open("rb") as fh:
            while chunk := fh.read(1 << 20):
                h.update(chunk)
        want = f.sha256 or f.blob_id or ""
        if h.hexdigest() != want.lower():
            problem = f"has {'sha256' if f.sha256 else 'git sha1'} {h.hexdigest()[:16]}..., the hub says {want[:16]}..."
    if problem:
        path.unlink(missing_ok=True)
        raise PullError(
            f"{f.name} {problem}: the download is corrupt and was deleted",
            "run the pull again; if it keeps failing the mirror or proxy alters files; nothing was registered",
        )


def _select(
    listing: Listing, folder: Path, quant: str | None, file: str | None, include: list[str] | None, report: Any
) -> tuple[list[RemoteFile], str, str, str]:
    """(files, first file or folder to register, quant label, reason)."""
    files = list(listing.files)
    if include:
        files = [f for f in files if any(fnmatch.fnmatch(f.name, p) for p in include)] or files
    choices = group_ggufs(files)
    if choices:
        if report is None:
            report = hardware_report()
        shape = None if (quant or file) else _config_shape(listing, folder)
        ch: Choice = choose_gguf(choices, report, shape, quant=quant, file=file)
        return list(ch.gguf.files), ch.gguf.first.name, ch.gguf.quant, ch.reason
    wanted = list(SAFETENSORS_FILES) + list(include or [])
    picked = [f for f in listing.files if any(fnmatch.fnmatch(f.name, p) for p in wanted)]
    if any(f.name.endswith(".safetensors") for f in picked) and any(f.name == "config.json" for f in picked):
        return picked, "", "safetensors", "the repo has no GGUF; its safetensors weights are for the torch backend"
    raise PullError(
        f"{listing.repo_id} has no GGUF file and no safetensors model (config.json + *.safetensors)",
        "look for a GGUF version of it (repos named ...-GGUF), or name files with --include",
    )


def pull(
    repo_id: str,
    quant: str | None = None,
    file: str | None = None,
    revision: str | None = None,
    *,
    include: list[str] | None = None,
    name: str | None = None,
    progress: ProgressCallback | None = None,
    report: Any = None,
    on_choice: Callable[[str], None] | None = None,
) -> ModelEntry:
    """Download and register a model; returns its ModelEntry.  Raises PullError / ConfigError / PlanError with
    a one-line message; nothing is registered unless every file arrived and verified.  `on_choice` hears the
    sentence that says which file(s) were chosen and why; `report` (a HardwareReport) skips probing."""
    check_repo_id(repo_id)
    if revision is not None and (not revision or len(revision) > 256 or any(ord(c) <= 32 for c in revision)):
        raise PullError(
            f"--revision {revision[:80]!r} is not a branch, tag or commit name",
            "use a name without spaces or control characters, or a commit sha",
        )
    listing = list_repo(repo_id, revision)
    folder = model_folder(repo_id)
    files, first, label, reason = _select(listing, folder, quant, file, include, report)
    store = ModelStore()
    default = repo_id.split("/")[-1].lower() + (f":{label.lower()}" if first else "")
    entry_name = name or _safe_name(default)
    old = store.get(entry_name)
    replace = old is not None and old.source == "hf" and old.repo == repo_id
    if old is not None and not replace:  # said before downloading, not after
        raise ConfigError(
            f"a model named {entry_name!r} is already registered ({old.path})",
            "pick another with --name, or remove it first with `hearth rm`",
        )
    for f in files:
        if not (folder / f.name).resolve().is_relative_to(folder.resolve()):
            raise PullError(f"the repo lists a file outside its folder: {f.name!r}", "refusing to write it")
    require_hashes(files, repo_id)
    if on_choice:
        on_choice(f"{label}: {reason}")
    check_disk(files, folder)
    for i, f in enumerate(files, 1):
        path = Path(_download(listing, f, folder, progress, i, len(files)))
        verify(path, f)
    target = folder / first if first else folder
    extra = {str(folder / "config.json")} if first and (folder / "config.json").is_file() else set()
    owned = sorted({str(folder / f.name) for f in files} | extra | set(old.files if replace and old else []))
    entry, _ = store.add(
        target,
        entry_name,
        source="hf",
        repo=repo_id,
        revision=listing.revision,
        owned=True,
        files=owned,
        replace=replace,
    )
    return entry


_REPO_PART = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,94}[A-Za-z0-9_])?")


def check_repo_id(repo_id: str) -> None:
    """owner/name as the hub allows them: letters, digits, _ . - (not first or last), at most 96 characters
    each, no `--` or `..`.  Refuses `a/b/c`, `../etc`, ids with spaces or NUL before anything touches the
    network or the disk (the id becomes a folder name)."""
    parts = repo_id.split("/")
    if len(parts) != 2 or not all(_REPO_PART.fullmatch(p) for p in parts) or "--" in repo_id or ".." in repo_id:
        raise PullError(
            f"{repo_id[:120]!r} is not a Hugging Face repo id",
            "use owner/name: letters, digits, _ . - (e.g. bartowski/Qwen2.5-7B-Instruct-GGUF)",
        )


def _safe_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._:@+-]", "-", name)[:128].lstrip("-._") or "model"
