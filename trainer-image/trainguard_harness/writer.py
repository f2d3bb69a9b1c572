"""Asynchronous checkpoint writer: the loop blocks only for the host snapshot.

`save()` waits for the previous persist (a save never starts while the previous one is still
being written), copies the state into the reused host buffer, and hands the rest to one
background thread: write every component file while hashing it, fsync, write the manifest
last, rename into place, fsync the root (all through `trainguard.ckpt`), read the new
checkpoint back to verify it, then apply keep-last-N.

A persist that fails (ENOSPC, EIO, a checkpoint that does not read back) is never swallowed:
it is reported at once through `on_event` and raised as `CheckpointSaveError` by the next
`check()`, `save()`, `wait()` or `close()`. The temporary directory is removed and the previous
checkpoint is untouched.
"""

from __future__ import annotations

import enum
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from pydantic import JsonValue

from trainguard.ckpt import (
    DEFAULT_ALGORITHM,
    CheckpointTransaction,
    Committed,
    Problem,
    new_hasher,
    prune,
    remove_partials,
    verify,
)
from trainguard_harness.settings import DEFAULT_KEEP_LAST
from trainguard_harness.snapshot import HostSnapshotter, Plan, Snapshot, plan_state
from trainguard_harness.tensorfile import FILE_SUFFIX

LOG = logging.getLogger(__name__)
# The persist thread yields the CPU to the training loop (and its dataloader) under contention.
BACKGROUND_NICE_INCREMENT = 10
MAX_NICE = 19
PRODUCER = "trainguard-harness"
META_PRODUCER = "producer"
META_COMPONENTS = "components"
META_SNAPSHOT_SECONDS = "snapshot_seconds"


class CheckpointSaveError(RuntimeError):
    """A checkpoint could not be made durable; `errno` is set when an OS error was the cause."""

    def __init__(self, step: int, message: str, errno: int | None = None) -> None:
        super().__init__(f"checkpoint of step {step} failed: {message}")
        self.step = step
        self.errno = errno


class EventKind(enum.StrEnum):
    """What a checkpoint event reports."""

    SAVED = "saved"
    FAILED = "failed"
    INVALID = "invalid"
    PRUNED = "pruned"
    PARTIAL_REMOVED = "partial-removed"


@dataclass(frozen=True)
class CheckpointEvent:
    """One thing that happened to checkpoints, for logs, the heartbeat or the agent.

    `problems`: what is wrong with an invalid checkpoint (`INVALID`), each naming its file.
    """

    kind: EventKind
    step: int | None
    path: Path | None
    message: str
    problems: tuple[Problem, ...] = ()


EventSink = Callable[[CheckpointEvent], None]


def log_event(event: CheckpointEvent) -> None:
    """The default event sink: failures and invalid checkpoints are errors in the log."""
    failed = event.kind in (EventKind.FAILED, EventKind.INVALID)
    LOG.log(
        logging.ERROR if failed else logging.INFO, "checkpoint %s: %s", event.kind, event.message
    )


def lower_thread_priority() -> None:
    """Raise the calling thread's nice value (Linux applies it to the thread, not the process)."""
    thread = threading.get_native_id()
    current = os.getpriority(os.PRIO_PROCESS, thread)
    os.setpriority(os.PRIO_PROCESS, thread, min(MAX_NICE, current + BACKGROUND_NICE_INCREMENT))


@dataclass(frozen=True)
class SaveStats:
    """What a save cost the training loop."""

    step: int
    wait_seconds: float  # waiting for the previous persist to finish
    snapshot_seconds: float  # copying into host memory
    nbytes: int

    @property
    def stall_seconds(self) -> float:
        """Total time the caller was blocked."""
        return self.wait_seconds + self.snapshot_seconds


@dataclass(frozen=True)
class PersistStats:
    """What the background part of a save did."""

    step: int
    path: Path
    nbytes: int
    write_seconds: float  # write + hash + fsync + manifest + rename
    verify_seconds: float  # read-back verification (0 when turned off)


class CheckpointWriter:
    """Writes checkpoints of a state mapping (component name -> state) into `root`."""

    def __init__(
        self,
        root: str | Path,
        *,
        keep_last: int = DEFAULT_KEEP_LAST,
        algorithm: str = DEFAULT_ALGORITHM,
        verify_after_write: bool = True,
        on_event: EventSink = log_event,
        background: bool = True,
    ) -> None:
        if keep_last < 1:
            raise ValueError(f"keep_last must be at least 1, got {keep_last}")
        new_hasher(algorithm)  # refuse an unknown name now, not at the first save
        self.root = Path(root)
        self.keep_last = keep_last
        self.algorithm = algorithm
        self.verify_after_write = verify_after_write
        self._on_event = on_event
        self._snapshotter = HostSnapshotter()
        # `background`: the persist yields the CPU to the training loop (a disk write may take
        # seconds); without it, it runs at the loop's priority (L0's short writes into memory,
        # which must keep up with the steps).
        self._executor = ThreadPoolExecutor(
            max_workers=1,
            thread_name_prefix="trainguard-ckpt",
            initializer=lower_thread_priority if background else None,
        )
        self._pending: Future[PersistStats | None] | None = None
        self.last_persisted: PersistStats | None = None
        # Checkpoints this writer checked: read back in full, or (without `verify_after_write`)
        # hashed as it wrote them, the check its owner chose. Keep-last-N hashes them no more:
        # reading back every kept checkpoint after each save would cost more than the one
        # read-back turned off (L0 in memory: twice its persist, at a snapshot every step or two).
        self._verified: set[Path] = set()
        # Checkpoints found invalid (by keep-last-N, or a reader: `note_invalid`): never removed.
        self._invalid: set[Path] = set()
        self.root.mkdir(parents=True, exist_ok=True)
        # This process is now the root's only writer: leftovers of a killed one go.
        for leftover in remove_partials(self.root):
            self._emit(EventKind.PARTIAL_REMOVED, None, leftover, f"removed leftover {leftover}")

    def note_invalid(self, path: Path) -> None:
        """A reader found this checkpoint invalid: keep-last-N never removes it.

        Its cheap check of an older checkpoint (manifest, sizes) cannot see a wrong hash.
        """
        self._invalid.add(path)

    def _emit(
        self,
        kind: EventKind,
        step: int | None,
        path: Path | None,
        message: str,
        problems: tuple[Problem, ...] = (),
    ) -> None:
        self._on_event(CheckpointEvent(kind, step, path, message, problems))

    @property
    def busy(self) -> bool:
        """True while a background persist (or buffer allocation) is running."""
        return self._pending is not None and not self._pending.done()

    def prepare(self, state: Mapping[str, object]) -> None:
        """Allocate the host buffer for `state` in the background, so no save pays for it.

        Call once the state has its final shapes (for most optimizers: after the first step).
        """
        plan = plan_state(state)
        self.wait()
        self._pending = self._executor.submit(self._allocate, plan)

    def _allocate(self, plan: Plan) -> None:
        self._snapshotter.ensure(plan)

    def save(
        self,
        step: int,
        state: Mapping[str, object],
        *,
        metadata: dict[str, JsonValue] | None = None,
    ) -> SaveStats:
        """Snapshot `state` into host memory and persist it in the background."""
        started = time.perf_counter()
        self.wait()
        waited = time.perf_counter()
        plan = plan_state(state)
        snapshot = self._snapshotter.capture(plan)
        done = time.perf_counter()
        meta: dict[str, JsonValue] = {
            META_PRODUCER: PRODUCER,
            META_COMPONENTS: [component.name for component in plan.components],
            META_SNAPSHOT_SECONDS: round(done - waited, 6),
            **(metadata or {}),
        }
        self._pending = self._executor.submit(self._persist, step, snapshot, meta)
        return SaveStats(step, waited - started, done - waited, plan.nbytes)

    def _persist(
        self, step: int, snapshot: Snapshot, metadata: dict[str, JsonValue]
    ) -> PersistStats:
        try:
            return self._persist_or_raise(step, snapshot, metadata)
        except CheckpointSaveError as error:
            self._emit(EventKind.FAILED, step, None, str(error))
            raise
        except Exception as error:
            failure = CheckpointSaveError(step, str(error), getattr(error, "errno", None))
            self._emit(EventKind.FAILED, step, None, str(failure))
            raise failure from error

    def _persist_or_raise(
        self, step: int, snapshot: Snapshot, metadata: dict[str, JsonValue]
    ) -> PersistStats:
        started = time.perf_counter()
        with CheckpointTransaction(
            self.root, step, algorithm=self.algorithm, metadata=metadata
        ) as txn:
            for index, component in enumerate(snapshot.plan.components):
                with txn.create(component.name + FILE_SUFFIX, direct=True) as out:
                    out.write(component.header())
                    out.write(snapshot.data(index))
            committed = txn.commit()
        return self.settle(committed, time.perf_counter() - started)

    def settle(self, committed: Committed, write_seconds: float = 0.0) -> PersistStats:
        """Verify, retire and report a committed checkpoint: read back, keep-last-N, events.

        Its own saves end here, and so does one another writer committed into this root (a
        sharded save's coordinator, `trainguard_harness.dcp`), which is then treated as one of
        its own. Raises CheckpointSaveError when it does not verify.
        """
        step = committed.manifest.step
        written = time.perf_counter()
        # The name holds this new checkpoint now (an invalid one in the way was moved aside).
        self._invalid.discard(committed.path)
        if committed.quarantined is not None:
            self._emit(
                EventKind.INVALID,
                step,
                committed.quarantined,
                f"an invalid checkpoint of step {step} was moved aside to {committed.quarantined}",
                committed.quarantined_problems,
            )
        if self.verify_after_write:
            # O_DIRECT: verify what the device holds, not the page cache's copy of it.
            result = verify(committed.path, direct=True)
            if not result.ok:
                raise CheckpointSaveError(
                    step, f"{committed.path} does not verify after writing: {result.reasons}"
                )
        verified = time.perf_counter()
        self._verified.add(committed.path)
        pruned = prune(
            self.root, self.keep_last, verified=self._verified, known_invalid=self._invalid
        )
        self._verified.difference_update(pruned.deleted)
        self._invalid.update(invalid.path for invalid in pruned.invalid)
        for path in pruned.deleted:
            self._emit(
                EventKind.PRUNED, None, path, f"removed {path.name} (keep-last-{self.keep_last})"
            )
        for invalid in pruned.invalid:
            reasons = "; ".join(invalid.reasons)
            message = f"{invalid.path.name}: {reasons} (kept, keep-last-{self.keep_last})"
            self._emit(EventKind.INVALID, invalid.step, invalid.path, message, invalid.problems)
        stats = PersistStats(
            step,
            committed.path,
            committed.manifest.total_bytes,
            write_seconds,
            verified - written,
        )
        self.last_persisted = stats
        self._emit(
            EventKind.SAVED,
            step,
            committed.path,
            f"step {step}: {stats.nbytes} bytes in {stats.write_seconds:.3f}s"
            f" (+{stats.verify_seconds:.3f}s verify)",
        )
        return stats

    def check(self) -> None:
        """Raise the error of a finished background persist, without waiting for a running one."""
        if self._pending is not None and self._pending.done():
            self.wait()

    def wait(self) -> PersistStats | None:
        """Wait for the background work; return its stats, or raise its CheckpointSaveError."""
        pending, self._pending = self._pending, None
        return None if pending is None else pending.result()

    def close(self) -> None:
        """Wait for the last persist (raising its error) and stop the background thread."""
        try:
            self.wait()
        finally:
            self._executor.shutdown(wait=True)
