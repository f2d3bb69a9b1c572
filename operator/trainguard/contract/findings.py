"""Invalid checkpoints found in a pod: one record per finding, and the Lease's summary of them.

Every checkpoint a pod finds invalid is skipped (never restored from) and kept for inspection;
it is also told, so that storage that corrupts checkpoints does not go unnoticed. Three checks
find them (`FoundBy`), and each hands its findings to the agent its own way:

- `Restore`: `trainguard restore`, in L1 and in each remote checkpoint it tries (newest first,
  until one verifies and fetches); handed over in `restore.json` (`RestoreReport.findings`);
- `Shipping`: the agent's shipper, in an L1 checkpoint before its upload, in a remote copy
  after it, and in a remote checkpoint its keep-N finds invalid; in the agent's memory;
- `Scan`: the trainer harness, in a checkpoint it skips when it resumes, one keep-last-N finds
  invalid, one a save of the same step moves aside (`.invalid-step-...`); in the heartbeat
  (`invalid_checkpoints`, its newest `MAX_HEARTBEAT_FINDINGS`).

A finding names the layer (`l1` or a remote layer), the step, the file within the checkpoint
(None when the checkpoint as a whole is wrong, e.g. its manifest missing) and the reason. The
agent tells each finding once (the same layer, step, file and reason found again, by any
check, is the same finding), as a Warning Event `InvalidCheckpoint`, and carries a summary in
the Lease annotation `trainguard.dev/invalid-checkpoints`: how many findings it told per layer,
and the last one, in the fields of `status.lastInvalidCheckpoint`:

    {"counts":{"backup":1},"last":{"layer":"backup","step":142,"file":"optimizer.safetensors",
     "reason":"xxh3-128 hash mismatch","found":"Restore","time":"2026-12-04T10:00:00Z"}}

Bounded by construction: a file and a reason are cut to `MAX_TEXT` characters, and a pod has
at most `1 + MAX_REMOTE_LAYERS` layers of 63-character names.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from trainguard.api.constants import FoundBy

# Characters of a finding's file and reason kept (the Lease summary and Events stay small).
MAX_TEXT = 160
ELLIPSIS = "..."
# The heartbeat's field of the harness's findings, and how many it keeps (the newest).
HEARTBEAT_FIELD = "invalid_checkpoints"
MAX_HEARTBEAT_FINDINGS = 8
RFC3339 = "%Y-%m-%dT%H:%M:%SZ"
# Who found it, in a sentence.
FINDERS = {
    FoundBy.RESTORE: "the restore step",
    FoundBy.SHIPPING: "the shipper",
    FoundBy.SCAN: "the trainer's L1 scan",
}


def _cut(text: object) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= MAX_TEXT else line[: MAX_TEXT - len(ELLIPSIS)] + ELLIPSIS


@dataclass(frozen=True)
class Finding:
    """One checkpoint found invalid: where, what is wrong, which check found it and when.

    `time` is wall-clock seconds since the epoch.
    """

    layer: str
    step: int | None
    file: str | None
    reason: str
    found: FoundBy
    time: float

    @classmethod
    def of(
        cls,
        layer: str,
        step: int | None,
        problems: Sequence[tuple[str | None, str]],
        found: FoundBy,
        at: float | None = None,
    ) -> Finding:
        """The finding of one checkpoint from its problems (file or None, reason).

        The first problem names the file and the reason; the others are counted in the reason.
        """
        file, reason = problems[0] if problems else (None, "does not verify")
        if len(problems) > 1:
            reason = f"{reason} (and {len(problems) - 1} more problems)"
        return cls(
            layer=layer,
            step=step,
            file=None if file is None else _cut(file),
            reason=_cut(reason),
            found=found,
            time=time.time() if at is None else at,
        )

    @property
    def key(self) -> tuple[str, int | None, str | None, str]:
        """What makes two findings the same, whichever check found them and when."""
        return self.layer, self.step, self.file, self.reason

    def line(self) -> str:
        """One line naming the layer, the step, the file and the reason."""
        step = "?" if self.step is None else self.step
        where = "" if self.file is None else f", {self.file}"
        finder = FINDERS[self.found]
        return f"layer {self.layer}, step {step}{where}: {self.reason} (found by {finder})"

    def to_dict(self) -> dict[str, Any]:
        """The finding as JSON-ready data (restore.json, the heartbeat)."""
        return {
            "layer": self.layer,
            "step": self.step,
            "file": self.file,
            "reason": self.reason,
            "found": self.found.value,
            "time": self.time,
        }

    @classmethod
    def from_dict(cls, data: object) -> Finding | None:
        """A finding as `to_dict` wrote it; None when it is not one."""
        if not isinstance(data, Mapping):
            return None
        layer, step, file = data.get("layer"), data.get("step"), data.get("file")
        reason, found, at = data.get("reason"), data.get("found"), data.get("time")
        if not layer or not reason or found not in set(FoundBy):
            return None
        return cls(
            layer=str(layer),
            step=step if isinstance(step, int) else None,
            file=_cut(file) if file else None,
            reason=_cut(reason),
            found=FoundBy(found),
            time=float(at) if isinstance(at, int | float) else 0.0,
        )

    def status_fields(self) -> dict[str, Any]:
        """The finding in the fields of `status.lastInvalidCheckpoint` (camelCase, RFC 3339)."""
        fields: dict[str, Any] = {
            "layer": self.layer,
            "step": self.step,
            "file": self.file,
            "reason": self.reason,
            "found": self.found.value,
            "time": datetime.fromtimestamp(self.time, UTC).strftime(RFC3339),
        }
        return {key: value for key, value in fields.items() if value is not None}


def read_findings(data: object) -> tuple[Finding, ...]:
    """The findings of a JSON list (restore.json, the heartbeat); entries that are not, left out."""
    if not isinstance(data, list):
        return ()
    found = (Finding.from_dict(item) for item in data)
    return tuple(finding for finding in found if finding is not None)


def newest(findings: Iterable[Finding], finding: Finding, limit: int) -> list[Finding]:
    """`findings` with `finding` added unless the same one is there, the newest `limit` kept."""
    kept = [f for f in findings if f.key != finding.key]
    return [*kept, finding][-limit:]


def lease_summary(counts: Mapping[str, int], last: Finding | None) -> str:
    """The Lease annotation: findings told per layer, and the last one (module docstring)."""
    data: dict[str, Any] = {"counts": dict(sorted(counts.items()))}
    if last is not None:
        data["last"] = last.status_fields()
    return json.dumps(data, separators=(",", ":"), sort_keys=True)
