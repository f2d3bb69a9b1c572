"""`ssh://[user@]host[:port]/path` layers: SFTP through paramiko, hashes on the remote host.

Each file is written as `<name>.partial` and renamed into place only after `sha256sum` run on
the remote host matches the sha256 of what was sent; that sha256 is the file's fingerprint, so
verifying a layer re-hashes every byte where it lies, without a download.

Resume: a dropped connection leaves the `.partial` file behind. The next put reconnects, takes
the partial file's size as the offset, hashes the local file up to it without sending it, and
continues writing at the offset; the remote hash of the whole file then decides. A partial
file that is not a prefix of the local one fails that check, is removed, and the retry starts
from zero.

Authentication is by the Secret's `ssh-privatekey` only (no agent, no password). The host key
must be known: the Secret's `known_hosts`, else the system's; an unknown host is refused. The
remote side needs an SFTP server and the coreutils (`sha256sum`, `mkdir`, `rm`).

Where the host is: the URI names it as the run knows it; the Secret's optional `config`, an
OpenSSH client config, says how this site reaches it (split DNS, a forwarded port). The
`HostName`, `Port` and `User` its `Host` blocks set for the URI's host (the first value wins,
as in OpenSSH) replace the URI's host, port and user; `known_hosts` then lists the host as it
is reached. Other keywords are ignored, and a `Match` block is refused: `Match exec` would run
a command of the Secret's in the agent.
"""

from __future__ import annotations

import hashlib
import posixpath
import re
import shlex
import stat
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import paramiko

from trainguard.api.constants import (
    SECRET_KEY_SSH_CONFIG,
    SECRET_KEY_SSH_KNOWN_HOSTS,
    SECRET_KEY_SSH_PRIVATE_KEY,
)
from trainguard.ckpt import MANIFEST_FILENAME, SHA256, hash_file, parse_step_dirname
from trainguard.layers import Credentials, LayerConfig, LayerError, Transfer
from trainguard.layers.base import CHUNK_BYTES, RemoteLayer, Uploads
from trainguard.layers.lineage import LEGACY, CheckpointRef, Origin, parse_origin

DEFAULT_PORT = 22
PARTIAL_SUFFIX = ".partial"
CONNECT_TIMEOUT_S = 15.0
COMMAND_TIMEOUT_S = 600.0
# A dead peer is noticed within a few keepalive rounds instead of a TCP timeout.
KEEPALIVE_S = 10
# What the Secret's `config` may say: where a host is, and nothing that acts.
CONFIG_KEYWORDS = frozenset({"host", "hostname", "port", "user"})
CONFIG_MATCH = "match"
# A config line's keyword, as OpenSSH and paramiko read it (`Keyword value`, `Keyword=value`).
_CONFIG_KEYWORD = re.compile(r"\s*(\w+)(?:\s*=\s*|\s+)")


@dataclass(frozen=True)
class SshTarget:
    """Where an `ssh://[user@]host[:port]/path` URI points, and the key files to get there."""

    host: str
    port: int
    username: str | None
    root: str
    key_file: Path
    known_hosts: Path | None


def ssh_target(uri_text: str, credentials: Credentials, name: str) -> SshTarget:
    """The target of an ssh:// URI with the Secret's key files; `name` prefixes the errors."""
    uri = urlparse(uri_text)
    if not uri.hostname or not uri.path:
        raise LayerError(f"{name}: {uri_text} needs a host and a path")
    key_file = credentials.file(SECRET_KEY_SSH_PRIVATE_KEY)
    if key_file is None:
        raise LayerError(f"{name}: the Secret has no {SECRET_KEY_SSH_PRIVATE_KEY}")
    host, port, username = uri.hostname, uri.port or DEFAULT_PORT, uri.username
    config = credentials.get(SECRET_KEY_SSH_CONFIG)
    if config is not None:
        try:
            host, port, username = configured(config, host, port, username)
        except ValueError as err:
            raise LayerError(f"{name}: the Secret's {SECRET_KEY_SSH_CONFIG}: {err}") from err
    return SshTarget(
        host, port, username, uri.path, key_file, credentials.file(SECRET_KEY_SSH_KNOWN_HOSTS)
    )


def configured(
    config: str, host: str, port: int, username: str | None
) -> tuple[str, int, str | None]:
    """`host`, `port` and `username` as an OpenSSH client config's `Host` blocks change them.

    Only `CONFIG_KEYWORDS` are read; ValueError, saying why, for a `Match` block or a config
    paramiko cannot parse.
    """
    kept = []
    for line in config.splitlines():
        keyword = _CONFIG_KEYWORD.match(line)
        if keyword is None:
            continue  # a blank line or a comment
        if keyword.group(1).lower() == CONFIG_MATCH:
            raise ValueError("Match blocks are not supported (only Host blocks)")
        if keyword.group(1).lower() in CONFIG_KEYWORDS:
            kept.append(line)
    try:
        found = paramiko.SSHConfig.from_text("\n".join(kept)).lookup(host)
    except paramiko.ConfigParseError as err:
        raise ValueError(str(err)) from err
    configured_port = found.get("port")
    try:
        port = int(configured_port) if configured_port is not None else port
    except ValueError:
        raise ValueError(f"Port {configured_port!r} is not a number") from None
    return found.get("hostname", host), port, found.get("user", username)


def connect(
    host: str, port: int, username: str | None, key_file: Path, known_hosts: Path | None
) -> paramiko.SSHClient:
    """A connection authenticated by the key alone, to a host whose key is known.

    The host key must be in `known_hosts`, else in the system's known hosts; an unknown host
    is refused. A dead peer is noticed by keepalives.
    """
    client = paramiko.SSHClient()
    if known_hosts is not None:
        client.load_host_keys(str(known_hosts))
    else:
        client.load_system_host_keys()
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    client.connect(
        host,
        port=port,
        username=username,
        pkey=paramiko.PKey.from_path(key_file),
        allow_agent=False,
        look_for_keys=False,
        timeout=CONNECT_TIMEOUT_S,
        banner_timeout=CONNECT_TIMEOUT_S,
        auth_timeout=CONNECT_TIMEOUT_S,
    )
    active = client.get_transport()
    if active is not None:
        active.set_keepalive(KEEPALIVE_S)
    return client


def run_command(
    client: paramiko.SSHClient, argv: list[str], timeout_s: float = COMMAND_TIMEOUT_S
) -> str:
    """Run a command on the remote host; its stdout (a non-zero exit is a `LayerError`)."""
    command = shlex.join(argv)
    _, stdout, stderr = client.exec_command(command, timeout=timeout_s)
    try:
        out = stdout.read().decode()
        status = stdout.channel.recv_exit_status()
        if status != 0:
            raise LayerError(f"`{command}` exited {status}: {stderr.read().decode()[:300]}")
        return out
    finally:
        # Closed now, not when the server gets round to it: a server counts open sessions.
        stdout.channel.close()


def remote_sha256(
    client: paramiko.SSHClient, paths: list[str], timeout_s: float = COMMAND_TIMEOUT_S
) -> dict[str, str]:
    """sha256 of each remote file (absolute paths), computed on the remote host."""
    if not paths:
        return {}
    digests = {}
    for line in run_command(client, ["sha256sum", "--", *paths], timeout_s).splitlines():
        digest, _, name = line.partition("  ")
        digests[name] = digest
    return digests


class SshStore:
    """A directory on a host reached over SSH, as a `Store`."""

    def __init__(
        self,
        host: str,
        port: int,
        username: str | None,
        root: str,
        key_file: Path,
        known_hosts: Path | None,
    ) -> None:
        self.host = host
        self.port = port
        self.username = username
        self.root = root.rstrip("/") or "/"
        self.key_file = key_file
        self.known_hosts = known_hosts
        self._client: paramiko.SSHClient | None = None
        self._sftp: paramiko.SFTPClient | None = None
        self._lock = threading.Lock()

    def _path(self, key: str) -> str:
        return posixpath.join(self.root, key)

    def sftp(self) -> paramiko.SFTPClient:
        """The SFTP session, reconnecting when the connection is gone."""
        with self._lock:
            transport = self._client.get_transport() if self._client else None
            if self._sftp is None or transport is None or not transport.is_active():
                self.close()
                client = connect(
                    self.host, self.port, self.username, self.key_file, self.known_hosts
                )
                self._client, self._sftp = client, client.open_sftp()
            return self._sftp

    def close(self) -> None:
        """Drop the connection (the next call reconnects)."""
        if self._client is not None:
            self._client.close()
        self._client, self._sftp = None, None

    def run(self, argv: list[str]) -> str:
        """Run a command on the remote host; its stdout (a non-zero exit is an error)."""
        self.sftp()
        assert self._client is not None
        return run_command(self._client, argv)

    def remote_sha256(self, paths: list[str]) -> dict[str, str]:
        """sha256 of each remote file, computed on the remote host."""
        self.sftp()
        assert self._client is not None
        return remote_sha256(self._client, paths)

    def _size(self, path: str) -> int | None:
        try:
            return self.sftp().stat(path).st_size
        except FileNotFoundError:
            return None

    def _dirs(self, path: str) -> list[str]:
        try:
            entries = self.sftp().listdir_attr(path)
        except FileNotFoundError:
            return []
        return [e.filename for e in entries if stat.S_ISDIR(e.st_mode or 0)]

    def list_checkpoints(self) -> dict[CheckpointRef, bool]:
        """Checkpoint directories under the root, and whether their manifest is there."""
        found = {}
        for name in self._dirs(self.root):
            step = parse_step_dirname(name)
            if step is not None:
                ref = CheckpointRef(step, LEGACY)
                found[ref] = self._size(self._path(f"{ref.path}/{MANIFEST_FILENAME}")) is not None
        for run in self._dirs(self.root):
            for attempt in self._dirs(self._path(run)):
                origin = parse_origin(run, attempt)
                if origin is None:
                    continue
                for name in self._dirs(self._path(f"{run}/{attempt}")):
                    step = parse_step_dirname(name)
                    if step is not None:
                        ref = CheckpointRef(step, origin)
                        manifest = self._path(f"{ref.path}/{MANIFEST_FILENAME}")
                        found[ref] = self._size(manifest) is not None
        return found

    def read(self, key: str) -> bytes | None:
        """A small file in full."""
        try:
            with self.sftp().open(self._path(key), "rb") as reader:
                return reader.read()
        except FileNotFoundError:
            return None

    def upload(self, files: Uploads, transfer: Transfer) -> dict[str, str]:
        """Send each file (resuming a partial one) and check it by its remote sha256.

        A connection that fails mid-upload is dropped here: the transport may still look
        active until its reader thread sees the EOF, and the next put must reconnect, not
        write into the dead session.
        """
        try:
            return {key: self._upload_one(source, key, transfer) for source, key in files}
        except (EOFError, OSError, paramiko.SSHException):
            with self._lock:
                self.close()
            raise

    def _upload_one(self, source: Path, key: str, transfer: Transfer) -> str:
        final = self._path(key)
        partial = final + PARTIAL_SUFFIX
        size = source.stat().st_size
        sftp = self.sftp()
        if self._size(final) == size:
            local = hash_file(source, SHA256)[1]
            if self.remote_sha256([final]).get(final) == local:
                transfer.advance(size, sent=False)
                return local
        self.run(["mkdir", "-p", "--", posixpath.dirname(final)])
        offset = self._size(partial) or 0
        if offset > size:
            sftp.remove(partial)
            offset = 0
        hasher = hashlib.sha256()
        with source.open("rb") as reader:
            while reader.tell() < offset:
                data = reader.read(min(CHUNK_BYTES, offset - reader.tell()))
                hasher.update(data)
                transfer.advance(len(data), sent=False)
            with sftp.open(partial, "r+b" if offset else "wb") as writer:
                writer.seek(offset)
                writer.set_pipelined(True)
                while data := reader.read(CHUNK_BYTES):
                    hasher.update(data)
                    writer.write(data)
                    transfer.advance(len(data))
        local = hasher.hexdigest()
        if self.remote_sha256([partial]).get(partial) != local:
            sftp.remove(partial)
            raise LayerError(f"{key}: the remote sha256 differs from the local file; discarded")
        sftp.posix_rename(partial, final)
        return local

    def write_last(self, items: list[tuple[str, bytes]]) -> None:
        """Each small file written aside and renamed into place (atomic), in order."""
        sftp = self.sftp()
        for key, data in items:
            final = self._path(key)
            with sftp.open(final + PARTIAL_SUFFIX, "wb") as writer:
                writer.write(data)
            sftp.posix_rename(final + PARTIAL_SUFFIX, final)

    def stats(self, keys: list[str]) -> dict[str, tuple[int, str] | None]:
        """Size and remote sha256 of each file."""
        sizes = {key: self._size(self._path(key)) for key in keys}
        present = [self._path(key) for key, size in sizes.items() if size is not None]
        digests = self.remote_sha256(present)
        return {
            key: None if size is None else (size, digests.get(self._path(key), ""))
            for key, size in sizes.items()
        }

    @contextmanager
    def download(self, key: str) -> Iterator[Iterator[bytes]]:
        """Stream one file (read ahead in the background)."""
        with self.sftp().open(self._path(key), "rb") as reader:
            reader.prefetch()
            yield iter(lambda: reader.read(CHUNK_BYTES), b"")

    def delete(self, ref: CheckpointRef) -> None:
        """The manifest first, then the directory."""
        directory = self._path(ref.path)
        with suppress(FileNotFoundError):
            self.sftp().remove(posixpath.join(directory, MANIFEST_FILENAME))
        self.run(["rm", "-rf", "--", directory])


def open_ssh(
    config: LayerConfig, credentials: Credentials, origin: Origin | None = None
) -> RemoteLayer:
    """The layer of an `ssh://[user@]host[:port]/path` URI, shipping for `origin`."""
    target = ssh_target(config.uri, credentials, config.name)
    store = SshStore(
        target.host,
        target.port,
        target.username,
        target.root,
        target.key_file,
        target.known_hosts,
    )
    return RemoteLayer(config, store, credentials, origin)
