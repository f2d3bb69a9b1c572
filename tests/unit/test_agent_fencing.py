"""The agent's side of fencing: what it reports, what it counts as reported, what it tells."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainguard.agent.main import LAYERS_ANNOTATION_LIMIT, Agent, layers_report
from trainguard.agent.shipper import FAILED, Shipper
from trainguard.api.constants import ANNOTATION_LAYERS
from trainguard.ckpt import CheckpointTransaction, Contents
from trainguard.contract import env
from trainguard.contract.files import RESTORE_FILENAME, write_restore_report
from trainguard.initsteps.restore import restore
from trainguard.layers import FileLayer, LayerConfig
from trainguard.layers.lineage import Lineage, Origin

pytestmark = pytest.mark.unit

RUN = "0b8f6a52-64f3-4a43-9d3e-5b2f0a1c9d77"


class Api:
    """The API's stand-in: records renewals and Events, or is unreachable."""

    def __init__(self) -> None:
        self.reachable = True
        self.annotations: dict[str, str] = {}
        self.events: list[tuple[str, str, bool]] = []

    def renew(self, duration: int, annotations: dict[str, str]) -> None:
        if not self.reachable:
            raise OSError("connection refused")
        self.annotations = annotations

    def event(self, reason: str, message: str, warning: bool) -> None:
        self.events.append((reason, message, warning))


def _save(root: Path, step: int) -> Path:
    with CheckpointTransaction(root, step, contents=Contents.FULL) as txn:
        txn.write_file("model.bin", step.to_bytes(4, "little") * 256)
        return Path(txn.commit().path)


def _environ(tmp_path: Path) -> dict[str, str]:
    state = tmp_path / "state"
    state.mkdir(exist_ok=True)
    return {env.STATE_DIR: str(state), env.L1_DIR: str(tmp_path / "l1")}


def test_the_layer_report_is_bounded_json_that_keeps_every_layer() -> None:
    states = {
        f"layer-{i}-" + "x" * 55: {
            "state": FAILED,
            "step": 12_345_678,
            "uploading": 12_345_679,
            "bytes_done": 987_654_321_000,
            "bytes_total": 987_654_321_000,
            "error": "botocore.exceptions.EndpointConnectionError: " + "detail " * 300,
            "at": 1.0,
            "shipped": 1_234_567,
            "skipped": 1_234_567,
        }
        for i in range(8)
    }
    text, reported = layers_report(states)
    assert len(text.encode()) <= LAYERS_ANNOTATION_LIMIT
    parsed = json.loads(text)  # never cut mid-JSON
    assert parsed == reported
    assert sorted(parsed) == sorted(states)
    assert all((s["state"], s["step"]) == (FAILED, 12_345_678) for s in parsed.values())
    assert all(s["uploading"] == 12_345_679 for s in parsed.values())
    assert all(s["shipped"] == s["skipped"] == 1_234_567 for s in parsed.values())
    small = {"s3": {"state": "verified", "step": 40, "error": None, "at": 2.0}}
    assert json.loads(layers_report(small)[0]) == {"s3": {"state": "verified", "step": 40}}


def test_only_a_renewal_that_reached_the_api_counts_as_reported(tmp_path: Path) -> None:
    l1, nfs = tmp_path / "l1", tmp_path / "nfs"
    origin = Origin(RUN, 1)
    layer = FileLayer(LayerConfig("nfs", f"file://{nfs}", keep=1), nfs, origin)
    shipper = Shipper(l1, [layer], lineage=Lineage(origin))
    api = Api()
    agent = Agent(_environ(tmp_path), api, shipper)
    _save(l1, 10)
    shipper.ship_once()
    agent.step()
    assert json.loads(api.annotations[ANNOTATION_LAYERS])["nfs"]["step"] == 10
    api.reachable = False  # partitioned from here on
    for step in (20, 30):
        _save(l1, step)
        shipper.ship_once()
        agent.step()
    # Nothing after step 10 reached the operator: keep 1 counted step 10 only, so it stays.
    assert [ref.step for ref in layer.checkpoints()] == [10, 20, 30]
    api.reachable = True
    agent.next_api_try = 0.0  # its back-off has run out
    agent.step()
    _save(l1, 40)
    shipper.ship_once()
    assert [ref.step for ref in layer.checkpoints()] == [30, 40]


def test_fenced_uploads_the_restore_ignored_become_a_warning_event(tmp_path: Path) -> None:
    nfs = tmp_path / "nfs"
    zombie = FileLayer(LayerConfig("nfs", f"file://{nfs}"), nfs, Origin(RUN, 1))
    for step in (10, 20, 30):
        zombie.put(_save(tmp_path / "old-l1", step))
    new = FileLayer(LayerConfig("nfs", f"file://{nfs}"), nfs, Origin(RUN, 2))
    report = restore(tmp_path / "l1", [new], Lineage(Origin(RUN, 2), {1: 10}))
    environ = _environ(tmp_path)
    write_restore_report(Path(environ[env.STATE_DIR]) / RESTORE_FILENAME, report)
    api = Api()
    Agent(environ, api).step()
    reasons = {reason: (message, warning) for reason, message, warning in api.events}
    assert reasons["Restored"][0] == f"restored step 10 from layer nfs (attempt 1 of run {RUN})"
    message, warning = reasons["FencedCheckpointsIgnored"]
    assert warning
    assert f"nfs step 30 (attempt 1 of run {RUN}): shipped after attempt 1 was superseded" in (
        message
    )
    assert "nfs step 20" in message
