"""The agent's per-layer shipping report, from the Lease to the run's status."""

from __future__ import annotations

import json

import pytest

from trainguard.agent.shipper import LayerState
from trainguard.api.constants import ShippingState
from trainguard.api.status import LayerCheckpoint, Shipping
from trainguard.operator.conditions import merge_layers
from trainguard.operator.k8s.leases import lease_view
from trainguard.operator.policies.layers import parse_layers

pytestmark = pytest.mark.unit


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
        LayerCheckpoint(layer="s3", step=40, verified=True),
        LayerCheckpoint(layer="backup", step=20, verified=True),
    ]
    fresh = parse_layers(_report(s3=LayerState(), backup=LayerState("verified", 60)))
    merged = {layer.layer: layer for layer in merge_layers(old, fresh)}
    assert (merged["s3"].step, merged["s3"].verified) == (40, True)
    assert merged["backup"].step == 60
    assert merge_layers(old, ()) == sorted(old, key=lambda layer: layer.layer)
