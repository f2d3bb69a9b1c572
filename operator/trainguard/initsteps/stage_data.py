"""`trainguard stage-data`: copy the run's data shards to local disk, verified and resumable.

In the first incident four dataloader workers reading shards from a network volume hung, and
the fix was to copy the shards to local SSD. This init step does that before every attempt,
from a source (a directory such as the source PVC mounted into this step only, or a URI; see
`trainguard.initsteps.sources`) into the local data directory (``TRAINGUARD_DATA_DIR``).

1. **Manifest.** The reference is the source's ``DATA_MANIFEST.json``: every file's relative
   path, size and hash, in the checkpoint manifests' terms (`trainguard.ckpt`; xxh3-128 by
   default)::

       {"format_version": 1, "hash_algorithm": "xxh3-128",
        "files": [{"path": "train/shard-00000.bin", "size": 4096, "hash": "9f0c..."}]}

   A source without one is listed. A server's fingerprint of each file (an S3 ETag, the Hub's
   LFS sha256 or git blob id, a sha256 computed on an SSH host: `trainguard.layers.fingerprints`)
   is the reference where there is one: the manifest is then built from the listing (``server``;
   its ``hash_algorithm`` is ``per-file`` and each hash names its algorithm, as in
   ``"sha256:9f0c..."``), and the source is read once. A file without one (every file of a
   directory) is hashed here first: an independent read, so a copy corrupted in transit cannot
   agree with it, at the cost of reading the source twice (``built``). What a staging found is
   kept for a resumed one: a file with the same size and mtime is not hashed, nor asked for its
   fingerprint, again. ``trainguard stage-data --write-manifest --source DIR`` writes the
   manifest at a source directory once, and every later staging reads the source only once.
2. **Skip.** A data directory whose bookkeeping says every file verified against this manifest,
   and whose files still have the recorded size, mtime and inode, is left as it is (a local
   PersistentVolume that already holds the copy).
3. **Copy and verify.** Each missing file is copied under a temporary name, fsynced, dropped
   from the page cache, hashed from the disk and compared with the manifest, and only then
   renamed into place. A mismatch is copied again (``--retries``), then staging fails naming
   the file. A file already in place with the manifest's size and hash (a copy whose
   bookkeeping was lost) is adopted without copying.
4. **Resume.** The bookkeeping (rewritten atomically at least every second) lists the verified
   files; a run killed half-way restarts with them and never copies them again, and a partial
   file continues from where it stopped (a ranged read on a remote source; its full hash is
   checked anyway).
5. **Bounded reads.** Every source read must return within ``--read-timeout``; a hung read
   fails the step with a message naming the file and the offset, instead of hanging the pod.
   A fingerprint the server computes (a remote ``sha256sum`` reads the whole file there) has
   that long plus the file's size at `MIN_SERVER_HASH_BYTES_PER_S`.

The data directory holds the staged files at their paths and, hidden from dataloaders' globs,
``.trainguard-staging/`` with ``state.json`` (the bookkeeping) and ``partial/`` (copies in
progress). Progress (phase, files, bytes, rate, ETA) goes to the log every
``--progress-interval`` and to ``$TRAINGUARD_STATE_DIR/staging.json`` (see `Progress.snapshot`)
for the agent to carry into the run's status; the final report is also the container's
termination message, in short (`trainguard.contract.reports.staging_summary`). Exit codes:
`ExitCode`.

Fault injection, for tests only and off by default: ``TRAINGUARD_STAGING_INJECT=slow-files:S``
pauses S seconds after each file's bytes are written, before it is verified (a slow source),
so a test can kill staging half-way at a point it controls.
"""

from __future__ import annotations

import argparse
import enum
import hashlib
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from trainguard.api.constants import StagingPhase
from trainguard.api.quantity import human_bytes
from trainguard.api.spec import DEFAULT_DATA_DIR
from trainguard.ckpt import DEFAULT_ALGORITHM, FileEntry, hash_file, new_hasher
from trainguard.ckpt.hashing import UnknownHashAlgorithmError
from trainguard.ckpt.layout import fsync_path
from trainguard.contract import env, files, reports
from trainguard.contract.env import ContractError, PodEnv
from trainguard.initsteps import common
from trainguard.initsteps.sources import (
    DATA_MANIFEST_FILENAME,
    DirectorySource,
    Source,
    SourceError,
    SourceFile,
    SourceTimeoutError,
    call_with_timeout,
    open_source,
    read_chunks,
)
from trainguard.layers.fingerprints import Fingerprint

STEP = "stage-data"
FORMAT_VERSION = 1
CONTROL_DIRNAME = ".trainguard-staging"
STATE_FILENAME = "state.json"
PARTIAL_DIRNAME = "partial"
INJECT_ENV = env.STAGING_INJECT
INJECT_SLOW_FILES = "slow-files:"

DEFAULT_READ_TIMEOUT_S = 60.0
DEFAULT_RETRIES = 3
# A few streams: a network filesystem or an object store rarely gives one stream its full rate.
DEFAULT_JOBS = 4
DEFAULT_PROGRESS_INTERVAL_S = 10.0
# A fingerprint computed by the server (a remote sha256sum) may take the read timeout plus the
# file's size at this rate: a slow disk over there, shared with other readers.
MIN_SERVER_HASH_BYTES_PER_S = 25 * 10**6
# The hash_algorithm of a manifest whose every hash names its own algorithm (`Fingerprint`).
PER_FILE = "per-file"
# Bookkeeping is rewritten at most this often: a kill loses at most this much of it, and the
# files it misses are adopted by their hash, not copied again.
STATE_SAVE_INTERVAL_S = 1.0
FILE_MODE = 0o644
ERROR_LIMIT = 2000  # characters of an error kept in staging.json

# Phases, as staging.json names them.
LISTING = StagingPhase.LISTING.value
HASHING = StagingPhase.HASHING.value
COPYING = StagingPhase.COPYING.value
COMPLETE = StagingPhase.COMPLETE.value
SKIPPED = StagingPhase.SKIPPED.value
FAILED = StagingPhase.FAILED.value

# Counters of staging.json: how each file got verified, and the extra work it took.
ALREADY_VERIFIED = "already_verified"
ADOPTED = "adopted"
COPIED = "copied"
RECOPIES = "recopies"
RESUMED_PARTIALS = "resumed_partials"
COUNTERS = (ALREADY_VERIFIED, ADOPTED, COPIED, RECOPIES, RESUMED_PARTIALS)

ManifestOrigin = Literal["source", "built", "server"]
T = TypeVar("T")
R = TypeVar("R")


class ExitCode(enum.IntEnum):
    """Exit status of `trainguard stage-data`, one per failure class."""

    OK = 0
    USAGE = 2
    VERIFY_FAILED = 3  # a file still differs from the manifest after every retry
    SOURCE_HUNG = 4  # a source read did not return within the read timeout
    SOURCE_ERROR = 5  # the source cannot be listed or read, or its manifest is invalid
    DEST_ERROR = 6  # the local data directory cannot be written (ENOSPC, EIO...)


class VerificationError(RuntimeError):
    """A staged file kept differing from the manifest."""


class _Cancelled(Exception):
    """Another file failed: the remaining copies stop."""


class DataManifest(BaseModel):
    """DATA_MANIFEST.json: every data file with its size and hash (see the module docstring)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    format_version: int = FORMAT_VERSION
    hash_algorithm: str
    files: tuple[FileEntry, ...]

    @field_validator("format_version")
    @classmethod
    def _known_version(cls, value: int) -> int:
        if value != FORMAT_VERSION:
            raise ValueError(f"unsupported format_version {value} (supported: {FORMAT_VERSION})")
        return value

    @field_validator("hash_algorithm")
    @classmethod
    def _usable_hash(cls, value: str) -> str:
        if value != PER_FILE:
            new_hasher(value)  # raises, naming the algorithms that are available
        return value

    @field_validator("files")
    @classmethod
    def _unique_paths(cls, value: tuple[FileEntry, ...]) -> tuple[FileEntry, ...]:
        if len({entry.path for entry in value}) != len(value):
            raise ValueError("file paths must be unique")
        return value

    @model_validator(mode="after")
    def _fingerprints(self) -> DataManifest:
        if self.hash_algorithm == PER_FILE:
            for entry in self.files:
                Fingerprint.parse(entry.hash)  # raises, naming the hash
        return self

    @property
    def total_bytes(self) -> int:
        """Sum of the sizes of all files."""
        return sum(entry.size for entry in self.files)

    def to_json_bytes(self) -> bytes:
        """The manifest as written at a source."""
        return (self.model_dump_json(indent=1) + "\n").encode()


@dataclass(frozen=True)
class _Found:
    """A source file's reference for the manifest: its size, fingerprint, and whose it is."""

    size: int
    fingerprint: Fingerprint
    server: bool  # the server's (else a hash of the bytes read here)


class VerifiedFile(BaseModel):
    """A staged file that verified, and its identity on disk when it did."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    hash: str
    size: int
    mtime_ns: int
    ino: int


class StagingState(BaseModel):
    """The bookkeeping of a data directory (`.trainguard-staging/state.json`)."""

    model_config = ConfigDict(extra="forbid")

    format_version: int = FORMAT_VERSION
    source: str
    manifest: DataManifest
    manifest_origin: ManifestOrigin
    # Built and server manifests: (size, mtime_ns) of each source file when it was listed, so
    # a resumed run reuses the hashes (and the fingerprints the server computed) of unchanged
    # files instead of reading the source (or having the server hash it) again.
    source_stats: dict[str, tuple[int, int | None]] = Field(default_factory=dict)
    verified: dict[str, VerifiedFile] = Field(default_factory=dict)
    complete: bool = False


@dataclass(frozen=True)
class Options:
    """How to stage (the command-line options)."""

    read_timeout_s: float = DEFAULT_READ_TIMEOUT_S
    retries: int = DEFAULT_RETRIES
    jobs: int = DEFAULT_JOBS
    progress_interval_s: float = DEFAULT_PROGRESS_INTERVAL_S
    hash_algorithm: str = DEFAULT_ALGORITHM  # of a manifest built here
    pause_per_file_s: float = 0.0  # fault injection (slow-files), see the module docstring


@dataclass(frozen=True)
class StageResult:
    """What one staging did."""

    skipped: bool
    files: int
    bytes: int
    already_verified: int
    adopted: int
    copied: int
    recopies: int
    resumed_partials: int
    bytes_transferred: int
    extra_files: int
    seconds: float


class Progress:
    """Counters shared by the copy workers; the main thread reports them (log, staging.json)."""

    def __init__(
        self,
        source: str,
        dest: Path,
        report_path: Path,
        interval_s: float,
        environ: Mapping[str, str] = os.environ,
    ) -> None:
        self._lock = threading.Lock()
        self._environ = environ  # where the termination message goes
        self._source = source
        self._dest = dest
        self._report_path = report_path
        self._interval_s = interval_s
        self._started_at = time.time()
        self._phase = LISTING
        self._manifest: tuple[ManifestOrigin, str] | None = None
        self._files_total = 0
        self._bytes_total = 0
        self._files_done = 0
        self._bytes_finished = 0
        self._inflight: dict[str, int] = {}
        self.counts = dict.fromkeys(COUNTERS, 0)
        self.bytes_transferred = 0
        self._error: str | None = None
        self._exit_code: int | None = None
        self._phase_start = time.monotonic()
        self._phase_start_bytes = 0
        self._last_log = 0.0

    def set_manifest(self, origin: ManifestOrigin, hash_algorithm: str) -> None:
        """Say where the manifest came from and its hash."""
        with self._lock:
            self._manifest = (origin, hash_algorithm)

    def begin(
        self,
        phase: str,
        files_total: int,
        bytes_total: int,
        files_done: int = 0,
        bytes_done: int = 0,
    ) -> None:
        """Start a phase; what is done already (`files_done`, `bytes_done`) is not in the rate.

        Call `report` to show it.
        """
        with self._lock:
            self._phase = phase
            self._files_total, self._bytes_total = files_total, bytes_total
            self._files_done, self._bytes_finished = files_done, bytes_done
            self._inflight.clear()
            self._phase_start, self._phase_start_bytes = time.monotonic(), bytes_done

    def moved(self, path: str, position: int, new_bytes: int) -> None:
        """`path` has reached `position` bytes; `new_bytes` of them came from the source now."""
        with self._lock:
            self._inflight[path] = position
            self.bytes_transferred += new_bytes

    def restart_file(self, path: str) -> None:
        """A file is copied again from its start."""
        with self._lock:
            self._inflight.pop(path, None)

    def file_done(self, path: str, size: int, counter: str | None = None) -> None:
        """A file of the phase is finished (and counted under `counter`)."""
        with self._lock:
            self._inflight.pop(path, None)
            self._files_done += 1
            self._bytes_finished += size
            if counter is not None:
                self.counts[counter] += 1

    def count(self, counter: str, number: int = 1) -> None:
        """Count events (a re-copy, a resumed partial file, files already verified)."""
        with self._lock:
            self.counts[counter] += number

    def snapshot(self) -> dict[str, Any]:
        """The report written to staging.json.

        Keys: phase (Listing, Hashing, Copying, Complete, Skipped, Failed), source, dest,
        manifest (source, built or server; None while listing), hash_algorithm (per-file for a
        server manifest), files_total/files_done and bytes_total/bytes_done of the phase,
        bytes_per_second and eta_seconds (None until known), the counters already_verified,
        adopted, copied, recopies, resumed_partials, bytes_transferred (read from the source by
        this run), started_at and updated_at (Unix seconds), error (one line, or None) and
        exit_code (None while running).
        """
        with self._lock:
            done = self._bytes_finished + sum(self._inflight.values())
            elapsed = time.monotonic() - self._phase_start
            rate = (done - self._phase_start_bytes) / elapsed if elapsed > 0 else 0.0
            remaining = max(0, self._bytes_total - done)
            origin, algorithm = self._manifest or (None, None)
            return {
                "phase": self._phase,
                "source": self._source,
                "dest": str(self._dest),
                "manifest": origin,
                "hash_algorithm": algorithm,
                "files_total": self._files_total,
                "files_done": self._files_done,
                "bytes_total": self._bytes_total,
                "bytes_done": done,
                "bytes_per_second": round(rate, 1) if rate > 0 else None,
                "eta_seconds": round(remaining / rate, 1) if rate > 0 else None,
                **self.counts,
                "bytes_transferred": self.bytes_transferred,
                "started_at": self._started_at,
                "updated_at": time.time(),
                "error": self._error,
                "exit_code": self._exit_code,
            }

    def report(self, force: bool = False) -> None:
        """Write staging.json; log a progress line when the interval has passed (or forced)."""
        snap = self.snapshot()
        files.write_json(self._report_path, snap)
        now = time.monotonic()
        if force or now - self._last_log >= self._interval_s:
            self._last_log = now
            common.log(STEP, progress_line(snap))

    def end(self, phase: str) -> None:
        """Staging succeeded (`phase` is Complete or Skipped): report it."""
        with self._lock:
            self._phase, self._exit_code = phase, int(ExitCode.OK)
        self.report(force=True)
        self._terminate(self.snapshot())

    def fail(self, message: str, code: ExitCode) -> int:
        """Record and report a failure; return its exit code."""
        with self._lock:
            # Bounded: staging.json stays small (its summary is the termination message).
            self._phase, self._error, self._exit_code = FAILED, message[:ERROR_LIMIT], int(code)
        snap = self.snapshot()
        files.write_json(self._report_path, snap)
        self._terminate(snap)
        common.log(STEP, f"FAILED: {message}")
        return int(code)

    def _terminate(self, snap: dict[str, Any]) -> None:
        summary = reports.staging_summary(snap, PodEnv.from_env(self._environ).attempt)
        reports.write_termination_message(summary, self._environ)


def progress_line(snap: Mapping[str, Any]) -> str:
    """One log line from a staging.json snapshot."""
    total = snap["bytes_total"]
    percent = f" ({100 * snap['bytes_done'] / total:.1f}%)" if total else ""
    line = (
        f"{snap['phase'].lower()}: {snap['files_done']}/{snap['files_total']} files, "
        f"{human_bytes(snap['bytes_done'])} of {human_bytes(total)}{percent}"
    )
    if snap["bytes_per_second"]:
        line += f", {snap['bytes_per_second'] / 1e6:.1f} MB/s"
    if snap["eta_seconds"] is not None and snap["phase"] in (HASHING, COPYING):
        line += f", ETA {_duration(snap['eta_seconds'])}"
    return line


def _duration(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


def _run_parallel(
    items: Iterable[T],
    work: Callable[[T], R],
    jobs: int,
    tick: Callable[[], None],
    cancel: threading.Event,
) -> list[R]:
    """`work` over `items` on `jobs` threads, calling `tick` about every second; fail fast.

    On the first error the other workers are told to stop and the error is raised at once,
    without waiting for them: one of them may be stuck in a read that never returns.
    """
    pool = ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="trainguard-stage")
    futures: list[Future[R]] = [pool.submit(work, item) for item in items]
    pending: set[Future[R]] = set(futures)
    try:
        while pending:
            done, pending = wait(
                pending, timeout=STATE_SAVE_INTERVAL_S, return_when=FIRST_EXCEPTION
            )
            tick()
            for future in done:
                error = future.exception()
                if error is not None:
                    raise error
    except BaseException:
        cancel.set()
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown(wait=True)
    return [future.result() for future in futures]


class Stager:
    """One staging of `source` into `dest` (see the module docstring)."""

    def __init__(self, source: Source, dest: Path, options: Options, progress: Progress) -> None:
        self.source = source
        self.dest = dest
        self.options = options
        self.progress = progress
        self.control = dest / CONTROL_DIRNAME
        self.partial_dir = self.control / PARTIAL_DIRNAME
        self.state_path = self.control / STATE_FILENAME
        self.cancel = threading.Event()
        self._lock = threading.Lock()
        self._state: StagingState | None = None
        self._dirty = False
        self._saved_at = 0.0

    @property
    def state(self) -> StagingState:
        """The bookkeeping of this staging (known once the manifest is)."""
        if self._state is None:
            raise RuntimeError("the manifest is not known yet")
        return self._state

    # -- bookkeeping ---------------------------------------------------------------------

    def _load_state(self) -> StagingState | None:
        try:
            return StagingState.model_validate_json(self.state_path.read_bytes())
        except FileNotFoundError:
            return None
        except (OSError, ValidationError) as err:
            # Lost bookkeeping costs hashing the local files again, never a wrong copy.
            common.log(STEP, f"ignoring unreadable {self.state_path}: {str(err).splitlines()[0]}")
            return None

    def _save_state(self, force: bool = False) -> None:
        """Rewrite state.json if it changed, at most every STATE_SAVE_INTERVAL_S unless forced."""
        now = time.monotonic()
        if not force and now - self._saved_at < STATE_SAVE_INTERVAL_S:
            return
        with self._lock:
            if not (self._dirty or force):
                return
            data = self.state.model_dump_json().encode()
            self._dirty = False
        files.write_atomic(self.state_path, data)
        self._saved_at = now

    def _record(self, path: str, digest: str) -> None:
        stat = (self.dest / path).stat()
        verified = VerifiedFile(
            hash=digest, size=stat.st_size, mtime_ns=stat.st_mtime_ns, ino=stat.st_ino
        )
        with self._lock:
            self.state.verified[path] = verified
            self._dirty = True

    def _still_verified(self, entry: FileEntry, previous: StagingState | None) -> bool:
        known = previous.verified.get(entry.path) if previous is not None else None
        if known is None or (known.hash, known.size) != (entry.hash, entry.size):
            return False
        try:
            stat = (self.dest / entry.path).stat()
        except OSError:
            return False
        return (stat.st_size, stat.st_mtime_ns, stat.st_ino) == (
            known.size,
            known.mtime_ns,
            known.ino,
        )

    def _tick(self) -> None:
        self._save_state()
        self.progress.report()

    # -- the manifest --------------------------------------------------------------------

    def manifest(
        self, previous: StagingState | None
    ) -> tuple[DataManifest, ManifestOrigin, dict[str, tuple[int, int | None]]]:
        """The source's manifest, or one built from the listing (reusing `previous`).

        Also returns, for a built or server manifest, each source file's (size, mtime_ns).
        """
        desc = self.source.description
        timeout = self.options.read_timeout_s
        what = f"reading {DATA_MANIFEST_FILENAME} of {desc}"
        raw = call_with_timeout(self.source.read_manifest, timeout, what)
        if raw is not None:
            try:
                return DataManifest.model_validate_json(raw), "source", {}
            except ValidationError as err:
                raise SourceError(f"{desc}/{DATA_MANIFEST_FILENAME} is invalid: {err}") from err
        listing = call_with_timeout(self.source.list_files, timeout, f"listing {desc}")
        stats = {f.path: (f.size, f.mtime_ns) for f in listing}
        manifest, origin = self.build_manifest(listing, previous)
        return manifest, origin, stats

    def build_manifest(
        self, listing: list[SourceFile], previous: StagingState | None
    ) -> tuple[DataManifest, ManifestOrigin]:
        """Every listed file's reference: the server's fingerprint, else a hash of its bytes.

        A fingerprint the listing carries is taken as it is; unchanged files keep what
        `previous` found; the others are fingerprinted by the server on request or, where it
        has none, read and hashed here. The manifest is `server` when a fingerprint came from
        the server (its hashes name their algorithms), else `built`.
        """
        found = self._known(listing, previous)
        found.update(
            {f.path: _Found(f.size, f.fingerprint, True) for f in listing if f.fingerprint}
        )
        todo = [f for f in listing if f.path not in found]
        self.progress.begin(HASHING, len(todo), sum(f.size for f in todo))
        if todo:
            self.progress.report(force=True)
        done = _run_parallel(
            todo,
            self._fingerprint_source_file,
            self.options.jobs,
            self.progress.report,
            self.cancel,
        )
        found.update({item.path: result for item, result in zip(todo, done, strict=True)})
        ordered = [(f.path, found[f.path]) for f in listing]
        if any(result.server for _, result in ordered):
            files = tuple(
                FileEntry(path=path, size=r.size, hash=str(r.fingerprint)) for path, r in ordered
            )
            return DataManifest(hash_algorithm=PER_FILE, files=files), "server"
        # Every hash is this staging's algorithm: the manifest's format at a source.
        files = tuple(
            FileEntry(path=path, size=r.size, hash=r.fingerprint.value) for path, r in ordered
        )
        return DataManifest(hash_algorithm=self.options.hash_algorithm, files=files), "built"

    def _known(self, listing: list[SourceFile], previous: StagingState | None) -> dict[str, _Found]:
        """What `previous` found for the files unchanged since (same size and mtime)."""
        algorithm = self.options.hash_algorithm
        if (
            previous is None
            or previous.source != self.source.description
            or previous.manifest_origin == "source"
            or (
                previous.manifest_origin == "built"
                and previous.manifest.hash_algorithm != algorithm
            )
        ):
            return {}
        server = previous.manifest_origin == "server"
        by_path = {entry.path: entry for entry in previous.manifest.files}
        known = {}
        for f in listing:
            entry = by_path.get(f.path)
            if (
                entry is None
                or f.mtime_ns is None
                or previous.source_stats.get(f.path) != (f.size, f.mtime_ns)
            ):
                continue
            fingerprint = (
                Fingerprint.parse(entry.hash) if server else Fingerprint(algorithm, entry.hash)
            )
            known[f.path] = _Found(entry.size, fingerprint, server)
        return known

    def _fingerprint_source_file(self, item: SourceFile) -> _Found:
        """The server's fingerprint of a file, asked for now; else a hash of its bytes."""
        # A server that hashes the file reads all of it first.
        timeout = self.options.read_timeout_s + item.size / MIN_SERVER_HASH_BYTES_PER_S
        fingerprint = call_with_timeout(
            lambda: self.source.fingerprint(item),
            timeout,
            f"asking {self.source.description} for the fingerprint of {item.path}",
        )
        if fingerprint is not None:
            self.progress.file_done(item.path, item.size)
            return _Found(item.size, fingerprint, True)
        entry = self._hash_source_file(item)
        return _Found(entry.size, Fingerprint(self.options.hash_algorithm, entry.hash), False)

    def _hash_source_file(self, item: SourceFile) -> FileEntry:
        hasher = new_hasher(self.options.hash_algorithm)
        size = 0
        for chunk in read_chunks(self.source, item.path, 0, self.options.read_timeout_s):
            if self.cancel.is_set():
                raise _Cancelled
            hasher.update(chunk)
            size += len(chunk)
            self.progress.moved(item.path, size, len(chunk))
        self.progress.file_done(item.path, size)
        return FileEntry(path=item.path, size=size, hash=hasher.hexdigest())

    def _local_digest(self, path: Path, entry: FileEntry) -> tuple[int, str]:
        """(size, hash) of a local file in the manifest's terms, read from the disk."""
        algorithm = self.state.manifest.hash_algorithm
        if algorithm != PER_FILE:
            return hash_file(path, algorithm)
        return path.stat().st_size, str(Fingerprint.parse(entry.hash).of_file(path))

    # -- staging -------------------------------------------------------------------------

    def run(self) -> StageResult:
        """Stage everything; raises on failure (see `ExitCode` for the classes)."""
        started = time.monotonic()
        self.partial_dir.mkdir(parents=True, exist_ok=True)
        previous = self._load_state()
        manifest, origin, source_stats = self.manifest(previous)
        self.progress.set_manifest(origin, manifest.hash_algorithm)
        done = [entry for entry in manifest.files if self._still_verified(entry, previous)]
        done_paths = {entry.path for entry in done}
        todo = [entry for entry in manifest.files if entry.path not in done_paths]
        # Only this manifest's files are kept: bookkeeping of other versions would be stale.
        self._state = StagingState(
            source=self.source.description,
            manifest=manifest,
            manifest_origin=origin,
            source_stats=source_stats,
            verified={path: previous.verified[path] for path in done_paths} if previous else {},
        )
        self._save_state(force=True)
        skip = not todo and previous is not None and previous.complete
        self.progress.begin(
            SKIPPED if skip else COPYING,
            len(manifest.files),
            manifest.total_bytes,
            files_done=len(done),
            bytes_done=sum(entry.size for entry in done),
        )
        self.progress.count(ALREADY_VERIFIED, len(done))
        if not skip:
            self.progress.report(force=True)
            if done:
                common.log(STEP, f"{len(done)} files already verified here: not copied again")
            self._remove_stale_partials(todo)
            try:
                _run_parallel(todo, self._ensure, self.options.jobs, self._tick, self.cancel)
            except BaseException:
                self._save_state(force=True)  # what verified so far is never copied again
                raise
        self.state.complete = True
        self._save_state(force=True)
        extra = self._extra_files()
        if extra:
            common.log(
                STEP,
                f"warning: {len(extra)} files in {self.dest} are not in the manifest "
                f"(e.g. {extra[0]}); the trainer may read them",
            )
        self.progress.end(SKIPPED if skip else COMPLETE)
        counts = self.progress.counts
        return StageResult(
            skipped=skip,
            files=len(manifest.files),
            bytes=manifest.total_bytes,
            already_verified=counts[ALREADY_VERIFIED],
            adopted=counts[ADOPTED],
            copied=counts[COPIED],
            recopies=counts[RECOPIES],
            resumed_partials=counts[RESUMED_PARTIALS],
            bytes_transferred=self.progress.bytes_transferred,
            extra_files=len(extra),
            seconds=time.monotonic() - started,
        )

    def _extra_files(self) -> list[str]:
        wanted = {entry.path for entry in self.state.manifest.files}
        extra = []
        for dirpath, dirnames, filenames in os.walk(self.dest):
            if Path(dirpath) == self.dest:
                dirnames[:] = [name for name in dirnames if name != CONTROL_DIRNAME]
            for name in filenames:
                relpath = Path(dirpath, name).relative_to(self.dest).as_posix()
                if relpath not in wanted:
                    extra.append(relpath)
        return sorted(extra)

    def _partial_path(self, entry: FileEntry) -> Path:
        # Named by path and expected hash: a partial copy of another version is never resumed.
        key = hashlib.sha256(f"{entry.path}\0{entry.hash}".encode()).hexdigest()[:32]
        return self.partial_dir / f"{key}.part"

    def _remove_stale_partials(self, todo: list[FileEntry]) -> None:
        wanted = {self._partial_path(entry).name for entry in todo}
        for path in self.partial_dir.iterdir():
            if path.name not in wanted:
                path.unlink()

    def _ensure(self, entry: FileEntry) -> None:
        """Make `entry` present and verified: adopt a matching file in place, else copy it."""
        final = self.dest / entry.path
        if final.is_file() and final.stat().st_size == entry.size:
            _, digest = self._local_digest(final, entry)
            if digest == entry.hash:
                self._record(entry.path, digest)
                self.progress.file_done(entry.path, entry.size, ADOPTED)
                return
            common.log(STEP, f"{entry.path}: the file in place differs from the manifest; copying")
        self._copy_verified(entry)

    def _copy_verified(self, entry: FileEntry) -> None:
        algorithm = self.state.manifest.hash_algorithm
        # A per-file hash names its algorithm already.
        label = "" if algorithm == PER_FILE else f"{algorithm} "
        partial = self._partial_path(entry)
        attempts = self.options.retries + 1
        problem = ""
        for attempt in range(1, attempts + 1):
            offset = partial.stat().st_size if attempt == 1 and partial.exists() else 0
            if offset > entry.size:
                offset = 0
            if offset:
                self.progress.count(RESUMED_PARTIALS)
            try:
                self._copy_bytes(entry, partial, offset)
            except SourceTimeoutError:
                raise  # a hung source is not retried: the next read would hang too
            except SourceError as err:
                problem = str(err)
            else:
                size, digest = self._local_digest(partial, entry)
                if (size, digest) == (entry.size, entry.hash):
                    final = self.dest / entry.path
                    final.parent.mkdir(parents=True, exist_ok=True)
                    os.replace(partial, final)
                    fsync_path(final.parent)
                    self._record(entry.path, digest)
                    self.progress.file_done(entry.path, entry.size, COPIED)
                    return
                problem = (
                    f"the copy has {size} bytes with {label}{digest}, the manifest says "
                    f"{entry.size} bytes with {entry.hash}"
                )
            partial.unlink(missing_ok=True)
            self.progress.restart_file(entry.path)
            if attempt < attempts:
                self.progress.count(RECOPIES)
                common.log(
                    STEP, f"{entry.path}: {problem}; copying again ({attempt + 1}/{attempts})"
                )
        raise VerificationError(
            f"{entry.path} from {self.source.description} still differs after {attempts} "
            f"copies: {problem}"
        )

    def _copy_bytes(self, entry: FileEntry, partial: Path, offset: int) -> None:
        """Append the source's bytes from `offset` to `partial`; fsync; drop it from the cache."""
        flags = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | (0 if offset else os.O_TRUNC)
        fd = os.open(partial, flags, FILE_MODE)
        try:
            os.lseek(fd, offset, os.SEEK_SET)
            position = offset
            # A partial copy that is complete asks nothing more of the source (S3 refuses a
            # range that starts at the end).
            chunks = (
                read_chunks(self.source, entry.path, offset, self.options.read_timeout_s)
                if offset < entry.size
                else iter(())
            )
            for chunk in chunks:
                if self.cancel.is_set():
                    raise _Cancelled
                view = memoryview(chunk)
                while view:
                    view = view[os.write(fd, view) :]
                position += len(chunk)
                self.progress.moved(entry.path, position, len(chunk))
            if self.options.pause_per_file_s:
                time.sleep(self.options.pause_per_file_s)
            os.fsync(fd)
            # The verification that follows must read what the disk holds, not the page cache.
            common.drop_page_cache(fd)
        finally:
            os.close(fd)


def stage(source: Source, dest: Path, options: Options, progress: Progress) -> StageResult:
    """Stage `source` into `dest` (see the module docstring); raises on failure."""
    return Stager(source, dest, options, progress).run()


def write_source_manifest(source: DirectorySource, options: Options, progress: Progress) -> Path:
    """Hash the source directory and write its DATA_MANIFEST.json; return its path."""
    listing = call_with_timeout(
        source.list_files, options.read_timeout_s, f"listing {source.description}"
    )
    manifest, _ = Stager(source, source.root, options, progress).build_manifest(listing, None)
    path = source.root / DATA_MANIFEST_FILENAME
    files.write_atomic(path, manifest.to_json_bytes())
    return path


def _parse_injection(value: str | None) -> float:
    if not value:
        return 0.0
    if value.startswith(INJECT_SLOW_FILES):
        return float(value.removeprefix(INJECT_SLOW_FILES))
    raise ValueError(f"{INJECT_ENV}={value!r}: known faults: {INJECT_SLOW_FILES}<seconds>")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trainguard stage-data",
        description="Copy the run's data shards to local disk, verified and resumable.",
    )
    parser.add_argument(
        "--source",
        help=(
            "a directory, or a file://, s3://, ssh:// or hf://datasets/ URI "
            f"(default: ${env.DATA_SOURCE})"
        ),
    )
    parser.add_argument(
        "--credentials",
        type=Path,
        metavar="DIR",
        help=(
            "the source's Secret, one file per key, as a layer's (default: "
            f"${env.DATA_SECRETS}; none: an s3:// source uses boto3's default credentials)"
        ),
    )
    parser.add_argument(
        "--dest",
        type=Path,
        help=f"the local data directory (default: ${env.DATA_DIR} or {DEFAULT_DATA_DIR})",
    )
    parser.add_argument(
        "--read-timeout",
        type=float,
        default=DEFAULT_READ_TIMEOUT_S,
        metavar="SECONDS",
        help="fail when one source read does not return within this long (default: %(default)s)",
    )
    parser.add_argument(
        "--retries",
        type=int,
        default=DEFAULT_RETRIES,
        help="copies of a file that failed verification before staging fails (default: "
        "%(default)s)",
    )
    parser.add_argument(
        "--jobs", type=int, default=DEFAULT_JOBS, help="files copied at once (default: %(default)s)"
    )
    parser.add_argument(
        "--progress-interval",
        type=float,
        default=DEFAULT_PROGRESS_INTERVAL_S,
        metavar="SECONDS",
        help="seconds between progress lines in the log (default: %(default)s)",
    )
    parser.add_argument(
        "--hash",
        help=f"hash of a manifest built here (default: ${env.HASH} or {DEFAULT_ALGORITHM})",
    )
    parser.add_argument(
        "--write-manifest",
        action="store_true",
        help=f"write {DATA_MANIFEST_FILENAME} at the source directory and exit",
    )
    return parser


def main(argv: list[str]) -> int:
    """Entry point of `trainguard stage-data` (an init step of the training pod)."""
    parser = _parser()
    args = parser.parse_args(argv)
    files.share_with_pod()
    environ = dict(os.environ)
    try:
        pod = PodEnv.from_env(environ)
    except ContractError as err:
        parser.error(str(err))
    source_value = args.source or pod.data_source
    if not source_value:
        parser.error(f"no data source: pass --source or set {env.DATA_SOURCE}")
    try:
        options = Options(
            read_timeout_s=args.read_timeout,
            retries=max(0, args.retries),
            jobs=max(1, args.jobs),
            progress_interval_s=args.progress_interval,
            hash_algorithm=args.hash or pod.hash_algorithm or DEFAULT_ALGORITHM,
            pause_per_file_s=_parse_injection(environ.get(INJECT_ENV)),
        )
        new_hasher(options.hash_algorithm)
        state = reports.ensure_state_dir(pod.state_dir)
    except (ValueError, UnknownHashAlgorithmError) as err:
        parser.error(str(err))
    dest = args.dest or pod.data_dir or Path(DEFAULT_DATA_DIR)
    progress = Progress(
        source_value, dest, state / files.STAGING_FILENAME, options.progress_interval_s, environ
    )
    if options.pause_per_file_s:
        common.log(STEP, f"FAULT INJECTION: {INJECT_ENV}: pausing after every file")
    try:
        source = open_source(
            source_value,
            exclude=frozenset({CONTROL_DIRNAME}),
            credentials_dir=args.credentials or pod.data_secrets,
            environ=environ,
        )
        if args.write_manifest:
            if not isinstance(source, DirectorySource):
                parser.error("--write-manifest needs a directory source")
            written = write_source_manifest(source, options, progress)
            common.log(STEP, f"wrote {written}")
            return int(ExitCode.OK)
        dest.mkdir(parents=True, exist_ok=True)
        result = stage(source, dest, options, progress)
    except SourceTimeoutError as err:
        progress.fail(str(err), ExitCode.SOURCE_HUNG)
        # The reading thread is blocked in the kernel and cannot be joined: exit without
        # waiting for it (an orderly interpreter exit would wait on the copy threads).
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(ExitCode.SOURCE_HUNG)
    except VerificationError as err:
        return progress.fail(str(err), ExitCode.VERIFY_FAILED)
    except SourceError as err:
        return progress.fail(str(err), ExitCode.SOURCE_ERROR)
    except OSError as err:
        return progress.fail(f"writing {dest}: {err}", ExitCode.DEST_ERROR)
    if result.skipped:
        summary = "already staged and verified here: nothing copied"
    else:
        summary = (
            f"staged and verified: copied {result.copied} (re-copies {result.recopies}, "
            f"resumed partial files {result.resumed_partials}), already verified "
            f"{result.already_verified}, adopted {result.adopted}; "
            f"{human_bytes(result.bytes_transferred)} read from the source"
        )
    common.log(
        STEP,
        f"{result.files} files, {human_bytes(result.bytes)}: {summary} in {result.seconds:.1f} s",
    )
    return int(ExitCode.OK)
