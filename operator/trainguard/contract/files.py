"""The shared state directory of a training pod: every file's name, its writer and its reader.

The state volume (an in-memory emptyDir, `PodEnv.state_dir`) is mounted into every container
of the pod. What each file is, who writes it and who reads it:

| file | written by | read by |
|---|---|---|
| `heartbeat.json` | the harness (`trainguard_harness.heartbeat`) | the agent (`agent.signals`) |
| `gpu.json` | the supervisor (`trainguard.gpu.publish`) | the agent (`gpu.read_published`) |
| `supervisor.json` (next to the heartbeat) | the supervisor | the agent (`read_supervised_child`) |
| `kill-request.json` (next to the heartbeat) | the agent, for a hung trainer | the supervisor |
| `stacks-<pid>.txt` | the harness, on SIGUSR1 (faulthandler) | the agent, for the hang Event |
| `preflight.json` | `trainguard preflight` | the agent (`trainguard.contract.reports`) |
| `staging.json` | `trainguard stage-data` | the agent (`trainguard.contract.reports`) |
| `restore.json` | `trainguard restore` | the agent (`read_restore_report`) |

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
STACKS_FILENAME_PATTERN = "stacks-{pid}.txt"
PREFLIGHT_FILENAME = "preflight.json"
STAGING_FILENAME = "staging.json"
RESTORE_FILENAME = "restore.json"
# Fields of `supervisor.json` its readers use: the state, and the PID of the process it runs
# (set only while the state is running).
SUPERVISOR_STATE = "state"
SUPERVISOR_RUNNING = "running"
SUPERVISOR_CHILD_PID = "child_pid"
# The trainer's output, in the logs volume (not the state volume): `PodEnv.log_file`.
LOG_FILENAME = "trainer.log"
STATE_FILENAMES = (
    HEARTBEAT_FILENAME,
    GPU_FILENAME,
    SUPERVISOR_FILENAME,
    KILL_REQUEST_FILENAME,
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


@dataclass(frozen=True)
class RestoreReport:
    """What `trainguard restore` did: the step it brought into L1, from which layer and attempt.

    `skipped`: what it could not use, one line each (invalid checkpoints, layers it could not
    list or fetch from); `findings`: the invalid checkpoints among them, one record each.
    `fenced`: the checkpoints it ignored because a superseded attempt shipped them after its
    fence (`trainguard.layers.lineage`), one line each.
    """

    step: int | None
    from_layer: str | None
    skipped: tuple[str, ...] = ()
    origin: str | None = None
    fenced: tuple[str, ...] = ()
    findings: tuple[Finding, ...] = ()

    def line(self) -> str:
        """A one-line account for the agent's log and the run's Events."""
        if self.step is None:
            return "no checkpoint to restore: started fresh"
        origin = f" ({self.origin})" if self.origin else ""
        return f"restored step {self.step} from layer {self.from_layer}{origin}"


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
    return RestoreReport(
        step=step if isinstance(step, int) else None,
        from_layer=str(layer) if layer else None,
        skipped=tuple(str(line) for line in data.get("skipped") or ()),
        origin=str(origin) if origin else None,
        fenced=tuple(str(line) for line in data.get("fenced") or ()),
        findings=read_findings(data.get("findings")),
    )
