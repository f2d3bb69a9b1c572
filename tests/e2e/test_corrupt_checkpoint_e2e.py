"""A corrupt L1 checkpoint, end to end: skipped, kept, told by an Event and in the status.

The reference trainer runs on a process-backed node and checkpoints into L1. The test kills
it and, before the supervisor restarts it, flips one byte of the newest L1 checkpoint (its
size unchanged: only a hash can tell). The restarted trainer's harness skips that checkpoint
when it resumes, resumes from the one before and lists the finding in its heartbeat; the agent
tells it once as a Warning Event `InvalidCheckpoint` naming layer, step, file and reason, and
carries it in the Lease, from which the operator writes `status.lastInvalidCheckpoint` and
`status.invalidCheckpoints`. The corrupt checkpoint is never deleted: it stays under its name
or, once the trainer saves its step again, is moved aside (`.invalid-step-<n>-<unique>/`).
What tells the finding is asserted as the real-node tier asserts it (`testing.signals`).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest
from operator_proc import apply, events_of
from recovery_helpers import bound_pod, status_of

from trainguard.api.constants import L1_LAYER, FoundBy
from trainguard.ckpt import scan, step_dirname
from trainguard_dev.cluster.cluster import Cluster
from trainguard_dev.testing.pods import checkpointed, heartbeat, pod_directory, state_dir
from trainguard_dev.testing.polling import eventually
from trainguard_dev.testing.processes import OperatorProcess
from trainguard_dev.testing.runs import make_shards, reference_run
from trainguard_dev.testing.signals import (
    HASH_MISMATCH,
    VICTIM,
    assert_invalid_checkpoint_told,
    flip_a_byte,
    invalid_checkpoint_events,
)

pytest_plugins = ("operator_fixtures",)
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

RUN = "corrupt"
EVERY_STEPS = 10
L1_VOLUME = "l1"


@pytest.mark.parametrize("operator", ["chart-rbac"], indirect=True)
def test_a_corrupt_l1_checkpoint_is_skipped_kept_and_told(
    cluster: Cluster,
    namespace: str,
    operator: OperatorProcess,
    tmp_path: Path,
    process_nodes: list[str],
) -> None:
    shards = make_shards(tmp_path / "shards")
    spec = {
        "monitor": {"startupGraceSeconds": 5},
        # keep-last-3: the checkpoint before the corrupt one is still there to resume from.
        "checkpoints": {"everySteps": EVERY_STEPS, "l1": {"keepLast": 3}},
        "recovery": {"backoff": {"initialSeconds": 1, "maxSeconds": 2}},
    }
    apply(cluster, namespace, reference_run(RUN, shards, EVERY_STEPS, spec))
    pod = eventually(lambda: bound_pod(cluster, namespace, RUN), what="pod bound")
    state = state_dir(cluster.root, pod)
    l1 = pod_directory(cluster.root, pod) / "volumes" / L1_VOLUME
    eventually(lambda: checkpointed(state, 2 * EVERY_STEPS), timeout=120, what="two checkpoints")

    beat = heartbeat(state)
    assert beat is not None
    os.kill(int(beat["pid"]), signal.SIGKILL)
    # Nothing writes L1 until the supervisor's restart (its back-off is a second at least).
    newest = scan(l1, check_hashes=False).valid[-1]
    assert newest.step is not None
    (newest.path / VICTIM).write_bytes(flip_a_byte((newest.path / VICTIM).read_bytes()))
    step = newest.step

    def told() -> dict[str, Any] | None:
        last = status_of(cluster, namespace, RUN).get("lastInvalidCheckpoint")
        return last if last and last.get("step") == step else None

    def warnings() -> list[dict[str, Any]]:
        return invalid_checkpoint_events(events_of(cluster, namespace, RUN))

    eventually(told, timeout=90, what=f"status.lastInvalidCheckpoint of step {step}")
    events = eventually(warnings, timeout=30, what="the InvalidCheckpoint Event")
    assert_invalid_checkpoint_told(
        status_of(cluster, namespace, RUN),
        events,
        layer=L1_LAYER,
        step=step,
        file=VICTIM,
        reason=HASH_MISMATCH,
        found=FoundBy.SCAN,
        attempt=1,
    )

    # The restarted trainer resumed from the checkpoint before and trains on.
    def trained_past() -> dict[str, Any] | None:
        now = heartbeat(state)
        fresh = now is not None and now["pid"] != beat["pid"] and (now.get("step") or 0) > step
        return now if fresh else None

    eventually(trained_past, timeout=90, what="training past the corrupt checkpoint's step")
    # Kept: under its name, or moved aside when its step was saved again.
    aside = list(l1.glob(f".invalid-{step_dirname(step)}-*"))
    in_place = [v.step for v in scan(l1).invalid]
    assert aside or step in in_place, sorted(p.name for p in l1.iterdir())
    # Told once, however often the heartbeat lists it.
    assert len(warnings()) == 1
