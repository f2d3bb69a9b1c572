"""Real servers on loopback for the remote-layer tests, the e2e scenarios and the shipping bench.

SeaweedFS (an S3-compatible server: master, volume, filer and S3 gateway in one `weed server`)
and OpenSSH's sshd, both installed by `hack/install-test-services.sh`. Each runs as a child
process on free ports of loopback (or of an address of this machine that pods on real nodes
reach) with its data in a directory the caller owns.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shlex
import signal
import socket
import subprocess
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
from botocore.config import Config

from trainguard.api.constants import (
    SECRET_KEY_S3_ACCESS_KEY_ID,
    SECRET_KEY_S3_ENDPOINT_URL,
    SECRET_KEY_S3_SECRET_ACCESS_KEY,
)
from trainguard_dev.testing.polling import eventually
from trainguard_dev.testing.processes import stop_process

REPO = Path(__file__).resolve().parents[3]
CACHE = Path(os.environ.get("TRAINGUARD_CACHE", REPO / ".cache"))
WEED = Path(os.environ.get("TRAINGUARD_WEED", CACHE / "bin" / "weed"))
SSHD = Path("/usr/sbin/sshd")
INSTALL_HINT = "run `bash hack/install-test-services.sh` first"
START_TIMEOUT_S = 60.0
S3_ACCESS_KEY = "trainguard-test-access"
S3_SECRET_KEY = "trainguard-test-secret-0123456789"


def free_ports(count: int) -> list[int]:
    """Ports free on 127.0.0.1 right now (held open together so they differ)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


@dataclass
class SeaweedFS:
    """A `weed server` (master, volume, filer, S3 gateway) on loopback, or on `ip`.

    `ip` is an address of this machine (for pods on real nodes: the host's address on the
    cluster's pod network); the default keeps it on loopback.
    """

    root: Path
    ip: str = "127.0.0.1"
    ports: list[int] = field(default_factory=lambda: free_ports(8))
    process: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        """The S3 endpoint URL."""
        return f"http://{self.ip}:{self.ports[6]}"

    def start(self) -> None:
        """Start (or restart, on the same ports and data) and wait until S3 answers."""
        data = self.root / "data"
        data.mkdir(parents=True, exist_ok=True)
        config = self.root / "s3.json"
        config.write_text(
            '{"identities":[{"name":"trainguard","credentials":[{"accessKey":"'
            + S3_ACCESS_KEY
            + '","secretKey":"'
            + S3_SECRET_KEY
            + '"}],"actions":["Admin","Read","Write","List","Tagging"]}]}'
        )
        master, master_grpc, volume, volume_grpc, filer, filer_grpc, s3, s3_grpc = self.ports
        argv = [
            str(WEED),
            "server",
            f"-dir={data}",
            f"-ip={self.ip}",
            f"-ip.bind={self.ip}",
            f"-master.port={master}",
            f"-master.port.grpc={master_grpc}",
            "-master.volumeSizeLimitMB=64",
            # One master: a short election makes a restart ready in seconds, not 15 s.
            "-master.electionTimeout=1s",
            f"-volume.port={volume}",
            f"-volume.port.grpc={volume_grpc}",
            "-volume.max=0",
            # No grace period on stop: the data is a test's, in a temporary directory.
            "-volume.preStopSeconds=0",
            "-filer",
            f"-filer.port={filer}",
            f"-filer.port.grpc={filer_grpc}",
            "-s3",
            f"-s3.port={s3}",
            f"-s3.port.grpc={s3_grpc}",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            f"-s3.config={config}",
        ]
        log = (self.root / "weed.log").open("ab")
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        self.process = process
        probe = self.client()

        def stores() -> bool:
            try:
                # The S3 gateway answers before the volume server can store: write to know.
                name = f"probe-{uuid.uuid4().hex[:12]}"
                probe.create_bucket(Bucket=name)
                probe.put_object(Bucket=name, Key="probe", Body=b"probe")
                probe.delete_object(Bucket=name, Key="probe")
                probe.delete_bucket(Bucket=name)
            except Exception:
                if process.poll() is not None:
                    raise RuntimeError(f"SeaweedFS exited:\n{self._log_tail()}") from None
                return False
            return True

        try:
            eventually(stores, START_TIMEOUT_S, "SeaweedFS to store an object")
        except TimeoutError as err:
            raise RuntimeError(f"SeaweedFS did not start ({err}):\n{self._log_tail()}") from None

    def _log_tail(self) -> str:
        return (self.root / "weed.log").read_text(errors="replace")[-3000:]

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        stop_process(self.process, sig=signal.SIGKILL)

    def secret_data(self) -> dict[str, str]:
        """A Secret's keys for an s3:// source or layer here: the test identity, the endpoint."""
        return {
            SECRET_KEY_S3_ACCESS_KEY_ID: S3_ACCESS_KEY,
            SECRET_KEY_S3_SECRET_ACCESS_KEY: S3_SECRET_KEY,
            SECRET_KEY_S3_ENDPOINT_URL: self.endpoint,
        }

    def client(self) -> Any:
        """A boto3 client with the test identity (for setup and for tampering)."""
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=S3_ACCESS_KEY,
            aws_secret_access_key=S3_SECRET_KEY,
            region_name="us-east-1",
            config=Config(
                s3={"addressing_style": "path"},
                retries={"max_attempts": 1, "mode": "standard"},
                connect_timeout=2,
            ),
        )


@dataclass
class Sshd:
    """OpenSSH's sshd on `host` (loopback by default) with generated host and client keys."""

    root: Path
    port: int
    process: subprocess.Popen[bytes]
    client_key: Path
    known_hosts: Path
    user: str
    host: str = "127.0.0.1"

    def drop_connections(self) -> int:
        """Kill every session process of this sshd (a dropped connection); return how many."""
        killed = 0
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == self.process.pid:
                os.kill(int(proc.name), signal.SIGKILL)
                killed += 1
        return killed

    def stop(self) -> None:
        """Stop sshd (its sessions end with it)."""
        stop_process(self.process)


def _keygen(path: Path) -> None:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "trainguard-test", "-f", str(path)],
        check=True,
    )


def in_mount_namespace(argv: list[str], mounts: Mapping[str, Path]) -> list[str]:
    """`argv` run in a mount namespace of its own, where each path of `mounts` is its directory.

    A server that serves fixed paths (a backup host's `/srv/...`) from a test's directory,
    without touching this machine's: the process and every child it starts see the directory
    at the path, nothing else does. Each path must be a directory here (the mount point).
    Needs root, as the test environments run.
    """
    binds = [f"mount --bind {shlex.quote(str(d))} {shlex.quote(p)}" for p, d in mounts.items()]
    script = " && ".join([*binds, f"exec {shlex.join(argv)}"])
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script]


def start_sshd(
    root: Path, mounts: Mapping[str, Path] | None = None, host: str = "127.0.0.1"
) -> Sshd:
    """Start sshd on a free port of `host`, with host and client keys generated under `root`.

    `mounts`: paths its sessions see as other directories (`in_mount_namespace`), e.g.
    ``{"/srv": root / "srv"}``. `host` is an address of this machine (for pods on real
    nodes: the host's address on the cluster's pod network); `known_hosts` names it.
    """
    host_key, client_key = root / "host_ed25519", root / "client_ed25519"
    _keygen(host_key)
    _keygen(client_key)
    authorized = root / "authorized_keys"
    authorized.write_text(Path(f"{client_key}.pub").read_text())
    port = free_ports(1)[0]
    config = root / "sshd_config"
    config.write_text(
        "\n".join(
            [
                f"Port {port}",
                f"ListenAddress {host}",
                f"HostKey {host_key}",
                f"AuthorizedKeysFile {authorized}",
                f"PidFile {root / 'sshd.pid'}",
                "PasswordAuthentication no",
                "KbdInteractiveAuthentication no",
                "UsePAM no",
                # Tests run as root in CI; the keys live in a temporary directory.
                "PermitRootLogin prohibit-password",
                "StrictModes no",
                "Subsystem sftp internal-sftp",
                "LogLevel ERROR",
                "",
            ]
        )
    )
    # sshd refuses to start without its privilege separation directory.
    Path("/run/sshd").mkdir(parents=True, exist_ok=True)
    log = (root / "sshd.log").open("ab")
    argv = [str(SSHD), "-D", "-e", "-f", str(config)]
    if mounts:
        # unshare and sh exec into sshd: `process` is sshd itself, its sessions' parent.
        argv = in_mount_namespace(argv, mounts)
    process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    host_pub = Path(f"{host_key}.pub").read_text().split()
    known_hosts = root / "known_hosts"
    known_hosts.write_text(f"[{host}]:{port} {host_pub[0]} {host_pub[1]}\n")

    def greets() -> bool:
        with (
            contextlib.suppress(OSError),
            socket.create_connection((host, port), timeout=1) as conn,
        ):
            if conn.recv(4).startswith(b"SSH-"):
                return True
        if process.poll() is not None:
            raise RuntimeError(f"sshd exited:\n{(root / 'sshd.log').read_text()[-3000:]}")
        return False

    try:
        eventually(greets, START_TIMEOUT_S, "sshd to greet", 0.1)
    except TimeoutError as err:
        tail = (root / "sshd.log").read_text()[-3000:]
        raise RuntimeError(f"sshd did not start ({err}):\n{tail}") from None
    user = pwd.getpwuid(os.getuid()).pw_name
    return Sshd(root, port, process, client_key, known_hosts, user, host)
