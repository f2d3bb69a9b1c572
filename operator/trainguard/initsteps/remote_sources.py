"""Data sources on remote servers, through the remote checkpoint layers' clients.

Each backend implements `trainguard.initsteps.sources.Source` with the client and credential
handling of the layer of the same scheme (`trainguard.layers.s3`, `.ssh`, `.hf`): the same
Secret keys (read from the data source's own Secret, mounted into the `stage-data` step only),
the same endpoint variables, the same host-key policy.

| source | listing | fingerprint of each file | ranged read |
|---|---|---|---|
| `s3://bucket/prefix` | ListObjectsV2 | ETag, checked by HEAD (see below) | GET, `Range` |
| `ssh://[user@]host[:port]/path` | SFTP walk | sha256 by `sha256sum` on the host | SFTP reads |
| `hf://datasets/owner/name[@rev][/path]` | repository tree | LFS sha256, or git blob id | `Range` |

S3: the listing gives each object's ETag, and a HEAD of the object, on request, says what it
is. A single-part object's ETag is the MD5 of its content, unless the object is encrypted with
KMS. A multipart object's ETag (`<MD5 of the parts' MD5s>-<parts>`) depends on the part size:
HEAD of its first and last parts (`partNumber`) gives it, used only when those agree with the
object's size (every part the first one's size but the last). Otherwise the object has no
fingerprint and staging hashes it by reading. SSH: hashing on the host reads the whole file
there, so it is asked for on request, file by file. The Hub: its listing gives every file's.

Every error of a client becomes a `SourceError` that names the source and the operation, whose
message passes through `Credentials.redact` and which never chains the client's exception (its
arguments could hold a request with credentials in it).
"""

from __future__ import annotations

import posixpath
import re
import stat
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar
from urllib.parse import urlparse

import paramiko
from botocore.exceptions import ClientError
from huggingface_hub import HfApi
from huggingface_hub.errors import HfHubHTTPError
from huggingface_hub.hf_api import RepoFile

from trainguard.api.constants import UriScheme
from trainguard.ckpt import SHA256
from trainguard.initsteps.sources import (
    DATA_MANIFEST_FILENAME,
    Source,
    SourceError,
    SourceFile,
    SourceReader,
)
from trainguard.layers import Credentials, LayerError
from trainguard.layers.base import MAX_MESSAGE, error_chain
from trainguard.layers.fingerprints import MD5, S3_MULTIPART, Fingerprint
from trainguard.layers.hf import REVISION, hf_api, repo_file_fingerprint, stream_file
from trainguard.layers.s3 import NOT_FOUND, s3_client
from trainguard.layers.ssh import SshTarget, connect, remote_sha256, ssh_target

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

# Who the credential helpers' errors name.
WHO = "the data source"
HF_DATASETS_PREFIX = "hf://datasets/"
HF_REPO_TYPE = "dataset"
HF_NOT_FOUND = 404
SINGLE_PART_ETAG = re.compile(r"[0-9a-f]{32}")
MULTIPART_ETAG = re.compile(r"[0-9a-f]{32}-([0-9]+)")
# Server-side encryption whose ETags are no MD5 of the content.
KMS_ENCRYPTIONS = frozenset({"aws:kms", "aws:kms:dsse"})
NS_PER_S = 10**9
# A channel the server refuses is asked for again this many times, after 0.1, 0.2, 0.4 s.
CHANNEL_ATTEMPTS = 4
CHANNEL_BACKOFF_S = 0.1

T = TypeVar("T")


class _Errors:
    """Turns a client's exceptions into redacted `SourceError`s that name the source."""

    def __init__(self, description: str, credentials: Credentials) -> None:
        self.description = description
        self.credentials = credentials

    @contextmanager
    def __call__(self, action: str) -> Iterator[None]:
        try:
            yield
        except SourceError:
            raise
        except Exception as err:  # every client library has its own exception types
            message = f"{self.description}: {action}: {error_chain(err)}"
            raise SourceError(self.credentials.redact(message)[:MAX_MESSAGE]) from None


class _Reader:
    """A `SourceReader` over a client's read and close, with its errors turned into ours."""

    def __init__(
        self,
        read: Callable[[int], bytes],
        close: Callable[[], None],
        errors: _Errors,
        path: str,
    ) -> None:
        self._read = read
        self._close = close
        self._errors = errors
        self._path = path

    def read(self, size: int) -> bytes:
        """Up to `size` bytes (a stream may give fewer); empty at the end."""
        with self._errors(f"reading {self._path}"):
            return self._read(size)

    def close(self) -> None:
        """Release the stream or the file handle."""
        with self._errors(f"closing {self._path}"):
            self._close()


class S3Source:
    """Objects under a bucket's prefix (`s3://bucket/prefix`), as a `Source`."""

    def __init__(self, uri: str, client: S3Client, credentials: Credentials) -> None:
        parsed = urlparse(uri)
        prefix = parsed.path.strip("/")
        self.uri = uri
        self.bucket = parsed.netloc
        self.prefix = f"{prefix}/" if prefix else ""
        self.client = client
        self.errors = _Errors(uri, credentials)
        # The listing's ETags, for the fingerprints asked for later.
        self._etags: dict[str, str] = {}

    @property
    def description(self) -> str:
        """The URI."""
        return self.uri

    def list_files(self) -> list[SourceFile]:
        """Every object under the prefix (folder markers and the data manifest left out)."""
        files = []
        with self.errors("listing"):
            pages = self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=self.prefix
            )
            for page in pages:
                for item in page.get("Contents", []):
                    path = item["Key"][len(self.prefix) :]
                    if not path or path.endswith("/") or path == DATA_MANIFEST_FILENAME:
                        continue
                    self._etags[path] = item["ETag"].strip('"')
                    mtime_ns = int(item["LastModified"].timestamp()) * NS_PER_S
                    files.append(SourceFile(path, item["Size"], mtime_ns))
        return sorted(files, key=lambda item: item.path)

    def read_manifest(self) -> bytes | None:
        """DATA_MANIFEST.json under the prefix, if present."""
        with self.errors(f"reading {DATA_MANIFEST_FILENAME}"):
            try:
                response = self.client.get_object(
                    Bucket=self.bucket, Key=self.prefix + DATA_MANIFEST_FILENAME
                )
            except ClientError as err:
                if err.response.get("Error", {}).get("Code") in NOT_FOUND:
                    return None
                raise
            return response["Body"].read()

    def fingerprint(self, file: SourceFile) -> Fingerprint | None:
        """The object's ETag as a fingerprint, when HEAD says it is one (see the module)."""
        etag = self._etags.get(file.path, "")
        single = SINGLE_PART_ETAG.fullmatch(etag)
        multipart = MULTIPART_ETAG.fullmatch(etag)
        if single is None and multipart is None:
            return None
        key = self.prefix + file.path
        with self.errors(f"reading the head of {file.path}"):
            try:
                head = (
                    self.client.head_object(Bucket=self.bucket, Key=key, PartNumber=1)
                    if multipart
                    else self.client.head_object(Bucket=self.bucket, Key=key)
                )
                if head.get("ServerSideEncryption") in KMS_ENCRYPTIONS:
                    return None  # the ETag of an object encrypted with KMS is no MD5
                if multipart is None:
                    return Fingerprint(MD5, etag)
                parts = int(multipart.group(1))
                last = (
                    self.client.head_object(Bucket=self.bucket, Key=key, PartNumber=parts)
                    if parts > 1
                    else head
                )
            except ClientError:
                return None  # e.g. a server without partNumber: the object is hashed by reading
        part_bytes, last_bytes = head["ContentLength"], last["ContentLength"]
        uniform = 0 < last_bytes <= part_bytes and (
            (parts - 1) * part_bytes + last_bytes == file.size
        )
        return Fingerprint(S3_MULTIPART, etag, part_bytes) if uniform else None

    def open(self, path: str, offset: int = 0) -> SourceReader:
        """GET the object, from `offset` on (a range request)."""
        with self.errors(f"opening {path}"):
            key = self.prefix + path
            if offset:
                response = self.client.get_object(
                    Bucket=self.bucket, Key=key, Range=f"bytes={offset}-"
                )
            else:
                response = self.client.get_object(Bucket=self.bucket, Key=key)
        body = response["Body"]
        return _Reader(body.read, body.close, self.errors, path)


class SshSource:
    """A directory on a host reached over SSH (`ssh://[user@]host[:port]/path`), as a `Source`.

    One connection, and a pool of SFTP sessions on it: an operation (a listing, a file being
    read) holds one session while it runs, since a session serves one caller at a time, and
    gives it back for the next. A failed operation drops the connection it used, with its
    sessions (the transport may look alive until its reader sees the end): the next operation
    reconnects instead of using a session that may be dead.
    """

    def __init__(self, uri: str, target: SshTarget, credentials: Credentials) -> None:
        self.uri = uri
        self.target = target
        self.root = target.root.rstrip("/") or "/"
        self.errors = _Errors(uri, credentials)
        self._lock = threading.Lock()
        self._client: paramiko.SSHClient | None = None
        self._generation = 0
        self._idle: list[paramiko.SFTPClient] = []

    @property
    def description(self) -> str:
        """The URI."""
        return self.uri

    def _connection(self) -> tuple[paramiko.SSHClient, int]:
        with self._lock:
            transport = self._client.get_transport() if self._client else None
            if self._client is None or transport is None or not transport.is_active():
                self._close_locked()
                target = self.target
                self._client = connect(
                    target.host, target.port, target.username, target.key_file, target.known_hosts
                )
                self._generation += 1
            return self._client, self._generation

    def _close_locked(self) -> None:
        if self._client is not None:
            self._client.close()  # its sessions with it
        self._client, self._idle = None, []

    def _on_channel(self, use: Callable[[paramiko.SSHClient], T]) -> tuple[T, int]:
        """`use(client)`, which opens a channel; a channel the server refuses is asked again.

        A server refuses sessions over its limit (sshd's MaxSessions, 10) while it is still
        closing earlier ones; the connection itself is sound then, and kept.
        """
        refused = 0
        while True:
            client, generation = self._connection()
            try:
                return use(client), generation
            except paramiko.SSHException:
                transport = client.get_transport()
                if transport is None or not transport.is_active():
                    self._drop(generation)
                    raise
                refused += 1
                if refused == CHANNEL_ATTEMPTS:
                    raise
            time.sleep(CHANNEL_BACKOFF_S * 2 ** (refused - 1))

    def _acquire(self) -> tuple[paramiko.SFTPClient, int]:
        self._connection()  # a dead connection is replaced, its idle sessions with it
        with self._lock:
            if self._idle:
                return self._idle.pop(), self._generation
        return self._on_channel(lambda client: client.open_sftp())

    def _release(self, sftp: paramiko.SFTPClient, generation: int) -> None:
        with self._lock:
            if generation == self._generation and self._client is not None:
                self._idle.append(sftp)
                return
        sftp.close()

    @contextmanager
    def _session(self) -> Iterator[paramiko.SFTPClient]:
        sftp, generation = self._acquire()
        try:
            with self._dropping(generation):
                yield sftp
        finally:
            self._release(sftp, generation)

    @contextmanager
    def _dropping(self, generation: int) -> Iterator[None]:
        """Drop connection `generation` when the operation in the block fails."""
        try:
            yield
        except BaseException:
            self._drop(generation)
            raise

    def _drop(self, generation: int) -> None:
        # Only that one: another thread may have reconnected since, and its connection is sound.
        with self._lock:
            if generation == self._generation:
                self._close_locked()

    def _path(self, path: str) -> str:
        return posixpath.join(self.root, path)

    def list_files(self) -> list[SourceFile]:
        """Walk the directory over SFTP (regular files, and symlinks to them)."""
        with self.errors("listing"), self._session() as sftp:
            files = self._walk(sftp, "")
        return sorted(files, key=lambda item: item.path)

    def _walk(self, sftp: paramiko.SFTPClient, relative: str) -> list[SourceFile]:
        files = []
        for entry in sftp.listdir_attr(self._path(relative)):
            path = posixpath.join(relative, entry.filename) if relative else entry.filename
            mode = entry.st_mode or 0
            if stat.S_ISDIR(mode):
                files += self._walk(sftp, path)
                continue
            if stat.S_ISLNK(mode):
                entry = sftp.stat(self._path(path))  # a symlinked file counts; a directory not
                mode = entry.st_mode or 0
            if not stat.S_ISREG(mode) or path == DATA_MANIFEST_FILENAME:
                continue
            mtime = entry.st_mtime
            size = entry.st_size or 0
            files.append(SourceFile(path, size, None if mtime is None else mtime * NS_PER_S))
        return files

    def read_manifest(self) -> bytes | None:
        """DATA_MANIFEST.json at the root, if present."""
        with self.errors(f"reading {DATA_MANIFEST_FILENAME}"), self._session() as sftp:
            try:
                with sftp.open(self._path(DATA_MANIFEST_FILENAME), "rb") as reader:
                    return reader.read()
            except FileNotFoundError:
                return None

    def fingerprint(self, file: SourceFile) -> Fingerprint | None:
        """The sha256 the remote host computes of the file where it lies."""
        path = self._path(file.path)
        with self.errors(f"hashing {file.path} on the remote host"):
            digests, _ = self._on_channel(lambda client: remote_sha256(client, [path]))
        digest = digests.get(path)
        return Fingerprint(SHA256, digest) if digest else None

    def open(self, path: str, offset: int = 0) -> SourceReader:
        """Open the file over SFTP; each read asks for its whole chunk at once (pipelined)."""
        with self.errors(f"opening {path}"):
            sftp, generation = self._acquire()
            try:
                with self._dropping(generation):
                    handle = sftp.open(self._path(path), "rb")
                    size = handle.stat().st_size or 0
            except BaseException:
                self._release(sftp, generation)
                raise
        position = offset

        def read(count: int) -> bytes:
            nonlocal position
            want = min(count, size - position)
            if want <= 0:
                return b""
            # One request per 32 KiB, all in flight together: the chunk arrives in one round trip.
            with self._dropping(generation):
                data = b"".join(handle.readv([(position, want)]))
            position += len(data)
            return data

        def close() -> None:
            try:
                handle.close()
            finally:
                self._release(sftp, generation)

        return _Reader(read, close, self.errors, path)


class HfSource:
    """A dataset repository on the Hub at a revision (and a folder in it), as a `Source`."""

    def __init__(self, uri: str, api: HfApi, credentials: Credentials) -> None:
        if not uri.startswith(HF_DATASETS_PREFIX):
            raise SourceError(
                f"{uri}: an hf:// data source is a dataset repository, "
                f"{HF_DATASETS_PREFIX}<owner>/<name>[@<revision>][/<path>]"
            )
        owner, _, rest = uri.removeprefix(HF_DATASETS_PREFIX).partition("/")
        name_revision, _, folder = rest.partition("/")
        name, _, revision = name_revision.partition("@")
        self.uri = uri
        self.repo_id = f"{owner}/{name}"
        self.revision = revision or REVISION
        self.folder = folder.strip("/")
        self.api = api
        self.errors = _Errors(uri, credentials)

    @property
    def description(self) -> str:
        """The URI."""
        return self.uri

    def _repo_path(self, path: str) -> str:
        return f"{self.folder}/{path}" if self.folder else path

    def list_files(self) -> list[SourceFile]:
        """Every file of the repository's tree under the folder, with the Hub's fingerprint."""
        files = []
        with self.errors("listing"):
            tree = self.api.list_repo_tree(
                self.repo_id,
                path_in_repo=self.folder or None,
                recursive=True,
                revision=self.revision,
                repo_type=HF_REPO_TYPE,
            )
            for info in tree:
                if not isinstance(info, RepoFile):
                    continue
                path = info.path[len(self.folder) + 1 :] if self.folder else info.path
                if path == DATA_MANIFEST_FILENAME:
                    continue
                files.append(SourceFile(path, info.size, None, repo_file_fingerprint(info)))
        return sorted(files, key=lambda item: item.path)

    @contextmanager
    def _stream(self, path: str, offset: int = 0) -> Iterator[Iterator[bytes]]:
        with stream_file(
            self.api,
            self.repo_id,
            self._repo_path(path),
            repo_type=HF_REPO_TYPE,
            revision=self.revision,
            offset=offset,
        ) as chunks:
            yield chunks

    def read_manifest(self) -> bytes | None:
        """DATA_MANIFEST.json at the folder's root, if present."""
        with self.errors(f"reading {DATA_MANIFEST_FILENAME}"):
            try:
                with self._stream(DATA_MANIFEST_FILENAME) as chunks:
                    return b"".join(chunks)
            except HfHubHTTPError as err:
                if err.response is not None and err.response.status_code == HF_NOT_FOUND:
                    return None
                raise

    def fingerprint(self, file: SourceFile) -> Fingerprint | None:
        """None: the listing gives every file's fingerprint."""
        return None

    def open(self, path: str, offset: int = 0) -> SourceReader:
        """Stream the file from the resolve endpoint, from `offset` on (a range request)."""
        stack = ExitStack()
        with self.errors(f"opening {path}"):
            chunks = stack.enter_context(self._stream(path, offset))

        pending = b""

        def read(size: int) -> bytes:
            nonlocal pending
            if not pending:
                pending = next(chunks, b"")
            data, pending = pending[:size], pending[size:]
            return data

        return _Reader(read, stack.close, self.errors, path)


def open_remote(uri: str, credentials_dir: Path | None, environ: Mapping[str, str]) -> Source:
    """The source of an `s3://`, `ssh://` or `hf://` URI, with the Secret mounted at a path."""
    scheme = urlparse(uri).scheme
    try:
        credentials = (
            Credentials.from_directory(credentials_dir, WHO)
            if credentials_dir is not None
            else Credentials({})
        )
    except (LayerError, OSError) as err:
        raise SourceError(f"{uri}: {err}") from None
    errors = _Errors(uri, credentials)
    with errors("connecting"):
        if scheme == UriScheme.S3:
            return S3Source(uri, s3_client(credentials, environ), credentials)
        if scheme == UriScheme.SSH:
            return SshSource(uri, ssh_target(uri, credentials, WHO), credentials)
        if scheme == UriScheme.HF:
            return HfSource(uri, hf_api(credentials, environ), credentials)
    raise SourceError(f"{uri}: no backend for {scheme}:// data sources")
