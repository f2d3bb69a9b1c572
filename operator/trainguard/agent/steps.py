"""What the init steps `stage-data` and `preflight` share: reports, log lines, local-disk I/O.

Reports: `trainguard stage-data` keeps `staging.json` current while it runs (progress) and
leaves its outcome in it; `trainguard preflight` writes `preflight.json` (every check with its
figures). Both live in ``TRAINGUARD_STATE_DIR``; the agent, a native sidecar that runs beside
the init steps, reads them and carries them into the run's status. Every file written here is
replaced atomically (temporary name, fsync, rename), so a reader never sees half of one.

The final outcome of each step also goes to the container's termination message
(`write_termination_message`): the kubelet copies it into the pod's status
(``initContainerStatuses[].state.terminated.message``), where the operator reads it even when
the failed step has failed the pod and the agent had no time to report.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trainguard.api import env
from trainguard.ckpt.layout import fsync_path

STAGING_FILENAME = "staging.json"
PREFLIGHT_FILENAME = "preflight.json"
_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")
# Kubernetes' default terminationMessagePath; the kubelet creates the file in every container
# and keeps at most 4 KiB of it.
TERMINATION_LOG = "/dev/termination-log"
TERMINATION_LIMIT = 4096
# Another file for the termination message, for runtimes without a per-container
# /dev/termination-log (the process-backed dev nodes, tests); never set in a real pod.
TERMINATION_LOG_ENV = "TRAINGUARD_TERMINATION_LOG"


def state_dir(environ: Mapping[str, str]) -> Path:
    """The shared state directory from the env contract, created if needed.

    ValueError, naming the directory, when it cannot be written: the state volume is not
    mounted into this step.
    """
    path = Path(environ.get(env.STATE_DIR, env.DEFAULT_STATE_DIR))
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ValueError(
            f"cannot write reports to {path} ({err}): mount the state volume into this step"
        ) from err
    return path


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
    fsync_path(path.parent)


def write_json(path: Path, data: Mapping[str, Any]) -> None:
    """Atomically replace `path` with `data` as indented JSON."""
    write_atomic(path, (json.dumps(data, indent=1, sort_keys=True) + "\n").encode())


def write_termination_message(data: Mapping[str, Any], environ: Mapping[str, str]) -> None:
    """Leave `data` (compact JSON, kept under 4 KiB by the caller) as the termination message.

    Only where the file exists: the kubelet creates it (the runtime named by
    TERMINATION_LOG_ENV does too); outside a container nothing is written.
    """
    target = Path(environ.get(TERMINATION_LOG_ENV) or TERMINATION_LOG)
    text = json.dumps(data, separators=(",", ":"), sort_keys=True)
    if len(text.encode()) > TERMINATION_LIMIT:
        raise ValueError(f"termination message of {len(text)} bytes exceeds {TERMINATION_LIMIT}")
    if target.exists():
        target.write_text(text)


def drop_page_cache(fd: int) -> bool:
    """Ask the kernel to forget a file's cached pages, so the next read comes from the disk.

    Only clean pages go, so call it after fsync. False where the hint is not available; on
    tmpfs it is accepted but has no effect (the pages are the storage).
    """
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    except (AttributeError, OSError):
        return False
    return True


def log(step: str, message: str) -> None:
    """One line to the step's log (stdout, which `kubectl logs` shows), with a wall-clock time."""
    print(f"{time.strftime('%H:%M:%S')} trainguard {step}: {message}", flush=True)


def human_bytes(count: float) -> str:
    """A byte count for a log line: 1.5 GiB, 340.0 MiB, 12 B."""
    value, unit = float(count), 0
    while abs(value) >= 1024 and unit < len(_UNITS) - 1:
        value /= 1024
        unit += 1
    return f"{value:.0f} B" if unit == 0 else f"{value:.1f} {_UNITS[unit]}"
