"""`trainguard status <run>`: a run's story, from its status and Events, for a terminal.

The rendering is pure (`render(run, events)`): where the run is now (phase, verdict, attempt,
node, step), its checkpoints per layer and the last one found invalid, the nodes it excludes,
its detections (each failure the operator acted on, and what it did), its restores, and then
every Event in order, the operator's and the agent's. Events are matched to the run by UID, so
those of an earlier run of the same name are left out. `main` reads the run and its Events with
the operator's client.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import Any

from trainguard.api.constants import API_VERSION, KIND, PLURAL, Reason, Verdict

Obj = dict[str, Any]

# Event reasons the operator records when it acts on a failure (a verdict or a cause).
FAILURE_REASONS = frozenset(
    {
        Verdict.DEAD.value,
        Verdict.HUNG.value,
        Verdict.GHOST_MEMORY.value,
        Verdict.IO_STUCK.value,
        Reason.LEASE_EXPIRED.value,
        Reason.NODE_LOST.value,
        Reason.POD_FAILED.value,
        Reason.GPU_MEMORY_NOT_RELEASED.value,
        Reason.PREFLIGHT_FAILED.value,
    }
)
RESTORE_REASONS = frozenset({Reason.RESTORED.value, Reason.RESTORE_FAILED.value})
# How the agent signs its Events (source.component, reportingComponent).
AGENT_COMPONENTS = frozenset({"trainguard-agent", "trainguard.dev/agent"})
# Evidence rides along in some messages as JSON; the timeline keeps the sentence before it.
EVIDENCE_MARK = "; evidence: "
NONE = "-"


@dataclass(frozen=True)
class Entry:
    """One Event, as the timeline shows it."""

    time: str
    source: str
    reason: str
    message: str
    warning: bool
    count: int


def _event_time(event: Obj) -> str:
    return str(
        event.get("eventTime")
        or event.get("firstTimestamp")
        or event.get("lastTimestamp")
        or event.get("metadata", {}).get("creationTimestamp")
        or ""
    )


def _source(event: Obj) -> str:
    component = event.get("source", {}).get("component") or event.get("reportingComponent") or ""
    if component in AGENT_COMPONENTS:
        return f"agent {event.get('reportingInstance') or ''}".rstrip()
    return "operator" if component else NONE


def entries(run: Obj, events: list[Obj]) -> list[Entry]:
    """The run's own Events (same UID), oldest first."""
    uid = run.get("metadata", {}).get("uid")
    own = [e for e in events if uid is None or e.get("involvedObject", {}).get("uid") == uid]
    own.sort(key=lambda e: (_event_time(e), e.get("metadata", {}).get("creationTimestamp", "")))
    return [
        Entry(
            time=_event_time(e),
            source=_source(e),
            reason=str(e.get("reason") or NONE),
            message=str(e.get("message") or "").split(EVIDENCE_MARK)[0],
            warning=e.get("type") == "Warning",
            count=int(e.get("count") or 1),
        )
        for e in own
    ]


def _clock(timestamp: str | None) -> str:
    """An RFC 3339 time as HH:MM:SS (the date is in the header)."""
    if not timestamp or "T" not in timestamp:
        return NONE
    return timestamp.split("T", 1)[1].rstrip("Z")[:8]


def _table(rows: list[tuple[str, ...]], indent: str = "  ") -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        indent + "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]


def _value(value: Any) -> str:
    return NONE if value is None or value == "" else str(value)


def _header(run: Obj) -> list[str]:
    meta, status = run.get("metadata", {}), run.get("status") or {}
    name = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
    lines = [
        f"{KIND} {name}: {_value(status.get('phase'))}, verdict {_value(status.get('verdict'))}",
        f"  attempt {_value(status.get('attempt'))} on node {_value(status.get('node'))}, "
        f"step {_value(status.get('step'))}, restarts {status.get('restarts', 0)} "
        f"({status.get('inPlaceRestarts', 0)} in place on this attempt)",
        f"  created {_value(meta.get('creationTimestamp'))}, "
        f"training since {_value(status.get('startTime'))}",
    ]
    tokens = status.get("tokensPerSecond")
    if tokens is not None:
        lines.append(f"  {tokens:,.0f} tokens/s")
    return lines


def _checkpoints(status: Obj) -> list[str]:
    rows: list[tuple[str, ...]] = [("LAYER", "STEP", "VERIFIED", "SHIPPING")]
    layers = status.get("checkpoints") or []
    if status.get("checkpointStep") is not None and not any(c["layer"] == "l1" for c in layers):
        rows.append(("l1 (local)", str(status["checkpointStep"]), "yes", NONE))
    for layer in layers:
        shipping = layer.get("shipping") or {}
        detail = NONE
        if shipping:
            detail = f"{shipping.get('state', NONE)} step {_value(shipping.get('step'))}"
            if shipping.get("shipped") is not None:
                skipped = shipping.get("skipped") or 0
                detail += f" ({shipping['shipped']} shipped, {skipped} skipped)"
            if shipping.get("message"):
                detail += f": {shipping['message']}"
        verified = "yes" if layer.get("verified") else "no"
        rows.append((str(layer["layer"]), _value(layer.get("step")), verified, detail))
    notes = [*_last_restore(status), *_last_invalid(status)]
    if len(rows) == 1:
        return ["Checkpoints: none yet", *notes]
    return ["Checkpoints", *_table(rows), *notes]


def _last_restore(status: Obj) -> list[str]:
    """The checkpoint the trainer last resumed from (e.g. l0 after a restart in place)."""
    last = status.get("lastRestore")
    if not last:
        return []
    return [
        f"  last resume: {last.get('message')} (attempt {_value(last.get('attempt'))}) "
        f"at {_clock(last.get('time'))}"
    ]


def _last_invalid(status: Obj) -> list[str]:
    """The last checkpoint found invalid (skipped and kept), as one line; none: no line."""
    last = status.get("lastInvalidCheckpoint")
    if not last:
        return []
    file = f", {last['file']}" if last.get("file") else ""
    found = f"found by {_value(last.get('found'))} (attempt {_value(last.get('attempt'))})"
    return [
        f"  last invalid: layer {last.get('layer')}, step {_value(last.get('step'))}{file}: "
        f"{last.get('reason')}; {found} at {_clock(last.get('time'))}, kept"
    ]


def _exclusions(status: Obj) -> list[str]:
    excluded = status.get("excludedNodes") or []
    if not excluded:
        return ["Excluded nodes: none"]
    rows: list[tuple[str, ...]] = [("NODE", "REASON", "SINCE")]
    rows += [(e["node"], _value(e.get("reason")), _value(e.get("time"))) for e in excluded]
    return ["Excluded nodes (tainted, never used again by this run)", *_table(rows)]


def _detections(found: list[Entry], status: Obj) -> list[str]:
    failures = [e for e in found if e.reason in FAILURE_REASONS]
    if not failures:
        last = status.get("lastFailure")
        if not last:
            return ["Detections: none"]
        failures = [
            Entry(last.get("time", ""), "operator", last["cause"], "", warning=True, count=1)
        ]
    rows: list[tuple[str, ...]] = [("TIME", "CAUSE", "WHAT TRAINGUARD DID")]
    rows += [(_clock(e.time), e.reason, e.message) for e in failures]
    return [f"Detections ({len(failures)})", *_table(rows)]


def _restores(found: list[Entry]) -> list[str]:
    restores = [e for e in found if e.reason in RESTORE_REASONS]
    if not restores:
        return ["Restores: none"]
    rows: list[tuple[str, ...]] = [("TIME", "BY", "RESULT")]
    rows += [(_clock(e.time), e.source, e.message) for e in restores]
    return [f"Restores ({len(restores)})", *_table(rows)]


def _events(found: list[Entry]) -> list[str]:
    if not found:
        return ["Events: none (Events expire after an hour by default)"]
    rows: list[tuple[str, ...]] = [("TIME", "FROM", "REASON", "MESSAGE")]
    for e in found:
        reason = f"!{e.reason}" if e.warning else e.reason
        count = f" (x{e.count})" if e.count > 1 else ""
        rows.append((_clock(e.time), e.source, reason, e.message + count))
    first = found[0].time.split("T", 1)[0]
    return [f"Timeline ({first}, UTC; ! marks a warning)", *_table(rows)]


def render(run: Obj, events: list[Obj]) -> str:
    """The run's status and Events as text for a terminal."""
    status = run.get("status") or {}
    found = entries(run, events)
    sections = [
        _header(run),
        _checkpoints(status),
        _exclusions(status),
        _detections(found, status),
        _restores(found),
        _events(found),
    ]
    return "\n\n".join("\n".join(lines) for lines in sections)


def main(argv: list[str]) -> int:
    """Entry point of `trainguard status`."""
    parser = argparse.ArgumentParser(
        prog="trainguard status",
        description="A TrainingRun's timeline: attempts, nodes, detections, exclusions, "
        "restores and checkpoints, from its status and Events.",
    )
    parser.add_argument("run", help="name of the TrainingRun")
    parser.add_argument("-n", "--namespace", default="default", help="its namespace")
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG)")
    args = parser.parse_args(argv)

    # Imported here: the client is only needed to read, never to render.
    from trainguard.operator.k8s.client import Kube, KubeError, object_path

    try:
        kube = Kube.connect(args.kubeconfig, pool_size=1)
    except Exception as err:  # the client raises its own types for a missing or bad kubeconfig
        print(f"trainguard status: cannot load a kubeconfig: {err}", file=sys.stderr)
        return 1
    try:
        run = kube.get(object_path(API_VERSION, PLURAL, args.namespace, args.run))
        if run is None:
            print(
                f"trainguard status: no TrainingRun {args.run!r} in namespace {args.namespace!r}",
                file=sys.stderr,
            )
            return 1
        selector = f"involvedObject.kind={KIND},involvedObject.name={args.run}"
        listed = kube.request(
            "GET",
            object_path("v1", "events", args.namespace, None),
            query={"fieldSelector": selector},
        )
    except KubeError as err:
        print(f"trainguard status: {err}", file=sys.stderr)
        return 1
    print(render(run, list(listed.get("items", []))))
    return 0
