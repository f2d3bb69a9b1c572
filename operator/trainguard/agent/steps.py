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

Summaries: `preflight_summary` and `staging_summary` cut a report down to the figures the
run's status shows (``status.preflight``, ``status.staging``; the keys are the status's
field names). The agent carries them in the run's Lease annotations (a few hundred bytes
each), and they are the steps' termination messages, so the operator reads one format from
both places.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trainguard.api import constants, env
from trainguard.ckpt.layout import fsync_path

STAGING_FILENAME = "staging.json"
PREFLIGHT_FILENAME = "preflight.json"
_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")
# Characters of a message kept in a summary: the Lease's annotations stay under 1 KiB.
SUMMARY_MESSAGE_LIMIT = 240
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


def _attempt(value: object) -> int | None:
    text = str(value or "")
    return int(text) if text.isdigit() and int(text) > 0 else None


def _cut(text: object, limit: int) -> str:
    line = " ".join(str(text or "").split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _drop_none(data: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in data.items() if value is not None}


def preflight_summary(
    report: Mapping[str, Any], message_limit: int = SUMMARY_MESSAGE_LIMIT
) -> dict[str, Any]:
    """The figures of a preflight.json report that the run's status shows (`status.preflight`).

    Bandwidth: the slowest write and read of the storage targets' test files; space: the
    filesystem with the least room beyond its need; the GPU check's result and memory. The
    message is cut to `message_limit` characters (a termination message has room for more).
    """
    checks = list(report.get("checks") or [])
    figures = [c.get("figures") or {} for c in checks]
    rates = [f for f in figures if "write_mb_per_s" in f and "read_mb_per_s" in f]
    spaces = [f for f in figures if "free_bytes" in f and "need_bytes" in f]
    tightest = min(spaces, key=lambda f: f["free_bytes"] - f["need_bytes"], default=None)
    gpu = next((c for c in checks if c.get("check") == "gpu"), None)
    gpu_figures = (gpu or {}).get("figures") or {}
    return _drop_none(
        {
            "attempt": _attempt(report.get("attempt")),
            "node": report.get("node") or None,
            "passed": bool(report.get("ok")),
            "failure": report.get("failure"),
            "writeMbps": min((f["write_mb_per_s"] for f in rates), default=None),
            "readMbps": min((f["read_mb_per_s"] for f in rates), default=None),
            "freeBytes": None if tightest is None else tightest["free_bytes"],
            "needBytes": None if tightest is None else tightest["need_bytes"],
            "gpu": None if gpu is None else gpu.get("status"),
            "gpuUsedMib": gpu_figures.get("used_mib"),
            "gpuTotalMib": gpu_figures.get("total_mib"),
            "message": _cut(report.get("message"), message_limit),
        }
    )


def staging_summary(snapshot: Mapping[str, Any], attempt: object) -> dict[str, Any]:
    """The progress of a staging.json snapshot that the run's status shows (`status.staging`)."""
    return _drop_none(
        {
            "attempt": _attempt(attempt),
            "phase": snapshot.get("phase"),
            "filesDone": snapshot.get("files_done"),
            "filesTotal": snapshot.get("files_total"),
            "bytesDone": snapshot.get("bytes_done"),
            "bytesTotal": snapshot.get("bytes_total"),
            "bytesPerSecond": snapshot.get("bytes_per_second"),
            "etaSeconds": snapshot.get("eta_seconds"),
            "copied": snapshot.get("copied"),
            "recopies": snapshot.get("recopies"),
            "message": _cut(snapshot["error"], SUMMARY_MESSAGE_LIMIT)
            if snapshot.get("error")
            else None,
        }
    )


def _read_report(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None  # not written yet
    return data if isinstance(data, dict) else None


def _compact(data: Mapping[str, Any]) -> str:
    return json.dumps(data, separators=(",", ":"), sort_keys=True)


def lease_annotations(state: Path, attempt: object) -> dict[str, str]:
    """The steps' summaries, from their reports in `state`, as the agent's Lease annotations.

    Read on every renewal, so staging progress reaches the status while staging runs; a step
    that has not reported yet is left out.
    """
    result = {}
    preflight = _read_report(state / PREFLIGHT_FILENAME)
    if preflight is not None:
        result[constants.ANNOTATION_PREFLIGHT] = _compact(preflight_summary(preflight))
    staging = _read_report(state / STAGING_FILENAME)
    if staging is not None:
        result[constants.ANNOTATION_STAGING] = _compact(staging_summary(staging, attempt))
    return result
