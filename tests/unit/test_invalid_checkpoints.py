"""Invalid checkpoints are told: restore and shipping find them, the agent tells each once.

The pod side of `trainguard.contract.findings`: a byte flipped in the newest remote checkpoint
is skipped by the restore step and recorded in `restore.json` (layer, step, file, reason); the
agent turns it into one Warning Event `InvalidCheckpoint` and a bounded summary in the Lease;
the shipper finds an L1 checkpoint that does not verify, a remote copy that does not, and an
invalid checkpoint its keep-N keeps. The operator's side is in test_reconcile_cycle.py and
test_metrics.py.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from trainguard.agent.main import ANNOTATION_INVALID_CHECKPOINTS, Agent
from trainguard.agent.shipper import FAILED, Shipper
from trainguard.api.constants import FoundBy
from trainguard.ckpt import CheckpointTransaction, Contents, Problem, step_dirname
from trainguard.contract import env
from trainguard.contract.files import (
    RESTORE_FILENAME,
    RestoreReport,
    read_restore_report,
    write_restore_report,
)
from trainguard.contract.findings import MAX_TEXT, Finding
from trainguard.initsteps.restore import restore
from trainguard.layers import FileLayer, LayerConfig
from trainguard.layers.lineage import CheckpointRef, Lineage, Origin
from trainguard.operator.k8s.leases import lease_view
from trainguard.operator.policies.findings import reported
from trainguard_dev.testing.agent_api import AgentApiRecorder

pytestmark = pytest.mark.unit

RUN = "5f0c7d36-0d7e-4b8e-9a59-3c1f2a9b8e01"
FIRST = Origin(RUN, 1)
HASH_MISMATCH = "xxh3-128 hash mismatch"


class Recorder(AgentApiRecorder):
    """The agent's renewals and Events, and the InvalidCheckpoint Events among them."""

    def invalid(self) -> list[tuple[str, str, bool]]:
        return [e for e in self.events if e[0] == "InvalidCheckpoint"]


def _save(root: Path, step: int) -> Path:
    with CheckpointTransaction(root, step, contents=Contents.FULL) as txn:
        txn.write_file("model.safetensors", b"m" * 4096 + step.to_bytes(4, "little"))
        txn.write_file("optimizer.safetensors", b"o" * 4096 + step.to_bytes(4, "little"))
        return Path(txn.commit().path)


def _layer(root: Path, keep: int = 2, origin: Origin = FIRST) -> FileLayer:
    return FileLayer(LayerConfig("backup", f"file://{root}", keep=keep), root, origin)


def _flip(path: Path, at: int = 100) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0x01  # the same size: only a hash can tell
    path.write_bytes(bytes(data))


def _agent(tmp_path: Path, client: AgentApiRecorder, shipper: Shipper | None = None) -> Agent:
    environ = {env.STATE_DIR: str(tmp_path / "state"), env.L1_DIR: str(tmp_path / "l1")}
    return Agent(environ, client, shipper)


def test_restore_records_a_flipped_byte_in_the_newest_remote_checkpoint(tmp_path: Path) -> None:
    remote = tmp_path / "remote"
    layer = _layer(remote)
    for step in (120, 142):
        layer.put(_save(tmp_path / "old-l1", step))
    _flip(remote / CheckpointRef(142, FIRST).path / "optimizer.safetensors")
    before = time.time()
    report = restore(
        tmp_path / "l1", [_layer(remote, origin=Origin(RUN, 2))], Lineage(Origin(RUN, 2), {1: 142})
    )
    assert (report.step, report.from_layer) == (120, "backup")
    [finding] = report.findings
    assert (finding.layer, finding.step, finding.file, finding.reason, finding.found) == (
        "backup",
        142,
        "optimizer.safetensors",
        HASH_MISMATCH,
        FoundBy.RESTORE,
    )
    assert before <= finding.time <= time.time()
    # The report's line stays as it was; the structured record rides beside it.
    assert report.skipped == (
        f"backup {CheckpointRef(142, FIRST)}: optimizer.safetensors: {HASH_MISMATCH}",
    )
    path = tmp_path / "state" / RESTORE_FILENAME
    write_restore_report(path, report)
    written = json.loads(path.read_text())["findings"]
    assert written == [
        {
            "layer": "backup",
            "step": 142,
            "file": "optimizer.safetensors",
            "reason": HASH_MISMATCH,
            "found": "Restore",
            "time": finding.time,
        }
    ]
    assert read_restore_report(path) == report


def test_restore_records_invalid_l1_checkpoints_and_a_fetch_that_finds_a_corrupt_file(
    tmp_path: Path,
) -> None:
    l1, remote = tmp_path / "l1", tmp_path / "remote"
    layer = _layer(remote)
    layer.put(_save(tmp_path / "old-l1", 30))
    broken = _save(l1, 40)
    (broken / "model.safetensors").write_bytes(b"short")

    class FlipsOnFetch(FileLayer):
        """Verifies, then a byte changes under the fetch (storage that corrupts on read)."""

        def fetch(self, ref: CheckpointRef, dest_root: Path) -> Path:
            _flip(self.root / ref.path / "model.safetensors")
            return super().fetch(ref, dest_root)

    flaky = FlipsOnFetch(layer.config, remote, FIRST)
    report = restore(l1, [flaky])
    assert report.step is None
    assert [(f.layer, f.step, f.file, f.found) for f in report.findings] == [
        ("l1", 40, "model.safetensors", FoundBy.RESTORE),
        ("backup", 30, "model.safetensors", FoundBy.RESTORE),
    ]
    assert report.findings[0].reason == "size 5 != 4100 in the manifest"
    assert report.findings[1].reason == HASH_MISMATCH
    # Nothing invalid is ever deleted: both are still there for inspection.
    assert (l1 / step_dirname(40)).is_dir() and flaky.checkpoints() == [CheckpointRef(30, FIRST)]


def test_the_agent_tells_a_restore_finding_once_and_carries_it_in_the_lease(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    finding = Finding("backup", 142, "optimizer.safetensors", HASH_MISMATCH, FoundBy.RESTORE, 1e9)
    client = Recorder()
    agent = _agent(tmp_path, client)
    agent.step()
    assert client.invalid() == [] and ANNOTATION_INVALID_CHECKPOINTS not in client.annotations
    write_restore_report(
        state / RESTORE_FILENAME, RestoreReport(120, "backup", findings=(finding,))
    )
    for _ in range(3):
        agent.step()
    [(_, message, warning)] = client.invalid()
    assert warning
    assert message == (
        "invalid checkpoint (skipped, kept for inspection): layer backup, step 142, "
        "optimizer.safetensors: xxh3-128 hash mismatch (found by the restore step)"
    )
    summary = json.loads(client.annotations[ANNOTATION_INVALID_CHECKPOINTS])
    assert summary == {
        "counts": {"backup": 1},
        "last": {
            "layer": "backup",
            "step": 142,
            "file": "optimizer.safetensors",
            "reason": HASH_MISMATCH,
            "found": "Restore",
            "time": "2001-09-09T01:46:40Z",
        },
    }
    # What the operator reads of it: the status's fields, for the attempt whose agent renewed.
    lease = lease_view(
        {
            "metadata": {"annotations": client.annotations},
            "spec": {"holderIdentity": "llm-2"},
        }
    )
    seen = reported("llm", 2, lease)
    assert seen is not None and seen.last is not None
    assert [(c.layer, c.attempt, c.count) for c in seen.counts] == [("backup", 2, 1)]
    assert (seen.last.layer, seen.last.step, seen.last.file, seen.last.attempt) == (
        "backup",
        142,
        "optimizer.safetensors",
        2,
    )
    assert reported("llm", 3, lease) is None  # another attempt's agent renewed it


def test_a_finding_and_the_lease_summary_are_bounded() -> None:
    long = "x" * 5000
    finding = Finding.of("backup", 7, [(long, long), ("b", "c")], FoundBy.SHIPPING)
    assert finding.file is not None and len(finding.file) == MAX_TEXT
    assert len(finding.reason) == MAX_TEXT
    told = Recorder()
    agent = Agent({env.STATE_DIR: "/nonexistent", env.L1_DIR: "/nonexistent"}, told)
    layers = [f"layer-{i:02d}-" + "n" * 54 for i in range(9)]
    agent.note_findings(Finding.of(name, 1, [(long, long)], FoundBy.SHIPPING) for name in layers)
    summary = agent.told.annotation()
    assert summary is not None and len(summary.encode()) < 2048
    assert all(len(message.encode()) < 1024 for _, message, _ in agent.pending_events)


def test_the_shipper_finds_a_corrupt_l1_checkpoint_and_the_agent_tells_it_once(
    tmp_path: Path,
) -> None:
    l1 = tmp_path / "l1"
    _save(l1, 10)
    _flip(_save(l1, 20) / "model.safetensors")
    layer = _layer(tmp_path / "remote")
    shipper = Shipper(l1, [layer])
    client = Recorder()
    agent = _agent(tmp_path, client, shipper)
    shipper.ship_once()
    shipper.ship_once()  # the same corrupt checkpoint is hashed once, and found once
    assert [r.step for r in layer.checkpoints()] == [10]
    agent.step()
    agent.step()
    [(_, message, _)] = client.invalid()
    assert "layer l1, step 20, model.safetensors: xxh3-128 hash mismatch" in message
    assert "(found by the shipper)" in message
    summary = json.loads(client.annotations[ANNOTATION_INVALID_CHECKPOINTS])
    assert summary["counts"] == {"l1": 1} and summary["last"]["found"] == "Shipping"
    assert (l1 / step_dirname(20)).is_dir()  # kept, never shipped


def test_a_remote_copy_that_does_not_verify_is_a_finding_and_fails_the_layer(
    tmp_path: Path,
) -> None:
    """A copy this attempt shipped before (an agent restarted in its pod) is verified again."""
    l1, remote = tmp_path / "l1", tmp_path / "remote"
    _save(l1, 10)
    Shipper(l1, [_layer(remote)], lineage=Lineage(FIRST)).ship_once()
    _flip(remote / CheckpointRef(10, FIRST).path / "optimizer.safetensors")
    again = Shipper(l1, [_layer(remote)], lineage=Lineage(FIRST))
    again.ship_once()
    state = again.states()["backup"]
    assert state["state"] == FAILED and state["step"] is None
    assert "optimizer.safetensors: xxh3-128 hash mismatch" in state["error"]
    [finding] = again.take_findings()
    assert (finding.layer, finding.step, finding.file, finding.reason, finding.found) == (
        "backup",
        10,
        "optimizer.safetensors",
        HASH_MISMATCH,
        FoundBy.SHIPPING,
    )
    assert again.take_findings() == []  # taken once


def test_keep_n_keeps_and_reports_an_invalid_remote_checkpoint(tmp_path: Path) -> None:
    """Older than the N kept, an invalid checkpoint is still never pruned: kept and told."""
    l1, remote = tmp_path / "l1", tmp_path / "remote"
    layer = _layer(remote, keep=1)
    shipper = Shipper(l1, [layer], lineage=Lineage(FIRST))
    _save(l1, 10)
    shipper.ship_once()
    shipper.acknowledge(shipper.states())
    damaged = remote / CheckpointRef(10, FIRST).path / "model.safetensors"
    damaged.write_bytes(b"truncated")
    lost = remote / CheckpointRef(10, FIRST).path
    for step in (20, 30, 40):
        _save(l1, step)
        shipper.ship_once()
        shipper.acknowledge(shipper.states())
    # Keep 1 counts what was reported: 40 stays on top until its renewal, 30 is the one kept.
    assert [r.step for r in layer.checkpoints()] == [10, 30, 40]
    assert lost.is_dir()
    findings = shipper.take_findings()
    assert {(f.layer, f.step, f.file, f.found) for f in findings} == {
        ("backup", 10, "model.safetensors", FoundBy.SHIPPING)
    }
    assert findings[0].reason == "size 9 != 4100 in the manifest"


def test_a_file_layer_keeps_a_checkpoint_that_lost_its_manifest(tmp_path: Path) -> None:
    """A directory layer's copies appear whole: one without a manifest is damaged, kept."""
    remote = tmp_path / "remote"
    layer = _layer(remote, keep=1)
    for step in (10, 20, 30):
        layer.put(_save(tmp_path / "l1", step))
    (remote / CheckpointRef(10, FIRST).path / "MANIFEST.json").unlink()
    pruned = layer.prune(1, Lineage(FIRST))
    assert pruned.deleted == [CheckpointRef(20, FIRST)]
    assert pruned.invalid == {CheckpointRef(10, FIRST): (Problem(None, "missing MANIFEST.json"),)}
    assert (remote / CheckpointRef(10, FIRST).path).is_dir()


def test_the_harness_findings_in_the_heartbeat_are_told_once(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    found = Finding("l1", 40, "model.safetensors", HASH_MISMATCH, FoundBy.SCAN, 1e9)
    beat = {"pid": 999999, "step": 41, "time": time.time(), "phase": "training"}
    heartbeat = state / "heartbeat.json"
    heartbeat.write_text(json.dumps({**beat, "invalid_checkpoints": [found.to_dict()]}))
    client = Recorder()
    agent = _agent(tmp_path, client)
    agent.step()
    agent.step()  # listed again in the next heartbeat: the same finding
    later = Finding("l1", 50, None, "missing MANIFEST.json", FoundBy.SCAN, 2e9)
    listed = [found.to_dict(), later.to_dict()]
    heartbeat.write_text(json.dumps({**beat, "invalid_checkpoints": listed}))
    agent.step()
    messages = [message for _, message, _ in client.invalid()]
    assert [m.split(": layer ")[1] for m in messages] == [
        "l1, step 40, model.safetensors: xxh3-128 hash mismatch (found by the trainer's L1 scan)",
        "l1, step 50: missing MANIFEST.json (found by the trainer's L1 scan)",
    ]
    summary = json.loads(client.annotations[ANNOTATION_INVALID_CHECKPOINTS])
    assert summary["counts"] == {"l1": 2} and summary["last"]["step"] == 50
