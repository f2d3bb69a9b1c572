"""`stage-data` from s3://, ssh:// and hf://datasets/ sources, against the layers' real servers.

The same dataset is published on SeaweedFS (S3; the large file as a multipart upload), on a
directory served by sshd, and as a dataset repository on the Hub stand-in, and staged through
the remote layers' clients: verified against what each server says of each file, killed
half-way and resumed, and with a corrupted object on the server.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hub_standin import HubServer, repo_key
from huggingface_hub import HfApi

from conftest import HF_TOKEN
from trainguard.api.constants import (
    SECRET_KEY_HF_TOKEN,
    SECRET_KEY_S3_ACCESS_KEY_ID,
    SECRET_KEY_S3_ENDPOINT_URL,
    SECRET_KEY_S3_SECRET_ACCESS_KEY,
    SECRET_KEY_SSH_KNOWN_HOSTS,
    SECRET_KEY_SSH_PRIVATE_KEY,
)
from trainguard.ckpt import DEFAULT_ALGORITHM, hash_file
from trainguard.contract import env, files
from trainguard.initsteps import stage_data as staging
from trainguard.initsteps.sources import (
    DATA_MANIFEST_FILENAME,
    Source,
    SourceReader,
    open_source,
)
from trainguard.layers.fingerprints import Fingerprint
from trainguard_dev.testing.polling import eventually
from trainguard_dev.testing.servers import S3_ACCESS_KEY, S3_SECRET_KEY, SeaweedFS, Sshd
from trainguard_dev.testing.sources import FlipSource, WrappedSource

pytest_plugins = ("integration.s3_fixtures",)
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

MIB = 2**20
PART_BYTES = 5 * MIB  # S3's smallest part: the large file goes up in three
FOLDER = "v3"  # every source is a folder of its server, not its root
DATASET_REPO = "acme/shards"
BIG = "train/big-00000.bin"
INFO = "meta/info.json"  # small: the Hub keeps it in git, not in LFS
CONTROL = staging.CONTROL_DIRNAME
BACKENDS = ["s3", "ssh", "hf"]


@dataclass
class Remote:
    """A data source on one of the servers, and what a test does to it there."""

    name: str
    uri: str
    secret: Path  # the source's Secret as the operator mounts it: one file per key
    publish: Callable[[dict[str, bytes]], None]
    # Damages one published file where the server keeps it (the same size).
    corrupt: Callable[[str], None]
    environ: dict[str, str] = field(default_factory=dict)

    def source(self) -> Source:
        return open_source(self.uri, credentials_dir=self.secret, environ=self.environ)


def flipped(data: bytes) -> bytes:
    """`data` with one byte in the middle changed."""
    middle = len(data) // 2
    return data[:middle] + bytes([data[middle] ^ 0xFF]) + data[middle + 1 :]


def secret_dir(root: Path, values: dict[str, str]) -> Path:
    secret = root / "secret"
    secret.mkdir()
    for key, value in values.items():
        (secret / key).write_text(value)
    return secret


def _s3(seaweedfs: SeaweedFS, bucket: str, tmp_path: Path) -> Remote:
    client = seaweedfs.client()
    prefix = f"datasets/{FOLDER}/"

    def put(path: str, data: bytes) -> None:
        key = prefix + path
        if len(data) <= PART_BYTES:
            client.put_object(Bucket=bucket, Key=key, Body=data)
            return
        upload = client.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
        parts = []
        for number, start in enumerate(range(0, len(data), PART_BYTES), 1):
            sent = client.upload_part(
                Bucket=bucket,
                Key=key,
                UploadId=upload,
                PartNumber=number,
                Body=data[start : start + PART_BYTES],
            )
            parts.append({"PartNumber": number, "ETag": sent["ETag"]})
        client.complete_multipart_upload(
            Bucket=bucket, Key=key, UploadId=upload, MultipartUpload={"Parts": parts}
        )

    def publish(contents: dict[str, bytes]) -> None:
        for path, data in contents.items():
            put(path, data)

    def corrupt(path: str) -> None:
        # A bad re-upload: S3 itself keeps an object and its ETag consistent.
        data = client.get_object(Bucket=bucket, Key=prefix + path)["Body"].read()
        client.put_object(Bucket=bucket, Key=prefix + path, Body=flipped(data))

    secret = secret_dir(
        tmp_path,
        {
            SECRET_KEY_S3_ACCESS_KEY_ID: S3_ACCESS_KEY,
            SECRET_KEY_S3_SECRET_ACCESS_KEY: S3_SECRET_KEY,
            SECRET_KEY_S3_ENDPOINT_URL: seaweedfs.endpoint,
        },
    )
    return Remote("s3", f"s3://{bucket}/{prefix.rstrip('/')}", secret, publish, corrupt)


def _ssh(sshd: Sshd, tmp_path: Path) -> Remote:
    root = tmp_path / "remote" / FOLDER

    def publish(contents: dict[str, bytes]) -> None:
        for path, data in contents.items():
            (root / path).parent.mkdir(parents=True, exist_ok=True)
            (root / path).write_bytes(data)

    def corrupt(path: str) -> None:
        (root / path).write_bytes(flipped((root / path).read_bytes()))

    secret = secret_dir(
        tmp_path,
        {
            SECRET_KEY_SSH_PRIVATE_KEY: sshd.client_key.read_text(),
            SECRET_KEY_SSH_KNOWN_HOSTS: sshd.known_hosts.read_text(),
        },
    )
    uri = f"ssh://{sshd.user}@127.0.0.1:{sshd.port}{root}"
    return Remote("ssh", uri, secret, publish, corrupt)


def _hf(hub: HubServer, tmp_path: Path) -> Remote:
    api = HfApi(endpoint=hub.url, token=HF_TOKEN)
    api.create_repo(DATASET_REPO, repo_type="dataset", private=True)

    def publish(contents: dict[str, bytes]) -> None:
        with tempfile.TemporaryDirectory(dir=tmp_path) as folder:
            for path, data in contents.items():
                (Path(folder) / path).parent.mkdir(parents=True, exist_ok=True)
                (Path(folder) / path).write_bytes(data)
            api.upload_folder(
                repo_id=DATASET_REPO,
                folder_path=folder,
                path_in_repo=FOLDER,
                repo_type="dataset",
            )

    def corrupt(path: str) -> None:
        # Bit rot in the Hub's storage: the LFS object no longer has the sha256 it is listed with.
        entry = hub.state.repos[repo_key(DATASET_REPO, "dataset")][f"{FOLDER}/{path}"]
        assert entry.lfs_oid is not None, path
        hub.state.lfs[entry.lfs_oid] = flipped(hub.state.lfs[entry.lfs_oid])

    secret = secret_dir(tmp_path, {SECRET_KEY_HF_TOKEN: HF_TOKEN})
    uri = f"hf://datasets/{DATASET_REPO}@main/{FOLDER}"
    return Remote("hf", uri, secret, publish, corrupt, {"HF_ENDPOINT": hub.url})


@pytest.fixture(params=BACKENDS)
def remote(request: pytest.FixtureRequest, tmp_path: Path) -> Remote:
    if request.param == "s3":
        return _s3(
            request.getfixturevalue("seaweedfs"), request.getfixturevalue("bucket"), tmp_path
        )
    if request.param == "ssh":
        return _ssh(request.getfixturevalue("sshd"), tmp_path)
    return _hf(request.getfixturevalue("hub"), tmp_path)


@pytest.fixture(autouse=True)
def termination_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The container's termination message file (the kubelet creates it in a pod)."""
    path = tmp_path / "termination-log"
    path.touch()
    monkeypatch.setenv(env.TERMINATION_LOG, str(path))
    return path


def dataset(shards: int, big: bool = True, seed: int = 3) -> dict[str, bytes]:
    """Shards of 64-192 KiB in two folders, a small JSON file and, if `big`, an 11 MiB shard."""
    rng = random.Random(seed)
    contents = {
        f"{'train' if index % 3 else 'valid'}/shard-{index:05d}.bin": rng.randbytes(
            rng.randint(64, 192) * 1024
        )
        for index in range(shards)
    }
    contents[INFO] = json.dumps({"shards": shards}).encode()
    if big:
        contents[BIG] = rng.randbytes(11 * MIB + 12345)
    return contents


def data_manifest(contents: dict[str, bytes], tmp_path: Path) -> bytes:
    """DATA_MANIFEST.json of `contents`, hashed here with the checkpoint hashing."""
    entries = []
    for path, data in sorted(contents.items()):
        local = tmp_path / "hashing"
        local.write_bytes(data)
        size, digest = hash_file(local, DEFAULT_ALGORITHM)
        entries.append({"path": path, "size": size, "hash": digest})
    manifest = {"format_version": 1, "hash_algorithm": DEFAULT_ALGORITHM, "files": entries}
    return json.dumps(manifest).encode()


def staged_files(dest: Path) -> dict[str, bytes]:
    """Every file in the data directory outside the bookkeeping."""
    return {
        p.relative_to(dest).as_posix(): p.read_bytes()
        for p in dest.rglob("*")
        if p.is_file() and CONTROL not in p.relative_to(dest).parts
    }


def stage(
    tmp_path: Path, source: Source, dest: Path, retries: int = 3
) -> tuple[staging.StageResult, dict[str, object]]:
    """Stage in this process; the result and the final staging.json."""
    report = tmp_path / files.STAGING_FILENAME
    progress = staging.Progress(source.description, dest, report, interval_s=60)
    result = staging.stage(
        source, dest, staging.Options(read_timeout_s=30, retries=retries), progress
    )
    return result, json.loads(report.read_text())


def state(dest: Path) -> dict[str, object]:
    data: dict[str, object] = json.loads((dest / CONTROL / staging.STATE_FILENAME).read_text())
    return data


# What each server says of the files: its fingerprints' algorithms.
SERVER_ALGORITHMS = {
    "s3": {"md5", "s3-multipart"},  # single-part objects: MD5; the large one: multipart
    "ssh": {"sha256"},  # computed on the remote host
    "hf": {"sha256", "git-blob-sha1"},  # LFS files; the JSON file kept in git
}


def test_staged_and_verified_against_the_servers_fingerprints_then_skipped(
    remote: Remote, tmp_path: Path
) -> None:
    contents = dataset(12)
    remote.publish(contents)
    dest = tmp_path / "data"

    result, report = stage(tmp_path, remote.source(), dest)

    assert staged_files(dest) == contents
    assert (result.files, result.copied, result.recopies) == (len(contents), len(contents), 0)
    assert report["phase"] == staging.COMPLETE and report["exit_code"] == 0
    assert report["manifest"] == "server" and report["hash_algorithm"] == staging.PER_FILE
    total = sum(map(len, contents.values()))
    assert report["files_done"] == report["files_total"] == len(contents)
    assert report["bytes_done"] == report["bytes_total"] == total
    # The server's fingerprints are the reference: the source was read once, not hashed first.
    assert report["bytes_transferred"] == total
    listed = state(dest)["manifest"]["files"]  # type: ignore[index]
    entries = {e["path"]: Fingerprint.parse(e["hash"]) for e in listed}
    assert {fp.algorithm for fp in entries.values()} == SERVER_ALGORITHMS[remote.name]
    if remote.name == "s3":
        assert entries[BIG].algorithm == "s3-multipart" and entries[BIG].part_bytes == PART_BYTES
        assert entries[BIG].value.endswith("-3")

    again, report = stage(tmp_path, remote.source(), dest)

    assert again.skipped and again.copied == 0 and again.bytes_transferred == 0
    assert report["phase"] == staging.SKIPPED and report["already_verified"] == len(contents)


def test_a_copy_damaged_in_transit_differs_from_the_servers_fingerprint_and_is_copied_again(
    remote: Remote, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    contents = dataset(4)
    remote.publish(contents)
    dest = tmp_path / "data"
    damaged = FlipSource(remote.source(), BIG, {1})

    result, report = stage(tmp_path, damaged, dest)

    assert staged_files(dest) == contents
    assert (result.copied, result.recopies) == (len(contents), 1)
    assert report["recopies"] == 1 and report["manifest"] == "server"
    assert f"{BIG}: the copy has {len(contents[BIG])} bytes with " in capsys.readouterr().out


def test_a_corrupted_object_on_the_server_fails_staging_naming_it(
    remote: Remote, tmp_path: Path
) -> None:
    contents = dataset(6)
    victim = "train/shard-00004.bin"
    remote.publish({**contents, DATA_MANIFEST_FILENAME: data_manifest(contents, tmp_path)})
    remote.corrupt(victim)
    dest = tmp_path / "data"

    with pytest.raises(staging.VerificationError, match=f"{victim} from .* still differs after 2"):
        stage(tmp_path, remote.source(), dest, retries=1)

    assert not (dest / victim).exists()
    recorded = state(dest)
    assert recorded["manifest_origin"] == "source"
    assert victim not in recorded["verified"]  # type: ignore[operator]


def test_a_corrupted_lfs_object_is_caught_by_the_hubs_own_sha256(
    hub: HubServer, tmp_path: Path
) -> None:
    remote = _hf(hub, tmp_path)
    contents = dataset(4)
    remote.publish(contents)  # no DATA_MANIFEST.json: the Hub's sha256 is the reference
    remote.corrupt(BIG)
    dest = tmp_path / "data"

    with pytest.raises(staging.VerificationError, match=f"{BIG} from .* still differs after 2"):
        stage(tmp_path, remote.source(), dest, retries=1)

    recorded = state(dest)
    assert recorded["manifest_origin"] == "server"
    assert BIG not in recorded["verified"]  # type: ignore[operator]


@pytest.mark.parametrize("ranges", [True, False], ids=["ranged", "range-ignored"])
def test_a_hub_file_is_read_from_an_offset_whether_or_not_the_server_honours_ranges(
    hub: HubServer, tmp_path: Path, ranges: bool
) -> None:
    remote = _hf(hub, tmp_path)
    contents = dataset(1)
    remote.publish(contents)
    hub.state.ignore_range = not ranges
    source = remote.source()
    offset = len(contents[BIG]) - 3 * MIB - 17

    reader = source.open(BIG, offset)
    received = b""
    while chunk := reader.read(MIB):
        assert len(chunk) <= MIB
        received += chunk
    reader.close()

    assert received == contents[BIG][offset:]


def _cli(
    tmp_path: Path, remote: Remote, dest: Path, inject: str | None = None
) -> subprocess.Popen[str]:
    environ = {**os.environ, **remote.environ, env.STATE_DIR: str(tmp_path / "state")}
    environ.pop(staging.INJECT_ENV, None)
    if inject is not None:
        environ[staging.INJECT_ENV] = inject
    argv = ["--source", remote.uri, "--dest", str(dest), "--credentials", str(remote.secret)]
    return subprocess.Popen(
        [sys.executable, "-m", "trainguard.cli.main", "stage-data", *argv, "--jobs", "2"],
        env=environ,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.kill()
            process.communicate(timeout=10)


def test_killed_mid_copy_resumes_copying_only_the_rest(
    remote: Remote, tmp_path: Path, processes: list[subprocess.Popen[str]]
) -> None:
    contents = dataset(30, big=False)
    remote.publish(contents)
    dest = tmp_path / "data"
    partials = dest / CONTROL / staging.PARTIAL_DIRNAME
    # Each file's bytes are written, then it waits 0.3 s before its verification: the copies
    # under way are nearly always in partial/ when the kill comes.
    first = _cli(tmp_path, remote, dest, inject=f"{staging.INJECT_SLOW_FILES}0.3")
    processes.append(first)

    def a_third_staged_and_copies_under_way() -> bool:
        assert first.poll() is None, first.communicate()[0]
        staged = staged_files(dest) if dest.exists() else {}
        under_way = [p for p in partials.iterdir() if p.stat().st_size] if partials.exists() else []
        return len(staged) >= len(contents) // 3 and bool(under_way)

    eventually(a_third_staged_and_copies_under_way, 60, "a third staged, copies under way", 0.02)
    first.send_signal(signal.SIGKILL)
    first.communicate(timeout=10)
    present = set(staged_files(dest))
    assert len(contents) // 3 <= len(present) < len(contents)
    assert staged_files(dest) == {path: contents[path] for path in present}
    # A copy cut short: the kill came in the middle of writing its bytes.
    under_way = sorted(
        (p for p in partials.iterdir() if p.stat().st_size), key=lambda p: p.stat().st_size
    )
    assert under_way
    cut = under_way[-1]
    with cut.open("r+b") as handle:
        handle.truncate(cut.stat().st_size // 2)
    resumed_bytes = sum(p.stat().st_size for p in under_way)

    second = _cli(tmp_path, remote, dest)
    processes.append(second)
    log, _ = second.communicate(timeout=120)

    assert second.returncode == 0, log
    assert staged_files(dest) == contents
    final = json.loads((tmp_path / "state" / files.STAGING_FILENAME).read_text())
    assert final["phase"] == staging.COMPLETE and final["manifest"] == "server"
    assert final["copied"] == len(contents) - len(present)
    assert final["already_verified"] + final["adopted"] == len(present)
    assert final["resumed_partials"] == len(under_way)
    # Only the rest came from the server: not the files verified before the kill, not the
    # bytes already in partial/ (a ranged read continued the copy cut short).
    rest = sum(len(data) for path, data in contents.items() if path not in present)
    assert final["bytes_transferred"] == rest - resumed_bytes
    # And nothing was hashed again, here or on the server: the fingerprints were kept.
    assert "hashing:" not in log


@pytest.mark.parametrize("backend", ["s3", "ssh"])
def test_a_source_that_refuses_the_credentials_fails_the_step_as_unreachable(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    wrong = "wrong-secret-value-0123456789"
    if backend == "s3":
        remote = _s3(
            request.getfixturevalue("seaweedfs"), request.getfixturevalue("bucket"), tmp_path
        )
        (remote.secret / SECRET_KEY_S3_SECRET_ACCESS_KEY).write_text(wrong)
        cause = "SignatureDoesNotMatch"
    else:
        remote = _ssh(request.getfixturevalue("sshd"), tmp_path)
        (remote.secret / SECRET_KEY_SSH_KNOWN_HOSTS).write_text("")  # the host is unknown
        cause = "not found in known_hosts"
    remote.publish(dataset(2, big=False))

    run = _cli(tmp_path, remote, tmp_path / "data")
    log, _ = run.communicate(timeout=60)

    # Exit 5: the operator reports DataSourceUnreachable and starts no new attempt.
    assert run.returncode == staging.ExitCode.SOURCE_ERROR, log
    report = json.loads((tmp_path / "state" / files.STAGING_FILENAME).read_text())
    assert report["phase"] == staging.FAILED
    assert str(report["error"]).startswith(f"{remote.uri}: ")
    assert cause in str(report["error"])
    assert wrong not in log and wrong not in json.dumps(report)


class DroppedOnce(WrappedSource):
    """A source whose connection the server drops once, just after `path` is opened."""

    def __init__(self, inner: Source, path: str, drop: Callable[[], int]) -> None:
        super().__init__(inner)
        self.path = path
        self.drop: Callable[[], int] | None = drop

    def open(self, path: str, offset: int = 0) -> SourceReader:
        reader = self.inner.open(path, offset)
        if path == self.path and self.drop is not None:
            drop, self.drop = self.drop, None
            assert drop() > 0  # sshd's session processes killed: the connection is gone
        return reader


# paramiko's read-ahead thread of the dropped session dies with it, and says so.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_an_ssh_connection_dropped_mid_copy_is_reopened_and_the_file_copied_again(
    sshd: Sshd, tmp_path: Path
) -> None:
    remote = _ssh(sshd, tmp_path)
    contents = dataset(6)
    remote.publish(contents)
    dest = tmp_path / "data"
    source = DroppedOnce(remote.source(), BIG, sshd.drop_connections)
    report = tmp_path / files.STAGING_FILENAME
    progress = staging.Progress(source.description, dest, report, interval_s=60)

    result = staging.stage(source, dest, staging.Options(read_timeout_s=30, jobs=1), progress)

    assert source.drop is None
    assert staged_files(dest) == contents
    assert (result.copied, result.recopies) == (len(contents), 1)
