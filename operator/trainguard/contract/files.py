"""The shared state directory of a training pod: every file's name, its writer and its reader.

The state volume (an in-memory emptyDir, `PodEnv.state_dir`) is mounted into every container
of the pod. What each file is, who writes it and who reads it:

| file | written by | read by |
|---|---|---|
| `heartbeat.json` | the harness (`trainguard_harness.heartbeat`) | the agent (`agent.signals`) |
| `heartbeat-<local rank>.json` | each rank of a multi-rank pod | the agent (`agent.signals`) |
| `gpu.json` | the supervisor (`trainguard.gpu.publish`) | the agent (`gpu.read_published`) |
| `supervisor.json` (next to the heartbeat) | the supervisor | the agent (`read_supervised_child`) |
| `kill-request.json` (next to the heartbeat) | the agent, for a hung trainer | the supervisor |
| `gang.json` (next to the heartbeat) | the agent, from its Lease | a gang member's supervisor |
| `launch.json` (next to the heartbeat) | the rank launcher, when a rank failed | the supervisor |
| `stacks-<pid>.txt` | the harness, on SIGUSR1 (faulthandler) | the agent, for the hang Event |
| `preflight.json` | `trainguard preflight` | the agent (`trainguard.contract.reports`) |
| `staging.json` | `trainguard stage-data` | the agent (`trainguard.contract.reports`) |
| `restore.json` | `trainguard restore`; the harness (a resume from L0) | the agent |

In a pod of several ranks (`PodEnv.procs_per_node` > 1) every rank writes its own heartbeat,
`heartbeat-<local rank>.json`, and local rank 0 also writes `heartbeat.json`, so a reader of the
one heartbeat (an older agent, `trainguard status`, a script) keeps working. The supervisor
publishes the ranks' PIDs (`rank_pids`, the worker processes, not the launcher) and the first
rank failure of the last launch (`rank_failure`) in `supervisor.json`; `read_rank_pids` and
`read_rank_failure` are their readers. In a one-rank pod `rank_pids` is `{"0": child_pid}`.

A gang's restart generation (`gang.json`, `GangOrder`) is the operator's: it writes the
generation every member must run on each member's Lease, the agent copies it here at each
renewal, and a member's supervisor restarts its ranks at once when its launch follows an older
one (`trainguard_harness.supervisor`). The supervisor publishes the generation its launch
follows (`gang_generation`) and the one of its last failed launch (`failed_generation`), which
the agent carries back on the Lease (`read_gang_generations`).

The heartbeat also carries the invalid checkpoints the harness found, and `restore.json` those
the restore step found (`trainguard.contract.findings`).

Paths come from `PodEnv` (`heartbeat`, `gpu`, `supervisor_file`, `kill_request_file`, `stacks_file`,
`report_file`); the names are defined here and nowhere else. Every writer replaces its file
atomically (`write_atomic`), so a reader never sees half of one and `read_json` returns None
only while a file does not exist yet or is not JSON.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from trainguard.contract.findings import Finding, read_findings

HEARTBEAT_FILENAME = "heartbeat.json"
GPU_FILENAME = "gpu.json"
SUPERVISOR_FILENAME = "supervisor.json"
KILL_REQUEST_FILENAME = "kill-request.json"
GANG_FILENAME = "gang.json"
RANK_HEARTBEAT_FILENAME_PATTERN = "heartbeat-{rank}.json"
LAUNCH_RESULT_FILENAME = "launch.json"
STACKS_FILENAME_PATTERN = "stacks-{pid}.txt"
PREFLIGHT_FILENAME = "preflight.json"
STAGING_FILENAME = "staging.json"
RESTORE_FILENAME = "restore.json"
# The harness writes a heartbeat at most this often (a changed record within it): how late a
# reader may see the loop's last report.
HEARTBEAT_INTERVAL_S = 1.0
# Fields of `supervisor.json` its readers use: the state, and the PID of the process it runs
# (set only while the state is running).
SUPERVISOR_STATE = "state"
SUPERVISOR_RUNNING = "running"
SUPERVISOR_CHILD_PID = "child_pid"
# The ranks the supervisor runs now, local rank (a string, as JSON keys are) -> PID; and the
# first rank failure of the current or last launch (`RankFailure`, its fields below).
SUPERVISOR_RANK_PIDS = "rank_pids"
SUPERVISOR_RANK_FAILURE = "rank_failure"
# The gang restart generation the running launch follows, and the one of the last launch that
# failed (a gang member's; absent in a one-pod run).
SUPERVISOR_GANG_GENERATION = "gang_generation"
SUPERVISOR_FAILED_GENERATION = "failed_generation"
# `gang.json`'s field: the generation the operator orders.
GANG_GENERATION = "generation"
RANK_FAILURE_RANK = "rank"
RANK_FAILURE_PID = "pid"
RANK_FAILURE_EXIT_CODE = "exit_code"
RANK_FAILURE_SIGNAL = "signal"
# The trainer's output, in the logs volume (not the state volume): `PodEnv.log_file`.
LOG_FILENAME = "trainer.log"
STATE_FILENAMES = (
    HEARTBEAT_FILENAME,
    GPU_FILENAME,
    SUPERVISOR_FILENAME,
    KILL_REQUEST_FILENAME,
    GANG_FILENAME,
    LAUNCH_RESULT_FILENAME,
    PREFLIGHT_FILENAME,
    STAGING_FILENAME,
    RESTORE_FILENAME,
)


# The pod's programs create files and directories group-writable: the containers run as
# different users sharing the pod's `fsGroup`, and one must be able to replace or prune what
# another wrote (the trainer prunes checkpoints the restore step wrote).
SHARED_UMASK = 0o002


def share_with_pod() -> None:
    """Make what this process creates writable by the pod's group (`SHARED_UMASK`).

    Called first by every program that runs in a training pod (agent, init steps, supervisor,
    reference trainer); the supervisor's umask is inherited by the training command.
    """
    os.umask(SHARED_UMASK)


def write_atomic(path: Path, data: bytes) -> None:
    """Replace `path` with `data`: written under a temporary name, fsynced, renamed, dir fsynced."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    directory = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def write_json(path: Path, data: Mapping[str, Any]) -> None:
    """Atomically replace `path` with `data` as indented JSON."""
    write_atomic(path, (json.dumps(data, indent=1, sort_keys=True) + "\n").encode())


def read_json(path: Path) -> dict[str, Any] | None:
    """A state file's JSON object, or None when it is absent (not written yet) or not one."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def read_supervised_child(path: Path) -> int | None:
    """The PID of the process the supervisor runs now (`supervisor.json`), or None.

    None while it runs none (between a death and the restart, after it gave up or finished)
    and where no supervisor writes the file.
    """
    data = read_json(path)
    if data is None or data.get(SUPERVISOR_STATE) != SUPERVISOR_RUNNING:
        return None
    child = data.get(SUPERVISOR_CHILD_PID)
    return child if isinstance(child, int) else None


def read_rank_pids(path: Path) -> dict[int, int]:
    """The ranks the supervisor runs now (`supervisor.json`): local rank -> PID; {} for none.

    Empty while it runs none (between a death and the restart, before the launcher has started
    them) and where no supervisor writes the file.
    """
    data = read_json(path)
    if data is None or data.get(SUPERVISOR_STATE) != SUPERVISOR_RUNNING:
        return {}
    pids = data.get(SUPERVISOR_RANK_PIDS)
    if not isinstance(pids, dict):
        return {}
    ranks: dict[int, int] = {}
    for rank, pid in pids.items():
        if isinstance(rank, str) and rank.isdigit() and isinstance(pid, int) and pid > 0:
            ranks[int(rank)] = pid
    return ranks


def write_gang_order(path: Path, generation: int) -> None:
    """Write `gang.json`: the restart generation every member of the gang must run."""
    write_json(path, {GANG_GENERATION: generation})


def read_gang_order(path: Path) -> int | None:
    """The generation `gang.json` orders; None before the agent wrote one (or not one)."""
    data = read_json(path)
    value = None if data is None else data.get(GANG_GENERATION)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def read_gang_generations(path: Path) -> tuple[int | None, int | None]:
    """A gang member's generations from `supervisor.json`: (running launch's, last failed one's).

    None for each it does not say (no supervisor, a one-pod run).
    """
    data = read_json(path) or {}

    def generation(key: str) -> int | None:
        value = data.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    return generation(SUPERVISOR_GANG_GENERATION), generation(SUPERVISOR_FAILED_GENERATION)


@dataclass(frozen=True)
class RankFailure:
    """The first rank that failed in a launch: its local rank, PID and how it ended.

    `exit_code` for an exit, `signal` (its name, e.g. SIGKILL) for a death by a signal; both
    None when only the absence was seen.
    """

    rank: int
    pid: int | None
    exit_code: int | None = None
    signal: str | None = None

    def how(self) -> str:
        """How it ended, in words."""
        if self.signal is not None:
            return f"killed by {self.signal}"
        if self.exit_code is not None:
            return f"exited with {self.exit_code}"
        return "gone"

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (`supervisor.json`'s `rank_failure`)."""
        return {
            RANK_FAILURE_RANK: self.rank,
            RANK_FAILURE_PID: self.pid,
            RANK_FAILURE_EXIT_CODE: self.exit_code,
            RANK_FAILURE_SIGNAL: self.signal,
        }

    @classmethod
    def from_dict(cls, data: Any) -> RankFailure | None:
        """Parse the JSON form; None when it is not one."""
        if not isinstance(data, dict):
            return None
        rank, pid = data.get(RANK_FAILURE_RANK), data.get(RANK_FAILURE_PID)
        code, sig = data.get(RANK_FAILURE_EXIT_CODE), data.get(RANK_FAILURE_SIGNAL)
        if not isinstance(rank, int) or rank < 0:
            return None
        return cls(
            rank=rank,
            pid=pid if isinstance(pid, int) else None,
            exit_code=code if isinstance(code, int) else None,
            signal=sig if isinstance(sig, str) else None,
        )


def read_rank_failure(path: Path) -> RankFailure | None:
    """The first rank failure of the supervisor's current or last launch, or None."""
    data = read_json(path)
    return None if data is None else RankFailure.from_dict(data.get(SUPERVISOR_RANK_FAILURE))


@dataclass(frozen=True)
class RestoreReport:
    """What `trainguard restore` did: the step it brought into L1, from which layer and attempt.

    `skipped`: what it could not use, one line each (invalid checkpoints, layers it could not
    list or fetch from); `findings`: the invalid checkpoints among them, one record each.
    `fenced`: the checkpoints it ignored because a superseded attempt shipped them after its
    fence (`trainguard.layers.lineage`), one line each.

    The trainer harness writes one too when a trainer resumes from another checkpoint than
    the one reported (from L0, or a newer L1 one after a restart in place), with `time` (wall
    clock seconds): each resume is a record of its own, even from the same step.
    """

    step: int | None
    from_layer: str | None
    skipped: tuple[str, ...] = ()
    origin: str | None = None
    fenced: tuple[str, ...] = ()
    findings: tuple[Finding, ...] = ()
    time: float | None = None

    def line(self) -> str:
        """A one-line account for the agent's log and the run's Events."""
        if self.step is None:
            return "no checkpoint to restore: started fresh"
        origin = f" ({self.origin})" if self.origin else ""
        return f"restored step {self.step} from layer {self.from_layer}{origin}"

    def summary(self) -> dict[str, Any]:
        """The Lease's compact form (`trainguard.dev/restored`): step, layer, time, message."""
        data = {"step": self.step, "layer": self.from_layer, "time": self.time}
        return {**{k: v for k, v in data.items() if v is not None}, "message": self.line()}


def write_restore_report(path: Path, report: RestoreReport) -> None:
    """Leave the restore step's report in the state directory."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = asdict(report)
    data["findings"] = [finding.to_dict() for finding in report.findings]
    write_json(path, data)


def read_restore_report(path: Path) -> RestoreReport | None:
    """The restore step's report, or None when the step did not run (or left nothing)."""
    data = read_json(path)
    if data is None:
        return None
    step = data.get("step")
    layer = data.get("from_layer")
    origin = data.get("origin")
    at = data.get("time")
    return RestoreReport(
        step=step if isinstance(step, int) else None,
        from_layer=str(layer) if layer else None,
        skipped=tuple(str(line) for line in data.get("skipped") or ()),
        origin=str(origin) if origin else None,
        fenced=tuple(str(line) for line in data.get("fenced") or ()),
        findings=read_findings(data.get("findings")),
        time=float(at) if isinstance(at, int | float) else None,
    )
