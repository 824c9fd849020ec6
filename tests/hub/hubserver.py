"""A tiny Hugging Face Hub look-alike on 127.0.0.1 for tests: the endpoints huggingface_hub really calls.

- GET  /api/models/{owner}/{name}[/revision/{rev}]?blobs=True   model info with siblings (size, blobId, lfs.sha256)
- HEAD /{owner}/{name}/resolve/{rev}/{file}     X-Repo-Commit, ETag / X-Linked-Etag, X-Linked-Size, Content-Length
- GET  same, honouring `Range: bytes=N-` with 206 + Content-Range
Errors carry X-Error-Code (RepoNotFound, RevisionNotFound, EntryNotFound, GatedRepo) as the real hub does, which
is how huggingface_hub.utils.hf_raise_for_status picks its exception class.
Per-repo switches: `gated`, `corrupt` (file names served with flipped bytes), `drop_once` (file names whose first
GET sends half the body, then drops the connection), `no_hash` (file names listed without their sha256 / blob id),
`listing_body` (raw bytes served instead of the JSON listing).
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit


@dataclass
class FakeRepo:
    files: dict[str, bytes]
    commit: str = "0123456789abcdef0123456789abcdef01234567"
    gated: bool = False
    corrupt: set[str] = field(default_factory=set)
    drop_once: set[str] = field(default_factory=set)
    no_hash: set[str] = field(default_factory=set)
    listing_body: bytes | None = None
    lfs_suffixes: tuple[str, ...] = (".gguf", ".safetensors")

    def is_lfs(self, name: str) -> bool:
        return name.endswith(self.lfs_suffixes)


@dataclass
class HubLog:
    requests: list[tuple[str, str, str | None]] = field(default_factory=list)  # (method, path, Range header)


def _sha1_blob(data: bytes) -> str:
    return hashlib.sha1(f"blob {len(data)}\0".encode() + data).hexdigest()


class FakeHub:
    def __init__(self) -> None:
        self.repos: dict[str, FakeRepo] = {}
        self.log = HubLog()
        self._dropped: set[tuple[str, str]] = set()
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                hub._handle(self, "GET")

            def do_HEAD(self) -> None:
                hub._handle(self, "HEAD")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    # -- handlers -----------------------------------------------------------------------------------------
    def _error(self, h: BaseHTTPRequestHandler, status: int, code: str, commit: str | None = None) -> None:
        body = json.dumps({"error": code}).encode()
        h.send_response(status)
        h.send_header("X-Error-Code", code)
        h.send_header("X-Error-Message", code)
        if commit:
            h.send_header("X-Repo-Commit", commit)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        if h.command != "HEAD":
            h.wfile.write(body)

    def _handle(self, h: BaseHTTPRequestHandler, method: str) -> None:
        path = unquote(urlsplit(h.path).path)
        self.log.requests.append((method, path, h.headers.get("Range")))
        m = re.fullmatch(r"/api/models/([^/]+/[^/]+)(?:/revision/([^/]+))?", path)
        if m:
            return self._info(h, m.group(1), m.group(2))
        m = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
        if m:
            return self._resolve(h, method, m.group(1), m.group(2), m.group(3))
        self._error(h, 404, "RepoNotFound")

    def _repo(self, h: BaseHTTPRequestHandler, repo_id: str, rev: str | None) -> FakeRepo | None:
        repo = self.repos.get(repo_id)
        if repo is None:
            self._error(h, 401, "RepoNotFound")
            return None
        if rev not in (None, "main", repo.commit):
            self._error(h, 404, "RevisionNotFound")
            return None
        return repo

    def _info(self, h: BaseHTTPRequestHandler, repo_id: str, rev: str | None) -> None:
        repo = self._repo(h, repo_id, rev)
        if repo is None:
            return
        siblings = []
        for name, data in sorted(repo.files.items()):
            s: dict[str, object] = {"rfilename": name, "size": len(data), "blobId": _sha1_blob(data)}
            if repo.is_lfs(name):
                s["lfs"] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest(), "pointerSize": 134}
            if name in repo.no_hash:
                s.pop("blobId")
                s.get("lfs", {}).pop("sha256", None)
            siblings.append(s)
        body = json.dumps(
            {
                "id": repo_id,
                "modelId": repo_id,
                "sha": repo.commit,
                "private": False,
                "gated": "auto" if repo.gated else False,
                "siblings": siblings,
            }
        ).encode()
        if repo.listing_body is not None:
            body = repo.listing_body
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    def _resolve(self, h: BaseHTTPRequestHandler, method: str, repo_id: str, rev: str, name: str) -> None:
        repo = self._repo(h, repo_id, rev)
        if repo is None:
            return
        if repo.gated:
            return self._error(h, 403, "GatedRepo", repo.commit)
        if name not in repo.files:
            return self._error(h, 404, "EntryNotFound", repo.commit)
        data = repo.files[name]
        if name in repo.corrupt:
            data = bytes([data[0] ^ 0xFF]) + data[1:]
        etag = hashlib.sha256(repo.files[name]).hexdigest() if repo.is_lfs(name) else _sha1_blob(repo.files[name])
        start = 0
        rng = h.headers.get("Range")
        if rng and method == "GET":
            start = int(re.fullmatch(r"bytes=(\d+)-\d*", rng).group(1))  # type: ignore[union-attr]
        h.send_response(206 if start else 200)
        h.send_header("X-Repo-Commit", repo.commit)
        h.send_header("ETag", f'"{etag}"')
        if repo.is_lfs(name):
            h.send_header("X-Linked-Etag", f'"{etag}"')
            h.send_header("X-Linked-Size", str(len(data)))
        h.send_header("Accept-Ranges", "bytes")
        if start:
            h.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        h.send_header("Content-Length", str(len(data) - start))
        h.end_headers()
        if method == "HEAD":
            return
        key = (repo_id, name)
        if name in repo.drop_once and key not in self._dropped:
            self._dropped.add(key)
            h.wfile.write(data[start : start + (len(data) - start) // 2])
            h.wfile.flush()
            h.close_connection = True
            import socket

            h.connection.shutdown(socket.SHUT_RDWR)
            return
        h.wfile.write(data[start:])
