"""Ship verified L1 checkpoints to the remote layers in the background.

`Shipper` runs in the agent: it never touches the training process, checks each new L1
checkpoint once (sizes and hashes), ships it to every layer whose cadence allows, verifies the
remote copy, applies the layer's keep-N and records per-layer state (pending, uploading with
bytes done of total, verified, failed with the error) for the Lease and the run's status.
Layers upload in parallel, at most `max_concurrent` at once, and all together stay under an
optional bandwidth cap (bytes per second, shared, so the node's uplink is left to training's
own traffic). `flush` ships the newest checkpoint now, with a bounded wait, before a deliberate
pod deletion.

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
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from trainguard.ckpt import scan, verify
from trainguard.layers import Layer, LayerError
from trainguard.layers.lineage import Lineage

PENDING = "pending"
UPLOADING = "uploading"
VERIFIED = "verified"
FAILED = "failed"
MAX_RETRY_S = 60.0
DEFAULT_MAX_CONCURRENT = 2
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
    uploading: int | None = None
    bytes_done: int = 0  # of the upload in progress (or the last one)
    bytes_total: int = 0
    error: str | None = None
    at: float = 0.0


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
        self._shipped_at: dict[str, float] = {}
        self._retry_at: dict[str, float] = {}
        self._stopping = threading.Event()
        self._wake = threading.Event()

    def states(self) -> dict[str, dict[str, Any]]:
        """A copy of every layer's state (for the Lease and status)."""
        with self._lock:
            return {name: asdict(state) for name, state in self._states.items()}

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
        for step, path in sorted(self._l1_dirs(), reverse=True):
            if step in self._verified:
                return step
            if step in self._invalid:
                continue
            if verify(path).ok:
                self._verified.add(step)
                return step
            self._invalid.add(step)
        return None

    def _l1_dirs(self) -> list[tuple[int, Path]]:
        result = scan(self.l1, check_hashes=False)
        return [(v.step, v.path) for v in result.valid if v.step is not None]

    def ship_once(self, force: bool = False) -> None:
        """Ship the newest verified checkpoint wherever the cadence allows (or `force`)."""
        step = self.newest_verified()
        if step is None:
            return
        path = dict(self._l1_dirs()).get(step)
        if path is None:
            return
        now = time.monotonic()
        due = []
        for layer in self.layers:
            with self._lock:
                state = self._states[layer.config.name]
                if state.step is not None and state.step >= step:
                    continue
            if force or self._due(layer, step, now):
                due.append(layer)
        if len(due) == 1:
            self._ship(due[0], step, path, now)
        elif due:
            with ThreadPoolExecutor(min(self.max_concurrent, len(due))) as pool:
                for _ in pool.map(lambda layer: self._ship(layer, step, path, now), due):
                    pass

    def _ship(self, layer: Layer, step: int, path: Path, now: float) -> None:
        """Put one checkpoint on one layer and apply its keep-N; record the outcome."""
        name = layer.config.name
        self._set(name, state=UPLOADING, uploading=step, error=None)
        try:
            layer.put(path, _Progress(self, name))
            layer.prune(layer.config.keep, self._lineage(layer))
        except (LayerError, OSError) as err:
            delay = min(MAX_RETRY_S, 2 * max(1.0, now - self._retry_at.get(name, now)))
            self._retry_at[name] = now + delay
            self._set(name, state=FAILED, uploading=None, error=str(err)[:200])
            return
        self._shipped_at[name] = now
        self._set(name, state=VERIFIED, step=step, uploading=None, error=None)

    def _due(self, layer: Layer, step: int, now: float) -> bool:
        name = layer.config.name
        if now < self._retry_at.get(name, 0.0):
            return False
        with self._lock:
            last = self._states[name].step
        cfg = layer.config
        if cfg.every_steps and last is not None and step - last < cfg.every_steps:
            return False
        shipped = self._shipped_at.get(name)
        return not (cfg.every_seconds and shipped is not None and now - shipped < cfg.every_seconds)

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
        """Poll L1 and ship until stopped; errors are recorded, never fatal."""
        with contextlib.suppress(OSError):  # lowering one's own priority needs no privilege
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), SHIPPER_NICE)
        while not self._stopping.is_set():
            try:
                self.ship_once()
            except Exception as err:  # keep the shipper alive; the state says what failed
                print(f"trainguard-shipper: {err!r}", file=sys.stderr, flush=True)
            self._wake.wait(self.poll_s)
            self._wake.clear()

    def stop(self) -> None:
        """Stop the loop."""
        self._stopping.set()
        self._wake.set()
