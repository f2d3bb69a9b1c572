"""`trainguard preflight`: test the node's local storage and GPU before an attempt trains on it.

In the first incident a volume that was fine for 12-23 GB checkpoints corrupted a 35 GB one
(the write "succeeded"; the error on close never reached Python), and the lesson was to test
the boring infrastructure first and again at each new scale. In the second, VRAM left behind
by dead processes slowed the next run; memory that outlives a pod is visible only to the next
pod's preflight. So this init step runs first in every attempt, and a failure makes the
operator exclude the node (reason `PreflightFailed`) and place the run elsewhere.

| check | on | fails when | failure (exit code) |
|---|---|---|---|
| integrity | l1, data | a test file errs on write, fsync, close or read, | StorageError (10) |
| | | or reads back with another hash than written | StorageCorrupt (10) |
| space | each filesystem | free < what L1 and data still need + margin | InsufficientSpace (11) |
| gpu | the pod's GPUs | memory in use beyond a bound, or a process | GpuMemoryHeld (12) |
| bandwidth | l1, data | test file write or read MB/s below a floor | StorageSlow (13) |

When several checks fail the exit code is the first of the table's order; `preflight.json` has
them all. Targets: L1 (``TRAINGUARD_L1_DIR``) always, the data directory
(``TRAINGUARD_DATA_DIR``) when it is mounted into this step (it is the staging target).

Integrity and bandwidth: a test file of ``--test-size`` random bytes (default: one checkpoint,
``TRAINGUARD_CKPT_BYTES``, within 64-256 MiB: below, fsync latency dominates and the
bandwidth means little; above, a disk's write cache is long left behind and the test would
only take longer; and at most half of the smallest tested volume's expected size, at least
4 MiB, since the kubelet evicts a pod whose emptyDir exceeds the sizeLimit the operator gave
it) is written, fsynced and closed (errors of each count: close is where the
incident's error hid), dropped from the page cache (``POSIX_FADV_DONTNEED``; no effect on
tmpfs), read back and hashed. Write bandwidth includes fsync and close. The file is removed
afterwards. It is skipped when the filesystem has no room for it (the space check then fails).
The bandwidth floors: ``--min-write-mbps`` / ``--min-read-mbps``, else
``TRAINGUARD_PREFLIGHT_MIN_WRITE_MBPS`` / ``TRAINGUARD_PREFLIGHT_MIN_READ_MBPS`` (a node
class's own, set in its environment), else 50 MB/s each.

Space, per filesystem (L1 and data share one when both are emptyDirs): the sum over its
targets of expected bytes minus what the target already holds (a local volume may keep a
copy), at least the test file, plus one margin. L1 expects (keep + 1) x checkpoint size (the
kept ones and the one being written; ``TRAINGUARD_KEEP_LAST``) plus, with remote layers
(``TRAINGUARD_LAYERS``), one checkpoint per upload the agent runs at once (a pinned checkpoint,
`trainguard.ckpt.pin`), as the operator sized it; data ``TRAINGUARD_DATA_BYTES``.
An emptyDir's sizeLimit is enforced by the kubelet and is not visible here: statvfs shows the
node's disk.

GPU: through `trainguard.gpu.default_probe` (NVML, or the named simulator where
``TRAINGUARD_GPU_SIMULATION`` is set). Before the trainer starts, every byte in use and every
compute process is someone else's; the bound is ``--gpu-max-used-mib`` (default: the run's
``monitor.ghostMemory.thresholdMiB``). Without a readable GPU the check is skipped, with the
probe's reason.

Results go to ``$TRAINGUARD_STATE_DIR/preflight.json`` (see `report`), the log, and, in short
(`trainguard.contract.reports.preflight_summary`: the figures of the run's ``status.preflight``),
the container's termination message.

Fault injection, for tests only and off by default: ``TRAINGUARD_PREFLIGHT_INJECT=corrupt-readback``
flips one byte of each test file on the disk between its close and its read-back, through a
separate descriptor, with fsync. Why a hook and not a faulty device: device-mapper's
dm-flakey (``corrupt_bio_byte``) would corrupt in the block layer, but it needs device-mapper
and loop devices, which CI containers and the process-backed test nodes lack; an LD_PRELOAD or
FUSE shim would only fake the bytes returned to this process. The hook changes the file's real
bytes on the real filesystem, which is what a disk or filesystem that corrupts data at rest
produces, and everything after it (cache drop, read from the disk, hash, comparison, report,
exit code) is the production path. It is logged and named in the report.
"""

from __future__ import annotations

import argparse
import enum
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from trainguard.api.quantity import human_bytes, quantity_bytes
from trainguard.api.spec import DEFAULT_KEEP_LAST, DEFAULT_L1_DIR
from trainguard.ckpt import DEFAULT_ALGORITHM, new_hasher, room_in_checkpoints
from trainguard.ckpt.hashing import CHUNK_BYTES, UnknownHashAlgorithmError
from trainguard.contract import env, files, reports
from trainguard.contract.env import PodEnv
from trainguard.gpu import GpuProbe, default_probe
from trainguard.initsteps import common

STEP = "preflight"
MIB = 2**20
MIN_DEFAULT_TEST_BYTES = 64 * MIB
MAX_DEFAULT_TEST_BYTES = 256 * MIB
# The least test file fitted into a small volume (`default_test_bytes`).
MIN_FITTED_TEST_BYTES = 4 * MIB
DEFAULT_MARGIN = "1Gi"
# Floors far below any local SSD (the incident's local disk saved 35 GB in 18.6 s: about
# 1.9 GB/s) and low enough that a busy but healthy disk passes: a failed floor excludes the
# node from the run for good, while a merely slow disk is still caught by the Slow verdict.
DEFAULT_MIN_WRITE_MBPS = 50.0
DEFAULT_MIN_READ_MBPS = 50.0
# The floors for a node class, where the flags are not given (e.g. set on a node pool).
MIN_WRITE_ENV = env.PREFLIGHT_MIN_WRITE_MBPS
MIN_READ_ENV = env.PREFLIGHT_MIN_READ_MBPS
MB = 1e6  # bandwidth in MB/s, as disks are rated
TEST_FILE_PREFIX = ".trainguard-preflight-"
INJECT_ENV = env.PREFLIGHT_INJECT
INJECT_CORRUPT_READBACK = "corrupt-readback"
MESSAGE_LIMIT = 900  # the summary goes into an Event and a condition message (< 1 KiB)

# Targets and checks, as preflight.json names them.
L1_TARGET = "l1"
DATA_TARGET = "data"
GPU_TARGET = "gpu"
INTEGRITY = "integrity"
BANDWIDTH = "bandwidth"
SPACE = "space"
GPU = "gpu"

PASS = "pass"
FAIL = "fail"
SKIPPED = "skipped"


class Failure(enum.StrEnum):
    """Why a check failed (CamelCase, for the operator's Event and condition)."""

    STORAGE_CORRUPT = "StorageCorrupt"
    STORAGE_ERROR = "StorageError"
    INSUFFICIENT_SPACE = "InsufficientSpace"
    GPU_MEMORY_HELD = "GpuMemoryHeld"
    STORAGE_SLOW = "StorageSlow"


class ExitCode(enum.IntEnum):
    """Exit status of `trainguard preflight`, one per failure class."""

    OK = 0
    USAGE = 2
    STORAGE_INTEGRITY = 10
    SPACE = 11
    GPU = 12
    BANDWIDTH = 13


# In priority order: the exit code of a run with several failures is the first one's.
EXIT_CODES = {
    Failure.STORAGE_CORRUPT: ExitCode.STORAGE_INTEGRITY,
    Failure.STORAGE_ERROR: ExitCode.STORAGE_INTEGRITY,
    Failure.INSUFFICIENT_SPACE: ExitCode.SPACE,
    Failure.GPU_MEMORY_HELD: ExitCode.GPU,
    Failure.STORAGE_SLOW: ExitCode.BANDWIDTH,
}


@dataclass
class Check:
    """One check's outcome: status (pass, fail, skipped), a one-line message, its figures."""

    check: str
    target: str
    path: str | None
    status: str
    message: str
    figures: dict[str, Any] = field(default_factory=dict)
    failure: Failure | None = None

    @classmethod
    def judged(
        cls,
        check: str,
        target: str,
        path: Path | None,
        figures: dict[str, Any],
        passed: str,
        failed: tuple[Failure, str] | None,
    ) -> Check:
        """Pass with the message `passed`, or fail with `failed` = (failure, message)."""
        where = None if path is None else str(path)
        if failed is None:
            return cls(check, target, where, PASS, passed, figures)
        return cls(check, target, where, FAIL, failed[1], figures, failed[0])

    @classmethod
    def skipped(
        cls, check: str, target: str, path: Path | None, message: str, figures: dict[str, Any]
    ) -> Check:
        """Not tested, and why."""
        return cls(check, target, None if path is None else str(path), SKIPPED, message, figures)


@dataclass(frozen=True)
class Settings:
    """What to test and the thresholds (from the env contract and the command line)."""

    paths: dict[str, Path]  # target -> directory
    test_bytes: int
    checkpoint_bytes: int | None
    data_bytes: int | None
    keep_last: int
    margin_bytes: int
    min_write_mbps: float
    min_read_mbps: float
    gpu_max_used_mib: float
    hash_algorithm: str = DEFAULT_ALGORITHM
    inject_corrupt_readback: bool = False
    remote_layers: int = 0

    def expected_bytes(self, target: str) -> int | None:
        """What `target` will hold at most: keep + 1 (+ pinned) checkpoints, or the data."""
        if target == L1_TARGET:
            if self.checkpoint_bytes is None:
                return None
            return room_in_checkpoints(self.keep_last, self.remote_layers) * self.checkpoint_bytes
        return self.data_bytes


def _mbps(count: int, seconds: float) -> float:
    # A clock tick floor instead of infinity, which JSON (and the Go side) cannot carry.
    return round(count / max(seconds, 1e-9) / MB, 1)


def _used_bytes(path: Path) -> int:
    """Disk space the files under `path` occupy (allocated blocks, symlinks not followed)."""
    total = 0
    for dirpath, _, filenames in os.walk(path):
        for name in filenames:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
            except FileNotFoundError:
                continue  # removed while we walked
    return total


def _free_bytes(path: Path) -> int:
    stat = os.statvfs(path)
    return stat.f_bavail * stat.f_frsize


def check_space(settings: Settings) -> list[Check]:
    """One check per filesystem: free space against what its targets still need + margin."""
    by_device: dict[int, list[str]] = {}
    for target, path in settings.paths.items():
        by_device.setdefault(path.stat().st_dev, []).append(target)
    return [_space_check(targets, settings) for targets in by_device.values()]


def _space_check(targets: list[str], settings: Settings) -> Check:
    path = settings.paths[targets[0]]
    free = _free_bytes(path)
    parts: dict[str, dict[str, int | None]] = {}
    words = []
    still_needed = 0
    for target in targets:
        expected = settings.expected_bytes(target)
        present = _used_bytes(settings.paths[target])
        parts[target] = {"expected_bytes": expected, "present_bytes": present}
        if expected is None:
            words.append(f"{target} size unknown")
            continue
        still_needed += max(0, expected - present)
        words.append(f"{target} {human_bytes(expected)} less {human_bytes(present)} present")
    # The test file needs room too (briefly): a disk that cannot hold it fails here.
    if settings.test_bytes > still_needed:
        words.append(f"test file {human_bytes(settings.test_bytes)}")
    need = max(still_needed, settings.test_bytes) + settings.margin_bytes
    words.append(f"margin {human_bytes(settings.margin_bytes)}")
    figures = {
        "paths": {target: str(settings.paths[target]) for target in targets},
        "free_bytes": free,
        "need_bytes": need,
        "margin_bytes": settings.margin_bytes,
        "test_file_bytes": settings.test_bytes,
        "keep_last": settings.keep_last,
        "remote_layers": settings.remote_layers,
        "checkpoint_bytes": settings.checkpoint_bytes,
        "targets": parts,
    }
    summary = f"{human_bytes(free)} free, {human_bytes(need)} needed ({', '.join(words)})"
    name = "+".join(targets)
    lacking = (Failure.INSUFFICIENT_SPACE, f"not enough space on {path}: {summary}")
    return Check.judged(SPACE, name, path, figures, summary, lacking if free < need else None)


def _write_test_file(path: Path, size: int, algorithm: str) -> tuple[str, float]:
    """Write `size` random bytes, fsync, close; return (hash, seconds spent in the kernel)."""
    hasher = new_hasher(algorithm)
    seconds = 0.0
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        remaining = size
        while remaining:
            # Random bytes: compression or deduplication cannot make the disk look faster.
            chunk = memoryview(os.urandom(min(CHUNK_BYTES, remaining)))
            hasher.update(chunk)
            started = time.perf_counter()
            while chunk:
                chunk = chunk[os.write(fd, chunk) :]
            seconds += time.perf_counter() - started
            remaining -= min(CHUNK_BYTES, remaining)
        started = time.perf_counter()
        os.fsync(fd)
    finally:
        # close() can report a deferred write error (the incident's corrupt checkpoint).
        os.close(fd)
    seconds += time.perf_counter() - started
    return hasher.hexdigest(), seconds


def _flip_one_byte(path: Path, size: int) -> None:
    """Fault injection: change one byte of the file on the disk (see the module docstring)."""
    fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    try:
        offset = size // 2
        byte = os.pread(fd, 1, offset)
        os.pwrite(fd, bytes([byte[0] ^ 0xFF]), offset)
        os.fsync(fd)
    finally:
        os.close(fd)


def _read_test_file(path: Path, algorithm: str) -> tuple[str, float, bool]:
    """Read the file back from the disk; return (hash, seconds, page cache dropped)."""
    hasher = new_hasher(algorithm)
    buffer = bytearray(CHUNK_BYTES)
    view = memoryview(buffer)
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        dropped = common.drop_page_cache(fd)
        started = time.perf_counter()
        while count := os.readv(fd, [view]):
            hasher.update(view[:count])
        seconds = time.perf_counter() - started
    finally:
        os.close(fd)
    return hasher.hexdigest(), seconds, dropped


@dataclass(frozen=True)
class Measurement:
    """One test file written and read back: hashes and timings."""

    bytes: int
    written_hash: str
    read_hash: str
    write_seconds: float
    read_seconds: float
    page_cache_dropped: bool

    @property
    def write_mb_per_s(self) -> float:
        """Write bandwidth (including fsync and close)."""
        return _mbps(self.bytes, self.write_seconds)

    @property
    def read_mb_per_s(self) -> float:
        """Read bandwidth from the disk (from the page cache on tmpfs)."""
        return _mbps(self.bytes, self.read_seconds)


def measure(path: Path, settings: Settings) -> Measurement:
    """Write, fsync, close, drop from the cache and read back a test file; remove it."""
    test_file = path / f"{TEST_FILE_PREFIX}{os.getpid()}.tmp"
    size, algorithm = settings.test_bytes, settings.hash_algorithm
    try:
        written, write_s = _write_test_file(test_file, size, algorithm)
        if settings.inject_corrupt_readback:
            common.log(STEP, f"FAULT INJECTION: flipping one byte of {test_file} on disk")
            _flip_one_byte(test_file, size)
        read, read_s, dropped = _read_test_file(test_file, algorithm)
    finally:
        test_file.unlink(missing_ok=True)
    return Measurement(size, written, read, round(write_s, 6), round(read_s, 6), dropped)


def check_storage(target: str, path: Path, settings: Settings) -> list[Check]:
    """The integrity and bandwidth checks of one directory, from one test file."""
    size = human_bytes(settings.test_bytes)
    figures: dict[str, Any] = {
        "bytes": settings.test_bytes,
        "hash_algorithm": settings.hash_algorithm,
    }
    free = _free_bytes(path)
    if free < settings.test_bytes + settings.margin_bytes:
        why = f"no room for a {size} test file ({human_bytes(free)} free): see space"
        return [
            Check.skipped(INTEGRITY, target, path, why, figures),
            Check.skipped(BANDWIDTH, target, path, why, figures),
        ]
    try:
        result = measure(path, settings)
    except OSError as err:
        error = (Failure.STORAGE_ERROR, f"{size} test file in {path}: {err}")
        return [
            Check.judged(INTEGRITY, target, path, figures, "", error),
            Check.skipped(BANDWIDTH, target, path, "no figures: the test file failed", figures),
        ]
    figures.update(asdict(result))
    figures.update(write_mb_per_s=result.write_mb_per_s, read_mb_per_s=result.read_mb_per_s)
    if settings.inject_corrupt_readback:
        figures["fault_injection"] = INJECT_CORRUPT_READBACK
    corrupt = (
        Failure.STORAGE_CORRUPT,
        f"read back {size} from {path} with another {settings.hash_algorithm} "
        f"({result.read_hash}) than written ({result.written_hash}): the disk corrupts data",
    )
    integrity = Check.judged(
        INTEGRITY,
        target,
        path,
        figures,
        f"{size} written, fsynced and read back intact",
        corrupt if result.read_hash != result.written_hash else None,
    )
    return [integrity, _bandwidth_check(target, path, result, settings)]


def _bandwidth_check(target: str, path: Path, result: Measurement, settings: Settings) -> Check:
    rates = (
        ("write", result.write_mb_per_s, settings.min_write_mbps),
        ("read", result.read_mb_per_s, settings.min_read_mbps),
    )
    slow = [
        f"{kind} {value:g} MB/s is below the floor of {floor:g} MB/s"
        for kind, value, floor in rates
        if value < floor
    ]
    figures = {
        "write_mb_per_s": result.write_mb_per_s,
        "read_mb_per_s": result.read_mb_per_s,
        "min_write_mb_per_s": settings.min_write_mbps,
        "min_read_mb_per_s": settings.min_read_mbps,
    }
    return Check.judged(
        BANDWIDTH,
        target,
        path,
        figures,
        ", ".join(f"{kind} {value:g} MB/s" for kind, value, _ in rates),
        (Failure.STORAGE_SLOW, f"{path}: " + "; ".join(slow)) if slow else None,
    )


def check_gpu(probe: GpuProbe, max_used_mib: float) -> Check:
    """The pod's GPUs must be empty: little memory used, no compute process."""
    snapshot = probe.read()
    if not snapshot.available:
        message = f"no GPU reading: {snapshot.error}"
        return Check.skipped(GPU, GPU_TARGET, None, message, {"source": snapshot.source})
    unattributed = snapshot.unattributed_mib
    figures: dict[str, Any] = {
        "source": snapshot.source,
        "max_used_mib": max_used_mib,
        "used_mib": round(snapshot.used_mib, 1),
        "total_mib": round(snapshot.total_mib, 1),
        "process_count": snapshot.process_count,
        "unattributed_mib": None if unattributed is None else round(unattributed, 1),
        "gpus": [
            {
                "index": g.index,
                "name": g.name,
                "used_mib": round(g.used_mib, 1),
                "total_mib": round(g.total_mib, 1),
                "processes": len(g.processes),
            }
            for g in snapshot.gpus
        ],
    }
    problems = [
        f"GPU {g.index} ({g.name}): {g.used_mib:.0f} of {g.total_mib:.0f} MiB already used "
        f"(bound {max_used_mib:g} MiB)"
        for g in snapshot.gpus
        if g.used_mib > max_used_mib
    ]
    if snapshot.process_count:
        problems.append(f"{snapshot.process_count} compute processes already on the GPUs")
    count = len(snapshot.gpus)
    idle = (
        f"{count} GPU{'s' if count != 1 else ''}, {snapshot.used_mib:.0f} of "
        f"{snapshot.total_mib:.0f} MiB used, no processes ({snapshot.source})"
    )
    held = (
        Failure.GPU_MEMORY_HELD,
        "; ".join(problems) + f" ({snapshot.source}): held by something else",
    )
    return Check.judged(GPU, GPU_TARGET, None, figures, idle, held if problems else None)


def run_checks(settings: Settings, probe: GpuProbe) -> list[Check]:
    """Every check, in the order of the module docstring's table (storage first)."""
    for path in settings.paths.values():
        for stale in path.glob(f"{TEST_FILE_PREFIX}*"):
            stale.unlink()  # left by a preflight that was killed; it would skew the space check
    space = check_space(settings)
    storage = [
        c for target, path in settings.paths.items() for c in check_storage(target, path, settings)
    ]
    integrity = [c for c in storage if c.check == INTEGRITY]
    bandwidth = [c for c in storage if c.check == BANDWIDTH]
    return [*integrity, *space, check_gpu(probe, settings.gpu_max_used_mib), *bandwidth]


def report(
    checks: list[Check], started: float, environ: Mapping[str, str], injection: str | None
) -> dict[str, Any]:
    """preflight.json.

    Keys: ok, failure (the first failure's CamelCase reason, or None), message (one line:
    the failed checks' messages, else every check's), exit_code, node, attempt, started_at,
    seconds, fault_injection (None unless a test injected a fault), checks: a list of
    {check, target, path, status, failure, message, figures}.
    """
    pod = PodEnv.from_env(environ)
    failed = [c for c in checks if c.status == FAIL]
    failed.sort(key=lambda c: list(EXIT_CODES).index(c.failure) if c.failure else 0)
    first = failed[0].failure if failed else None
    shown = failed or [c for c in checks if c.status != SKIPPED] or checks
    message = "; ".join(f"{c.check} {c.target}: {c.message}" for c in shown)
    return {
        "ok": not failed,
        "failure": None if first is None else str(first),
        "message": message[:MESSAGE_LIMIT],
        "exit_code": int(ExitCode.OK if first is None else EXIT_CODES[first]),
        "node": pod.node_name or None,
        "attempt": pod.attempt,
        "started_at": started,
        "seconds": round(time.time() - started, 3),
        "fault_injection": injection,
        "checks": [
            {**asdict(c), "failure": None if c.failure is None else str(c.failure)} for c in checks
        ],
    }


def default_test_bytes(
    checkpoint_bytes: int | None, volume_bytes: Sequence[int | None] = ()
) -> int:
    """One checkpoint, within the bounds of the module docstring (the most when unknown).

    `volume_bytes` are the tested volumes' expected sizes (None: unknown): the file stays
    within half of the smallest, at least `MIN_FITTED_TEST_BYTES`. The operator sizes an
    emptyDir's sizeLimit to what it expects, and the kubelet evicts a pod whose emptyDir holds
    more when it looks (this step cannot see the limit: statvfs shows the node's disk).
    """
    wanted = MAX_DEFAULT_TEST_BYTES if checkpoint_bytes is None else checkpoint_bytes
    size = min(max(wanted, MIN_DEFAULT_TEST_BYTES), MAX_DEFAULT_TEST_BYTES)
    known = [volume for volume in volume_bytes if volume]
    if known:
        size = min(size, max(MIN_FITTED_TEST_BYTES, min(known) // 2))
    return size


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trainguard preflight",
        description="Test local storage (L1, data) and the GPU before training starts.",
    )
    parser.add_argument(
        "--l1", type=Path, help=f"L1 directory (default: ${env.L1_DIR} or {DEFAULT_L1_DIR})"
    )
    parser.add_argument(
        "--data",
        type=Path,
        help=f"data directory, tested when it exists (default: ${env.DATA_DIR})",
    )
    parser.add_argument(
        "--test-size",
        type=quantity_bytes,
        metavar="QUANTITY",
        help="test file size, e.g. 64Mi (default: one checkpoint "
        f"(${env.CKPT_BYTES}) within {MIN_DEFAULT_TEST_BYTES // MIB}Mi-"
        f"{MAX_DEFAULT_TEST_BYTES // MIB}Mi)",
    )
    parser.add_argument(
        "--checkpoint-size",
        type=quantity_bytes,
        metavar="QUANTITY",
        help=f"one full checkpoint (default: ${env.CKPT_BYTES})",
    )
    parser.add_argument(
        "--data-size",
        type=quantity_bytes,
        metavar="QUANTITY",
        help=f"the staged data (default: ${env.DATA_BYTES})",
    )
    parser.add_argument(
        "--keep",
        type=int,
        help=f"L1 keep-last-N (default: ${env.KEEP_LAST} or {DEFAULT_KEEP_LAST})",
    )
    parser.add_argument(
        "--margin",
        type=quantity_bytes,
        default=DEFAULT_MARGIN,
        metavar="QUANTITY",
        help="free space required beyond data and checkpoints (default: %(default)s)",
    )
    parser.add_argument(
        "--min-write-mbps",
        type=float,
        help=f"write bandwidth floor in MB/s (default: ${MIN_WRITE_ENV} or "
        f"{DEFAULT_MIN_WRITE_MBPS:g})",
    )
    parser.add_argument(
        "--min-read-mbps",
        type=float,
        help=f"read bandwidth floor in MB/s (default: ${MIN_READ_ENV} or "
        f"{DEFAULT_MIN_READ_MBPS:g})",
    )
    parser.add_argument(
        "--gpu-max-used-mib",
        type=float,
        help="GPU memory that may be in use before training (default: the "
        f"run's monitor.ghostMemory.thresholdMiB from ${env.MONITOR})",
    )
    return parser


def _floor(flag: float | None, environ: Mapping[str, str], name: str, default: float) -> float:
    if flag is not None:
        return flag
    text = environ.get(name)
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:  # also NaN
        raise ValueError(f"{name}={text!r}: a bandwidth in MB/s (a number >= 0)")
    return value


def settings_from(args: argparse.Namespace, environ: Mapping[str, str]) -> Settings:
    """Resolve the settings: command line first, then the env contract, then defaults."""
    pod = PodEnv.from_env(environ)
    l1 = args.l1 or pod.l1_dir
    l1.mkdir(parents=True, exist_ok=True)
    paths = {L1_TARGET: l1}
    data = args.data or pod.data_dir
    if data is not None and data.is_dir():
        paths[DATA_TARGET] = data
    elif data is not None:
        common.log(STEP, f"data directory {data} is not mounted in this step: not tested")
    checkpoint = args.checkpoint_size or pod.checkpoint_bytes
    injection = environ.get(INJECT_ENV) or None
    if injection not in (None, INJECT_CORRUPT_READBACK):
        raise ValueError(f"{INJECT_ENV}={injection!r}: known faults: {INJECT_CORRUPT_READBACK}")
    max_used = args.gpu_max_used_mib
    algorithm = pod.hash_algorithm or DEFAULT_ALGORITHM
    new_hasher(algorithm)
    settings = Settings(
        paths=paths,
        test_bytes=args.test_size or 1,
        checkpoint_bytes=checkpoint,
        data_bytes=args.data_size or pod.data_bytes,
        keep_last=args.keep if args.keep is not None else pod.keep_last,
        margin_bytes=args.margin,
        min_write_mbps=_floor(args.min_write_mbps, environ, MIN_WRITE_ENV, DEFAULT_MIN_WRITE_MBPS),
        min_read_mbps=_floor(args.min_read_mbps, environ, MIN_READ_ENV, DEFAULT_MIN_READ_MBPS),
        gpu_max_used_mib=pod.monitor.ghost_memory.threshold_mib if max_used is None else max_used,
        hash_algorithm=algorithm,
        inject_corrupt_readback=injection == INJECT_CORRUPT_READBACK,
        remote_layers=len(pod.layers),
    )
    if args.test_size:
        return settings
    # The test file fits the volumes it goes to, as the operator sized them.
    volumes = [settings.expected_bytes(target) for target in paths]
    return replace(settings, test_bytes=default_test_bytes(checkpoint, volumes))


def main(argv: list[str]) -> int:
    """Entry point of `trainguard preflight` (the first init step of the training pod)."""
    parser = _parser()
    args = parser.parse_args(argv)
    files.share_with_pod()
    environ = dict(os.environ)
    try:
        settings = settings_from(args, environ)  # ContractError is a ValueError
        state = reports.ensure_state_dir(PodEnv.from_env(environ).state_dir)
    except (ValueError, UnknownHashAlgorithmError) as err:
        parser.error(str(err))
    started = time.time()
    checks = run_checks(settings, default_probe(environ))
    for check in checks:
        common.log(STEP, f"{check.check} {check.target}: {check.status.upper()}: {check.message}")
    injection = INJECT_CORRUPT_READBACK if settings.inject_corrupt_readback else None
    result = report(checks, started, environ, injection)
    files.write_json(state / files.PREFLIGHT_FILENAME, result)
    # The termination message is the evidence of a failure: it keeps the whole message.
    reports.write_termination_message(reports.preflight_summary(result, MESSAGE_LIMIT), environ)
    verdict = "passed" if result["ok"] else f"FAILED ({result['failure']})"
    common.log(STEP, f"{verdict} in {result['seconds']:.1f} s, exit code {result['exit_code']}")
    code: int = result["exit_code"]
    return code
