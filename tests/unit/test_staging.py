"""`trainguard stage-data`: verified, resumable copies of data shards, and bounded source reads."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from trainguard.api.constants import ANNOTATION_STAGING, StagingPhase
from trainguard.api.status import Staging
from trainguard.ckpt import DEFAULT_ALGORITHM, hash_file
from trainguard.contract import env, files, reports
from trainguard.initsteps import stage_data as staging
from trainguard.initsteps.sources import (
    DATA_MANIFEST_FILENAME,
    DirectorySource,
    Source,
    SourceError,
    SourceFile,
    SourceTimeoutError,
    open_source,
    read_chunks,
)
from trainguard.layers.fingerprints import Fingerprint
from trainguard.operator.policies import initsteps
from trainguard_dev.testing.polling import eventually
from trainguard_dev.testing.sources import FlipSource

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]

SHARDS = 200
CONTROL = staging.CONTROL_DIRNAME


def write_shard_files(root: Path, count: int = SHARDS, seed: int = 8) -> dict[str, bytes]:
    """`count` shards of 2-4 KB in two subdirectories; returns relative path -> contents."""
    rng = random.Random(seed)
    shards = {}
    for index in range(count):
        relpath = f"{'train' if index % 4 else 'valid'}/shard-{index:05d}.bin"
        data = rng.randbytes(rng.randint(2048, 4096))
        (root / relpath).parent.mkdir(parents=True, exist_ok=True)
        (root / relpath).write_bytes(data)
        shards[relpath] = data
    return shards


def write_manifest(root: Path, paths: list[str]) -> None:
    """DATA_MANIFEST.json computed here with the checkpoint hashing, not by the code under test."""
    files = []
    for relpath in sorted(paths):
        size, digest = hash_file(root / relpath, DEFAULT_ALGORITHM)
        files.append({"path": relpath, "size": size, "hash": digest})
    manifest = {"format_version": 1, "hash_algorithm": DEFAULT_ALGORITHM, "files": files}
    (root / DATA_MANIFEST_FILENAME).write_text(json.dumps(manifest))


def staged_files(dest: Path) -> dict[str, bytes]:
    """Every file in the data directory outside the bookkeeping."""
    return {
        p.relative_to(dest).as_posix(): p.read_bytes()
        for p in dest.rglob("*")
        if p.is_file() and CONTROL not in p.relative_to(dest).parts
    }


def progress(tmp_path: Path, source: str, dest: Path) -> staging.Progress:
    return staging.Progress(source, dest, tmp_path / files.STAGING_FILENAME, interval_s=60)


def report(tmp_path: Path) -> dict[str, object]:
    data: dict[str, object] = json.loads((tmp_path / files.STAGING_FILENAME).read_text())
    return data


def run_stage(tmp_path: Path, source: Source, dest: Path, retries: int = 3) -> staging.StageResult:
    opts = staging.Options(read_timeout_s=10, retries=retries)
    return staging.stage(source, dest, opts, progress(tmp_path, source.description, dest))


@pytest.fixture(autouse=True)
def termination_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The container's termination message file (the kubelet creates it in a pod)."""
    path = tmp_path / "termination-log"
    path.touch()
    monkeypatch.setenv(env.TERMINATION_LOG, str(path))
    return path


@pytest.fixture
def shards(tmp_path: Path) -> tuple[Path, dict[str, bytes]]:
    source = tmp_path / "source"
    contents = write_shard_files(source)
    return source, contents


@pytest.mark.parametrize("with_manifest", [True, False], ids=["source-manifest", "built"])
def test_stages_200_shards_verified_then_skips_the_verified_copy(
    tmp_path: Path,
    shards: tuple[Path, dict[str, bytes]],
    with_manifest: bool,
    termination_log: Path,
) -> None:
    source, contents = shards
    if with_manifest:
        write_manifest(source, list(contents))
    dest = tmp_path / "data"

    result = run_stage(tmp_path, DirectorySource(source), dest)

    assert (result.files, result.copied, result.recopies) == (SHARDS, SHARDS, 0)
    assert staged_files(dest) == contents
    assert list((dest / CONTROL / staging.PARTIAL_DIRNAME).iterdir()) == []
    state = json.loads((dest / CONTROL / staging.STATE_FILENAME).read_text())
    assert state["complete"] and len(state["verified"]) == SHARDS
    assert state["manifest_origin"] == ("source" if with_manifest else "built")
    done = report(tmp_path)
    assert done["phase"] == staging.COMPLETE and done["exit_code"] == 0
    assert done["files_done"] == done["files_total"] == SHARDS
    assert done["bytes_done"] == done["bytes_total"] == sum(map(len, contents.values()))
    # Built: the source is read twice (hash, then copy); with a manifest, once.
    assert done["bytes_transferred"] == done["bytes_total"] * (1 if with_manifest else 2)

    again = run_stage(tmp_path, DirectorySource(source), dest)

    assert again.skipped and again.copied == 0 and again.bytes_transferred == 0
    assert report(tmp_path)["phase"] == staging.SKIPPED
    assert report(tmp_path)["already_verified"] == SHARDS
    # The final report is also the container's termination message, for the operator.
    assert json.loads(termination_log.read_text())["phase"] == staging.SKIPPED


@pytest.mark.parametrize("with_manifest", [True, False], ids=["source-manifest", "built"])
def test_a_shard_corrupted_in_transit_is_detected_and_copied_again(
    tmp_path: Path,
    shards: tuple[Path, dict[str, bytes]],
    with_manifest: bool,
    capsys: pytest.CaptureFixture[str],
) -> None:
    source, contents = shards
    if with_manifest:
        write_manifest(source, list(contents))
    victim = "train/shard-00077.bin"
    # A built manifest reads each file once to hash it: corrupt the first copy, not that.
    corrupt = FlipSource(DirectorySource(source), victim, {1 if with_manifest else 2})
    dest = tmp_path / "data"

    result = run_stage(tmp_path, corrupt, dest)

    assert (result.copied, result.recopies) == (SHARDS, 1)
    assert staged_files(dest) == contents
    assert report(tmp_path)["recopies"] == 1
    log = capsys.readouterr().out
    assert f"{victim}: the copy has" in log and "copying again (2/4)" in log


def test_a_shard_that_never_verifies_fails_naming_it(
    tmp_path: Path, shards: tuple[Path, dict[str, bytes]]
) -> None:
    source, contents = shards
    write_manifest(source, list(contents))
    victim = "valid/shard-00008.bin"
    corrupt = FlipSource(DirectorySource(source), victim, set(range(1, 100)))
    dest = tmp_path / "data"

    with pytest.raises(staging.VerificationError, match=f"{victim} .* still differs after 3"):
        run_stage(tmp_path, corrupt, dest, retries=2)

    assert corrupt.count == 3
    assert not (dest / victim).exists()
    # What verified before the failure is in the bookkeeping: a retry will not copy it again.
    state = json.loads((dest / CONTROL / staging.STATE_FILENAME).read_text())
    assert victim not in state["verified"] and len(state["verified"]) >= SHARDS // 2
    assert not state["complete"]


def test_a_copy_in_place_without_bookkeeping_is_adopted_and_a_changed_file_recopied(
    tmp_path: Path, shards: tuple[Path, dict[str, bytes]]
) -> None:
    source, contents = shards
    write_manifest(source, list(contents))
    dest = tmp_path / "data"
    for relpath, data in contents.items():  # e.g. a local volume copied by hand
        (dest / relpath).parent.mkdir(parents=True, exist_ok=True)
        (dest / relpath).write_bytes(data)
    changed = "train/shard-00101.bin"
    (dest / changed).write_bytes(b"\0" * len(contents[changed]))

    result = run_stage(tmp_path, DirectorySource(source), dest)

    assert (result.adopted, result.copied, result.bytes_transferred) == (
        SHARDS - 1,
        1,
        len(contents[changed]),
    )
    assert staged_files(dest) == contents

    time.sleep(0.01)  # a new mtime for the file changed after staging
    (dest / changed).write_bytes(b"\1" * len(contents[changed]))
    again = run_stage(tmp_path, DirectorySource(source), dest)

    assert (again.already_verified, again.copied, again.skipped) == (SHARDS - 1, 1, False)
    assert staged_files(dest) == contents


class ServerSource(DirectorySource):
    """A directory standing in for a server that gives sha256 fingerprints.

    In its listing for valid/, on request for every other train/ shard, none for the rest.
    """

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.asked: list[str] = []

    def _sha256(self, path: str) -> Fingerprint:
        return Fingerprint("sha256", hashlib.sha256((self.root / path).read_bytes()).hexdigest())

    def list_files(self) -> list[SourceFile]:
        return [
            dataclasses.replace(f, fingerprint=self._sha256(f.path))
            if f.path.startswith("valid/")
            else f
            for f in super().list_files()
        ]

    def fingerprint(self, file: SourceFile) -> Fingerprint | None:
        self.asked.append(file.path)
        index = int(file.path.rsplit("-", 1)[1].split(".")[0])
        return self._sha256(file.path) if index % 2 == 0 else None


def test_the_servers_fingerprints_are_the_reference_and_are_not_asked_for_twice(
    tmp_path: Path, shards: tuple[Path, dict[str, bytes]]
) -> None:
    source_dir, contents = shards
    source = ServerSource(source_dir)
    dest = tmp_path / "data"

    result = run_stage(tmp_path, source, dest)

    assert staged_files(dest) == contents
    manifest = json.loads((dest / CONTROL / staging.STATE_FILENAME).read_text())["manifest"]
    assert manifest["hash_algorithm"] == staging.PER_FILE
    algorithms = {e["path"]: Fingerprint.parse(e["hash"]).algorithm for e in manifest["files"]}
    asked = [p for p in contents if p.startswith("train/")]
    hashed_here = [p for p in asked if int(p[-9:-4]) % 2]
    assert sorted(source.asked) == sorted(asked)  # listed ones are never asked for
    assert {p for p, a in algorithms.items() if a == DEFAULT_ALGORITHM} == set(hashed_here)
    assert {p for p, a in algorithms.items() if a == "sha256"} == set(contents) - set(hashed_here)
    # Read once, but the files with no fingerprint: read twice (hashed, then copied).
    total = sum(map(len, contents.values()))
    assert result.bytes_transferred == total + sum(len(contents[p]) for p in hashed_here)
    assert report(tmp_path)["manifest"] == "server"

    # Copies lost, the source unchanged but one file: a new staging asks only about that one.
    for path in asked[:10]:
        (dest / path).unlink()
    changed = asked[1]
    time.sleep(0.01)
    (source_dir / changed).write_bytes(b"new" + contents[changed])
    again = ServerSource(source_dir)

    result = run_stage(tmp_path, again, dest)

    assert again.asked == [changed]
    assert result.copied == 10
    assert staged_files(dest) == {**contents, changed: b"new" + contents[changed]}


def test_a_per_file_manifest_names_a_usable_algorithm_for_every_file() -> None:
    entry = {"path": "a.bin", "size": 1, "hash": "crc32:00"}
    with pytest.raises(ValueError, match="unknown or unavailable hash algorithm 'crc32'"):
        staging.DataManifest.model_validate({"hash_algorithm": staging.PER_FILE, "files": [entry]})


def _cli(tmp_path: Path, *args: str, inject: str | None = None) -> subprocess.Popen[str]:
    environ = {**os.environ, env.STATE_DIR: str(tmp_path / "state")}
    environ.pop(staging.INJECT_ENV, None)
    if inject is not None:
        environ[staging.INJECT_ENV] = inject
    return subprocess.Popen(
        [sys.executable, "-m", "trainguard.cli.main", "stage-data", *args],
        env=environ,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _cli_report(tmp_path: Path) -> dict[str, object]:
    data: dict[str, object] = json.loads((tmp_path / "state" / files.STAGING_FILENAME).read_text())
    return data


def test_killed_half_way_resumes_without_copying_verified_files_again(
    tmp_path: Path, shards: tuple[Path, dict[str, bytes]]
) -> None:
    source, contents = shards
    write_manifest(source, list(contents))
    dest = tmp_path / "data"
    args = ("--source", str(source), "--dest", str(dest), "--jobs", "2")
    first = _cli(tmp_path, *args, inject=f"{staging.INJECT_SLOW_FILES}0.05")

    def a_quarter_staged() -> bool:
        assert first.poll() is None, "staging ended before it was killed"
        return len(staged_files(dest) if dest.exists() else {}) >= SHARDS // 4

    eventually(a_quarter_staged, 30, "a quarter of the shards staged", 0.02)
    first.send_signal(signal.SIGKILL)
    first.communicate(timeout=10)
    present = {
        relpath: ((dest / relpath).stat().st_ino, (dest / relpath).stat().st_mtime_ns)
        for relpath in staged_files(dest)
    }
    assert SHARDS // 4 <= len(present) < SHARDS

    second = _cli(tmp_path, *args)
    log, _ = second.communicate(timeout=30)

    assert second.returncode == 0, log
    assert staged_files(dest) == contents
    final = _cli_report(tmp_path)
    # Every file verified before the kill is kept as it is (bookkeeping, or adopted by hash).
    assert final["copied"] == SHARDS - len(present)
    assert final["already_verified"] + final["adopted"] == len(present)  # type: ignore[operator]
    assert final["already_verified"] > 0  # type: ignore[operator]
    assert "already verified here: not copied again" in log
    for relpath, identity in present.items():
        stat = (dest / relpath).stat()
        assert (stat.st_ino, stat.st_mtime_ns) == identity, relpath


def test_a_source_read_that_never_returns_fails_within_the_timeout(
    tmp_path: Path, shards: tuple[Path, dict[str, bytes]], termination_log: Path
) -> None:
    source, contents = shards
    hung = "train/shard-00005.bin"
    write_manifest(source, list(contents))
    # A FIFO with no writer: opening it blocks forever, like a read from a hung network mount.
    (source / hung).unlink()
    os.mkfifo(source / hung)
    dest = tmp_path / "data"
    started = time.monotonic()

    run = _cli(tmp_path, "--source", str(source), "--dest", str(dest), "--read-timeout", "1")
    log, _ = run.communicate(timeout=20)

    elapsed = time.monotonic() - started
    assert run.returncode == staging.ExitCode.SOURCE_HUNG, log
    assert elapsed < 10, f"took {elapsed:.1f} s"
    assert f"reading {hung} at offset 0 from {source}: no answer from the source within 1 s" in log
    failed = _cli_report(tmp_path)
    assert failed["phase"] == staging.FAILED
    assert failed["exit_code"] == staging.ExitCode.SOURCE_HUNG
    assert hung in str(failed["error"])
    # Reported before os._exit, in short: the fields of the run's status.staging.
    short = json.loads(termination_log.read_text())
    assert short == reports.staging_summary(failed, None)
    assert short["phase"] == staging.FAILED and hung in short["message"]
    assert len(short["message"]) <= reports.SUMMARY_MESSAGE_LIMIT


@pytest.fixture
def stalled_fifo(tmp_path: Path) -> Iterator[tuple[Path, Callable[[], None]]]:
    """A FIFO whose writer sends 100 bytes and then stalls (open until released)."""
    fifo = tmp_path / "src" / "stalled.bin"
    fifo.parent.mkdir()
    os.mkfifo(fifo)
    release = threading.Event()

    def writer() -> None:
        with fifo.open("wb", buffering=0) as handle:
            handle.write(b"x" * 100)
            release.wait(30)

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    yield fifo, release.set
    release.set()
    thread.join(10)


def test_a_read_that_stalls_mid_file_times_out_naming_the_offset(
    stalled_fifo: tuple[Path, Callable[[], None]],
) -> None:
    fifo, _ = stalled_fifo
    source = DirectorySource(fifo.parent)
    received = b""
    started = time.monotonic()

    with pytest.raises(SourceTimeoutError, match=r"stalled\.bin at offset 100 .* within 0\.5 s"):
        for chunk in read_chunks(source, fifo.name, 0, timeout_s=0.5):
            received += chunk

    assert received == b"x" * 100
    assert time.monotonic() - started < 5


def test_staging_fails_cleanly_when_the_local_disk_is_full(
    tmp_path: Path, shards: tuple[Path, dict[str, bytes]], tmpfs: Callable[[int], Path]
) -> None:
    source, contents = shards
    write_manifest(source, list(contents))
    dest = tmpfs(256 * 1024)  # the 200 shards need about 600 KB

    run = _cli(tmp_path, "--source", str(source), "--dest", str(dest))
    log, _ = run.communicate(timeout=30)

    assert run.returncode == staging.ExitCode.DEST_ERROR, log
    assert "No space left on device" in str(_cli_report(tmp_path)["error"])


def test_source_errors_are_clear(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="gs:// data sources are not supported"):
        open_source("gs://bucket/shards")
    with pytest.raises(SourceError, match="the data source: the Secret has no ssh-privatekey"):
        open_source("ssh://host.example/shards", credentials_dir=tmp_path)
    with pytest.raises(SourceError, match="hf:// data source is a dataset repository"):
        open_source("hf://acme/model", environ={})
    with pytest.raises(SourceError, match=r"credentials directory .*missing is not mounted"):
        open_source("s3://bucket/shards", credentials_dir=tmp_path / "missing")
    assert isinstance(open_source(f"file://{tmp_path}"), DirectorySource)

    run = _cli(tmp_path, "--source", str(tmp_path / "missing"), "--dest", str(tmp_path / "d"))
    log, _ = run.communicate(timeout=30)

    assert run.returncode == staging.ExitCode.SOURCE_ERROR, log
    assert f"{tmp_path / 'missing'}: not a directory" in log


def test_write_manifest_records_every_shard_for_later_stagings(
    tmp_path: Path, shards: tuple[Path, dict[str, bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    source, contents = shards
    monkeypatch.delenv(staging.INJECT_ENV, raising=False)
    monkeypatch.setenv(env.STATE_DIR, str(tmp_path / "state"))

    assert staging.main(["--source", str(source), "--write-manifest"]) == 0

    written = json.loads((source / DATA_MANIFEST_FILENAME).read_text())
    expected = {
        relpath: list(hash_file(source / relpath, DEFAULT_ALGORITHM)) for relpath in contents
    }
    assert written["hash_algorithm"] == DEFAULT_ALGORITHM
    assert {f["path"]: [f["size"], f["hash"]] for f in written["files"]} == expected


def test_progress_reaches_the_agents_lease_annotations_while_staging_runs(
    tmp_path: Path, shards: tuple[Path, dict[str, bytes]]
) -> None:
    source, contents = shards
    dest = tmp_path / "data"
    # A slow source (the documented hook): about 20 ms per file, one stream.
    opts = staging.Options(read_timeout_s=10, jobs=1, pause_per_file_s=0.02)
    worker = threading.Thread(
        target=staging.stage,
        args=(DirectorySource(source), dest, opts, progress(tmp_path, "src", dest)),
    )
    worker.start()
    seen: list[Staging] = []
    while worker.is_alive():
        text = reports.lease_annotations(tmp_path, "2").get(ANNOTATION_STAGING)
        parsed = initsteps.parse(Staging, text)
        if parsed is not None:
            seen.append(parsed)
        time.sleep(0.05)
    worker.join()
    running = [s for s in seen if s.phase == StagingPhase.COPYING and 0 < s.files_done < SHARDS]
    assert running, seen
    assert running[-1].bytes_per_second and running[-1].eta_seconds is not None
    assert all(s.attempt == 2 for s in seen)
    final = initsteps.parse(
        Staging, reports.lease_annotations(tmp_path, "2").get(ANNOTATION_STAGING)
    )
    assert final is not None and final.phase == StagingPhase.COMPLETE
    assert final.files_done == final.files_total == len(contents)
    assert len(reports.lease_annotations(tmp_path, "2")[ANNOTATION_STAGING]) < 400
