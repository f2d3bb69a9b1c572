"""Fencing: checkpoints bound to their attempt; restore and prune stay in the run's lineage.

The scenario of every test: attempt 1 of a run was superseded (its node partitioned) after it
had reported step 20; its pod kept running and shipped steps 30 and 40 (a zombie). Attempt 2
runs now. The layers are real directory layers (`FileLayer`) as the agent and the restore
step open them in a pod.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from trainguard.agent.shipper import Shipper
from trainguard.ckpt import CheckpointTransaction, Contents, Problem, verify
from trainguard.initsteps.restore import restore
from trainguard.layers import FileLayer, LayerConfig
from trainguard.layers.lineage import (
    LEGACY,
    CheckpointRef,
    Lineage,
    Origin,
    checkpoint_key,
    parse_key,
    prune_plan,
)

pytestmark = pytest.mark.unit

RUN = "5f0c7d36-0d7e-4b8e-9a59-3c1f2a9b8e01"
FIRST = Origin(RUN, 1)
SECOND = Origin(RUN, 2)
FENCES = {1: 20}


def _save(root: Path, step: int, tag: bytes = b"") -> Path:
    with CheckpointTransaction(root, step, contents=Contents.FULL) as txn:
        txn.write_file("model.bin", b"m" * 2048 + tag + step.to_bytes(4, "little"))
        txn.write_file("optimizer.bin", b"o" * 2048)
        return Path(txn.commit().path)


def _layer(root: Path, origin: Origin, keep: int = 2) -> FileLayer:
    return FileLayer(LayerConfig("backup", f"file://{root}", keep=keep), root, origin)


def _ship(layer: FileLayer, l1: Path, steps: list[int], tag: bytes = b"") -> None:
    for step in steps:
        layer.put(_save(l1, step, tag))


def test_the_lineage_rule() -> None:
    lineage = Lineage(SECOND, {1: 20})
    assert lineage.refusal(CheckpointRef(20, FIRST)) is None  # reported before supersession
    assert "shipped after attempt 1 was superseded" in str(
        lineage.refusal(CheckpointRef(30, FIRST))
    )
    assert lineage.accepts(CheckpointRef(500, SECOND))  # its own
    assert lineage.accepts(CheckpointRef(900, Origin("another-run", 7)))  # a re-created run's
    assert "later attempt" in str(lineage.refusal(CheckpointRef(1, Origin(RUN, 3))))
    assert "no fence" in str(Lineage(Origin(RUN, 3), {2: 5}).refusal(CheckpointRef(1, FIRST)))
    unreported = Lineage(SECOND, {1: None})
    assert "before it reported" in str(unreported.refusal(CheckpointRef(0, FIRST)))
    bounded = Lineage(SECOND, {1: 20}, own_limit=40)
    assert bounded.accepts(CheckpointRef(40, SECOND))
    assert "not reported yet" in str(bounded.refusal(CheckpointRef(50, SECOND)))


def test_keys_name_the_run_and_attempt_and_parse_back() -> None:
    ref = CheckpointRef(7, SECOND)
    key = checkpoint_key(ref, "model.bin")
    assert key == f"run-{RUN}/attempt-2/step-00000007/model.bin"
    assert parse_key(key) == (ref, "model.bin")
    # The layout before checkpoints named their attempt: read as LEGACY.
    assert parse_key("step-00000007/model.bin") == (CheckpointRef(7, LEGACY), "model.bin")
    assert CheckpointRef(7, LEGACY).path == "step-00000007"
    assert parse_key(f"run-{RUN}/attempt-02/step-00000007/x") is None
    assert Origin.of("", None) == Origin("local", 0)


def test_two_attempts_never_write_the_same_key(tmp_path: Path) -> None:
    first, second = _layer(tmp_path / "nfs", FIRST), _layer(tmp_path / "nfs", SECOND)
    _ship(first, tmp_path / "l1-a", [30], b"zombie")
    _ship(second, tmp_path / "l1-b", [30], b"current")
    assert first.checkpoints() == [CheckpointRef(30, FIRST), CheckpointRef(30, SECOND)]
    model = (tmp_path / "nfs" / CheckpointRef(30, SECOND).path / "model.bin").read_bytes()
    assert b"current" in model


def test_restore_resumes_from_the_fence_and_reports_the_zombies_uploads(tmp_path: Path) -> None:
    zombie = _layer(tmp_path / "nfs", FIRST)
    _ship(zombie, tmp_path / "l1-a", [10, 20, 30, 40])
    new_pod = _layer(tmp_path / "nfs", SECOND)
    report = restore(tmp_path / "l1-b", [new_pod], Lineage(SECOND, FENCES))
    assert (report.step, report.from_layer, report.origin) == (20, "backup", str(FIRST))
    assert verify(tmp_path / "l1-b" / "step-00000020").ok
    assert [line.split(":")[0] for line in report.fenced] == [
        f"backup step 40 ({FIRST})",
        f"backup step 30 ({FIRST})",
    ]
    assert report.line() == f"restored step 20 from layer backup ({FIRST})"
    # Outside a pod (no lineage) the newest checkpoint wins, as before fencing.
    assert restore(tmp_path / "l1-c", [new_pod]).step == 40


def test_an_attempt_that_reported_nothing_contributes_nothing(tmp_path: Path) -> None:
    zombie = _layer(tmp_path / "nfs", FIRST)
    _ship(zombie, tmp_path / "l1-a", [10])
    report = restore(tmp_path / "l1-b", [zombie], Lineage(SECOND, {1: None}))
    assert report.step is None and len(report.fenced) == 1


def test_prune_counts_and_deletes_only_the_lineage(tmp_path: Path) -> None:
    zombie = _layer(tmp_path / "nfs", FIRST, keep=1)
    _ship(zombie, tmp_path / "l1-a", [10, 20, 30, 40])
    current = _layer(tmp_path / "nfs", SECOND, keep=1)
    _ship(current, tmp_path / "l1-b", [20, 50])
    pruned = current.prune(1, Lineage(SECOND, FENCES))
    assert pruned.deleted == [
        CheckpointRef(10, FIRST),
        CheckpointRef(20, FIRST),
        CheckpointRef(20, SECOND),
    ]
    assert pruned.invalid == {}
    # The zombie's uploads are never deleted by the new attempt: kept for inspection.
    assert current.checkpoints() == [
        CheckpointRef(30, FIRST),
        CheckpointRef(40, FIRST),
        CheckpointRef(50, SECOND),
    ]


def test_a_partitioned_agent_never_prunes_what_its_successor_resumes_from(tmp_path: Path) -> None:
    """The zombie's shipper counts only what it reported: the fence checkpoint survives."""
    l1, nfs = tmp_path / "l1", tmp_path / "nfs"
    layer = _layer(nfs, FIRST, keep=1)
    shipper = Shipper(l1, [layer], lineage=Lineage(FIRST))
    for step in (10, 20, 30):
        _save(l1, step)
        shipper.ship_once()
        shipper.acknowledge(shipper.states())  # the Lease renewal carrying it succeeded
    # keep 1 counts what was reported when pruning: 30 stays on top until reported.
    assert [r.step for r in layer.checkpoints()] == [20, 30]
    # The partition: renewals fail from here on (the operator fences attempt 1 at step 30),
    # shipping goes on.
    for step in (40, 50, 60):
        _save(l1, step)
        shipper.ship_once()
    assert [r.step for r in layer.checkpoints()] == [30, 40, 50, 60]
    report = restore(tmp_path / "l1-new", [_layer(nfs, SECOND)], Lineage(SECOND, {1: 30}))
    assert report.step == 30
    assert len(report.fenced) == 3


def test_prune_plan_leaves_invalid_and_drops_abandoned_partials() -> None:
    refs = {
        CheckpointRef(5, SECOND): True,  # invalid, older than the one kept
        CheckpointRef(10, SECOND): True,
        CheckpointRef(20, SECOND): True,
        CheckpointRef(30, SECOND): True,  # invalid, the newest
        CheckpointRef(15, SECOND): False,  # an abandoned partial upload
        CheckpointRef(35, SECOND): False,  # the upload under way
    }
    broken = {CheckpointRef(30, SECOND), CheckpointRef(5, SECOND)}
    checked: dict[int, bool] = {}

    def problems(ref: CheckpointRef, deep: bool) -> list[Problem]:
        checked[ref.step] = deep
        return [Problem("model.bin", "size 1 != 2 in the manifest")] if ref in broken else []

    plan = prune_plan(refs, 1, Lineage(SECOND), problems)
    assert sorted(plan.deleted) == [CheckpointRef(10, SECOND), CheckpointRef(15, SECOND)]
    # Invalid ones are never deleted, however old: kept and reported.
    assert set(plan.invalid) == broken
    assert plan.invalid[CheckpointRef(5, SECOND)] == (
        Problem("model.bin", "size 1 != 2 in the manifest"),
    )
    # The candidates to keep are checked in depth, the older ones only enough to go.
    assert checked == {30: True, 20: True, 10: False, 5: False}
    with pytest.raises(ValueError, match="at least 1"):
        prune_plan(refs, 0, Lineage(SECOND), lambda ref, deep: [])


def test_an_upgraded_operator_resumes_from_checkpoints_shipped_before_attempts(
    tmp_path: Path,
) -> None:
    """A layer written by the earlier layout (`step-<n>/` under the root) is still restored."""
    nfs = tmp_path / "nfs"
    nfs.mkdir()
    old = _save(tmp_path / "old-l1", 60)
    (nfs / old.name).mkdir()
    for item in old.iterdir():
        (nfs / old.name / item.name).write_bytes(item.read_bytes())
    layer = _layer(nfs, SECOND)
    assert layer.checkpoints() == [CheckpointRef(60, LEGACY)]
    report = restore(tmp_path / "l1", [layer], Lineage(SECOND, FENCES))
    assert (report.step, report.origin) == (60, str(LEGACY))
    assert verify(tmp_path / "l1" / "step-00000060").ok
