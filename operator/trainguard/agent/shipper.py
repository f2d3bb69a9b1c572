"""Ship verified L1 checkpoints to the remote layers in the background.

`Shipper` runs in the agent: it never touches the training process, checks each new L1
checkpoint once (sizes and hashes), ships it to every layer whose cadence allows, verifies the
remote copy, applies the layer's keep-N and records per-layer state (pending, uploading with
bytes done of total, verified, failed with the step and the error, and how many checkpoints
it shipped to the layer and skipped) for the Lease and the run's status. Layers upload in
parallel, at most `max_concurrent` at once, and all together stay under an optional bandwidth
cap (bytes per second, shared, so the node's uplink is left to training's own traffic). `flush`
ships the newest checkpoint now, with a bounded wait, before a deliberate pod deletion.

Each layer ships on its own: a layer still uploading (or waiting to retry after a failure) is
left to it while the others ship newer checkpoints, and when it is free again it ships the
newest verified checkpoint, not the ones that came meanwhile; those its cadence would have
shipped are counted in its `skipped`. An upload reads from a pinned copy of its checkpoint
(`trainguard.ckpt.pin`: hard links in a hidden directory of L1, shared by the layers shipping
the same step), so the trainer's keep-last-N may remove the checkpoint while it is uploaded;
the pod's disk sizing has room for one pinned checkpoint per concurrent upload, so
`max_concurrent` defaults to `trainguard.ckpt.MAX_PINNED`. Pins left by an earlier agent of the
pod are removed when a shipper is made.

Every checkpoint found invalid on the way is a finding (`trainguard.contract.findings`, found
by `Shipping`) that the agent takes (`take_findings`) and tells: an L1 checkpoint whose hashes
do not match its manifest (it is never shipped), a remote copy that does not verify after its
upload (the layer's upload fails and is retried), and a remote checkpoint the layer's keep-N
found invalid (kept, never pruned).

In a pod, keep-N works within the run's lineage (`trainguard.layers.lineage`) and counts only
the checkpoints the agent has reported to the operator (`acknowledge`, after each Lease renewal
that carried them): a newer one stays on top of the N until it is reported. The operator fences
a superseded attempt at its newest reported checkpoint, so an agent cut off from the API (a
partitioned node) never prunes the checkpoint its successor resumes from.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from trainguard.api.constants import L1_LAYER, FoundBy
from trainguard.ckpt import (
    MAX_PINNED,
    CheckpointInvalidError,
    Problem,
    pin_checkpoint,
    remove_pins,
    scan,
    unpin_checkpoint,
    verify,
)
from trainguard.contract.findings import Finding
from trainguard.layers import InvalidCheckpointError, Layer, LayerConfig, LayerError
from trainguard.layers.lineage import Lineage

PENDING = "pending"
UPLOADING = "uploading"
VERIFIED = "verified"
FAILED = "failed"
MAX_RETRY_S = 60.0
# One pinned checkpoint per upload at most: the pod's disk sizing has room for this many.
DEFAULT_MAX_CONCURRENT = MAX_PINNED
# Checkpoints remembered as they appeared in L1 (to count what a busy layer skipped).
MAX_ARRIVALS = 1024
# A burst of this many seconds of the cap may go out at once; one upload chunk (a few MiB)
# must fit in it, or every chunk would wait.
BURST_S = 1.0
# Shipping runs at a lower CPU priority than anything else in its container (on Linux a
# thread's nice value is its own, and threads it starts inherit it): where the agent's CPU is
# shared with the training process, training wins every contended slice.
SHIPPER_NICE = 10


@dataclass
class LayerState:
    """Where one layer stands."""

    state: str = PENDING
    step: int | None = None  # newest step verified on the layer
    uploading: int | None = None  # step of the upload in progress, or of the one that failed
    bytes_done: int = 0  # of the upload in progress (or the last one)
    bytes_total: int = 0
    error: str | None = None
    at: float = 0.0
    shipped: int = 0  # checkpoints this shipper put on the layer and verified there
    # Checkpoints the layer never got because a newer one superseded them before it could
    # start them (busy with an older upload, or waiting to retry), as its cadence would have
    # shipped them.
    skipped: int = 0


def cadence_allows(
    config: LayerConfig, step: int, at: float, last_step: int | None, last_at: float | None
) -> bool:
    """Whether a layer's cadence ships `step` (at monotonic time `at`) after `last_step`."""
    if config.every_steps and last_step is not None and step - last_step < config.every_steps:
        return False
    seconds = config.every_seconds
    return not (seconds and last_at is not None and at - last_at < seconds)


class RateLimiter:
    """A token bucket shared by every upload: callers block until their bytes fit the cap."""

    def __init__(self, bytes_per_s: float) -> None:
        if bytes_per_s <= 0:
            raise ValueError(f"bytes_per_s must be positive, got {bytes_per_s}")
        self.rate = bytes_per_s
        self._lock = threading.Lock()
        self._tokens = bytes_per_s * BURST_S
        self._at = time.monotonic()

    def take(self, nbytes: int) -> None:
        """Account for `nbytes` sent; sleep as long as the cap requires."""
        with self._lock:
            now = time.monotonic()
            self._tokens = min(self.rate * BURST_S, self._tokens + (now - self._at) * self.rate)
            self._at = now
            self._tokens -= nbytes
            # A debt is paid by waiting; the lock serialises waiters, so the cap holds overall.
            wait = -self._tokens / self.rate if self._tokens < 0 else 0.0
            if wait:
                time.sleep(wait)


class _Progress:
    """The `Transfer` of one put: progress into the layer's state, bytes through the cap."""

    def __init__(self, shipper: Shipper, name: str) -> None:
        self._shipper = shipper
        self._name = name

    def begin(self, total_bytes: int) -> None:
        self._shipper._set(self._name, bytes_done=0, bytes_total=total_bytes)

    def advance(self, nbytes: int, *, sent: bool = True) -> None:
        with self._shipper._lock:
            self._shipper._states[self._name].bytes_done += nbytes
        if sent and self._shipper.limiter is not None:
            self._shipper.limiter.take(nbytes)


class Shipper(threading.Thread):
    """The background shipping loop of one pod."""

    def __init__(
        self,
        l1: Path,
        layers: list[Layer],
        poll_s: float = 1.0,
        *,
        max_concurrent: int = DEFAULT_MAX_CONCURRENT,
        bandwidth_bytes_per_s: float | None = None,
        lineage: Lineage | None = None,
    ) -> None:
        """Ship from `l1` to `layers`.

        `lineage`: the pod's (its attempt and the fences); keep-N then counts only what
        `acknowledge` reported. None (outside a pod): every shipped checkpoint counts.
        """
        super().__init__(name="trainguard-shipper", daemon=True)
        self.l1 = l1
        self.layers = layers
        self.poll_s = poll_s
        self.max_concurrent = max(1, max_concurrent)
        self.limiter = RateLimiter(bandwidth_bytes_per_s) if bandwidth_bytes_per_s else None
        self.lineage = lineage
        self._reported: dict[str, int] = {}  # layer -> newest step the operator was told of
        self._lock = threading.Lock()
        self._states = {layer.config.name: LayerState() for layer in layers}
        self._verified: set[int] = set()
        self._invalid: set[int] = set()
        self._findings: list[Finding] = []  # invalid checkpoints not taken by the agent yet
        self._scan_lock = threading.Lock()  # one L1 scan (and hash check) at a time
        # New checkpoints as they appeared in L1 (step, monotonic time), oldest first.
        self._arrivals: list[tuple[int, float]] = []
        self._last_upload: dict[str, tuple[int, float]] = {}  # layer -> step, time it began
        self._busy: set[str] = set()  # layers with an upload claimed (waiting or running)
        self._slots = threading.BoundedSemaphore(self.max_concurrent)
        self._pin_lock = threading.Lock()
        self._pins: dict[int, tuple[Path, int]] = {}  # step -> its pinned copy, uploads using it
        self._shipped_at: dict[str, float] = {}
        self._retry_at: dict[str, float] = {}
        self._stopping = threading.Event()
        self._wake = threading.Event()
        # Only this pod's shipper pins in its L1: a pin there now is an earlier agent's leftover.
        try:
            remove_pins(l1)
        except OSError as err:  # it costs disk space only; shipping goes on
            print(f"trainguard-shipper: stale pins: {err!r}", file=sys.stderr, flush=True)

    def states(self) -> dict[str, dict[str, Any]]:
        """A copy of every layer's state (for the Lease and status)."""
        with self._lock:
            return {name: asdict(state) for name, state in self._states.items()}

    def take_findings(self) -> list[Finding]:
        """The invalid checkpoints found since the last call (the agent tells each once)."""
        with self._lock:
            found, self._findings = self._findings, []
        return found

    def _found(self, layer: str, step: int, problems: tuple[Problem, ...]) -> None:
        with self._lock:
            self._findings.append(Finding.of(layer, step, problems, FoundBy.SHIPPING))

    def acknowledge(self, reported: Mapping[str, Mapping[str, Any]]) -> None:
        """These layer states (as `states()` gave them) reached the operator."""
        with self._lock:
            for name, state in reported.items():
                step = state.get("step")
                if isinstance(step, int) and step > self._reported.get(name, -1):
                    self._reported[name] = step

    def _lineage(self, layer: Layer) -> Lineage | None:
        """The lineage keep-N works in for `layer`: own checkpoints up to the reported one."""
        if self.lineage is None:
            return None
        with self._lock:
            reported = self._reported.get(layer.config.name, -1)
        return replace(self.lineage, own_limit=reported)

    def newest_verified(self) -> int | None:
        """Newest L1 step that verified (each checkpoint is hashed once)."""
        newest = self._newest_verified()
        return None if newest is None else newest[0]

    def _newest_verified(self) -> tuple[int, Path] | None:
        with self._scan_lock:
            found = sorted(self._l1_dirs(), reverse=True)
            self._arrived((step for step, _ in found), time.monotonic())
            for step, path in found:
                if step in self._verified:
                    return step, path
                if step in self._invalid:
                    continue
                result = verify(path)
                if result.ok:
                    self._verified.add(step)
                    return step, path
                self._invalid.add(step)
                # One removed by keep-last-N while it was read is gone, not invalid.
                if path.exists():
                    self._found(L1_LAYER, step, result.problems)
            return None

    def _l1_dirs(self) -> list[tuple[int, Path]]:
        result = scan(self.l1, check_hashes=False)
        return [(v.step, v.path) for v in result.valid if v.step is not None]

    def _arrived(self, steps: Iterable[int], now: float) -> None:
        """Remember the checkpoints newer than every one seen before (at first: the newest)."""
        with self._lock:
            last = self._arrivals[-1][0] if self._arrivals else None
            new = sorted(step for step in steps if last is None or step > last)
            # What L1 held before the first look predates this shipper: nothing skipped it.
            self._arrivals.extend((step, now) for step in (new if last is not None else new[-1:]))
            del self._arrivals[:-MAX_ARRIVALS]

    def _superseded(self, config: LayerConfig, step: int) -> int:
        """How many checkpoints `step` supersedes for the layer (the caller holds the lock).

        Those older than `step` that appeared since its last upload began and that its cadence
        would have shipped had it been free.
        """
        last_step, last_at = self._last_upload.get(config.name, (None, None))
        count = 0
        for arrived, at in self._arrivals:
            if arrived >= step:
                break
            if (last_step is not None and arrived <= last_step) or arrived in self._invalid:
                continue
            if cadence_allows(config, arrived, at, last_step, last_at):
                count += 1
                last_step, last_at = arrived, at
        return count

    def ship_once(self, force: bool = False) -> None:
        """Ship the newest verified checkpoint wherever the cadence allows (or `force`); wait.

        A layer still busy with an earlier upload (started by `run`) is left to it.
        """
        claimed = self._claim(force)
        if len(claimed) == 1:
            self._ship_claimed(claimed[0])
        elif claimed:
            with ThreadPoolExecutor(min(self.max_concurrent, len(claimed))) as pool:
                for _ in pool.map(self._ship_claimed, claimed):
                    pass

    def _claim(self, force: bool) -> list[Layer]:
        """The layers due for the newest verified checkpoint now, each marked busy."""
        step = self.newest_verified()
        if step is None:
            return []
        now = time.monotonic()
        claimed = []
        for layer in self.layers:
            name = layer.config.name
            if not force and not self._due(layer, step, now):
                continue
            with self._lock:
                shipped = self._states[name].step
                if name in self._busy or (shipped is not None and shipped >= step):
                    continue
                self._busy.add(name)
            claimed.append(layer)
        return claimed

    def _ship_claimed(self, layer: Layer, background: bool = False) -> None:
        """Ship to a claimed layer once an upload slot is free, then release the claim.

        The checkpoint is chosen when the slot is free: a layer that waited ships the newest.
        In the background (`run`), an upload not started before `stop` is dropped, and an
        unexpected error is logged (it would otherwise vanish with the worker's future).
        """
        try:
            with self._slots:
                if background and self._stopping.is_set():
                    return
                newest = self._newest_verified()
                if newest is not None:
                    self._ship(layer, *newest)
        except Exception as err:
            if not background:
                raise
            print(f"trainguard-shipper: {layer.config.name}: {err!r}", file=sys.stderr, flush=True)
        finally:
            with self._lock:
                self._busy.discard(layer.config.name)
            self._wake.set()  # the layer is free: look for a newer checkpoint at once

    def _ship(self, layer: Layer, step: int, path: Path) -> None:
        """Put one checkpoint on one layer and apply its keep-N; record the outcome.

        The upload reads a pinned copy, which keep-last-N in L1 cannot remove under it.
        """
        name = layer.config.name
        with self._lock:
            shipped = self._states[name].step
        if shipped is not None and shipped >= step:
            return
        now = time.monotonic()
        try:
            pinned = self._pin(step, path)
        except (OSError, CheckpointInvalidError) as err:
            if not path.exists():
                return  # removed by keep-last-N since the scan: a newer one is there to ship
            if isinstance(err, CheckpointInvalidError):
                self._found(L1_LAYER, step, err.problems)  # changed since it was hashed
            self._failed(name, step, now, f"{name}: pin of step {step}: {err}")
            return
        self._begin(layer.config, step, now)
        try:
            try:
                layer.put(pinned, _Progress(self, name))
            finally:
                self._unpin(step)
            pruned = layer.prune(layer.config.keep, self._lineage(layer))
        except InvalidCheckpointError as err:
            self._found(name, err.step, err.problems)  # the copy it left does not verify
            self._failed(name, step, now, str(err))
            return
        except (LayerError, OSError) as err:
            self._failed(name, step, now, str(err))
            return
        for ref, problems in pruned.invalid.items():
            self._found(name, ref.step, problems)
        self._shipped_at[name] = now
        with self._lock:
            shipped = self._states[name].shipped + 1
        self._set(name, state=VERIFIED, step=step, uploading=None, error=None, shipped=shipped)

    def _begin(self, config: LayerConfig, step: int, now: float) -> None:
        """An upload of `step` starts: count the checkpoints it supersedes for the layer."""
        with self._lock:
            state = self._states[config.name]
            state.skipped += self._superseded(config, step)
            self._last_upload[config.name] = (step, now)
            state.state, state.uploading, state.error = UPLOADING, step, None
            state.at = time.time()

    def _failed(self, name: str, step: int, now: float, error: str) -> None:
        """The upload of `step` failed: keep the step and the error, retry later."""
        delay = min(MAX_RETRY_S, 2 * max(1.0, now - self._retry_at.get(name, now)))
        self._retry_at[name] = now + delay
        self._set(name, state=FAILED, uploading=step, error=error[:200])

    def _pin(self, step: int, path: Path) -> Path:
        """The pinned copy of checkpoint `step`: one per step, shared by its uploads."""
        with self._pin_lock:
            held = self._pins.get(step)
            pinned, users = held if held is not None else (pin_checkpoint(path), 0)
            self._pins[step] = (pinned, users + 1)
            return pinned

    def _unpin(self, step: int) -> None:
        """One upload of `step` is done with its pin; the last one removes it."""
        with self._pin_lock:
            pinned, users = self._pins.pop(step)
            if users > 1:
                self._pins[step] = (pinned, users - 1)
                return
        try:
            unpin_checkpoint(pinned)
        except OSError as err:  # left for the next agent of the pod, which removes it
            print(f"trainguard-shipper: {err!r}", file=sys.stderr, flush=True)

    def _due(self, layer: Layer, step: int, now: float) -> bool:
        name = layer.config.name
        if now < self._retry_at.get(name, 0.0):
            return False
        with self._lock:
            last = self._states[name].step
        return cadence_allows(layer.config, step, now, last, self._shipped_at.get(name))

    def _set(self, name: str, **changes: Any) -> None:
        with self._lock:
            state = self._states[name]
            for key, value in changes.items():
                setattr(state, key, value)
            state.at = time.time()

    def flush(self, timeout_s: float) -> bool:
        """Ship the newest checkpoint to every layer now; True if at least one has it."""
        deadline = time.monotonic() + timeout_s
        newest = self.newest_verified()
        if newest is None:
            return False
        while time.monotonic() < deadline:
            self.ship_once(force=True)
            states = self.states().values()
            if any(s["step"] is not None and s["step"] >= newest for s in states):
                return True
            time.sleep(0.2)
        return False

    def run(self) -> None:
        """Poll L1 and start uploads until stopped; errors are recorded, never fatal.

        A layer's upload runs in a worker of its own, so the loop goes on starting uploads to
        the layers that are free. Stopping waits for the uploads in progress.
        """
        with contextlib.suppress(OSError):  # lowering one's own priority needs no privilege
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), SHIPPER_NICE)
        # One worker per layer (a layer has one upload at a time); the slots bound how many
        # upload at once. Workers are started from this thread, so they inherit its priority.
        workers = max(1, len(self.layers))
        with ThreadPoolExecutor(workers, thread_name_prefix="trainguard-upload") as pool:
            while not self._stopping.is_set():
                try:
                    for layer in self._claim(force=False):
                        pool.submit(self._ship_claimed, layer, True)
                except Exception as err:  # keep the shipper alive; the state says what failed
                    print(f"trainguard-shipper: {err!r}", file=sys.stderr, flush=True)
                self._wake.wait(self.poll_s)
                self._wake.clear()

    def stop(self) -> None:
        """Stop the loop."""
        self._stopping.set()
        self._wake.set()
