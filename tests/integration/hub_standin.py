"""A local HTTP stand-in of the Hugging Face Hub's API, for the hf:// layer and data tests.

No Hub server can run here, so this stand-in answers the endpoints the real `huggingface_hub`
client calls when `HfApi(endpoint=...)` points at it: create a repo, preupload (upload mode per
file), the LFS batch API with the basic transfer (PUT, then verify), commit (ndjson: regular
files, LFS files, deletions), paths-info, the recursive tree listing and resolve (download,
with a `Range: bytes=<from>-` answered as 206 Partial Content), for model repositories and for
dataset repositories (`repo_type="dataset"`: the `datasets/` routes; kept in `repos` under
`datasets/<owner>/<name>`, see `repo_key`).
Like the Hub, it checks the token on every request, refuses an LFS object whose sha256 is not
its oid (LFS uploads go to presigned URLs, as on the Hub), and reports each file's git blob id
and LFS sha256. It can answer the next commits
with an error (e.g. 429 with Retry-After) to exercise the client's backoff. It speaks the LFS
protocol only (no Xet storage), so the tests turn the client's Xet path off.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlparse

# Like the Hub's .gitattributes defaults: safetensors in LFS, small JSON files in git.
LFS_SUFFIXES = (".safetensors", ".bin")
LFS_POINTER_SIZE = 134
REPO = r"(?P<repo>[^/]+/[^/]+)"
# API routes name the repository's kind; git and file routes prefix a dataset with datasets/.
API_KIND = r"(?P<kind>models|datasets)"
URL_KIND = r"(?:(?P<kind>datasets)/)?"
DATASETS = "datasets"
RANGE = re.compile(r"bytes=([0-9]+)-")


def repo_key(repo: str, kind: str | None = None) -> str:
    """Where `HubState.repos` keeps a repository: its id, a dataset's under datasets/."""
    return f"{DATASETS}/{repo}" if kind in (DATASETS, "dataset") else repo


def blob_id(data: bytes) -> str:
    """The git blob id of `data`."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class Entry:
    """One file of a repo: in git (content) or in LFS (oid of the stored object)."""

    size: int
    blob: str
    lfs_oid: str | None = None
    content: bytes = b""


@dataclass
class HubState:
    """Everything the stand-in holds; tests read and tamper with it."""

    token: str
    repos: dict[str, dict[str, Entry]] = field(default_factory=dict)
    lfs: dict[str, bytes] = field(default_factory=dict)
    commits: list[tuple[str, list[dict[str, Any]]]] = field(default_factory=list)
    # Statuses to answer the next commits with, in order (e.g. [429]).
    fail_commits: list[int] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    # Answer a range request with the whole file (200), as a server without range support.
    ignore_range: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)


class Handler(BaseHTTPRequestHandler):
    """Routes one request of the Hub's API."""

    server: HubServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the tests assert on `HubState.requests`."""

    @property
    def state(self) -> HubState:
        return self.server.state

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            # The client streams a file body without a length (chunked transfer encoding).
            data = b""
            while size := int(self.rfile.readline().split(b";")[0], 16):
                data += self.rfile.read(size)
                self.rfile.readline()
            self.rfile.readline()
            return data
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _send(self, status: int, body: Any = None, headers: dict[str, str] | None = None) -> None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(status)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        if not isinstance(body, bytes):
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _error(self, status: int, code: str, message: str) -> None:
        self._send(status, {"error": message}, {"X-Error-Code": code, "X-Error-Message": message})

    def _signature(self, path: str) -> str:
        return hashlib.sha256(f"{self.state.token}:{path}".encode()).hexdigest()

    def _authorized(self) -> bool:
        if self.headers.get("Authorization") == f"Bearer {self.state.token}":
            return True
        self._error(401, "Unauthorized", "Invalid credentials in Authorization header")
        return False

    def _route(self, method: str) -> None:
        url = urlparse(self.path)
        path = unquote(url.path)
        self.state.requests.append(f"{method} {path}")
        body = self._body()
        # LFS uploads go to a presigned URL (on the Hub: storage), so they carry no token.
        presigned = parse_qs(url.query).get("signature") == [self._signature(path)]
        if not presigned and not self._authorized():
            return
        routes = [
            ("POST", r"/api/repos/create", self._create_repo),
            ("POST", rf"/api/{API_KIND}/{REPO}/preupload/[^/]+", self._preupload),
            ("POST", rf"/{URL_KIND}{REPO}\.git/info/lfs/objects/batch", self._lfs_batch),
            ("PUT", r"/lfs/(?P<oid>[0-9a-f]{64})", self._lfs_put),
            ("POST", r"/lfs/verify", self._lfs_verify),
            ("POST", rf"/api/{API_KIND}/{REPO}/commit/[^/]+", self._commit),
            ("POST", rf"/api/{API_KIND}/{REPO}/paths-info/[^/]+", self._paths_info),
            ("GET", rf"/api/{API_KIND}/{REPO}/tree/[^/]+(?P<sub>/.*)?", self._tree),
            ("GET", rf"/{URL_KIND}{REPO}/resolve/[^/]+/(?P<file>.+)", self._resolve),
            ("HEAD", rf"/{URL_KIND}{REPO}/resolve/[^/]+/(?P<file>.+)", self._resolve),
        ]
        for verb, pattern, handler in routes:
            match = re.fullmatch(pattern, path)
            if verb == method and match:
                with self.state.lock:
                    handler(body, **match.groupdict())
                return
        self._error(404, "NotFound", f"the stand-in has no route for {method} {path}")

    def do_GET(self) -> None:
        self._route("GET")

    def do_HEAD(self) -> None:
        self._route("HEAD")

    def do_POST(self) -> None:
        self._route("POST")

    def do_PUT(self) -> None:
        self._route("PUT")

    def _repo(self, repo: str, kind: str | None) -> dict[str, Entry] | None:
        files = self.state.repos.get(repo_key(repo, kind))
        if files is None:
            self._error(404, "RepoNotFound", f"Repository not found: {repo}")
        return files

    def _create_repo(self, body: bytes) -> None:
        request = json.loads(body)
        repo = f"{request['organization']}/{request['name']}"
        key = repo_key(repo, request.get("type"))
        if key in self.state.repos:
            # As the Hub answers: the client's create_repo(exist_ok=True) reads the url.
            message = "You already created this repo"
            headers = {"X-Error-Code": "RepoExists", "X-Error-Message": message}
            self._send(409, {"error": message, "url": f"{self.server.url}/{key}"}, headers)
            return
        self.state.repos[key] = {}
        self._send(200, {"url": f"{self.server.url}/{key}", "name": repo})

    def _preupload(self, body: bytes, repo: str, kind: str | None) -> None:
        if self._repo(repo, kind) is None:
            return
        files = json.loads(body)["files"]
        modes = [
            {
                "path": f["path"],
                "uploadMode": "lfs" if f["path"].endswith(LFS_SUFFIXES) else "regular",
                "shouldIgnore": False,
            }
            for f in files
        ]
        self._send(200, {"files": modes, "commitOid": "0" * 40})

    def _lfs_batch(self, body: bytes, repo: str, kind: str | None) -> None:
        request = json.loads(body)
        objects = []
        for item in request["objects"]:
            entry: dict[str, Any] = {"oid": item["oid"], "size": item["size"]}
            if item["oid"] not in self.state.lfs:  # already stored: nothing to send again
                entry["actions"] = {
                    "upload": {"href": self._presigned(f"/lfs/{item['oid']}"), "header": {}},
                    "verify": {"href": f"{self.server.url}/lfs/verify", "header": {}},
                }
            objects.append(entry)
        self._send(200, {"transfer": "basic", "objects": objects})

    def _presigned(self, path: str) -> str:
        return f"{self.server.url}{path}?signature={self._signature(path)}"

    def _lfs_put(self, body: bytes, oid: str) -> None:
        if hashlib.sha256(body).hexdigest() != oid:
            self._error(400, "BadOid", "the uploaded content does not match its sha256 oid")
            return
        self.state.lfs[oid] = body
        self._send(200, {})

    def _lfs_verify(self, body: bytes) -> None:
        request = json.loads(body)
        stored = self.state.lfs.get(request["oid"])
        if stored is None or len(stored) != request["size"]:
            self._error(404, "NotFound", "no such LFS object")
            return
        self._send(200, {})

    def _commit(self, body: bytes, repo: str, kind: str | None) -> None:
        files = self._repo(repo, kind)
        if files is None:
            return
        if self.state.fail_commits:
            status = self.state.fail_commits.pop(0)
            self._send(status, {"error": "slow down"}, {"Retry-After": "1"})
            return
        lines = [json.loads(line) for line in body.splitlines() if line.strip()]
        for line in lines:
            key, value = line["key"], line["value"]
            if key == "file":
                data = base64.b64decode(value["content"])
                files[value["path"]] = Entry(len(data), blob_id(data), content=data)
            elif key == "lfsFile":
                stored = self.state.lfs.get(value["oid"])
                if stored is None:
                    self._error(422, "LfsMissing", f"LFS object of {value['path']} not uploaded")
                    return
                pointer = b"version https://git-lfs.github.com/spec/v1\noid sha256:%s\n" % (
                    value["oid"].encode()
                )
                files[value["path"]] = Entry(len(stored), blob_id(pointer), lfs_oid=value["oid"])
            elif key == "deletedFile":
                files.pop(value["path"], None)
            elif key == "deletedFolder":
                folder = value["path"].rstrip("/") + "/"
                for path in [p for p in files if p.startswith(folder)]:
                    del files[path]
        self.state.commits.append((repo, lines))
        oid = hashlib.sha1(body).hexdigest()
        self._send(200, {"commitUrl": f"{self.server.url}/{repo}/commit/{oid}", "commitOid": oid})

    def _info(self, path: str, entry: Entry) -> dict[str, Any]:
        info: dict[str, Any] = {"type": "file", "path": path, "size": entry.size, "oid": entry.blob}
        if entry.lfs_oid is not None:
            info["lfs"] = {
                "oid": entry.lfs_oid,
                "size": entry.size,
                "pointerSize": LFS_POINTER_SIZE,
            }
        return info

    def _paths_info(self, body: bytes, repo: str, kind: str | None) -> None:
        files = self._repo(repo, kind)
        if files is None:
            return
        paths = parse_qs(body.decode()).get("paths", [])
        self._send(200, [self._info(p, files[p]) for p in paths if p in files])

    def _tree(self, body: bytes, repo: str, kind: str | None, sub: str | None) -> None:
        files = self._repo(repo, kind)
        if files is None:
            return
        prefix = (sub or "").strip("/")
        listed = [self._info(p, e) for p, e in sorted(files.items()) if p.startswith(prefix)]
        folders = {p.rsplit("/", 1)[0] for p in files if "/" in p and p.startswith(prefix)}
        listed += [{"type": "directory", "path": f, "oid": "0" * 40} for f in sorted(folders)]
        self._send(200, listed)

    def _resolve(self, body: bytes, repo: str, kind: str | None, file: str) -> None:
        files = self._repo(repo, kind)
        if files is None:
            return
        entry = files.get(file)
        if entry is None:
            self._error(404, "EntryNotFound", f"{file} does not exist on main")
            return
        data = self.state.lfs[entry.lfs_oid] if entry.lfs_oid else entry.content
        headers = {"ETag": f'"{entry.lfs_oid or entry.blob}"', "X-Repo-Commit": "0"}
        wanted = RANGE.fullmatch(self.headers.get("Range", ""))
        if wanted is None or self.state.ignore_range:
            self._send(200, data, headers)
            return
        start = int(wanted.group(1))
        if start >= len(data):
            self._error(416, "RangeNotSatisfiable", f"{file} has {len(data)} bytes")
            return
        headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        self._send(206, data[start:], headers)


class HubServer(ThreadingHTTPServer):
    """The stand-in on a free port of `host`; `url` is what `HfApi(endpoint=...)` takes.

    `host` is loopback unless pods must reach it (on real nodes: the host's address on the
    cluster's pod network).
    """

    daemon_threads = True

    def __init__(self, token: str, host: str = "127.0.0.1") -> None:
        super().__init__((host, 0), Handler)
        self.state = HubState(token)
        self.url = f"http://{host}:{self.server_address[1]}"


@contextmanager
def serving(token: str, host: str = "127.0.0.1") -> Iterator[HubServer]:
    """A stand-in served from a thread of this process, shut down on leaving."""
    server = HubServer(token=token, host=host)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
