"""Stop a hung trainer: its stacks first, then the kill, and say only what really happened.

The agent and the trainer run in different containers and, on a real node, as different users:
signals between two non-root users fail with EPERM. So the agent asks the one process that may
signal the trainer, the supervisor (`trainguard supervise`, the trainer's parent in the
trainer's container): it writes a kill request naming the trainer's PID on the shared state
volume; the supervisor sends SIGUSR1 (the harness's faulthandler writes the stacks), waits for
the dump, kills the trainer's process group and records the kill in its state file. The agent
counts the trainer killed only once that record names the PID.

Where no supervisor runs that trainer (a command started without `trainguard supervise`), the
agent signals it itself, which works only when it may (same user, or CAP_KILL). Either way, a
kill that did not happen is reported as not done, with the reason, and is tried again later.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from trainguard.contract.env import PodEnv
from trainguard.contract.files import read_json, read_supervised_child, write_json

STACK_WAIT_S = 3.0
STACK_READ_BYTES = 4096
# How long the supervisor may take to answer a kill request: the dump wait plus its polling.
KILL_CONFIRM_S = STACK_WAIT_S + 5.0
POLL_S = 0.05


@dataclass(frozen=True)
class StopResult:
    """What stopping a hung trainer did."""

    dump: str
    killed: bool
    how: str  # who killed it, or why it was not killed


def supervised_child(pod: PodEnv) -> int | None:
    """The PID of the trainer the supervisor runs now, or None when none runs or no supervisor."""
    return read_supervised_child(pod.supervisor_file)


def _kill_recorded(pod: PodEnv, pid: int) -> bool:
    data = read_json(pod.supervisor_file)
    last = None if data is None else data.get("last_kill")
    return isinstance(last, dict) and last.get("pid") == pid


def _read_new(stacks: Path, before: int) -> str:
    try:
        with stacks.open("rb") as handle:
            handle.seek(before)
            return handle.read(STACK_READ_BYTES).decode(errors="replace")
    except OSError:
        return ""


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _wait_for_dump(stacks: Path, before: int, deadline: float) -> str:
    while time.monotonic() < deadline:
        if _size(stacks) > before:
            time.sleep(0.2)  # let the handler finish writing
            return _read_new(stacks, before)
        time.sleep(POLL_S)
    return ""


def _through_supervisor(pod: PodEnv, pid: int, reason: str) -> StopResult:
    stacks = pod.stacks_file(pid)
    before = _size(stacks)
    request = {"pid": pid, "reason": reason, "requested_at": time.time()}
    write_json(pod.kill_request_file, request)
    deadline = time.monotonic() + KILL_CONFIRM_S
    while time.monotonic() < deadline and not _kill_recorded(pod, pid):
        time.sleep(POLL_S)
    dump = _read_new(stacks, before) if _size(stacks) > before else ""
    if _kill_recorded(pod, pid):
        return StopResult(dump, True, "killed by the supervisor")
    return StopResult(
        dump, False, f"the supervisor did not record a kill of pid {pid} in {KILL_CONFIRM_S:.0f} s"
    )


def _by_signal(pod: PodEnv, pid: int) -> StopResult:
    stacks = pod.stacks_file(pid)
    before = _size(stacks)
    try:
        os.kill(pid, signal.SIGUSR1)
        os.kill(pid, signal.SIGCONT)  # a stopped process handles the signal only once resumed
        dump = _wait_for_dump(stacks, before, time.monotonic() + STACK_WAIT_S)
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return StopResult(_read_new(stacks, before), True, "already gone")
    except PermissionError:
        return StopResult(
            "",
            False,
            f"no supervisor runs pid {pid} and this agent may not signal it "
            "(another user); start the command under `trainguard supervise`",
        )
    return StopResult(dump, True, "killed by the agent")


def stop_hung(pod: PodEnv, pid: int, reason: str) -> StopResult:
    """Dump the stacks of hung trainer `pid` and kill it (see the module docstring)."""
    if supervised_child(pod) == pid:
        return _through_supervisor(pod, pid, reason)
    return _by_signal(pod, pid)
