"""`trainguard supervise -- <command>`: run the training command and restart it in place.

The command runs in its own session (`setsid`), detached from whoever launched the supervisor,
so the whole training process group can be signalled and cleaned up as one. When it dies
(non-zero exit or a signal), the supervisor kills whatever is left of its process group
(dataloader workers and other children that would keep GPU memory), waits a backoff, and
starts it again (defaults: the run's `spec.recovery` from `TRAINGUARD_RECOVERY`):

- the backoff doubles with each restart from `--backoff` up to `--backoff-max`, and starts
  over at `--backoff` after a process that ran `--backoff-reset` seconds before it died (the
  kubelet's rule for a crash loop);
- it gives up, exiting non-zero, on the death that would make `--max-restarts` + 1 restarts
  in a row without progress. Progress is a checkpoint in L1 (`TRAINGUARD_L1_DIR`) whose
  manifest verifies, newer than the newest one at the previous death: a death after progress
  counts as the first again, so a trainer that keeps saving keeps being restarted.

SIGTERM and SIGINT are forwarded to the process group and end supervision; after
`--grace-period` seconds the group is killed. A child that exits 0 ends supervision with 0.

Everything is recorded in a JSON state file next to the heartbeat (`supervisor.json`)::

    {"pid": 10, "command": ["python", "-m", "trainguard_harness.train"], "state": "backoff",
     "child_pid": null, "attempt": 2, "restarts": 1, "max_restarts": 3,
     "restarts_without_progress": 1, "backoff_restarts": 1, "checkpoint_step": 1200,
     "started_at": 1764720000.0, "updated_at": 1764720042.3,
     "history": [{"attempt": 1, "pid": 11, "started_at": 1764720000.1,
                  "ended_at": 1764720041.2, "exit_code": null, "signal": "SIGKILL",
                  "reason": "killed by SIGKILL", "leftover_processes": 2}],
     "gang_generation": null, "failed_generation": null, "last_gang_restart": null}

`state` is one of running, backoff, stopping, completed, gave-up, terminated. `restarts`
counts every restart; `restarts_without_progress` those since progress (bounded by
`max_restarts`), `backoff_restarts` those since the backoff last started over, and
`checkpoint_step` is the newest verified L1 checkpoint at the last death.

Several ranks in one pod (`TRAINGUARD_PROCS_PER_NODE` > 1, or `--procs-per-node`): the command
is started through PyTorch's elastic launcher (`trainguard_harness.launcher`, torchrun with
`--max-restarts 0`), so any rank that dies ends all of them and the launcher; the supervisor then
records the first failed rank (`rank_failure`: rank, pid, exit code or signal), makes sure every
rank of the launch is gone (each rank's own process group, and any orphan, which comes to the
supervisor as a child subreaper), and restarts all ranks together under the same back-off and
restart cap. While they run, `rank_pids` maps each local rank to its worker process (not the
launcher, which is `child_pid`). A member of a gang (`TRAINGUARD_NNODES` > 1) always runs its
ranks through the launcher, which joins member 0's rendezvous (`launcher.Gang`): a rank that
dies on any member fails the others' next collective, so every member's supervisor restarts
its ranks in place, each under its own back-off, and they meet again at member 0. With one
rank the command is started directly, exactly as without ranks, `rank_pids` is
``{"0": child_pid}`` and a death is rank 0's `rank_failure`.

A gang's restart generation: the operator keeps one number for the gang (0 at first), raised
each time the gang restarts, and orders it on every member's Lease; the pod's agent copies the
order into `gang.json` next to the state file (`read_gang_order`), and a member's supervisor
follows it (the fields stay null in a one-pod run, where nothing of this applies).
`gang_generation` is the generation the running (or last) launch follows, `failed_generation`
that of the last launch that ended without completing (a failure or an ordered stop):

- the first launch follows the order in `gang.json`, or 0 while there is none;
- after a launch of its own fails, the relaunch (after the usual back-off) follows the failed
  launch's generation + 1, or the order if that is newer: the operator, told of the failure,
  orders exactly that next generation, so its order does not restart the member a second time;
- while a launch runs, `gang.json` is looked at every poll (re-read only when it changed). An
  order newer than the launch's generation ends the launch at once (SIGKILL to the launcher's
  group and every rank's) and relaunches on the ordered generation with no back-off: it is
  not this member's failure, so it counts in `restarts` but not in
  `restarts_without_progress` nor `backoff_restarts`, and records no `rank_failure`; it is
  recorded as ``"last_gang_restart": {"generation": 2, "from": 1, "killed_at": ...}``.
  Except the first order this supervisor ever reads: a member created after the gang
  restarted (a replacement pod) learns from it where the gang is, and follows it without a
  restart. And a launch with a rank gone already is left to end on its own: the launcher is
  ending it, the order is most likely about that very failure, and the failure stays this
  member's (its `rank_failure` recorded, its relaunch on the next generation). A terminating
  supervisor (SIGTERM) ignores orders.

Why: when a member's node vanishes, its peers' ranks do not fail, they block in their next
collective and would only be ended by the hang bound; the operator's order ends them at once,
and with one generation number that all members follow, no member restarts twice for one
failure (its own failure and the order that follows it are the same restart).

A restart of a Python trainer (the supervisor's own interpreter running a script or a module)
takes a warm standby (`trainguard_harness.standby`): an interpreter started `--standby-delay`
seconds (default `STANDBY_DELAY_S`) after the trainer, with torch already imported, waiting
for the command; the restarted trainer skips the import (`--no-standby` starts every trainer
afresh). One rank only: torchrun starts
the ranks of a multi-rank pod.

L0, the checkpoint layer in memory that outlives a trainer (`TRAINGUARD_L0_DIR`), is the pod's
in a pod. Where the supervisor runs without one (by hand, in tests) it gives its children one
of its own under `/dev/shm` (`L0_SHM_DIR`), which outlives each trainer as the pod's would, and
removes it when supervision ends; where there is no `/dev/shm`, L0 stays off.

It also answers the pod agent's kill requests (`kill-request.json` next to the state file):
the agent watches from another container, as another user, and may not signal the trainer.
A request naming the running child's PID (or one of its ranks') gets SIGUSR1 (the harness
dumps its stacks; every rank of a multi-rank pod is asked), up to `STACK_WAIT_S` for the dump,
then SIGKILL to the whole group (and every rank's); the kill is recorded as
``"last_kill": {"pid": 11, "requested_at": ..., "killed_at": ..., "dumped": true}`` before
the restart. A request for any other PID (an earlier trainer) is ignored. This module does
not import torch.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, MutableMapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from trainguard.api.spec import DEFAULT_BACKOFF_RESET_AFTER_SECONDS
from trainguard.ckpt import find_newest_valid
from trainguard.contract import env
from trainguard.contract.env import ContractError, PodEnv
from trainguard.contract.files import (
    GANG_FILENAME,
    GPU_FILENAME,
    KILL_REQUEST_FILENAME,
    LAUNCH_RESULT_FILENAME,
    SUPERVISOR_FILENAME,
    RankFailure,
    read_gang_order,
    read_json,
    share_with_pod,
)
from trainguard_harness import launcher, standby
from trainguard_harness.gpu_publisher import GpuPublisher
from trainguard_harness.settings import HarnessSettings

STATE_RUNNING = "running"
STATE_BACKOFF = "backoff"
STATE_STOPPING = "stopping"
STATE_COMPLETED = "completed"
STATE_GAVE_UP = "gave-up"
STATE_TERMINATED = "terminated"
FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT)
HISTORY_LIMIT = 50
POLL_S = 0.1
# A standby for the next restart is started this long after the trainer: not at the same time
# as the trainer's own start-up, which it would slow down on a small machine.
STANDBY_DELAY_S = 5.0
EXIT_USAGE = 2
DEFAULT_MAX_RESTARTS = 3
DEFAULT_BACKOFF_S = 1.0
DEFAULT_BACKOFF_MAX_S = 30.0
DEFAULT_BACKOFF_RESET_S = float(DEFAULT_BACKOFF_RESET_AFTER_SECONDS)
# 2^62 outlasts any cap: a larger exponent would only overflow the float.
MAX_EXPONENT = 62
# How long a hung trainer gets to write its stacks after SIGUSR1 before it is killed.
STACK_WAIT_S = 3.0
# How long the ranks of an ended launch may take to be gone after SIGKILL (they are reaped by
# the launcher or, orphaned, by the supervisor).
RANKS_GONE_WAIT_S = 10.0
PR_SET_CHILD_SUBREAPER = 36
# Where a supervisor without a pod's L0 makes one for its children (memory, like the pod's).
L0_SHM_DIR = Path("/dev/shm")
L0_PREFIX = "trainguard-l0-"  # then the supervisor's process id: `remove_orphaned_l0`


@dataclass
class Attempt:
    """One run of the command."""

    attempt: int
    pid: int
    started_at: float
    ended_at: float | None = None
    exit_code: int | None = None
    signal: str | None = None
    reason: str | None = None
    leftover_processes: int = 0

    def ran(self) -> float:
        """Seconds the process ran (so far, while it runs)."""
        return (self.ended_at or time.time()) - self.started_at


@dataclass
class SupervisorState:
    """The contents of the state file."""

    pid: int
    command: list[str]
    max_restarts: int
    state: str = STATE_RUNNING
    child_pid: int | None = None
    attempt: int = 0
    restarts: int = 0
    restarts_without_progress: int = 0
    backoff_restarts: int = 0
    checkpoint_step: int | None = None  # the newest verified L1 checkpoint at the last death
    started_at: float = field(default_factory=time.time)
    updated_at: float = field(default_factory=time.time)
    history: list[Attempt] = field(default_factory=list)
    last_kill: dict[str, Any] | None = None  # the last kill a request asked for
    procs_per_node: int = 1
    # The running ranks, local rank -> PID (JSON keys are strings); {} while none runs.
    rank_pids: dict[str, int] = field(default_factory=dict)
    # The first failed rank of the last launch that failed (`RankFailure.to_dict`).
    rank_failure: dict[str, Any] | None = None
    # A gang member's: the restart generation the running (or last) launch follows, and the
    # one of the last launch that ended without completing (a failure or an ordered stop).
    # None in a one-pod run. The names are `SUPERVISOR_GANG_GENERATION` and
    # `SUPERVISOR_FAILED_GENERATION` of the contract.
    gang_generation: int | None = None
    failed_generation: int | None = None
    # The last launch ended because the gang restarted: {generation, from, killed_at}.
    last_gang_restart: dict[str, Any] | None = None

    def write(self, path: Path) -> None:
        """Replace the state file atomically."""
        self.updated_at = time.time()
        self.history = self.history[-HISTORY_LIMIT:]
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        temporary.write_text(json.dumps(asdict(self)) + "\n")
        os.replace(temporary, path)


def exit_status(returncode: int) -> int:
    """A shell-style status: the exit code, or 128 + the signal number for a signal death."""
    return 128 - returncode if returncode < 0 else returncode


def describe(returncode: int) -> tuple[int | None, str | None, str]:
    """(exit code, signal name, human reason) of a child's return code."""
    if returncode < 0:
        name = signal.Signals(-returncode).name
        return None, name, f"killed by {name}"
    return returncode, None, f"exited with {returncode}"


def group_members(pgid: int) -> list[int]:
    """PIDs of the live processes in process group `pgid` (from /proc)."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # exited while we looked
        # Fields after the parenthesised command name: state, ppid, pgrp, ...
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(entry.name))
    return members


def _size(path: Path | None) -> int:
    if path is None:
        return 0
    try:
        return path.stat().st_size
    except OSError:
        return 0


def newest_checkpoint(l1_dir: Path) -> int | None:
    """Step of the newest L1 checkpoint whose manifest and file sizes verify, or None.

    Sizes only: the writer read every file back and hashed it when it saved, and a restart
    must not wait for a full read of the checkpoint (the trainer's resume does that).
    """
    newest = find_newest_valid(l1_dir, check_hashes=False).newest
    return None if newest is None else newest.step


def kill_group(pgid: int, sig: signal.Signals = signal.SIGKILL) -> None:
    """Signal a whole process group, ignoring one that is already gone."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


def become_subreaper() -> bool:
    """Adopt orphaned descendants (Linux), so ranks a dead launcher left behind are found.

    False where the kernel does not offer it; the ranks whose PIDs were learnt are still ended.
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def reap_orphans() -> None:
    """Collect the exit status of adopted orphans that ended (none of them is `Popen`'s)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


class Supervisor:
    """Runs, watches and restarts one command (see the module docstring)."""

    def __init__(
        self,
        command: list[str],
        state_file: Path,
        *,
        max_restarts: int,
        backoff: float,
        backoff_max: float,
        backoff_reset: float,
        l1_dir: Path,
        grace_period: float,
        stacks_file: Callable[[int], Path] | None = None,
        procs_per_node: int = 1,
        gang: launcher.Gang | None = None,
        use_standby: bool = True,
        standby_delay: float = STANDBY_DELAY_S,
    ) -> None:
        self.command = command
        # What a warm standby runs for this command; None where none can (`standby.order_for`).
        eligible = use_standby and not launcher.through_torchrun(procs_per_node, gang)
        self.order = standby.order_for(command) if eligible else None
        self.standby: standby.Standby | None = None
        self.standbys = 0  # standbys started: each one's serial (`standby.Standby`)
        self.standby_delay = standby_delay
        self.state_file = state_file
        self.kill_request_file = state_file.with_name(KILL_REQUEST_FILENAME)
        self.procs_per_node = procs_per_node
        self.gang = gang
        # Ranks started by torchrun (several here, or a gang's member), each watched apart.
        self.multi = launcher.through_torchrun(procs_per_node, gang)
        self.launch_result_file = state_file.with_name(LAUNCH_RESULT_FILENAME)
        self.ranks: dict[int, int] = {}  # the running launch's ranks, local rank -> PID
        self.stacks_file = stacks_file
        self._answered: float | None = None  # the requested_at of the last request answered
        self.backoff, self.backoff_max = backoff, backoff_max
        self.backoff_reset = backoff_reset
        self.l1_dir = l1_dir
        self.grace_period = grace_period
        self.state = SupervisorState(
            os.getpid(), command, max_restarts, procs_per_node=procs_per_node
        )
        self.child: subprocess.Popen[bytes] | None = None
        self.terminating: signal.Signals | None = None
        self._kill_at: float | None = None
        self._wake = threading.Event()
        self._first_gone: RankFailure | None = None  # the first rank seen gone in this launch
        self._gone_seen = False  # whether any rank of this launch was seen gone
        # A gang member's restart generation (module docstring): the operator's order, as the
        # agent copies it into `gang.json`; the newest one read (None: none ever was), the file
        # as it was then (inode, mtime, size: it is re-read only when it changed), the
        # generation the next launch follows at least, and the generation that ended the
        # running launch (None while none did).
        self.gang_file = state_file.with_name(GANG_FILENAME)
        self._order: int | None = None
        self._order_seen: tuple[int, int, int] | None = None
        self._next_generation = 0
        self._ordered: int | None = None

    def child_alive(self) -> bool:
        """True while a training process runs."""
        child = self.child
        return child is not None and child.poll() is None

    def live_ranks(self) -> int:
        """Training processes alive now: the ranks of a multi-rank pod, else the child."""
        if not self.multi:
            return int(self.child_alive())
        return sum(1 for pid in list(self.ranks.values()) if not launcher.ended(pid)[0])

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        sig = signal.Signals(signum)
        if self.terminating is None:
            self.terminating = sig
            self._kill_at = time.monotonic() + self.grace_period
        if self.child is not None and self.child.poll() is None:
            kill_group(self.child.pid, sig)
        for pid in list(self.ranks.values()):  # in sessions of their own (launcher docstring)
            kill_group(pid, sig)
        self._wake.set()

    def _set(self, state: str, **changes: Any) -> None:
        self.state.state = state
        for key, value in changes.items():
            setattr(self.state, key, value)
        self.state.write(self.state_file)

    def _run_once(self) -> int:
        """Start the command, wait for it to end, clean up its group; return its return code."""
        self.state.attempt += 1
        multi = self.multi
        if multi:
            self.launch_result_file.unlink(missing_ok=True)
        command = launcher.launch_command(
            self.command, self.procs_per_node, self.launch_result_file, self.gang
        )
        child = self._take_standby() or subprocess.Popen(command, start_new_session=True)
        self.child = child
        started = time.monotonic()
        if self.terminating is not None:
            kill_group(child.pid, self.terminating)  # the signal arrived while starting it
        record = Attempt(self.state.attempt, child.pid, time.time())
        self.state.history.append(record)
        self.ranks = {} if multi else {0: child.pid}
        failure_before = self.state.rank_failure
        if self.gang is not None:
            self.state.gang_generation = max(self._next_generation, self._read_order() or 0)
        self._set(STATE_RUNNING, child_pid=child.pid, rank_pids=self._rank_pids())
        while True:
            try:
                returncode = child.wait(timeout=POLL_S)
                break
            except subprocess.TimeoutExpired:
                if self._kill_at is not None and time.monotonic() >= self._kill_at:
                    self._kill_launch(child.pid)
                if self._ordered is not None:
                    continue  # killed for the gang: ranks seen gone now are no failure
                if multi:
                    self._watch_ranks(child.pid)
                self._answer_kill_request(child.pid)
                if self.gang is not None:
                    self._follow_order(child.pid)
                if time.monotonic() - started >= self.standby_delay:
                    self._prepare_standby()
        # The session leader is gone; anything left in its group would hold GPU memory.
        leftovers = group_members(child.pid)
        kill_group(child.pid)
        if multi:
            leftovers += self._end_ranks()
        self.child = None
        record.ended_at = time.time()
        record.exit_code, record.signal, record.reason = describe(returncode)
        record.leftover_processes = len(leftovers)
        if self._ordered is not None and returncode != 0:
            record.reason = f"stopped: the gang restarts at generation {self._ordered}"
        if returncode != 0 and self.terminating is None and self._ordered is None:
            self.state.rank_failure = self._failure(child.pid, record).to_dict()
        else:  # an early record of a rank that finished, stopped with the others or for the gang
            self.state.rank_failure = failure_before
        self.ranks = {}
        self.state.rank_pids = {}
        return returncode

    def _take_standby(self) -> subprocess.Popen[bytes] | None:
        """The warm standby, given the command, if one waits; None to start afresh."""
        waiting, self.standby = self.standby, None
        if waiting is None or self.order is None:
            return None
        if not waiting.alive():
            waiting.discard()
            return None
        return waiting.take(self.order)

    def _prepare_standby(self) -> None:
        """Start the standby of the next restart, unless there is one or none is wanted."""
        if self.order is None or self.standby is not None or self.terminating is not None:
            return
        try:
            self.standbys += 1
            self.standby = standby.Standby(self.standbys)
        except OSError:
            self.order = None  # no standby can start here: every restart starts afresh

    def discard_standby(self) -> None:
        """End the waiting standby, if any (supervision ends)."""
        waiting, self.standby = self.standby, None
        if waiting is not None:
            waiting.discard()

    def _rank_pids(self) -> dict[str, int]:
        return {str(rank): pid for rank, pid in sorted(self.ranks.items())}

    def _watch_ranks(self, launcher_pid: int) -> None:
        """Learn the launch's rank PIDs as the launcher starts them; publish them.

        The launcher ends every rank once one dies, so a rank seen gone alone is recorded at
        once as the first failure (with its wait status while it is a zombie), for the agent's
        first look; several seen gone at one poll are left to the launcher's own account,
        which replaces the early record when the launch ends.
        """
        found = launcher.find_ranks(launcher_pid)
        if any(self.ranks.get(rank) != pid for rank, pid in found.items()):
            self.ranks.update(found)
            self._set(STATE_RUNNING, rank_pids=self._rank_pids())
        if self._gone_seen:
            return
        gone = []
        for rank, pid in sorted(self.ranks.items()):
            ended, status = launcher.ended(pid)
            if ended and status != 0:  # a rank that finished (exit 0) is no failure
                gone.append(launcher.failure_of(rank, pid, status))
            self._gone_seen = self._gone_seen or ended
        if len(gone) == 1:
            self._first_gone = gone[0]
            self._set(STATE_RUNNING, rank_failure=self._first_gone.to_dict())

    def _failure(self, child_pid: int, record: Attempt) -> RankFailure:
        """The first failed rank of the launch that just ended (rank 0 = the child for one)."""
        if not self.multi:
            return RankFailure(0, child_pid, record.exit_code, record.signal)
        recorded = launcher.read_result(self.launch_result_file)
        if recorded is not None:
            return recorded
        if self._first_gone is not None:
            return self._first_gone
        # The launcher itself died (killed) before any rank: no rank is to blame.
        return RankFailure(0, self.ranks.get(0), record.exit_code, record.signal)

    def _kill_launch(self, launcher_pid: int) -> None:
        """SIGKILL the launcher's group and every rank's (each in a session of its own)."""
        kill_group(launcher_pid)
        for pid in list(self.ranks.values()):
            kill_group(pid)

    def _end_ranks(self) -> list[int]:
        """Make sure no rank of the ended launch is left; return those that were.

        Ranks the launcher did not end (it was killed, or it gave up on a rank that ignores
        SIGTERM) are killed with their process groups. Orphans come to this process (a child
        subreaper) and are reaped here; the wait is bounded, a rank in uninterruptible I/O
        may outlive it (the agent sees its memory held).
        """
        left = [pid for pid in self.ranks.values() if not launcher.ended(pid)[0]]
        left += [pid for pid in launcher.children(os.getpid()) if pid not in left]
        for pid in left:
            kill_group(pid)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + RANKS_GONE_WAIT_S
        while time.monotonic() < deadline:
            reap_orphans()
            if all(launcher.ended(pid)[0] for pid in left):
                break
            time.sleep(POLL_S / 2)
        return left

    def _read_order(self) -> int | None:
        """The newest generation `gang.json` ordered (None: none yet); re-read when it changed.

        A stat per call: the agent replaces the file atomically (a new inode) at each change.
        An order once read stands while the file is absent.
        """
        try:
            stat = self.gang_file.stat()
        except OSError:
            return self._order
        seen = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
        if seen != self._order_seen:
            self._order_seen = seen
            order = read_gang_order(self.gang_file)
            if order is not None:
                self._order = order
        return self._order

    def _follow_order(self, launcher_pid: int) -> None:
        """Follow a newer generation the gang ordered while the launch runs (module docstring).

        A supervisor's first order adopts the gang's generation without a restart (a member
        created after the gang restarted); a later one ends the launch at once, unless a rank of
        it is gone already (the launcher is ending it: its own failure, recorded as one). A
        terminating supervisor ignores orders.
        """
        if self.terminating is not None:
            return
        adopted = self._order is not None
        order = self._read_order()
        following = self.state.gang_generation or 0
        if order is None or order <= following:
            return
        if not adopted:
            self._set(STATE_RUNNING, gang_generation=order)
            return
        if self._gone_seen:
            # A rank of this launch is gone already: the launch is failing on its own (the
            # order is most likely about that very failure). Its end is this member's failure,
            # recorded as such, and its relaunch runs the next generation anyway.
            return
        self._ordered = order
        self._kill_launch(launcher_pid)
        self.state.last_gang_restart = {
            "generation": order,
            "from": following,
            "killed_at": time.time(),
        }
        self.state.write(self.state_file)

    def _answer_kill_request(self, pid: int) -> None:
        """Dump and kill the running child when the agent asks for it (module docstring)."""
        request = read_json(self.kill_request_file)
        if request is None or request.get("pid") not in (pid, *self.ranks.values()):
            return
        named = request["pid"]
        requested_at = request.get("requested_at")
        if requested_at == self._answered:
            return
        self._answered = requested_at if isinstance(requested_at, float | int) else None
        stacks = self.stacks_file(named) if self.stacks_file is not None else None
        before = _size(stacks)
        # Every rank dumps its stacks (a hang in a collective shows on all of them); the
        # launcher has no harness and is not signalled.
        for target in self.ranks.values() if self.multi else (pid,):
            with contextlib.suppress(ProcessLookupError):
                os.kill(target, signal.SIGUSR1)
                os.kill(target, signal.SIGCONT)  # a stopped process handles it once resumed
        deadline = time.monotonic() + STACK_WAIT_S
        while stacks is not None and time.monotonic() < deadline and _size(stacks) <= before:
            time.sleep(POLL_S)
        if stacks is not None and _size(stacks) > before:
            time.sleep(0.2)  # let the handler finish writing
        self._kill_launch(pid)
        self.state.last_kill = {
            "pid": named,
            "requested_at": requested_at,
            "killed_at": time.time(),
            "dumped": _size(stacks) > before,
            "reason": request.get("reason"),
        }
        self.state.write(self.state_file)

    def run(self) -> int:
        """Supervise until completion, termination or giving up; return the exit status."""
        try:
            return self._supervise()
        finally:
            self.discard_standby()

    def _supervise(self) -> int:
        for sig in FORWARDED_SIGNALS:
            signal.signal(sig, self._on_signal)
        if self.multi:
            become_subreaper()
        while True:
            self._first_gone, self._gone_seen, self._ordered = None, False, None
            returncode = self._run_once()
            if self.terminating is not None:
                self._set(STATE_TERMINATED, child_pid=None)
                return exit_status(returncode)
            if returncode == 0:
                self._set(STATE_COMPLETED, child_pid=None)
                return 0
            following = self.state.gang_generation
            if self._ordered is not None:
                # The gang restarts (not this member's failure): relaunch at once, on the
                # generation ordered, with no back-off and nothing counted against progress.
                self._next_generation = self._ordered
                self.state.restarts += 1
                self.state.failed_generation = following
                continue
            if following is not None:
                # The operator, told of this failure, orders the next generation: the relaunch
                # follows it already, so its order restarts nothing a second time.
                self._next_generation = following + 1
                self.state.failed_generation = following
            newest = newest_checkpoint(self.l1_dir)
            last = self.state.checkpoint_step
            progressed = newest is not None and (last is None or newest > last)
            counted = 0 if progressed else self.state.restarts_without_progress
            if counted >= self.state.max_restarts:
                self._set(STATE_GAVE_UP, child_pid=None, checkpoint_step=newest)
                return exit_status(returncode)
            ran = self.state.history[-1].ran()
            streak = 0 if ran >= self.backoff_reset else self.state.backoff_restarts
            delay = min(self.backoff_max, self.backoff * 2 ** min(streak, MAX_EXPONENT))
            self._set(
                STATE_BACKOFF,
                child_pid=None,
                restarts=self.state.restarts + 1,
                restarts_without_progress=counted + 1,
                backoff_restarts=streak + 1,
                checkpoint_step=newest,
            )
            self._wake.wait(delay)  # a forwarded signal cuts the backoff short
            if self.terminating is not None:
                self._set(STATE_TERMINATED)
                return 128 + self.terminating


def own_l0(environ: MutableMapping[str, str]) -> Path | None:
    """Give the children an L0 in memory when none is set: the directory made, or None.

    Sets `TRAINGUARD_L0_DIR` in `environ` (the children's environment) to a new private
    directory under `L0_SHM_DIR`; None, and `environ` untouched, where L0 is set already or
    there is no `/dev/shm`.
    """
    if environ.get(env.L0_DIR) or not L0_SHM_DIR.is_dir():
        return None
    remove_orphaned_l0(L0_SHM_DIR)
    try:
        made = Path(tempfile.mkdtemp(prefix=f"{L0_PREFIX}{os.getpid()}-", dir=L0_SHM_DIR))
    except OSError:
        return None
    environ[env.L0_DIR] = str(made)
    return made


def remove_orphaned_l0(root: Path) -> list[Path]:
    """Remove the private L0s under `root` whose supervisor is gone; return them.

    A supervisor killed with SIGKILL cannot remove its L0, and memory under `/dev/shm` outlives
    it until the machine restarts: the next supervisor removes those whose owner's process no
    longer exists (named `trainguard-l0-<pid>-...`). One whose process id lives on, as another
    process's after a reuse, is left: a directory kept is cheaper than one removed under a
    live trainer.
    """
    removed = []
    for path in root.glob(f"{L0_PREFIX}*-*"):
        owner = path.name.removeprefix(L0_PREFIX).split("-", 1)[0]
        if not owner.isdigit() or int(owner) == os.getpid():
            continue
        try:
            os.kill(int(owner), 0)
            continue  # alive, or another user's: not ours to judge
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def recovery_defaults(environ: dict[str, str]) -> tuple[int, float, float, float]:
    """(max restarts, first delay, longest delay, reset after) from the run's `spec.recovery`.

    The operator passes `spec.recovery` as JSON (`TRAINGUARD_RECOVERY`), so the restarts made
    in place wait the run's back-off, the same delays the operator keeps between attempts.
    Without it (run by hand), the command line's defaults apply.
    """
    pod = PodEnv.from_env(environ)
    if "recovery" not in pod.model_fields_set:
        return (
            DEFAULT_MAX_RESTARTS,
            DEFAULT_BACKOFF_S,
            DEFAULT_BACKOFF_MAX_S,
            DEFAULT_BACKOFF_RESET_S,
        )
    recovery = pod.recovery
    backoff = recovery.backoff
    return (
        recovery.max_restarts,
        float(backoff.initial_seconds),
        float(backoff.max_seconds),
        float(backoff.reset_after_seconds),
    )


def parse_args(argv: list[str], environ: dict[str, str] | None = None) -> argparse.Namespace:
    """The command line: options, `--`, then the command (defaults from `TRAINGUARD_RECOVERY`)."""
    try:
        environ = dict(os.environ) if environ is None else environ
        max_restarts, backoff, backoff_max, backoff_reset = recovery_defaults(environ)
        pod = PodEnv.from_env(environ)
        procs = pod.procs_per_node
        # A gang's member learns its place from the contract alone (`launcher.Gang`).
        gang = launcher.Gang.of(pod)
    except ContractError as err:  # it names the variable and its value
        print(f"trainguard supervise: {err}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE) from err
    parser = argparse.ArgumentParser(
        prog="trainguard supervise",
        description="Run a training command in its own session and restart it after a death.",
        usage="%(prog)s [options] -- command [args...]",
    )
    parser.add_argument(
        "--max-restarts",
        type=int,
        default=max_restarts,
        help="restarts in a row without a newer verified L1 checkpoint before giving up",
    )
    parser.add_argument("--backoff", type=float, default=backoff, help="first restart delay (s)")
    parser.add_argument("--backoff-max", type=float, default=backoff_max, help="longest delay (s)")
    parser.add_argument(
        "--backoff-reset",
        type=float,
        default=backoff_reset,
        help="a process that ran this long (s) before it died starts the delay over",
    )
    parser.add_argument(
        "--grace-period",
        type=float,
        default=30.0,
        help="seconds between forwarding SIGTERM/SIGINT and killing the process group",
    )
    parser.add_argument(
        "--state-file",
        type=Path,
        help=f"default: {SUPERVISOR_FILENAME} next to the heartbeat ({env.HEARTBEAT_FILE})",
    )
    parser.add_argument(
        "--gpu-file",
        type=Path,
        help=f"where to publish GPU readings each second (default: {env.GPU_FILE}, "
        f"else {GPU_FILENAME} in the state dir)",
    )
    parser.add_argument(
        "--procs-per-node",
        type=int,
        default=procs,
        help=f"ranks in this pod, started through torchrun if more than one ({env.PROCS_PER_NODE})",
    )
    parser.add_argument("--no-gpu", action="store_true", help="do not publish GPU readings")
    parser.add_argument(
        "--no-standby",
        action="store_true",
        help="start every restarted trainer afresh, without a warm standby interpreter",
    )
    parser.add_argument(
        "--standby-delay",
        type=float,
        default=STANDBY_DELAY_S,
        help="seconds after a trainer starts before the standby for its restart is started",
    )
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.command[:1] == ["--"]:
        args.command = args.command[1:]
    if not args.command:
        parser.error("no command given (put it after --)")
    if min(args.max_restarts, args.backoff, args.backoff_max, args.backoff_reset) < 0:
        parser.error("--max-restarts, --backoff, --backoff-max and --backoff-reset must be >= 0")
    if args.procs_per_node < 1:
        parser.error("--procs-per-node must be at least 1")
    if args.standby_delay < 0:
        parser.error("--standby-delay must be >= 0")
    args.gang = gang
    return args


def main(argv: list[str]) -> int:
    """`trainguard supervise` entry point."""
    try:
        args = parse_args(argv)
    except SystemExit as exit_:
        return exit_.code if isinstance(exit_.code, int) else EXIT_USAGE
    share_with_pod()  # inherited by the training command
    l0 = own_l0(os.environ)  # the children's environment
    try:
        return _supervise_command(args)
    finally:
        if l0 is not None:
            shutil.rmtree(l0, ignore_errors=True)


def _supervise_command(args: argparse.Namespace) -> int:
    """Supervise the command of `args` (with GPU readings unless turned off)."""
    settings = HarnessSettings.from_env()
    state_file = args.state_file or settings.supervisor_state_file
    supervisor = Supervisor(
        args.command,
        state_file,
        max_restarts=args.max_restarts,
        backoff=args.backoff,
        backoff_max=args.backoff_max,
        backoff_reset=args.backoff_reset,
        l1_dir=settings.l1_dir,
        grace_period=args.grace_period,
        stacks_file=settings.stacks_file,
        procs_per_node=args.procs_per_node,
        gang=args.gang,
        use_standby=not args.no_standby,
        standby_delay=args.standby_delay,
    )
    publisher = None
    if not args.no_gpu:
        gpu_file = args.gpu_file or PodEnv.from_env(os.environ).gpu
        publisher = GpuPublisher(gpu_file, supervisor.child_alive, live_count=supervisor.live_ranks)
        publisher.start()
    try:
        return supervisor.run()
    finally:
        if publisher is not None:
            publisher.stop()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
