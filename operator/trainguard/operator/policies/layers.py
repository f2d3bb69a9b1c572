"""Per-layer checkpoint state, pure: the agent's shipping report in the Lease -> the status.

The agent renews the heartbeat Lease with one JSON object per remote layer under
`trainguard.dev/layers` (see `trainguard.agent.shipper.LayerState`): the newest step verified
on the layer, the upload in progress and its bytes (or the failed one and its error), and how
many checkpoints this agent shipped there and how many it skipped because a newer one
superseded them. The status keeps the
newest checkpoint of each layer (`status.checkpoints`) with the shipping state: a layer whose
uploads fail shows `Failed` with the step and the error even before it verified any. A new pod's
agent starts knowing nothing of what an earlier attempt shipped:
`trainguard.operator.conditions` merges a report into what the status holds. L0, the layer in
pod memory, is reported beside them with its newest step only (it is never shipped).

The agent also carries the pod's last restore record under `trainguard.dev/restored`
(`RestoreReport.summary`: step, layer, time, message): `parse_restore` makes it
`status.lastRestore`.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

from pydantic import ValidationError

from trainguard.api.constants import ShippingState
from trainguard.api.status import LayerCheckpoint, Restore, Shipping

# The agent's state names (lower case) -> the API's.
STATES = {state.value.lower(): state for state in ShippingState}


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and value >= 0 else None


def _layer(name: str, report: dict[str, object]) -> LayerCheckpoint | None:
    state = STATES.get(str(report.get("state", "")).lower())
    step = _count(report.get("step"))
    shipping = None
    shipped = _count(report.get("uploading"))
    shipped = step if shipped is None else shipped
    if state is not None and shipped is not None:
        error = report.get("error")
        shipping = Shipping(
            state=state,
            step=shipped,
            bytes_done=_count(report.get("bytes_done")),
            bytes_total=_count(report.get("bytes_total")),
            message=str(error) if error else None,
            shipped=_count(report.get("shipped")),
            skipped=_count(report.get("skipped")),
        )
    try:
        return LayerCheckpoint(layer=name, step=step, verified=step is not None, shipping=shipping)
    except ValidationError:
        return None  # a name the status cannot hold: left out, never fatal


def parse_layers(text: str | None) -> tuple[LayerCheckpoint, ...]:
    """The layers of a Lease's report, by name; a malformed report reads as none."""
    if not text:
        return ()
    try:
        data = json.loads(text)
    except ValueError:
        return ()
    if not isinstance(data, dict):
        return ()
    found = (
        _layer(str(name), report)
        for name, report in sorted(data.items())
        if isinstance(report, dict)
    )
    return tuple(layer for layer in found if layer is not None)


def parse_restore(text: str | None, attempt: int | None) -> Restore | None:
    """The pod's restore record of a Lease as `status.lastRestore`; None when there is none."""
    if not text:
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("message"), str):
        return None
    at = data.get("time")
    try:
        return Restore(
            layer=data.get("layer"),
            step=_count(data.get("step")),
            attempt=attempt,
            time=datetime.fromtimestamp(at, UTC) if isinstance(at, int | float) else None,
            message=data["message"],
        )
    except ValidationError:
        return None  # a value the status cannot hold: left out, never fatal
