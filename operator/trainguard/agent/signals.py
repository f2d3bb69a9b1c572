"""Collect the agent's signals: the trainer process, its heartbeat, checkpoints, GPU, log.

The trainer is the process the supervisor runs (`supervisor.json`), watched from its start:
presence needs no heartbeat, so a script without the harness is watched too. The harness
heartbeat adds the step, phase, rate and framework memory, and names the trainer where no
supervisor runs one or where it is a process of its own below the supervisor's (a launcher's
worker). Only the heartbeat of the process watched counts: one an earlier trainer left in the
file says nothing about its successor.

GPU memory is observed per GPU (`gpu_signals`): the driver's reading of each of the pod's GPUs,
the framework's memory on that device from the heartbeat (`framework_by_gpu`), and what the
last death left on it.

After a death, a script without the heartbeat is followed to the process the supervisor
restarts. A trainer that wrote heartbeats is followed to its successor's first heartbeat
instead: its `Dead` lasts through the successor's start-up (imports, restore), not only
through the supervisor's back-off, so an operator that is away for a few seconds (it counts
deaths from the verdicts on the Lease) still finds it.

A pod of several ranks (`rank_heartbeats` set): the supervisor publishes the ranks' PIDs and
its record of the first failed rank (`supervisor.json`), and each rank writes its own heartbeat
(`heartbeat-<local rank>.json`). Each rank is watched from the moment its PID is published: its
presence, and its step from its own heartbeat (`RankSignals`). The main trainer watched is the
writer of `heartbeat.json`, local rank 0, as in a one-rank pod; the framework memory of every
rank counts on its own GPU.

Each collector reads one source and keeps just enough memory across calls to turn states into
durations (how long the step has been frozen, how long ago the process died, how long it has
been in uninterruptible I/O). Times are monotonic seconds from the caller, so the collectors
are testable with a fake clock.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainguard import gpu
from trainguard.agent.verdicts import PHASE_CLOSED, GpuSignals, RankSignals, Signals
from trainguard.ckpt import MANIFEST_FILENAME, parse_step_dirname
from trainguard.contract.files import (
    RankFailure,
    read_json,
    read_rank_failure,
    read_rank_pids,
    read_supervised_child,
)
from trainguard.contract.findings import HEARTBEAT_FIELD, Finding, read_findings

# /proc states of a process that is gone: no entry, or a zombie waiting to be reaped.
GONE = (None, "Z")
# Phases of the harness's heartbeat during which a frozen step is expected.
PROGRESS_PHASES = ("loading",)
MIB = 1024 * 1024
# The heartbeat's framework memory per device (trainguard_harness.heartbeat), and its keys.
MEMORY_BY_DEVICE = "memory_by_device"
DEVICE = "device"
DEVICE_UUID = "uuid"
DEVICE_RESERVED = "reserved_bytes"
# Several ranks seen gone at one look: the launcher ends the others once one dies, so which
# one failed first is the supervisor's record, written a moment after the last one ended.
RANK_RECORD_WAIT_S = 2.0
RANK_RECORD_POLL_S = 0.05
# NVML names a GPU `GPU-<uuid>` (a MIG instance `MIG-<uuid>`); CUDA, as the harness reports it,
# by the UUID alone.
UUID_PREFIXES = ("GPU-", "MIG-")


@dataclass(frozen=True)
class DeviceMemory:
    """The framework's memory on one device, as a heartbeat reports it."""

    device: int  # the CUDA index in the trainer's process
    uuid: str | None  # without NVML's prefix
    reserved_mib: float


@dataclass(frozen=True)
class Heartbeat:
    """The fields of the harness's heartbeat file that the agent uses.

    `reserved_mib` is the current device's; `devices` every device the process holds memory
    on, None where the heartbeat does not say (an older harness, or no GPU in use).
    """

    pid: int
    step: int | None
    time: float | None
    phase: str | None
    tokens_per_s: float | None
    reserved_mib: float | None
    devices: tuple[DeviceMemory, ...] | None = None
    # The invalid checkpoints the harness found in L1, its newest (`contract.findings`).
    invalid_checkpoints: tuple[Finding, ...] = ()
    # The slowest of the trainer's recent steps (s); None before it has enough of them.
    slowest_step_s: float | None = None


def parse_heartbeat(data: dict[str, Any]) -> Heartbeat:
    """Read a heartbeat JSON object (see trainguard_harness.heartbeat for the writer)."""

    def number(*keys: str) -> float | None:
        for key in keys:
            value = data.get(key)
            if isinstance(value, int | float):
                return float(value)
        return None

    reserved = number("memory_reserved_mib")
    if reserved is None:
        reserved_bytes = number("memory_reserved_bytes", "memory_reserved")
        reserved = None if reserved_bytes is None else reserved_bytes / MIB
    step = data.get("step")
    phase = data.get("phase")
    return Heartbeat(
        pid=int(data["pid"]),
        step=int(step) if isinstance(step, int) else None,
        time=number("time"),
        phase=str(phase) if phase else None,
        tokens_per_s=number("tokens_per_s", "tokens_per_second"),
        reserved_mib=reserved,
        devices=_devices(data.get(MEMORY_BY_DEVICE)),
        invalid_checkpoints=read_findings(data.get(HEARTBEAT_FIELD)),
        slowest_step_s=number("slowest_step_s"),
    )


def slowest_step(beats: Sequence[Heartbeat]) -> float | None:
    """The slowest recent step of the trainer's ranks; None unless every rank has a figure.

    One rank's steps wait for the others' in each collective, so the slowest is the pod's.
    """
    figures = [beat.slowest_step_s for beat in beats]
    if not figures or any(figure is None for figure in figures):
        return None
    return max(figure for figure in figures if figure is not None)


def _devices(value: Any) -> tuple[DeviceMemory, ...] | None:
    """The per-device figures; None when absent or malformed (the rest of the beat counts)."""
    if not isinstance(value, list):
        return None
    try:
        return tuple(
            DeviceMemory(
                device=int(entry[DEVICE]),
                uuid=_bare_uuid(entry[DEVICE_UUID]) if entry.get(DEVICE_UUID) else None,
                reserved_mib=float(entry[DEVICE_RESERVED]) / MIB,
            )
            for entry in value
        )
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


def _bare_uuid(uuid: str) -> str:
    """A GPU's UUID without NVML's prefix, as CUDA names it."""
    for prefix in UUID_PREFIXES:
        if uuid.startswith(prefix):
            return uuid[len(prefix) :]
    return uuid


def framework_by_gpu(
    readings: Sequence[gpu.GpuReading], beats: Sequence[Heartbeat]
) -> list[float | None]:
    """The framework's reserved MiB on each reading's GPU (None: not known there).

    Each heartbeat's per-device figures land on the GPU of the same UUID, else on the pod's
    GPU at the device's CUDA index (NVML and CUDA number the pod's GPUs alike unless
    ``CUDA_VISIBLE_DEVICES`` renumbers them, which the UUID sees through). The figures of
    several heartbeats (one per rank) add up. A GPU that no heartbeat names has no figure: the
    process there may be a rank whose heartbeat is not read, so the driver's view alone
    judges it. A heartbeat without per-device figures (an older harness) gives the current
    device's figure alone, which is known to be that GPU's only in a pod with one GPU.
    """
    figures: list[float | None] = [None] * len(readings)
    if any(beat.devices is None for beat in beats):
        if len(beats) == 1 and len(readings) == 1:
            figures[0] = beats[0].reserved_mib
        return figures
    by_uuid = {_bare_uuid(r.uuid): position for position, r in enumerate(readings)}
    for beat in beats:
        for device in beat.devices or ():
            position = by_uuid.get(device.uuid or "", device.device)
            if 0 <= position < len(readings):
                figures[position] = (figures[position] or 0.0) + device.reserved_mib
    return figures


def gpu_signals(
    snapshot: gpu.GpuSnapshot, beats: Sequence[Heartbeat], left: dict[int, float]
) -> tuple[GpuSignals, ...]:
    """Each of the pod's GPUs as the classifier judges it; `left`: a death's memory, by index."""
    framework = framework_by_gpu(snapshot.gpus, beats)
    return tuple(
        GpuSignals(
            index=reading.index,
            used_mib=reading.used_mib,
            processes=len(reading.processes),
            unattributed_mib=reading.unattributed_mib,
            framework_reserved_mib=reserved,
            left_mib=left.get(reading.index),
        )
        for reading, reserved in zip(snapshot.gpus, framework, strict=True)
    )


def framework_total(beat: Heartbeat | None) -> float | None:
    """The framework's reserved MiB on all its devices (the current one's where that is all)."""
    if beat is None or beat.devices is None:
        return None if beat is None else beat.reserved_mib
    return sum(device.reserved_mib for device in beat.devices)


def frameworks_total(beats: Sequence[Heartbeat]) -> float | None:
    """The framework's reserved MiB of several processes (ranks); None when none says."""
    figures = [figure for beat in beats if (figure := framework_total(beat)) is not None]
    return sum(figures) if figures else None


@dataclass
class RankWatch:
    """What the collector remembers of one rank between observations."""

    pid: int
    step_changed_at: float  # when its step last changed (or it was first seen)
    step: int | None = None
    beat: Heartbeat | None = None  # its latest heartbeat (its own process's)


def read_heartbeat(path: Path) -> Heartbeat | None:
    """The current heartbeat, or None when absent or unreadable (mid-replace is atomic)."""
    record = read_json(path)
    if record is None:
        return None
    try:
        return parse_heartbeat(record)
    except (ValueError, KeyError, TypeError):
        return None


def proc_state(pid: int, proc: Path = Path("/proc")) -> str | None:
    """The /proc state letter of a process (R, S, D, T, Z, ...), or None when gone."""
    try:
        stat = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    # The command name is in parentheses and may itself contain spaces or parentheses.
    return stat[stat.rindex(")") + 2 :].split(" ", 1)[0]


def _cmdline(pid: int, proc: Path) -> bytes | None:
    try:
        return (proc / str(pid) / "cmdline").read_bytes()
    except OSError:
        return None


def _parent(pid: int, proc: Path) -> int | None:
    try:
        stat = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    return int(stat[stat.rindex(")") + 2 :].split(" ", 2)[1])


def _in_run(pid: int, proc: Path, marker: bytes) -> bool:
    """Whether process `pid` belongs to this run, judged by `marker` in its environment.

    Another user's environment cannot be read (EPERM): that happens on a real node, where the
    shared process namespace is the pod's own, so every process in it is the run's. A process
    node shares the host's process table, but runs every container as one user, so the marker
    is readable there and keeps other pods' trainers out.
    """
    try:
        return marker in (proc / str(pid) / "environ").read_bytes().split(b"\0")
    except PermissionError:
        return True
    except OSError:
        return False  # exited while we looked


def count_like(pid: int, marker: bytes, proc: Path = Path("/proc")) -> int:
    """Trainer processes of this run: those running `pid`'s command line, forked workers not.

    More than one means a duplicate trainer: the ghost seen from the other side. A process
    whose ancestor is itself such a process is that trainer's child (a DataLoader forks its
    workers with the trainer's command line) and is not another trainer.
    """
    reference = _cmdline(pid, proc)
    if not reference:
        return 0
    same_command = [
        int(entry.name)
        for entry in proc.iterdir()
        if entry.name.isdigit() and _cmdline(int(entry.name), proc) == reference
    ]
    trainers = {
        other
        for other in same_command
        if proc_state(other, proc) not in (None, "Z") and _in_run(other, proc, marker)
    }
    return sum(1 for other in trainers if not _has_ancestor_in(other, trainers, proc))


def _has_ancestor_in(pid: int, group: set[int], proc: Path, depth: int = 8) -> bool:
    parent = _parent(pid, proc)
    while parent is not None and parent > 1 and depth > 0:
        if parent in group:
            return True
        parent, depth = _parent(parent, proc), depth - 1
    return False


def newest_saved_step(l1: Path) -> int | None:
    """The newest step in L1 with a manifest (cheap: existence only, no hashing)."""
    newest = None
    try:
        entries = list(l1.iterdir())
    except OSError:
        return None
    for entry in entries:
        step = parse_step_dirname(entry.name)
        if step is not None and (entry / MANIFEST_FILENAME).exists():
            newest = step if newest is None else max(newest, step)
    return newest


@dataclass
class Collector:
    """Turns successive observations into the classifier's `Signals`."""

    heartbeat_file: Path
    gpu_file: Path
    l1_dir: Path
    log_file: Path | None
    marker: bytes  # an env entry only this run's trainer has (e.g. its L1 path)
    gpu_stale_s: float = 5.0
    # GPU memory at or below this counts as released (the classifier's `released_mib`).
    released_mib: float = 512.0
    # The supervisor's state file: the process it runs, from the start of each, before any
    # heartbeat and for scripts that never write one.
    supervisor_file: Path | None = None
    proc: Path = Path("/proc")
    # Every rank's heartbeat, in local rank order, in a pod of several ranks; () for one.
    rank_heartbeats: tuple[Path, ...] = ()
    # How long to wait for the supervisor's record of the first failed rank when several ranks
    # are seen gone at one look (`_ranks`).
    record_wait_s: float = RANK_RECORD_WAIT_S
    # How much older than the look a new step's heartbeat `time` may count: the harness writes
    # its heartbeat at most once a second, the agent looks once an interval (`_reported_at`).
    report_lag_s: float = 2.0

    def __post_init__(self) -> None:
        self.pid: int | None = None  # the trainer watched
        self.beats = False  # whether it has written a heartbeat
        self.beat_pid: int | None = None  # the process that wrote the last heartbeat read
        self.died_at: float | None = None
        # The last death whose memory has not been seen released yet (kept across restarts).
        self.unreleased_death_at: float | None = None
        self.d_since: float | None = None
        self.step: int | None = None
        self.step_changed_at: float | None = None
        self.pid_seen_at: float = 0.0
        self.last_heartbeat: Heartbeat | None = None
        # What the last heartbeat read lists as invalid in L1, whichever trainer wrote it.
        self.findings: tuple[Finding, ...] = ()
        self.last_gpu: gpu.GpuSnapshot | None = None
        self.gpu_fresh = False
        self.ranks: dict[int, RankWatch] = {}  # by local rank, kept through a restart's gap
        self.rank_failure: RankFailure | None = None
        self.rank_record_awaited: set[int] = set()  # the ranks whose failure record was awaited

    def collect(self, now: float, wall_now: float) -> Signals:
        """Observe every source once."""
        beat = read_heartbeat(self.heartbeat_file)
        supervisor = self.supervisor_file
        child = None if supervisor is None else read_supervised_child(supervisor)
        self._follow(beat, child, now)
        # L1 is the run's: what any trainer found there counts, before its death too.
        self.findings = () if beat is None else beat.invalid_checkpoints
        # The heartbeat of the process watched; None: no heartbeat (yet, or ever) from it.
        beat = beat if beat is not None and beat.pid == self.pid else None
        self.beats = self.beats or beat is not None
        self.last_heartbeat = beat
        state = proc_state(self.pid, self.proc) if self.pid is not None else None
        alive = state is not None and state != "Z"
        if self.pid is not None and not alive and self.died_at is None:
            self.died_at = self.unreleased_death_at = now
        if state == "D":
            self.d_since = self.d_since if self.d_since is not None else now
        else:
            self.d_since = None
        if beat is not None and beat.phase in PROGRESS_PHASES:
            self.step, self.step_changed_at = beat.step, now
        elif beat is not None and beat.step != self.step:
            self.step, self.step_changed_at = beat.step, self._reported_at(beat, now, wall_now)
        snapshot = gpu.read_published(self.gpu_file)
        self.last_gpu = snapshot
        self.gpu_fresh = (
            snapshot is not None
            and snapshot.available
            and wall_now - snapshot.time <= self.gpu_stale_s
        )
        # A successor not watched yet (no heartbeat so far) runs too: its memory is its own.
        running = alive or (
            child is not None and child != self.pid and proc_state(child, self.proc) not in GONE
        )
        fresh = snapshot if self.gpu_fresh else None
        held_s, left = self._held_since_death(now, running, fresh)
        ranks = self._ranks(now, wall_now)
        # The framework memory of every live rank, each on its GPU; else the main trainer's.
        if ranks:
            live = {r.pid for r in ranks if r.alive}
            beats = [w.beat for w in self.ranks.values() if w.beat is not None and w.pid in live]
        else:
            beats = [beat] if beat else []
        return Signals(
            trainer_seen=self.pid is not None,
            heartbeat=beat is not None,
            process_alive=alive,
            process_state=state,
            process_count=count_like(self.pid, self.marker, self.proc) if alive and self.pid else 0,
            seconds_since_death=None if self.died_at is None else now - self.died_at,
            seconds_in_d_state=0.0 if self.d_since is None else now - self.d_since,
            step=self.step if beat is not None else None,
            seconds_since_step_advanced=0.0
            if self.step_changed_at is None
            else now - self.step_changed_at,
            phase=beat.phase if beat else None,
            tokens_per_s=beat.tokens_per_s if beat and alive else None,
            framework_reserved_mib=frameworks_total(beats) if ranks else framework_total(beat),
            gpu_used_mib=fresh.used_mib if fresh else None,
            gpu_processes=fresh.distinct_processes if fresh else None,
            gpu_unattributed_mib=fresh.unattributed_mib if fresh else None,
            log_age_s=self._log_age(wall_now),
            seconds_since_start=now - self.pid_seen_at if self.pid is not None else 0.0,
            seconds_held_since_death=held_s,
            memory_left_mib=None if held_s is None else sum(left.values()),
            gpus=gpu_signals(fresh, beats, left) if fresh else (),
            slowest_step_s=slowest_step(beats),
            ranks=ranks,
            rank_failure=self.rank_failure if ranks else None,
        )

    def _reported_at(self, beat: Heartbeat, now: float, wall_now: float) -> float:
        """When the loop reported a newly seen step, on the agent's clock (`now`'s).

        The heartbeat's `time` is when the loop last reported (the same node's wall clock), so
        a step frozen since then is timed from its last report, not from the look that first
        saw it, up to `report_lag_s` late (a write interval and a look apart). A time from the
        future, or none, counts as now.
        """
        if beat.time is None:
            return now
        return now - min(max(0.0, wall_now - beat.time), self.report_lag_s)

    def _ranks(self, now: float, wall_now: float) -> tuple[RankSignals, ...]:
        """Each rank's presence and step (module docstring); () in a one-rank pod.

        A rank is watched from its PID's publication until the supervisor publishes another
        PID for that rank: a dead rank stays dead through the restart's back-off.
        """
        if not self.rank_heartbeats or self.supervisor_file is None:
            return ()
        for rank, pid in read_rank_pids(self.supervisor_file).items():
            watch = self.ranks.get(rank)
            if watch is None or watch.pid != pid:
                self.ranks[rank] = RankWatch(pid, step_changed_at=now)
        self.rank_failure = self._rank_failure()
        signals = []
        for rank, watch in sorted(self.ranks.items()):
            beat = (
                read_heartbeat(self.rank_heartbeats[rank])
                if rank < len(self.rank_heartbeats)
                else None
            )
            if beat is not None and beat.pid == watch.pid:
                watch.beat = beat
                if beat.phase in PROGRESS_PHASES:
                    watch.step, watch.step_changed_at = beat.step, now
                elif beat.step != watch.step:
                    watch.step = beat.step
                    watch.step_changed_at = self._reported_at(beat, now, wall_now)
            signals.append(
                RankSignals(
                    rank=rank,
                    pid=watch.pid,
                    alive=proc_state(watch.pid, self.proc) not in GONE,
                    closed=watch.beat is not None and watch.beat.phase == PHASE_CLOSED,
                    step=watch.step,
                    seconds_since_step_advanced=now - watch.step_changed_at,
                )
            )
        return tuple(signals)

    def _rank_failure(self) -> RankFailure | None:
        """The supervisor's record of the first failed rank.

        When several ranks of the launch watched are gone and the record does not name one of
        them yet, wait (a bounded moment) for it, so that a death's first verdict names the
        rank that failed, not every rank the launcher ended after it.
        """
        assert self.supervisor_file is not None
        failure = read_rank_failure(self.supervisor_file)
        watched = {watch.pid for watch in self.ranks.values()}
        gone = [pid for pid in watched if proc_state(pid, self.proc) in GONE]
        if watched == self.rank_record_awaited:
            return failure  # waited once for this launch's record already
        if len(gone) > 1:
            self.rank_record_awaited = watched
        deadline = time.monotonic() + self.record_wait_s
        while (
            len(gone) > 1
            and (failure is None or failure.pid not in watched)
            and time.monotonic() < deadline
        ):
            time.sleep(RANK_RECORD_POLL_S)
            failure = read_rank_failure(self.supervisor_file)
        return failure

    def _follow(self, beat: Heartbeat | None, child: int | None, now: float) -> None:
        """Switch to a new trainer: the supervisor's process `child`, or a new heartbeat's writer.

        The supervisor's process is taken unless the trainer watched wrote heartbeats (module
        docstring). A heartbeat's writer is taken while no supervisor runs a process, or when
        it is that process or one of its descendants; a heartbeat left by an earlier trainer
        (dead, so no descendant) is not. Each writer is considered once, at its first heartbeat
        read. A trainer that died since the last look is still watched at this one, so that its
        death is seen even when its successor already runs.
        """
        if (
            self.pid is not None
            and self.died_at is None
            and proc_state(self.pid, self.proc) in GONE
        ):
            return
        if child is not None and child != self.pid and not self.beats:
            self._watch(child, now)
        if beat is None or beat.pid == self.beat_pid:
            return
        self.beat_pid = beat.pid
        if beat.pid != self.pid and (
            child is None or beat.pid == child or _has_ancestor_in(beat.pid, {child}, self.proc)
        ):
            self._watch(beat.pid, now)

    def _watch(self, pid: int, now: float) -> None:
        """Watch a new trainer process (first start or an in-place restart by the supervisor)."""
        self.pid, self.beats, self.died_at, self.d_since = pid, False, None, None
        self.pid_seen_at = now
        self.step_changed_at = now

    def _held_since_death(
        self, now: float, running: bool, snapshot: gpu.GpuSnapshot | None
    ) -> tuple[float | None, dict[int, float]]:
        """(seconds since the last death, memory it left by GPU index) while that is held.

        While no trainer runs, all used memory of a GPU is left over (a leftover process
        holding it included); once the supervisor has restarted the trainer (watched yet or
        not), what no live process accounts for is. NVML's PIDs are host PIDs, so this reasons
        from each GPU's totals only. A reading with every GPU at or below the released bound
        ends it; the GPUs still above it are those named.
        """
        if self.unreleased_death_at is None or snapshot is None:
            return None, {}
        left: dict[int, float] = {}
        for reading in snapshot.gpus:
            leftover = reading.unattributed_mib if running else reading.used_mib
            if leftover is None:
                return None, {}  # the driver cannot attribute memory per process: no judgement
            if leftover > self.released_mib:
                left[reading.index] = leftover
        if not left:
            self.unreleased_death_at = None
            return None, {}
        return now - self.unreleased_death_at, left

    def _log_age(self, wall_now: float) -> float | None:
        if self.log_file is None:
            return None
        try:
            return max(0.0, wall_now - os.stat(self.log_file).st_mtime)
        except OSError:
            return None
