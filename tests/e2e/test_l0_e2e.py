"""L0 end to end: a trainer killed in place resumes from pod memory; a corrupt L0 is skipped.

The reference trainer runs on a process-backed node with the pod the operator builds: an `l0`
volume (memory-backed emptyDir) mounted into the trainer and, read-only, the agent. The test
SIGKILLs the trainer the moment a new L0 checkpoint appears:

- as it is, the restarted trainer resumes from that L0 checkpoint, and the status
  (`lastRestore`, the `l0` layer in `checkpoints`) and a `Restored` Event, as the operator and
  the agent wrote them to the API server, say so;
- with every L0 checkpoint from L1's newest step on corrupted (a byte flipped between the
  death and the restart), the restarted trainer skips them and resumes from L1; each is told
  like any invalid checkpoint (Warning Event `InvalidCheckpoint` naming layer l0, the step, the
  file and the reason; `status.lastInvalidCheckpoint`; the per-layer count).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest
from operator_proc import apply, events_of
from recovery_helpers import bound_pod, status_of

from trainguard.api.constants import L0_LAYER, L1_LAYER, FoundBy
from trainguard.ckpt import MANIFEST_FILENAME, find_newest_valid, step_dirname
from trainguard.ckpt.layout import parse_step_dirname
from trainguard.contract.files import SUPERVISOR_FILENAME, read_supervised_child
from trainguard_dev.cluster.cluster import Cluster
from trainguard_dev.testing.pods import checkpointed, pod_directory, state_dir
from trainguard_dev.testing.polling import eventually
from trainguard_dev.testing.processes import OperatorProcess
from trainguard_dev.testing.runs import make_shards, reference_run
from trainguard_dev.testing.signals import (
    HASH_MISMATCH,
    VICTIM,
    flip_a_byte,
    invalid_checkpoint_events,
)

pytest_plugins = ("operator_fixtures",)
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

EVERY_STEPS = 10
STEP_S = 0.25  # slow steps: the kill lands within a step of the L0 checkpoint it follows
L0_VOLUME = "l0"
L1_VOLUME = "l1"


def newest_l0(l0: Path) -> int | None:
    """The newest step in L0 with a manifest."""
    steps = [
        step
        for entry in (l0.iterdir() if l0.is_dir() else ())
        if (step := parse_step_dirname(entry.name)) is not None
        and (entry / MANIFEST_FILENAME).exists()
    ]
    return max(steps, default=None)


class L0Run:
    """One run of the reference trainer and its pod's directories on the process node."""

    def __init__(
        self, cluster: Cluster, namespace: str, tmp_path: Path, name: str, backoff: int
    ) -> None:
        self.cluster, self.namespace, self.name = cluster, namespace, name
        spec = {
            "monitor": {"startupGraceSeconds": 5},
            "recovery": {"backoff": {"initialSeconds": backoff, "maxSeconds": backoff}},
        }
        shards = make_shards(tmp_path / "shards")
        apply(cluster, namespace, reference_run(name, shards, EVERY_STEPS, spec,
                                                min_step_seconds=STEP_S))  # fmt: skip
        pod = eventually(lambda: bound_pod(cluster, namespace, name), what="pod bound")
        self.state = state_dir(cluster.root, pod)
        volumes = pod_directory(cluster.root, pod) / "volumes"
        self.l0, self.l1 = volumes / L0_VOLUME, volumes / L1_VOLUME
        eventually(lambda: checkpointed(self.state, EVERY_STEPS), timeout=120, what="L1 saved")

    def trainer(self) -> int:
        """The running trainer's PID (the supervisor's child)."""
        found = eventually(
            lambda: read_supervised_child(self.state / SUPERVISOR_FILENAME), what="a trainer"
        )
        assert isinstance(found, int)
        return found

    def kill_after_l0_snapshot(self) -> tuple[int, int]:
        """SIGKILL the trainer the moment a new L0 checkpoint appears: its PID and that step."""
        pid = self.trainer()
        before = newest_l0(self.l0) or 0

        def fresh() -> int | None:
            step = newest_l0(self.l0)
            return step if step is not None and step > before and step % EVERY_STEPS else None

        step = eventually(fresh, timeout=60, what="a new L0 checkpoint", interval=0.002)
        os.kill(pid, signal.SIGKILL)
        return pid, step

    def status(self) -> dict[str, Any]:
        """The run's status as the operator wrote it."""
        return status_of(self.cluster, self.namespace, self.name)

    def restored_events(self) -> list[str]:
        """The messages of the run's `Restored` Events."""
        events = events_of(self.cluster, self.namespace, self.name)
        return [e["message"] for e in events if e.get("reason") == "Restored"]


@pytest.mark.parametrize("operator", ["chart-rbac"], indirect=True)
def test_a_trainer_killed_after_an_l0_snapshot_resumes_from_l0(
    cluster: Cluster,
    namespace: str,
    operator: OperatorProcess,
    tmp_path: Path,
    process_nodes: list[str],
) -> None:
    run = L0Run(cluster, namespace, tmp_path, "l0-resume", backoff=1)
    # L0's state is in the status like other layers': its newest step.
    eventually(
        lambda: any(c["layer"] == L0_LAYER and c.get("step") for c in run.status()["checkpoints"]),
        timeout=60,
        what="the l0 layer in status.checkpoints",
    )
    _, step = run.kill_after_l0_snapshot()
    newest_l1 = find_newest_valid(run.l1).newest
    assert newest_l1 is not None and newest_l1.step < step

    def resumed() -> dict[str, Any] | None:
        last = run.status().get("lastRestore")
        return last if last and last.get("layer") == L0_LAYER else None

    last = eventually(resumed, timeout=90, what="status.lastRestore from l0")
    assert last["step"] >= step, (last, step)
    assert last["attempt"] == 1 and last["time"], last
    assert last["message"] == f"restored step {last['step']} from layer l0", last
    events = eventually(run.restored_events, timeout=30, what="the Restored Event")
    assert f"restored step {last['step']} from layer l0" in events, events
    # No restart of the pod: the same attempt, restarted in place.
    assert run.status()["attempt"] == 1


@pytest.mark.parametrize("operator", ["chart-rbac"], indirect=True)
def test_a_corrupt_l0_checkpoint_is_skipped_told_and_l1_resumed_from(
    cluster: Cluster,
    namespace: str,
    operator: OperatorProcess,
    tmp_path: Path,
    process_nodes: list[str],
) -> None:
    # Three seconds of back-off: time to corrupt L0 between the death and the restart.
    run = L0Run(cluster, namespace, tmp_path, "l0-corrupt", backoff=3)
    run.kill_after_l0_snapshot()
    newest_l1 = find_newest_valid(run.l1).newest
    assert newest_l1 is not None
    corrupted = sorted(
        step
        for entry in run.l0.iterdir()
        if (step := parse_step_dirname(entry.name)) is not None and step >= newest_l1.step
    )
    assert corrupted
    for step in corrupted:
        victim = run.l0 / step_dirname(step) / VICTIM
        victim.write_bytes(flip_a_byte(victim.read_bytes()))

    def resumed() -> dict[str, Any] | None:
        last = run.status().get("lastRestore")
        return last if last and last.get("layer") == L1_LAYER else None

    last = eventually(resumed, timeout=90, what="status.lastRestore from l1")
    assert last["step"] == newest_l1.step, (last, newest_l1.step)
    events = eventually(run.restored_events, timeout=30, what="the Restored Event")
    assert f"restored step {newest_l1.step} from layer l1" in events, events

    def told() -> list[dict[str, Any]] | None:
        found = invalid_checkpoint_events(events_of(cluster, namespace, run.name))
        counts = run.status().get("invalidCheckpoints") or []
        enough = len(found) == len(corrupted) and counts and counts[0]["count"] == len(corrupted)
        return found if enough else None

    events_told = eventually(told, timeout=60, what="an InvalidCheckpoint Event per L0 one")
    for step in corrupted:
        assert any(
            f"layer l0, step {step}, {VICTIM}: {HASH_MISMATCH}" in e["message"] for e in events_told
        ), events_told
    status = run.status()
    assert status["invalidCheckpoints"] == [
        {"layer": L0_LAYER, "attempt": 1, "count": len(corrupted)}
    ]
    last_invalid = status["lastInvalidCheckpoint"]
    assert last_invalid["layer"] == L0_LAYER and last_invalid["step"] in corrupted, last_invalid
    assert (last_invalid["file"], last_invalid["reason"]) == (VICTIM, HASH_MISMATCH), last_invalid
    assert last_invalid["found"] == FoundBy.SCAN and last_invalid["attempt"] == 1, last_invalid
