"""The verdict classifier: signals in, one verdict with its evidence out (pure).

Liveness is judged by *absence*: a trainer process that is gone, GPU memory that the driver
says was released, a step that stopped advancing. Log age is only ever a slowness signal: a
quiet log proves nothing about death. The order of the checks below is the order of
severity; the first that holds wins.

What each verdict needs: the trainer's PID (from the supervisor, or the harness heartbeat)
for `Dead`, `IOStuck` and a duplicate trainer; GPU readings for the memory checks; the
harness heartbeat's step for `Hung` and `Slow`. A trainer without the heartbeat (a script
that does not use the harness) is judged by presence and memory only, and is `Healthy` while
it runs (`Slow` while it is stopped): it has no step that could freeze.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from trainguard.api import constants
from trainguard.api.constants import EVIDENCE_CAUSE, Reason
from trainguard.api.spec import (
    DEFAULT_GHOST_RATIO,
    DEFAULT_GHOST_THRESHOLD_MIB,
    DEFAULT_GPU_RELEASE_SECONDS,
    DEFAULT_HANG_AFTER_SECONDS,
    DEFAULT_IO_STUCK_AFTER_SECONDS,
    DEFAULT_SLOW_AFTER_SECONDS,
    DEFAULT_STARTUP_GRACE_SECONDS,
    Monitor,
)

HEALTHY = constants.Verdict.HEALTHY.value
SLOW = constants.Verdict.SLOW.value
HUNG = constants.Verdict.HUNG.value
DEAD = constants.Verdict.DEAD.value
GHOST_MEMORY = constants.Verdict.GHOST_MEMORY.value
IO_STUCK = constants.Verdict.IO_STUCK.value
UNKNOWN = "Unknown"  # nothing to judge yet (trainer not started); never in the API

VERDICTS = (HEALTHY, SLOW, HUNG, DEAD, GHOST_MEMORY, IO_STUCK, UNKNOWN)
# Memory not released after a death is a GhostMemory verdict whose evidence names the
# narrower cause (`EVIDENCE_CAUSE`), which the operator records and taints the node with.
NOT_RELEASED = Reason.GPU_MEMORY_NOT_RELEASED.value


@dataclass(frozen=True)
class Thresholds:
    """Bounds from the TrainingRun's `spec.monitor` (`from_monitor`); defaults are the API's."""

    hang_after_s: float = DEFAULT_HANG_AFTER_SECONDS
    slow_after_s: float = DEFAULT_SLOW_AFTER_SECONDS
    io_stuck_after_s: float = DEFAULT_IO_STUCK_AFTER_SECONDS
    min_tokens_per_s: float = 0.0
    ghost_mib: float = DEFAULT_GHOST_THRESHOLD_MIB
    ghost_ratio: float = DEFAULT_GHOST_RATIO
    release_after_death_s: float = DEFAULT_GPU_RELEASE_SECONDS
    expected_processes: int = 1
    startup_grace_s: float = DEFAULT_STARTUP_GRACE_SECONDS
    # GPU memory at or below this counts as "released" (driver and CUDA context overhead).
    released_mib: float = 512.0

    @classmethod
    def from_monitor(cls, monitor: Monitor) -> Thresholds:
        """The classifier's bounds from the run's `spec.monitor`."""
        return cls(
            hang_after_s=monitor.hang_after_seconds,
            slow_after_s=monitor.slow_after_seconds,
            io_stuck_after_s=monitor.io_stuck_after_seconds,
            min_tokens_per_s=monitor.min_tokens_per_second or 0.0,
            ghost_mib=monitor.ghost_memory.threshold_mib,
            ghost_ratio=monitor.ghost_memory.ratio,
            release_after_death_s=monitor.ghost_memory.release_timeout_seconds,
            startup_grace_s=monitor.startup_grace_seconds,
        )


@dataclass(frozen=True)
class Signals:
    """What the agent observed at one moment (times in seconds).

    `trainer_seen` says whether a training process has ever run in this pod; before it, there
    is nothing to judge. `heartbeat` says whether that process writes the harness heartbeat
    (without it, `step` is None). GPU fields are None when no probe reading is available.
    """

    trainer_seen: bool
    process_alive: bool
    heartbeat: bool = True
    process_state: str | None = None  # /proc state letter: R, S, D, T, Z
    process_count: int = 0
    seconds_since_death: float | None = None
    seconds_in_d_state: float = 0.0
    step: int | None = None
    seconds_since_step_advanced: float = 0.0
    phase: str | None = None  # the harness's phase: training, saving, loading
    tokens_per_s: float | None = None
    framework_reserved_mib: float | None = None
    gpu_used_mib: float | None = None
    gpu_processes: int | None = None
    gpu_unattributed_mib: float | None = None  # used by no live process (driver's view)
    log_age_s: float | None = None
    seconds_since_start: float = float("inf")  # since this trainer process was first seen
    # Since the last death, while the memory it left (all used memory until a trainer runs
    # again, then what no live process accounts for) has stayed above the released bound at
    # every reading; None: no such death, released, or unknown. `memory_left_mib` is that
    # memory at the latest reading.
    seconds_held_since_death: float | None = None
    memory_left_mib: float | None = None


@dataclass(frozen=True)
class Verdict:
    """A verdict and the evidence that led to it (short `key=value` strings)."""

    name: str
    reason: str
    evidence: dict[str, str] = field(default_factory=dict)


def _fmt(value: float | int | None) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.1f}"
    return str(value)


def classify(s: Signals, t: Thresholds) -> Verdict:
    """Classify the signals into one verdict."""
    evidence = {
        "alive": str(s.process_alive).lower(),
        "state": s.process_state or "-",
        "procs": _fmt(s.process_count),
        "step": _fmt(s.step),
        "frozen_s": _fmt(s.seconds_since_step_advanced),
        "gpu_used_mib": _fmt(s.gpu_used_mib),
        "gpu_procs": _fmt(s.gpu_processes),
        "gpu_orphan_mib": _fmt(s.gpu_unattributed_mib),
        "fw_reserved_mib": _fmt(s.framework_reserved_mib),
    }
    if s.seconds_held_since_death is not None:
        evidence["held_s"] = _fmt(s.seconds_held_since_death)
    if not s.heartbeat:
        evidence["heartbeat"] = "none"
    if not s.trainer_seen:
        return Verdict(UNKNOWN, "trainer process not started yet", evidence)

    gpu_known = s.gpu_used_mib is not None
    held_s = s.seconds_held_since_death
    if held_s is not None and held_s >= t.release_after_death_s:
        # Whether or not the trainer was restarted in place meanwhile, what the dead process
        # held is still held by no live one: the node's GPU is not usable as it should be.
        return Verdict(
            GHOST_MEMORY,
            f"{s.memory_left_mib or 0.0:.0f} MiB still held {held_s:.0f}s after the trainer "
            "died, by no live trainer: memory not released after death",
            {**evidence, EVIDENCE_CAUSE: NOT_RELEASED},
        )
    if not s.process_alive or s.process_state == "Z":
        return Verdict(DEAD, "trainer process absent", evidence)

    if s.process_state == "D" and s.seconds_in_d_state >= t.io_stuck_after_s:
        return Verdict(
            IO_STUCK,
            f"trainer in uninterruptible I/O (D) for {s.seconds_in_d_state:.0f}s",
            evidence,
        )

    if s.process_count > t.expected_processes or (
        s.gpu_processes is not None and s.gpu_processes > t.expected_processes
    ):
        return Verdict(
            GHOST_MEMORY,
            f"{max(s.process_count, s.gpu_processes or 0)} trainer processes where "
            f"{t.expected_processes} expected",
            evidence,
        )

    if s.gpu_unattributed_mib is not None and s.gpu_unattributed_mib > t.ghost_mib:
        return Verdict(
            GHOST_MEMORY,
            f"driver reports {s.gpu_unattributed_mib:.0f} MiB held by no live process",
            evidence,
        )

    if gpu_known and s.framework_reserved_mib is not None:
        used = s.gpu_used_mib or 0.0
        reserved = s.framework_reserved_mib
        if used - reserved > t.ghost_mib and used > t.ghost_ratio * max(reserved, 1.0):
            return Verdict(
                GHOST_MEMORY,
                f"driver reports {used:.0f} MiB used, framework holds {reserved:.0f} MiB: "
                f"{used - reserved:.0f} MiB unaccounted for",
                evidence,
            )

    starting = s.seconds_since_start < t.startup_grace_s
    if not s.heartbeat and not starting:
        # A script that does not use the harness: it has no step that could freeze, so it is
        # never Hung; absence, I/O and memory above, and a stop, are all that is judged.
        if s.process_state == "T":
            return Verdict(SLOW, "trainer stopped (T state)", evidence)
        return Verdict(
            HEALTHY,
            "alive, running without the harness: no step signal (watched by presence and "
            "GPU memory)",
            evidence,
        )
    if s.step is None or starting:
        # Compiling, restoring, or no heartbeat yet: only absence, I/O and memory are judged
        # until the first step and the start-up grace have passed.
        return Verdict(HEALTHY, "alive, starting up", evidence)

    frozen = s.seconds_since_step_advanced >= t.hang_after_s
    if (
        gpu_known
        and (s.gpu_used_mib or 0.0) <= t.released_mib
        and (s.framework_reserved_mib or 0.0) > t.released_mib
        and frozen
    ):
        return Verdict(DEAD, "GPU memory of the run dropped to ~0 with the step frozen", evidence)

    if frozen or s.process_state == "T":
        if s.process_state == "T" and not frozen:
            # Stopped by a signal: not hung yet, but it cannot advance either.
            return Verdict(SLOW, "trainer stopped (T state)", evidence)
        return Verdict(
            HUNG,
            f"step frozen for {s.seconds_since_step_advanced:.0f}s (bound {t.hang_after_s:.0f}s)",
            evidence,
        )

    if s.tokens_per_s is not None and s.tokens_per_s < t.min_tokens_per_s:
        return Verdict(
            SLOW, f"{s.tokens_per_s:.0f} tokens/s below {t.min_tokens_per_s:.0f}", evidence
        )
    if s.log_age_s is not None and s.log_age_s >= t.slow_after_s:
        return Verdict(SLOW, f"trainer log quiet for {s.log_age_s:.0f}s", evidence)
    return Verdict(HEALTHY, "alive and advancing", evidence)
