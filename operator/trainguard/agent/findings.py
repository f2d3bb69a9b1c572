"""The invalid checkpoints the agent tells of: each once, counted per layer, the last one kept.

Findings reach the agent from the restore step's report, its shipper and the harness's
heartbeat (`trainguard.contract.findings`); the same one may come again (the heartbeat lists
the harness's newest findings every second, keep-N finds the same invalid checkpoint at every
upload), and is told once. An agent restarted in its pod starts afresh: it tells the restore
step's findings again.
"""

from __future__ import annotations

from collections.abc import Iterable

from trainguard.contract.findings import Finding, lease_summary


def event_message(finding: Finding) -> str:
    """The Warning Event's message: what was found, and that it is kept, not used."""
    return f"invalid checkpoint (skipped, kept for inspection): {finding.line()}"


class Told:
    """The findings told so far: their keys, a count per layer, the last one."""

    def __init__(self) -> None:
        self._keys: set[tuple[str, int | None, str | None, str]] = set()
        self.counts: dict[str, int] = {}
        self.last: Finding | None = None

    def news(self, findings: Iterable[Finding]) -> list[Finding]:
        """The findings not told yet, now counted as told."""
        fresh = []
        for finding in findings:
            if finding.key in self._keys:
                continue
            self._keys.add(finding.key)
            self.counts[finding.layer] = self.counts.get(finding.layer, 0) + 1
            self.last = finding
            fresh.append(finding)
        return fresh

    def annotation(self) -> str | None:
        """The Lease's summary (`lease_summary`); None before the first finding."""
        return lease_summary(self.counts, self.last) if self.last is not None else None
