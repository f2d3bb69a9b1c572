"""`trainguard status` rendering, on a run and Events recorded from `trainguard demo`.

The recording (tests/unit/recorded/) holds the demo run after both recoveries (silent death
restarted in place twice, then ghost memory: node excluded, attempt 2 restored from the
remote layer) and the Events of its namespace, including those of two earlier runs of the
same name, which the timeline must leave out.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from trainguard.cli.status import entries, render

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]

RECORDED = Path(__file__).parent / "recorded"


@pytest.fixture
def run() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((RECORDED / "demo-run.json").read_text())
    return data


@pytest.fixture
def events() -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = json.loads((RECORDED / "demo-events.json").read_text())["items"]
    return items


def _section(text: str, title: str) -> str:
    """One blank-line-separated section of the rendering, by its first words."""
    found = [s for s in text.split("\n\n") if s.startswith(title)]
    assert len(found) == 1, f"no single section {title!r} in:\n{text}"
    return found[0]


def test_only_the_runs_own_events_in_time_order(
    run: dict[str, Any], events: list[dict[str, Any]]
) -> None:
    uid = run["metadata"]["uid"]
    own = [e for e in events if e["involvedObject"]["uid"] == uid]
    assert 0 < len(own) < len(events)  # the recording holds other runs' Events too
    found = entries(run, events)
    assert len(found) == len(own)
    times = [e.time for e in found]
    assert times == sorted(times)
    # An earlier run of the same name stopped on a repeated failure; this one never did.
    assert "RepeatedFailureAtStep" not in {e.reason for e in found}


def test_header_shows_where_the_run_is(run: dict[str, Any], events: list[dict[str, Any]]) -> None:
    header = render(run, events).split("\n\n")[0]
    assert header.startswith("TrainingRun trainguard-demo/demo: Suspended, verdict Healthy")
    assert "attempt 2" in header
    assert "step 112" in header
    assert "restarts 3" in header


def test_detections_list_each_failure_and_the_action(
    run: dict[str, Any], events: list[dict[str, Any]]
) -> None:
    detections = _section(render(run, events), "Detections")
    assert detections.splitlines()[0] == "Detections (3)"
    rows = detections.splitlines()[2:]
    assert [row.split()[1] for row in rows] == ["Dead", "Dead", "GhostMemory"]
    assert "restart in place 1/3" in rows[0]
    assert "excluding it and moving the run" in rows[2]
    # The JSON evidence stays out of the terminal view.
    assert "evidence" not in detections and "{" not in detections


def test_exclusion_and_restore_from_the_remote_layer(
    run: dict[str, Any], events: list[dict[str, Any]]
) -> None:
    text = render(run, events)
    excluded = _section(text, "Excluded nodes")
    assert excluded.splitlines()[2].split()[:2] == ["proc-node-0", "GhostMemory"]
    restores = _section(text, "Restores")
    assert "agent demo-2" in restores
    assert "restored step 100 from layer backup" in restores
    checkpoints = _section(text, "Checkpoints")
    assert checkpoints.splitlines()[3].split()[:3] == ["backup", "116", "yes"]


def test_a_layers_shipping_counts_and_failure_are_shown(
    run: dict[str, Any], events: list[dict[str, Any]]
) -> None:
    (backup,) = [c for c in run["status"]["checkpoints"] if c["layer"] == "backup"]
    backup["shipping"] = {
        "state": "Failed",
        "step": 120,
        "shipped": 3,
        "skipped": 2,
        "message": "backup: copy of step 120: No space left on device",
    }
    rows = _section(render(run, events), "Checkpoints").splitlines()
    (row,) = [r for r in rows if r.split()[0] == "backup"]
    assert row.endswith(
        "Failed step 120 (3 shipped, 2 skipped): backup: copy of step 120: No space left on device"
    )


def test_the_last_invalid_checkpoint_is_shown(
    run: dict[str, Any], events: list[dict[str, Any]]
) -> None:
    run["status"]["lastInvalidCheckpoint"] = {
        "layer": "backup",
        "step": 142,
        "file": "optimizer.safetensors",
        "reason": "xxh3-128 hash mismatch",
        "found": "Restore",
        "time": "2026-12-04T10:00:05Z",
        "attempt": 2,
    }
    lines = _section(render(run, events), "Checkpoints").splitlines()
    assert lines[-1] == (
        "  last invalid: layer backup, step 142, optimizer.safetensors: xxh3-128 hash mismatch; "
        "found by Restore (attempt 2) at 10:00:05, kept"
    )


def test_the_last_resume_and_l0_are_shown(
    run: dict[str, Any], events: list[dict[str, Any]]
) -> None:
    run["status"]["checkpoints"] = [{"layer": "l0", "step": 57, "verified": True}]
    run["status"]["lastRestore"] = {
        "layer": "l0",
        "step": 57,
        "attempt": 1,
        "time": "2026-12-04T10:03:07Z",
        "message": "restored step 57 from layer l0",
    }
    lines = _section(render(run, events), "Checkpoints").splitlines()
    assert any(line.split()[:3] == ["l0", "57", "yes"] for line in lines), lines
    assert lines[-1] == "  last resume: restored step 57 from layer l0 (attempt 1) at 10:03:07"


def test_timeline_marks_warnings_and_names_the_agent(
    run: dict[str, Any], events: list[dict[str, Any]]
) -> None:
    timeline = _section(render(run, events), "Timeline")
    assert timeline.splitlines()[0].startswith("Timeline (2026-12-03, UTC")
    lines = timeline.splitlines()[2:]
    assert any("agent demo-1" in line and "!VerdictGhostMemory" in line for line in lines)
    assert any("operator" in line and "!GhostMemory" in line for line in lines)
    assert any(
        "operator" in line and " Scheduling " in line and "attempt 2" in line for line in lines
    )


def test_a_new_run_without_status_or_events(run: dict[str, Any]) -> None:
    fresh = {"metadata": copy.deepcopy(run["metadata"])}
    text = render(fresh, [])
    assert "Checkpoints: none yet" in text
    assert "Excluded nodes: none" in text
    assert "Detections: none" in text
    assert "Restores: none" in text
    assert "Events: none" in text


def test_last_failure_stands_in_when_the_events_expired(run: dict[str, Any]) -> None:
    detections = _section(render(run, []), "Detections")
    assert detections.splitlines()[0] == "Detections (1)"
    assert detections.splitlines()[2].split()[:2] == ["04:43:43", "GhostMemory"]
