"""The init steps' reports in the state directory, and the summaries the run's status shows.

Reports: `trainguard stage-data` keeps `staging.json` current while it runs (progress) and
leaves its outcome in it; `trainguard preflight` writes `preflight.json` (every check with its
figures). Both live in the state directory (`trainguard.contract.files`); the agent, a native
sidecar that runs beside the init steps, reads them and carries them into the run's status.

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
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trainguard.api import constants
from trainguard.contract import env
from trainguard.contract.files import PREFLIGHT_FILENAME, STAGING_FILENAME, read_json

# Characters of a message kept in a summary: the Lease's annotations stay under 1 KiB.
SUMMARY_MESSAGE_LIMIT = 240
# Kubernetes' default terminationMessagePath; the kubelet creates the file in every container
# and keeps at most 4 KiB of it.
TERMINATION_LOG = "/dev/termination-log"
TERMINATION_LIMIT = 4096


def ensure_state_dir(path: Path) -> Path:
    """The shared state directory (`PodEnv.state_dir`), created if needed.

    ValueError, naming the directory, when it cannot be written: the state volume is not
    mounted into this step.
    """
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ValueError(
            f"cannot write reports to {path} ({err}): mount the state volume into this step"
        ) from err
    return path


def write_termination_message(data: Mapping[str, Any], environ: Mapping[str, str]) -> None:
    """Leave `data` (compact JSON, kept under 4 KiB by the caller) as the termination message.

    Only where the file exists: the kubelet creates it (so does a runtime that names another
    file in `env.TERMINATION_LOG`); outside a container nothing is written.
    """
    target = Path(environ.get(env.TERMINATION_LOG) or TERMINATION_LOG)
    text = json.dumps(data, separators=(",", ":"), sort_keys=True)
    if len(text.encode()) > TERMINATION_LIMIT:
        raise ValueError(f"termination message of {len(text)} bytes exceeds {TERMINATION_LIMIT}")
    if target.exists():
        target.write_text(text)


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


def _compact(data: Mapping[str, Any]) -> str:
    return json.dumps(data, separators=(",", ":"), sort_keys=True)


def lease_annotations(state: Path, attempt: object) -> dict[str, str]:
    """The steps' summaries, from their reports in `state`, as the agent's Lease annotations.

    Read on every renewal, so staging progress reaches the status while staging runs; a step
    that has not reported yet is left out.
    """
    result = {}
    preflight = read_json(state / PREFLIGHT_FILENAME)
    if preflight is not None:
        result[constants.ANNOTATION_PREFLIGHT] = _compact(preflight_summary(preflight))
    staging = read_json(state / STAGING_FILENAME)
    if staging is not None:
        result[constants.ANNOTATION_STAGING] = _compact(staging_summary(staging, attempt))
    return result
