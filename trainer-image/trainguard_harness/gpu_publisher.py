"""The supervisor's GPU readings, published on the shared state volume for the agent.

Only a container that requests `nvidia.com/gpu` can open the pod's GPUs, and the supervisor
outlives the training process, so it is the one place that can see whether GPU memory is
released after a death. Every interval it reads `trainguard.gpu.default_probe()` (NVML;
the named simulator only where `TRAINGUARD_GPU_SIMULATION` configures it; "unavailable"
otherwise) and atomically replaces the readings file. A supervisor that stops publishing is
itself an absence the agent notices (stale readings).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from pathlib import Path

from trainguard.gpu import SIMULATED_PROCESS_MIB, GpuProbe, default_probe, publish

DEFAULT_INTERVAL_S = 1.0


class GpuPublisher(threading.Thread):
    """Publish the pod's GPU readings every `interval_s` until stopped."""

    def __init__(
        self,
        path: Path,
        child_alive: Callable[[], bool],
        interval_s: float = DEFAULT_INTERVAL_S,
        environ: dict[str, str] | None = None,
        live_count: Callable[[], int] | None = None,
    ) -> None:
        super().__init__(name="trainguard-gpu-publisher", daemon=True)
        self.path = path
        self.interval_s = interval_s
        self._child_alive = child_alive
        # The live training processes, where the pod runs several ranks (one each).
        self._live_count = live_count
        self._environ = environ
        self._probe: GpuProbe | None = None
        self._done = threading.Event()

    def _live_processes(self) -> list[float]:
        # For the simulator: the training process holds memory (on each of the pod's GPUs)
        # exactly while it lives; several ranks hold it each on its own GPU.
        if self._live_count is not None:
            return [SIMULATED_PROCESS_MIB] * self._live_count()
        return [SIMULATED_PROCESS_MIB] if self._child_alive() else []

    def publish_once(self) -> None:
        """Take one reading and publish it."""
        if self._probe is None:
            self._probe = default_probe(self._environ, live_processes=self._live_processes)
        publish(self._probe.read(), self.path)

    def run(self) -> None:
        """Publish until stopped; a failed write is reported and retried next interval."""
        if not self.path.parent.is_dir():
            # Run by hand, outside a training pod: there is no state volume to publish on.
            print(f"trainguard supervise: no {self.path.parent}; GPU readings not published")
            return
        while not self._done.is_set():
            try:
                self.publish_once()
            except OSError as err:
                print(f"trainguard supervise: GPU readings not published: {err}", file=sys.stderr)
            self._done.wait(self.interval_s)

    def stop(self) -> None:
        """Stop publishing (the last readings stay, and age)."""
        self._done.set()
