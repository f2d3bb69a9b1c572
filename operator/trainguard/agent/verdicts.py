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

Ranks: a pod of several ranks (torchrun) is judged rank by rank as well. A rank whose process
is gone is `Dead`, and the evidence names the rank and its PID (the supervisor's record of the
first failed rank, with its exit code or signal, where it has one); a rank whose step is frozen
while the hang bound passes is `Hung`, naming the frozen ranks (one frozen rank stalls the
others in their next collective, so usually all are named, the culprit among them).

Memory is judged per GPU: on each of the pod's GPUs, what the driver reports used against
what the live trainer processes on it account for (their memory as the driver attributes it,
the framework's reserved memory on that device), and the compute processes on it (each GPU is
used by one trainer process: its rank, or the one process that uses them all). So a healthy
pod on N GPUs reads as N healthy GPUs, not as N times one GPU's memory and processes, and a
memory verdict names the GPU it is about; the operator knows the node.
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
    DEFAULT_INTERVAL_SECONDS,
    DEFAULT_IO_STUCK_AFTER_SECONDS,
    DEFAULT_SLOW_AFTER_SECONDS,
    DEFAULT_STARTUP_GRACE_SECONDS,
    MIN_ADAPTIVE_HANG_SECONDS,
    Monitor,
)
from trainguard.contract.files import RankFailure

HEALTHY = constants.Verdict.HEALTHY.value
SLOW = constants.Verdict.SLOW.value
HUNG = constants.Verdict.HUNG.value
DEAD = constants.Verdict.DEAD.value
GHOST_MEMORY = constants.Verdict.GHOST_MEMORY.value
IO_STUCK = constants.Verdict.IO_STUCK.value
PHASE_TRAINING = "training"  # the harness heartbeat's phase between steps
PHASE_CLOSED = "closed"  # ... once its session is closed, before the process ends
UNKNOWN = "Unknown"  # nothing to judge yet (trainer not started); never in the API

VERDICTS = (HEALTHY, SLOW, HUNG, DEAD, GHOST_MEMORY, IO_STUCK, UNKNOWN)
# Memory not released after a death is a GhostMemory verdict whose evidence names the
# narrower cause (`EVIDENCE_CAUSE`), which the operator records and taints the node with.
NOT_RELEASED = Reason.GPU_MEMORY_NOT_RELEASED.value


@dataclass(frozen=True)
class Thresholds:
    """Bounds from the TrainingRun's `spec.monitor` (`from_monitor`); defaults are the API's."""

    hang_after_s: float = DEFAULT_HANG_AFTER_SECONDS
    # `monitor.hangAfterStepTimes`: Hung sooner, after this many slowest recent steps while
    # training (`hang_bound`); None: `hang_after_s` alone.
    hang_after_step_times: float | None = None
    interval_s: float = DEFAULT_INTERVAL_SECONDS  # between two looks of the agent
    slow_after_s: float = DEFAULT_SLOW_AFTER_SECONDS
    io_stuck_after_s: float = DEFAULT_IO_STUCK_AFTER_SECONDS
    min_tokens_per_s: float = 0.0
    ghost_mib: float = DEFAULT_GHOST_THRESHOLD_MIB
    ghost_ratio: float = DEFAULT_GHOST_RATIO
    release_after_death_s: float = DEFAULT_GPU_RELEASE_SECONDS
    expected_processes: int = 1  # trainer processes in the pod
    # Compute processes on each GPU: its rank, or the one process that uses every GPU.
    processes_per_gpu: int = 1
    startup_grace_s: float = DEFAULT_STARTUP_GRACE_SECONDS
    # GPU memory at or below this counts as "released" (driver and CUDA context overhead).
    released_mib: float = 512.0

    @classmethod
    def from_monitor(cls, monitor: Monitor) -> Thresholds:
        """The classifier's bounds from the run's `spec.monitor`."""
        return cls(
            hang_after_s=monitor.hang_after_seconds,
            hang_after_step_times=monitor.hang_after_step_times,
            interval_s=monitor.interval_seconds,
            slow_after_s=monitor.slow_after_seconds,
            io_stuck_after_s=monitor.io_stuck_after_seconds,
            min_tokens_per_s=monitor.min_tokens_per_second or 0.0,
            ghost_mib=monitor.ghost_memory.threshold_mib,
            ghost_ratio=monitor.ghost_memory.ratio,
            release_after_death_s=monitor.ghost_memory.release_timeout_seconds,
            startup_grace_s=monitor.startup_grace_seconds,
        )


@dataclass(frozen=True)
class GpuSignals:
    """One of the pod's GPUs at one moment (MiB); `index` None: the pod's GPUs as one.

    `framework_reserved_mib` is what the trainer's framework holds on this GPU (None: not
    known here); `left_mib` what the last death left on it, while that is above the released
    bound (`Signals.seconds_held_since_death`).
    """

    index: int | None
    used_mib: float | None
    processes: int | None
    unattributed_mib: float | None = None  # used by no live process (driver's view)
    framework_reserved_mib: float | None = None
    left_mib: float | None = None


@dataclass(frozen=True)
class RankSignals:
    """One rank of a multi-rank pod at one moment: its process and its heartbeat's step."""

    rank: int  # the local rank
    pid: int
    alive: bool
    step: int | None = None
    seconds_since_step_advanced: float = 0.0
    closed: bool = False  # its heartbeat says it closed its session: it ends on purpose

    @property
    def failed(self) -> bool:
        """Gone without having closed its session: a death."""
        return not self.alive and not self.closed


@dataclass(frozen=True)
class Signals:
    """What the agent observed at one moment (times in seconds).

    `trainer_seen` says whether a training process has ever run in this pod; before it, there
    is nothing to judge. `heartbeat` says whether that process writes the harness heartbeat
    (without it, `step` is None). GPU fields are None when no probe reading is available.
    The `gpu_*` and `framework_reserved_mib` fields are the pod's totals (the evidence);
    `gpus` has each GPU's figures, which the memory checks judge. Signals without them (a
    source that does not read the GPUs one by one) are judged as one GPU with the totals.
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
    # The slowest of the trainer's recent steps, as its harness measured it (s); None: unknown.
    slowest_step_s: float | None = None
    # Since the last death, while the memory it left (all used memory until a trainer runs
    # again, then what no live process accounts for) has stayed above the released bound on
    # some GPU at every reading; None: no such death, released, or unknown. `memory_left_mib`
    # is that memory at the latest reading, on the GPUs still above the bound (each one's
    # in `gpus`).
    seconds_held_since_death: float | None = None
    memory_left_mib: float | None = None
    gpus: tuple[GpuSignals, ...] = ()
    # The ranks of a multi-rank pod (none for one process), and the first failed rank of the
    # last launch as the supervisor recorded it.
    ranks: tuple[RankSignals, ...] = ()
    rank_failure: RankFailure | None = None

    def per_gpu(self) -> tuple[GpuSignals, ...]:
        """The GPUs to judge one by one: `gpus`, else the totals as one GPU."""
        if self.gpus:
            return self.gpus
        total = GpuSignals(
            None,
            self.gpu_used_mib,
            self.gpu_processes,
            self.gpu_unattributed_mib,
            self.framework_reserved_mib,
            self.memory_left_mib,
        )
        return (total,)


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


def _on(gpus: list[GpuSignals]) -> str:
    """Where, in a reason: " on GPU 2", " on GPUs 0, 2", or nothing for the GPUs as one."""
    indices = [str(g.index) for g in gpus if g.index is not None]
    if not indices:
        return ""
    return f" on GPU{'s' if len(indices) > 1 else ''} {', '.join(indices)}"


def _naming(evidence: dict[str, str], gpus: list[GpuSignals]) -> dict[str, str]:
    """The evidence, with the indices of the GPUs a verdict is about (`gpu`)."""
    indices = [str(g.index) for g in gpus if g.index is not None]
    return {**evidence, "gpu": ",".join(indices)} if indices else evidence


def _gpu_memory(s: Signals, t: Thresholds, evidence: dict[str, str]) -> Verdict | None:
    """GhostMemory on a GPU whose processes or memory the live trainer does not account for."""
    gpus = s.per_gpu()
    for g in gpus:
        if g.processes is not None and g.processes > t.processes_per_gpu:
            return Verdict(
                GHOST_MEMORY,
                f"{g.processes} compute processes{_on([g])} where {t.processes_per_gpu} expected",
                _naming(evidence, [g]),
            )
    for g in gpus:
        if g.unattributed_mib is not None and g.unattributed_mib > t.ghost_mib:
            return Verdict(
                GHOST_MEMORY,
                f"driver reports {g.unattributed_mib:.0f} MiB{_on([g])} held by no live process",
                _naming(evidence, [g]),
            )
    for g in gpus:
        if g.used_mib is None or g.framework_reserved_mib is None:
            continue
        used, reserved = g.used_mib, g.framework_reserved_mib
        if used - reserved > t.ghost_mib and used > t.ghost_ratio * max(reserved, 1.0):
            return Verdict(
                GHOST_MEMORY,
                f"driver reports {used:.0f} MiB used{_on([g])}, framework holds "
                f"{reserved:.0f} MiB: {used - reserved:.0f} MiB unaccounted for",
                _naming(evidence, [g]),
            )
    return None


def _ranks_text(ranks: list[RankSignals]) -> str:
    return ", ".join(f"{r.rank} (pid {r.pid})" for r in ranks)


def _failed_record(s: Signals) -> bool:
    """The supervisor's record names a gone rank that ended badly (even after closing)."""
    failure = s.rank_failure
    gone = {r.pid for r in s.ranks if not r.alive}
    return failure is not None and failure.pid in gone and bool(failure.signal or failure.exit_code)


def _rank_death(s: Signals, evidence: dict[str, str]) -> Verdict:
    """Dead, naming the failed rank: the supervisor's record, else the ranks seen gone."""
    gone = [r for r in s.ranks if r.failed]
    failure = s.rank_failure
    closed = {r.pid for r in s.ranks if r.closed and not r.alive}
    if failure is not None and failure.pid in closed and not (failure.signal or failure.exit_code):
        failure = None  # seen gone (status reaped) after closing its session: it ended
    watched = {r.pid for r in s.ranks}
    if failure is not None and (failure.pid in watched or not gone):
        named = {**evidence, "rank": str(failure.rank), "rank_pid": _fmt(failure.pid)}
        if failure.signal is not None:
            named["rank_signal"] = failure.signal
        elif failure.exit_code is not None:
            named["rank_exit"] = str(failure.exit_code)
        return Verdict(
            DEAD,
            f"rank {failure.rank} (pid {_fmt(failure.pid)}) {failure.how()}: all ranks restart",
            named,
        )
    if not gone:
        return Verdict(DEAD, "trainer process absent", evidence)
    named = {
        **evidence,
        "rank": ",".join(str(r.rank) for r in gone),
        "rank_pid": ",".join(str(r.pid) for r in gone),
    }
    plural = "s" if len(gone) > 1 else ""
    return Verdict(DEAD, f"rank{plural} {_ranks_text(gone)} absent: all ranks restart", named)


def hang_bound(s: Signals, t: Thresholds) -> float:
    """How long the step may stay frozen before the trainer is Hung.

    `hang_after_s`; with `hang_after_step_times`, while training with a known slowest recent
    step, that many of it if shorter, but never below `MIN_ADAPTIVE_HANG_SECONDS` or three
    looks (a step is timed from the loop's report in the heartbeat, written once a second, so
    a healthy step reads up to about a second old; the looks add their spacing). A save or a
    restore has no step time to go by. A trainer with
    step times (five steps done) is past its start-up: the start-up grace no longer holds.
    """
    if not _adaptive(s, t):
        return t.hang_after_s
    assert t.hang_after_step_times is not None and s.slowest_step_s is not None  # _adaptive
    return min(t.hang_after_s, max(_adaptive_floor(t), t.hang_after_step_times * s.slowest_step_s))


def _adaptive(s: Signals, t: Thresholds) -> bool:
    """Whether the hang bound is a multiple of the slowest recent step (`hang_bound`)."""
    return (
        t.hang_after_step_times is not None
        and s.slowest_step_s is not None
        and s.phase == PHASE_TRAINING
    )


def _adaptive_floor(t: Thresholds) -> float:
    return max(float(MIN_ADAPTIVE_HANG_SECONDS), 3 * t.interval_s)


def _bound_text(bound: float, s: Signals, t: Thresholds) -> str:
    if bound < t.hang_after_s and t.hang_after_step_times and s.slowest_step_s is not None:
        return (
            f"bound {bound:.1f}s: {t.hang_after_step_times:g} x the slowest recent step "
            f"{s.slowest_step_s:.2f}s, at least {_adaptive_floor(t):g}s"
        )
    return f"bound {bound:.0f}s"


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
    if s.gpus:
        evidence["gpus"] = _fmt(len(s.gpus))
    if s.seconds_held_since_death is not None:
        evidence["held_s"] = _fmt(s.seconds_held_since_death)
    if not s.heartbeat:
        evidence["heartbeat"] = "none"
    if not s.trainer_seen:
        return Verdict(UNKNOWN, "trainer process not started yet", evidence)

    held_s = s.seconds_held_since_death
    if held_s is not None and held_s >= t.release_after_death_s:
        # Whether or not the trainer was restarted in place meanwhile, what the dead process
        # held is still held by no live one: the node's GPU is not usable as it should be.
        held = [g for g in s.per_gpu() if g.left_mib is not None]
        return Verdict(
            GHOST_MEMORY,
            f"{s.memory_left_mib or 0.0:.0f} MiB still held{_on(held)} {held_s:.0f}s after "
            "the trainer died, by no live trainer: memory not released after death",
            {**_naming(evidence, held), EVIDENCE_CAUSE: NOT_RELEASED},
        )
    if s.ranks:
        evidence["ranks"] = _fmt(len(s.ranks))
        if not s.process_alive or any(r.failed for r in s.ranks) or _failed_record(s):
            return _rank_death(s, evidence)
    if not s.process_alive or s.process_state == "Z":
        return Verdict(DEAD, "trainer process absent", evidence)

    if s.process_state == "D" and s.seconds_in_d_state >= t.io_stuck_after_s:
        return Verdict(
            IO_STUCK,
            f"trainer in uninterruptible I/O (D) for {s.seconds_in_d_state:.0f}s",
            evidence,
        )

    if s.process_count > t.expected_processes:
        return Verdict(
            GHOST_MEMORY,
            f"{s.process_count} trainer processes where {t.expected_processes} expected",
            evidence,
        )
    ghost = _gpu_memory(s, t, evidence)
    if ghost is not None:
        return ghost

    # A trainer whose step times the adaptive hang bound goes by is past its start-up.
    starting = s.seconds_since_start < t.startup_grace_s and not _adaptive(s, t)
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

    bound = hang_bound(s, t)
    frozen = s.seconds_since_step_advanced >= bound
    dropped = [
        g
        for g in s.per_gpu()
        if g.used_mib is not None
        and g.used_mib <= t.released_mib
        and (g.framework_reserved_mib or 0.0) > t.released_mib
    ]
    if dropped and frozen:
        return Verdict(
            DEAD,
            f"GPU memory of the run dropped to ~0{_on(dropped)} with the step frozen",
            _naming(evidence, dropped),
        )

    hung = [r for r in s.ranks if r.step is not None and r.seconds_since_step_advanced >= bound]
    if hung:
        frozen_s = max(r.seconds_since_step_advanced for r in hung)
        plural = "s" if len(hung) > 1 else ""
        return Verdict(
            HUNG,
            f"step of rank{plural} {_ranks_text(hung)} frozen for {frozen_s:.0f}s "
            f"({_bound_text(bound, s, t)})",
            {
                **evidence,
                "rank": ",".join(str(r.rank) for r in hung),
                "rank_pid": ",".join(str(r.pid) for r in hung),
            },
        )
    if frozen or s.process_state == "T":
        if s.process_state == "T" and not frozen:
            # Stopped by a signal: not hung yet, but it cannot advance either.
            return Verdict(SLOW, "trainer stopped (T state)", evidence)
        return Verdict(
            HUNG,
            f"step frozen for {s.seconds_since_step_advanced:.0f}s ({_bound_text(bound, s, t)})",
            evidence,
        )

    if s.tokens_per_s is not None and s.tokens_per_s < t.min_tokens_per_s:
        return Verdict(
            SLOW, f"{s.tokens_per_s:.0f} tokens/s below {t.min_tokens_per_s:.0f}", evidence
        )
    if s.log_age_s is not None and s.log_age_s >= t.slow_after_s:
        return Verdict(SLOW, f"trainer log quiet for {s.log_age_s:.0f}s", evidence)
    return Verdict(HEALTHY, "alive and advancing", evidence)
