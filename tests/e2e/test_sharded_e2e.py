"""Sharded checkpoints end to end: one rank's corrupt shard makes the whole checkpoint invalid.

The reference trainer runs fully sharded (`--sharded`: FSDP2 over 2 ranks, gloo on CPU,
`procsPerNode: 2`) on a process-backed node: every rank saves its shard of each checkpoint
into one global checkpoint (`rank-<k>/` files, the global manifest written last by rank 0).
One byte of rank 1's shard of the newest checkpoint is flipped, then the run restores:

- in place: rank 1 is SIGKILLed and the byte flipped in L1 before the supervisor restarts the
  ranks; the harness of the restarted ranks skips that checkpoint as a whole;
- across pods: the node goes down after the newest checkpoint was shipped to the run's
  `file://` layer and the byte is flipped there; the operator moves the run to another node
  and its `restore` init step skips that checkpoint as a whole.

Either way no rank resumes from the corrupt checkpoint (rank 0's intact shard of it is not
used): both ranks resume from the previous global checkpoint, the same step on each; the
finding is told like any invalid checkpoint's (status.lastInvalidCheckpoint, the per-layer
count in status.invalidCheckpoints, one Warning Event `InvalidCheckpoint` naming the file and
its rank), and the corrupt checkpoint is kept.
"""

from __future__ import annotations

import os
import re
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from operator_proc import apply, events_of, get_json
from recovery_helpers import bound_pod, status_of

from trainguard.api.constants import L1_LAYER, FoundBy
from trainguard.ckpt import FileEntry, Verification, scan, step_dirname, verify
from trainguard.contract.env import PodEnv, lease_name
from trainguard.contract.files import read_json, read_rank_pids
from trainguard.operator.k8s.leases import lease_view
from trainguard.operator.policies.fencing import reported_step
from trainguard_dev.cluster.cluster import Cluster
from trainguard_dev.cluster.procnode import DOWN_FILENAME, claim_dir, pod_processes, shared_claim
from trainguard_dev.demo.env import create_claim
from trainguard_dev.testing.pods import (
    checkpointed,
    pod_directory,
    state_dir,
)
from trainguard_dev.testing.polling import eventually
from trainguard_dev.testing.processes import OperatorProcess
from trainguard_dev.testing.runs import (
    REFERENCE_MIN_STEP_SECONDS,
    REFERENCE_STEPS,
    make_shards,
    merge,
    reference_command,
    reference_run,
)
from trainguard_dev.testing.signals import (
    HASH_MISMATCH,
    assert_invalid_checkpoint_told,
    flip_a_byte,
    invalid_checkpoint_events,
)
from trainguard_harness.launcher import ended

pytest_plugins = ("operator_fixtures",)
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]

EVERY_STEPS = 10
RANKS = 2
L1_VOLUME = "l1"
LAYER = "backup"
CLAIM = "sharded-backup"
# Each start imports torch three times (the launcher and two ranks) on 2 loaded cores.
START_S = 120
# How the verification of a sharded checkpoint names the rank of a bad file.
RANK_1_MISMATCH = f"{HASH_MISMATCH} (rank 1 of {RANKS})"


def sharded_run(name: str, shards: Path, spec: dict[str, Any] | None = None) -> dict[str, Any]:
    """The reference trainer, sharded over 2 ranks on 2 simulated GPUs."""
    command = [*reference_command(REFERENCE_STEPS, REFERENCE_MIN_STEP_SECONDS), "--sharded"]
    base = {
        "trainer": {"command": command, "resources": {"gpus": RANKS}, "procsPerNode": RANKS},
        "monitor": {"startupGraceSeconds": 5},
        "recovery": {"backoff": {"initialSeconds": 1, "maxSeconds": 2}},
    }
    return reference_run(name, shards, EVERY_STEPS, merge(base, spec or {}))


def training(state: Path, step: int) -> dict[int, int] | None:
    """Both ranks' PIDs once both train and the run has saved a checkpoint at or past `step`."""
    pod = PodEnv(state_dir=state, procs_per_node=RANKS)
    ranks = read_rank_pids(pod.supervisor_file)
    if len(ranks) != RANKS or not checkpointed(state, step):
        return None
    beats = [read_json(pod.rank_heartbeat(rank)) for rank in range(RANKS)]
    own = all(b is not None and b["pid"] == ranks[r] and b["step"] for r, b in enumerate(beats))
    return ranks if own else None


def resumed(trainer_log: Path) -> list[tuple[str, int, str]]:
    """(rank, step, layer) of every resume the ranks logged."""
    text = trainer_log.read_text() if trainer_log.exists() else ""
    found = re.findall(r"rank (\d) resumed from \S*step-(\d{8}) \(layer (\w+)\)", text)
    return sorted((rank, int(step), layer) for rank, step, layer in found)


def rank1_shard(checkpoint: Verification) -> FileEntry:
    """The file rank 1 wrote into a global checkpoint of both ranks' shards."""
    manifest = checkpoint.manifest
    assert manifest is not None and manifest.world_size == RANKS, checkpoint.path
    assert {entry.rank for entry in manifest.files} == {None, 0, 1}, manifest.files
    return next(entry for entry in manifest.files if entry.rank == 1)


def corrupt(checkpoint: Verification) -> FileEntry:
    """Flip one byte of rank 1's shard of `checkpoint` (its size unchanged); that file."""
    victim = rank1_shard(checkpoint)
    path = checkpoint.path / victim.path
    path.write_bytes(flip_a_byte(path.read_bytes()))
    return victim


def test_a_corrupt_rank_shard_in_l1_is_skipped_as_a_whole_by_a_restart_in_place(
    cluster: Cluster,
    namespace: str,
    operator: OperatorProcess,
    tmp_path: Path,
    process_nodes: list[str],
) -> None:
    name = "sharded"
    apply(cluster, namespace, sharded_run(name, make_shards(tmp_path / "shards")))
    pod = eventually(lambda: bound_pod(cluster, namespace, name), what="the pod bound")
    state = state_dir(cluster.root, pod)
    l1 = pod_directory(cluster.root, pod) / "volumes" / L1_VOLUME
    log = pod_directory(cluster.root, pod) / "trainer.log"
    first = eventually(
        lambda: training(state, 2 * EVERY_STEPS), START_S, "both ranks past two checkpoints", 0.1
    )
    assert resumed(log) == []  # a fresh start

    os.kill(first[1], signal.SIGKILL)
    # Once the ranks of the first launch are gone nothing writes L1 until the supervisor's
    # restart (its back-off is a second at least, then torch is imported three times).
    eventually(lambda: all(ended(pid)[0] for pid in first.values()), 60, "the first launch gone")
    *_, previous, newest = scan(l1, check_hashes=False).valid
    victim = corrupt(newest)
    step, before = newest.step, previous.step
    assert step is not None and before is not None

    # The restarted ranks skip the newest as a whole: both resume from the one before.
    both = eventually(lambda: len(resumed(log)) == RANKS and resumed(log), START_S, "both resumed")
    assert both == [(str(rank), before, L1_LAYER) for rank in range(RANKS)], both

    def told() -> dict[str, Any] | None:
        last = status_of(cluster, namespace, name).get("lastInvalidCheckpoint")
        return last if last and last.get("step") == step else None

    def warnings() -> list[dict[str, Any]]:
        return invalid_checkpoint_events(events_of(cluster, namespace, name))

    eventually(told, timeout=90, what=f"status.lastInvalidCheckpoint of step {step}")
    events = eventually(warnings, timeout=30, what="the InvalidCheckpoint Event")
    assert_invalid_checkpoint_told(
        status_of(cluster, namespace, name),
        events,
        layer=L1_LAYER,
        step=step,
        file=victim.path,
        reason=RANK_1_MISMATCH,
        found=FoundBy.SCAN,
        attempt=1,
    )
    # In place: attempt 1 trains on past the corrupt checkpoint's step.
    eventually(lambda: training(state, step + EVERY_STEPS), START_S, "training past it", 0.1)
    assert status_of(cluster, namespace, name).get("attempt") == 1
    # Kept, whole: moved aside when its step was saved again (or still under its name).
    kept = [
        *l1.glob(f".invalid-{step_dirname(step)}-*"),
        *(v.path for v in scan(l1).invalid),
    ]
    assert len(kept) == 1, sorted(p.name for p in l1.iterdir())
    problems = verify(kept[0]).problems
    assert [(p.file, p.reason) for p in problems] == [(victim.path, RANK_1_MISMATCH)]
    assert len(warnings()) == 1


@pytest.fixture
def backup_volume(cluster: Cluster, namespace: str) -> Iterator[Path]:
    """The remote layer's claim, on a volume every node reaches; its directory."""
    create_claim(cluster, namespace, CLAIM)
    try:
        yield claim_dir(cluster.root, namespace, CLAIM)
    finally:
        volume = shared_claim(cluster.root, namespace, CLAIM)[0]["metadata"]["name"]
        cluster.kubectl("delete", "pv", volume, "--wait=false", check=False)


def test_a_corrupt_rank_shard_on_the_remote_layer_is_skipped_as_a_whole_by_the_restore_step(
    cluster: Cluster,
    namespace: str,
    operator: OperatorProcess,
    tmp_path: Path,
    process_nodes: list[str],
    backup_volume: Path,
) -> None:
    name = "sharded-moved"
    backup = Path("/backup") / name
    layer = {"name": LAYER, "uri": f"file://{backup}", "claimName": CLAIM, "keep": 3}
    run = sharded_run(name, make_shards(tmp_path / "shards"), {"checkpoints": {"remote": [layer]}})
    apply(cluster, namespace, run)
    pod = eventually(lambda: bound_pod(cluster, namespace, name), what="the pod bound")
    lost = str(pod["spec"]["nodeName"])
    state = state_dir(cluster.root, pod)

    def shipped() -> int | None:
        entries = status_of(cluster, namespace, name).get("checkpoints") or []
        step = next((e.get("step") for e in entries if e.get("layer") == LAYER), None)
        return step if step and step >= 2 * EVERY_STEPS else None

    eventually(lambda: training(state, 2 * EVERY_STEPS), START_S, "both ranks training", 0.1)
    eventually(shipped, 60, "two checkpoints shipped", 0.2)

    # The node vanishes with every process of the pod: no final save, no flush.
    (cluster.root / "procnodes" / lost / DOWN_FILENAME).touch()
    uid = str(pod["metadata"]["uid"])
    eventually(lambda: not pod_processes(uid), 30, "every process of the pod gone", 0.1)
    # The newest checkpoint the next attempt may restore: the newest its agent reported
    # shipped (the fence; anything shipped after its last report is never restored).
    lease = get_json(cluster, "lease", lease_name(name), "-n", namespace)
    fence = reported_step(lease_view(lease), name, 1)
    assert fence is not None
    # The layer keeps each attempt's checkpoints under run-<uid>/attempt-<k>/.
    copies = {
        checkpoint.step: checkpoint
        for attempt in backup_volume.glob("run-*/attempt-1")
        for checkpoint in scan(attempt, check_hashes=False).valid
        if checkpoint.step is not None
    }
    assert fence in copies, (fence, sorted(copies))
    previous = max(step for step in copies if step < fence)
    victim = corrupt(copies[fence])

    moved = eventually(lambda: bound_pod(cluster, namespace, name, attempt=2), 120, "attempt 2")
    assert moved["spec"]["nodeName"] != lost
    log = pod_directory(cluster.root, moved) / "trainer.log"
    both = eventually(lambda: len(resumed(log)) == RANKS and resumed(log), START_S, "both resumed")
    # The restore step brought the previous global checkpoint into the new pod's L1.
    assert both == [(str(rank), previous, L1_LAYER) for rank in range(RANKS)], both

    def told() -> dict[str, Any] | None:
        last = status_of(cluster, namespace, name).get("lastInvalidCheckpoint")
        return last if last and last.get("step") == fence else None

    def warnings() -> list[dict[str, Any]]:
        return invalid_checkpoint_events(events_of(cluster, namespace, name))

    eventually(told, timeout=90, what=f"status.lastInvalidCheckpoint of step {fence}")
    events = eventually(warnings, timeout=30, what="the InvalidCheckpoint Event")
    status = status_of(cluster, namespace, name)
    assert_invalid_checkpoint_told(
        status,
        events,
        layer=LAYER,
        step=fence,
        file=victim.path,
        reason=RANK_1_MISMATCH,
        found=FoundBy.RESTORE,
        attempt=2,
    )

    def restored() -> dict[str, Any] | None:
        last = status_of(cluster, namespace, name).get("lastRestore") or {}
        return last if last.get("attempt") == 2 else None

    restore = eventually(restored, timeout=60, what="status.lastRestore of attempt 2")
    assert (restore["layer"], restore["step"]) == (LAYER, previous), restore
    # Kept on the layer, whole, as it was found.
    problems = verify(copies[fence].path).problems
    assert [(p.file, p.reason) for p in problems] == [(victim.path, RANK_1_MISMATCH)]
