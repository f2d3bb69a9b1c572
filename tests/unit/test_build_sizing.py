"""Local disk sizing: data + (keepLast + 1 + pinned) x checkpoint + margin, per spec shape."""

from __future__ import annotations

from typing import Any

import pytest
from run_factory import make_run

from trainguard.operator.build.sizing import checkpoint_bytes, disk_sizes, mebibytes

pytestmark = pytest.mark.unit

GI = 2**30
MARGIN = 2 * GI + 1 * GI  # logs volume + fixed slack


def margin(local: int) -> int:
    return MARGIN + -(-local * 5 // 100)  # + 5 %, rounded up


def remote(count: int) -> list[dict[str, Any]]:
    """`count` remote layers."""
    return [{"name": f"layer-{i}", "uri": f"s3://bucket/run-{i}"} for i in range(count)]


CASES: list[tuple[str, dict[str, Any], int | None, int | None, int | None]] = [
    # name, spec changes, checkpoint, l1, staged data
    ("estimated from 1e9 parameters x 16 B", {}, 16 * 10**9, 3 * 16 * 10**9, None),
    ("declared checkpoint size wins", {"checkpoints": {"size": "35Gi"}}, 35 * GI, 105 * GI, None),
    (
        "keepLast 4 keeps 5",
        {"checkpoints": {"size": "10Gi", "l1": {"keepLast": 4}}},
        10 * GI,
        50 * GI,
        None,
    ),
    (
        "explicit emptyDir sizeLimit",
        {"checkpoints": {"l1": {"storage": {"emptyDir": {"sizeLimit": "200Gi"}}}}},
        16 * 10**9,
        200 * GI,
        None,
    ),
    (
        "staged data counts",
        {
            "checkpoints": {"size": "1Gi"},
            "data": {"source": {"uri": "s3://shards/x"}, "size": "71Gi"},
        },
        GI,
        3 * GI,
        71 * GI,
    ),
    (
        "data read in place does not",
        {
            "checkpoints": {"size": "1Gi"},
            "data": {"source": {"pvc": {"claimName": "shards"}}, "size": "71Gi", "stage": False},
        },
        GI,
        3 * GI,
        None,
    ),
    ("nothing to size by", {"model": {"parameters": None}}, None, None, None),
    # An upload reads a pinned copy that keep-last-N cannot free: one per concurrent upload.
    (
        "one remote layer pins one more",
        {"checkpoints": {"size": "10Gi", "remote": remote(1)}},
        10 * GI,
        40 * GI,
        None,
    ),
    (
        "three remote layers pin at most two more",
        {"checkpoints": {"size": "10Gi", "remote": remote(3)}},
        10 * GI,
        50 * GI,
        None,
    ),
]


@pytest.mark.parametrize(
    ("changes", "checkpoint", "l1", "data"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_sizes(
    changes: dict[str, Any], checkpoint: int | None, l1: int | None, data: int | None
) -> None:
    sizes = disk_sizes(make_run(changes).spec)
    assert (sizes.checkpoint, sizes.l1, sizes.data) == (checkpoint, l1, data)
    local = (l1 or 0) + (data or 0)
    assert sizes.ephemeral_request == local + margin(local)


def test_local_volume_l1_is_not_ephemeral_storage() -> None:
    spec = make_run(
        {
            "checkpoints": {
                "size": "35Gi",
                "l1": {"storage": {"localVolume": {"storageClassName": "local", "size": "300Gi"}}},
            }
        }
    ).spec
    sizes = disk_sizes(spec)
    assert sizes.l1 == 300 * GI
    assert sizes.ephemeral_request == margin(0)


def test_incident_one_needs_more_than_the_100gb_disk_that_failed() -> None:
    # 71 GB of shards + the last 2 full 35 GB checkpoints: the disk grew from 100 to 200 GB.
    spec = make_run(
        {
            "checkpoints": {"size": "35G"},
            "data": {"source": {"uri": "s3://shards/x"}, "size": "71G"},
        }
    ).spec
    request = disk_sizes(spec).ephemeral_request
    assert 176 * 10**9 < request < 200 * 10**9
    assert checkpoint_bytes(spec) == 35 * 10**9


@pytest.mark.parametrize(
    ("size", "quantity"), [(1, "1Mi"), (2**20, "1Mi"), (2**20 + 1, "2Mi"), (GI, "1024Mi")]
)
def test_quantities_round_up_to_whole_mebibytes(size: int, quantity: str) -> None:
    assert mebibytes(size) == quantity
