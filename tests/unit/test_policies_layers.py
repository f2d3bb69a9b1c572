"""The agent's per-layer shipping report, from the Lease to the run's status."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from trainguard.agent.shipper import LayerState
from trainguard.api.constants import ShippingState
from trainguard.api.status import LayerCheckpoint, Restore, Shipping
from trainguard.operator.conditions import merge_layers
from trainguard.operator.k8s.leases import lease_view
from trainguard.operator.policies.layers import parse_layers, parse_restore

pytestmark = pytest.mark.unit

T0 = datetime(2026, 12, 4, 10, 0, tzinfo=UTC)
T1 = datetime(2026, 12, 4, 11, 0, tzinfo=UTC)


def _report(**layers: LayerState) -> str:
    # As the agent writes it: its states without None values and without the time.
    return json.dumps(
        {
            name: {k: v for k, v in vars(state).items() if v is not None and k != "at"}
            for name, state in layers.items()
        }
    )


@pytest.mark.parametrize(
    ("state", "expected"),
    [
        (LayerState(), LayerCheckpoint(layer="s3", verified=False)),
        (
            LayerState("uploading", None, 40, 1024, 4096),
            LayerCheckpoint(
                layer="s3",
                shipping=Shipping(
                    state=ShippingState.UPLOADING,
                    step=40,
                    bytes_done=1024,
                    bytes_total=4096,
                    shipped=0,
                    skipped=0,
                ),
            ),
        ),
        (
            LayerState("verified", 40, None, 4096, 4096, shipped=3, skipped=2),
            LayerCheckpoint(
                layer="s3",
                step=40,
                verified=True,
                shipping=Shipping(
                    state=ShippingState.VERIFIED,
                    step=40,
                    bytes_done=4096,
                    bytes_total=4096,
                    shipped=3,
                    skipped=2,
                ),
            ),
        ),
        (
            LayerState("failed", 40, 60, 0, 4096, "s3: connection refused", shipped=1),
            LayerCheckpoint(
                layer="s3",
                step=40,
                verified=True,
                shipping=Shipping(
                    state=ShippingState.FAILED,
                    step=60,
                    bytes_done=0,
                    bytes_total=4096,
                    message="s3: connection refused",
                    shipped=1,
                    skipped=0,
                ),
            ),
        ),
        (
            # Failing from the first upload on: no step verified, the failure still shows.
            LayerState("failed", None, 10, 0, 4096, "s3: connection refused"),
            LayerCheckpoint(
                layer="s3",
                verified=False,
                shipping=Shipping(
                    state=ShippingState.FAILED,
                    step=10,
                    bytes_done=0,
                    bytes_total=4096,
                    message="s3: connection refused",
                    shipped=0,
                    skipped=0,
                ),
            ),
        ),
    ],
)
def test_a_layer_report_becomes_its_status_entry(
    state: LayerState, expected: LayerCheckpoint
) -> None:
    assert parse_layers(_report(s3=state)) == (expected,)


@pytest.mark.parametrize(
    "text", [None, "", "not json", "[1, 2]", '{"s3": 5}', '{"' + "x" * 64 + '": {}}']
)
def test_a_malformed_report_reads_as_none(text: str | None) -> None:
    assert parse_layers(text) == ()


def test_the_lease_carries_the_report() -> None:
    lease = {
        "metadata": {
            "annotations": {"trainguard.dev/layers": _report(s3=LayerState("verified", 40))}
        },
        "spec": {"holderIdentity": "llm-1"},
    }
    [layer] = lease_view(lease).layers
    assert (layer.layer, layer.step, layer.verified) == ("s3", 40, True)


def test_a_new_pods_report_keeps_what_earlier_attempts_shipped() -> None:
    old = [
        LayerCheckpoint(layer="s3", step=40, verified=True, time=T0),
        LayerCheckpoint(layer="backup", step=20, verified=True, time=T0),
    ]
    fresh = parse_layers(_report(s3=LayerState(), backup=LayerState("verified", 60)))
    merged = {layer.layer: layer for layer in merge_layers(old, fresh, T1)}
    assert (merged["s3"].step, merged["s3"].verified, merged["s3"].time) == (40, True, T0)
    assert merged["backup"].step == 60
    assert merge_layers(old, (), T1) == sorted(old, key=lambda layer: layer.layer)


def test_a_layers_time_is_when_its_step_was_first_seen() -> None:
    """The age of a layer's newest verified checkpoint counts from its first sight."""
    first = merge_layers([], parse_layers(_report(s3=LayerState("verified", 40))), T0)
    assert [(layer.step, layer.time) for layer in first] == [(40, T0)]
    again = merge_layers(first, parse_layers(_report(s3=LayerState("verified", 40))), T1)
    assert again[0].time == T0  # the same step seen again: as old as before
    newer = merge_layers(again, parse_layers(_report(s3=LayerState("verified", 60))), T1)
    assert (newer[0].step, newer[0].time) == (60, T1)
    none = merge_layers([], parse_layers(_report(s3=LayerState("failed", None, 40))), T1)
    assert none[0].step is None and none[0].time is None  # none verified yet: no age


def test_l0_is_what_the_pods_agent_reports_never_carried_over() -> None:
    # A remote layer keeps its newest step across attempts (the copy is still there); L0 lives
    # in pod memory: the new pod's empty L0 replaces the old one's step.
    old = merge_layers([], parse_layers('{"l0":{"step":57},"s3":{"state":"idle","step":40}}'), T0)
    assert [(c.layer, c.step, c.time) for c in old] == [("l0", 57, T0), ("s3", 40, T0)]
    same = merge_layers(old, parse_layers('{"l0":{"step":57}}'), T1)
    assert [(c.layer, c.step, c.time) for c in same] == [("l0", 57, T0), ("s3", 40, T0)]
    fresh = merge_layers(same, parse_layers('{"l0":{},"s3":{"state":"idle"}}'), T1)
    assert [(c.layer, c.step, c.verified, c.time) for c in fresh] == [
        ("l0", None, False, None),
        ("s3", 40, True, T0),
    ]


def test_the_restore_record_of_the_lease_is_the_status_last_restore() -> None:
    annotations = {
        "trainguard.dev/restored": json.dumps(
            {
                "step": 57,
                "layer": "l0",
                "time": T1.timestamp(),
                "message": "restored step 57 from layer l0",
            }
        )
    }
    lease = lease_view({"metadata": {"annotations": annotations}})
    restore = parse_restore(lease.restored, attempt=2)
    assert restore == Restore(
        layer="l0", step=57, attempt=2, time=T1, message="restored step 57 from layer l0"
    )
    fresh = parse_restore('{"message":"no checkpoint to restore: started fresh"}', 1)
    assert fresh is not None and (fresh.layer, fresh.step) == (None, None)
    too_long = json.dumps({"layer": "x" * 64, "message": "restored"})
    for malformed in ("", "not json", "[]", '{"step":3}', too_long):
        assert parse_restore(malformed, 1) is None, malformed
