"""A gang of two members of two ranks: DDP on CPU (gloo), one world of four ranks.

Each member is a real supervisor (`trainguard supervise`) with its own state directory and L1,
as two pods would have; they learn their place from the pod contract (TRAINGUARD_NNODES,
NODE_RANK, MASTER_ADDR, MASTER_PORT) and start their ranks through PyTorch's launcher, whose
static rendezvous member 0 hosts. Only global rank 0 saves, in member 0's L1; member 1's ranks
resume from rank 0's checkpoint, sent to them over the process group.

SIGKILL of one rank on member 1: member 1's launcher ends its other rank, member 0's ranks fail
at their next collective, both supervisors restart their ranks in place, and all four resume
from the same verified step; every loss logged matches the uninterrupted gang's.

Member 1 frozen as if its node vanished (every process of it stopped): member 0's ranks block in
their next collective and nothing fails. The gang's restart generation is raised (the order
written into member 0's `gang.json`, as its agent would after the operator replaced member 1):
member 0's supervisor ends its launch at once and relaunches, a fresh member 1 (the replacement
pod) starts on that generation, and all four ranks resume from one step with the uninterrupted
gang's losses.

The uninterrupted gang runs once for the module (`reference`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from harness_helpers import trainer_command, trainer_env

from trainguard.ckpt import find_newest_valid
from trainguard.contract import env
from trainguard.contract.env import PodEnv
from trainguard.contract.files import (
    RankFailure,
    read_json,
    read_rank_failure,
    read_rank_pids,
    read_supervised_child,
    write_gang_order,
)
from trainguard_dev.testing.polling import eventually, holds
from trainguard_harness import heartbeat as hb
from trainguard_harness.launcher import ended
from trainguard_harness.sharded import PROBE_PREFIX

pytestmark = [pytest.mark.unit, pytest.mark.timeout(600)]
# The generation each member's agent copies into gang.json at its first renewal.
FIRST_GENERATION = 0

MEMBERS = 2
RANKS = 2  # per member
STEPS = 40
EVERY = 5
# Generous for two cores under load: six processes import torch at every start.
START_S = 180
# What a rank of a sharded session spanning pods says (trainguard_harness.sharded).
REFUSAL = "sharded checkpoints need every rank in one pod"


def free_port() -> int:
    """A port free now, for member 0's rendezvous (every member must know it beforehand)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def losses(path: Path) -> list[tuple[int, float]]:
    return [
        (record["step"], record["loss"])
        for record in map(json.loads, path.read_text().splitlines())
    ]


class Gang:
    """The supervisors of the gang's members, each as its pod would run it."""

    def __init__(
        self, root: Path, data_dir: Path, port: int, *trainer_args: str, l1: Path | None = None
    ) -> None:
        """`l1`: one L1 every member mounts (default: each member's own, as on its node)."""
        self.root = root
        self.data_dir = data_dir
        self.port = port
        self.trainer_args = trainer_args
        self.l1 = l1
        self.loss_log = root / "loss.jsonl"
        self.members: list[subprocess.Popen[str]] = []
        self.pods: list[PodEnv] = []
        self.homes: list[Path] = []
        for member in range(MEMBERS):
            self.start(member, root / f"member-{member}", FIRST_GENERATION)

    def start(self, member: int, home: Path, generation: int) -> None:
        """Start member `member`'s supervisor in `home`, its pod's (a replacement's: a new one).

        Its state directory holds the gang's order (`gang.json`) as the pod's agent left it.
        """
        (home / "state").mkdir(parents=True)
        contract = {
            env.STATE_DIR: str(home / "state"),
            env.PROCS_PER_NODE: str(RANKS),
            env.NNODES: str(MEMBERS),
            env.NODE_RANK: str(member),
            env.MASTER_ADDR: "127.0.0.1",
            env.MASTER_PORT: str(self.port),
        }
        pod = PodEnv.from_env(contract)
        write_gang_order(pod.gang_file, generation)
        environ = {**trainer_env(home), **contract, "PYTHONUNBUFFERED": "1"}
        if self.l1 is not None:
            environ[env.L1_DIR] = str(self.l1)
        common = (
            "--steps", str(STEPS), "--ckpt-every-steps", str(EVERY), "--keep-last", "3",
            "--min-step-seconds", "0.05", "--loss-log", str(self.loss_log), *self.trainer_args,
        )  # fmt: skip
        command = [
            sys.executable, "-m", "trainguard.cli.main", "supervise", "--no-gpu",
            "--backoff", "0.2", "--",
            *trainer_command(self.data_dir, *common),
        ]  # fmt: skip
        with (home / "output.log").open("w") as output:
            process = subprocess.Popen(
                command, env=environ, stdout=output, stderr=subprocess.STDOUT, text=True
            )
        if member < len(self.members):
            self.members[member], self.pods[member], self.homes[member] = process, pod, home
        else:
            self.members.append(process)
            self.pods.append(pod)
            self.homes.append(home)

    def output(self, member: int) -> str:
        return (self.homes[member] / "output.log").read_text()

    def state(self, member: int) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(self.pods[member].supervisor_file.read_text())
        return data

    def alive(self) -> None:
        for member, process in enumerate(self.members):
            assert process.poll() is None, self.output(member)[-4000:]

    def ranks(self, member: int) -> dict[int, int]:
        return read_rank_pids(self.pods[member].supervisor_file)

    def beat(self, member: int, rank: int) -> dict[str, Any] | None:
        return read_json(self.pods[member].rank_heartbeat(rank))

    def training(self, ranks: list[dict[int, int]]) -> bool:
        """Whether every rank of these launches (member -> rank -> PID) has written a step."""
        return all(
            (beat := self.beat(m, r)) is not None and beat[hb.PID] == ranks[m][r] and beat[hb.STEP]
            for m in range(MEMBERS)
            for r in range(RANKS)
        )

    def finish(self) -> None:
        try:
            for process in self.members:
                process.wait(timeout=2 * START_S)
        finally:
            self.kill()
        for member, process in enumerate(self.members):
            assert process.returncode == 0, self.output(member)[-4000:]

    def kill(self) -> None:
        """End every supervisor, and the launcher and ranks a killed one leaves behind."""
        for member, process in enumerate(self.members):
            if process.poll() is None:
                process.kill()
                process.wait(10)
                state = read_json(self.pods[member].supervisor_file) or {}
                launch = [state.get("child_pid"), *(state.get("rank_pids") or {}).values()]
                for pid in launch:  # each in a session of its own
                    if isinstance(pid, int) and pid > 0:
                        with contextlib.suppress(ProcessLookupError):
                            os.killpg(pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def reference(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[int, float]:
    """The uninterrupted gang's loss at every step."""
    gang = Gang(tmp_path_factory.mktemp("reference"), data_dir, free_port())
    gang.finish()
    logged = dict(losses(gang.loss_log))
    assert sorted(logged) == list(range(1, STEPS + 1))
    return logged


def past_a_checkpoint(gang: Gang) -> dict[int, int] | None:
    """Member 1's ranks once every rank of the gang is a step past a checkpoint (from step 10)."""
    gang.alive()
    ranks = [gang.ranks(member) for member in range(MEMBERS)]
    beats = [gang.beat(m, r) for m in range(MEMBERS) for r in range(RANKS)]
    if any(len(r) != RANKS for r in ranks) or any(b is None for b in beats):
        return None
    steps = [b[hb.STEP] or 0 for b in beats if b]
    saved = beats[0][hb.LAST_CHECKPOINT_STEP] if beats[0] else None
    # Past it by a step: heartbeats are written at most once a second (a narrower window can be
    # missed until the run ends).
    past = saved is not None and saved >= 2 * EVERY and min(steps) > saved
    return ranks[1] if past else None


def assert_resumed_together(gang: Gang, reference: dict[int, float]) -> None:
    """All four ranks resumed from one verified step, with the uninterrupted gang's losses."""
    # The newest verified checkpoint of member 0 at the death (its L0, the memory layer its
    # supervisor keeps, or its L1); member 1's came from rank 0.
    resumed: dict[str, str] = {}
    for member in range(MEMBERS):
        resumed.update(re.findall(r"rank (\d) resumed from \S*step-(\d{8})", gang.output(member)))
    assert set(resumed) == {"0", "1", "2", "3"}, resumed
    assert len(set(resumed.values())) == 1, resumed
    step = int(resumed["0"])
    assert step >= 2 * EVERY
    for home in gang.homes[1:]:
        assert not list((home / "l1").glob("step-*"))
    # Every loss logged before the resume is the uninterrupted gang's, bit for bit; after it,
    # the same to float rounding. With four ranks the ring all-reduce adds each gradient
    # element in an order set by DDP's bucket layout, which DDP rebuilds after its first step:
    # a restarted trainer's first step runs on the initial layout, the uninterrupted run's
    # did at step 1 (with two ranks every order gives the same bits, `test_ranks.py`). A resume
    # from any other step, or with any other state, differs by orders of magnitude more.
    logged = losses(gang.loss_log)
    assert all(loss == reference[s] for s, loss in logged if s <= step)
    assert all(loss == pytest.approx(reference[s], rel=1e-5) for s, loss in logged)
    steps = [s for s, _ in logged]
    k = next((i for i in range(1, len(steps)) if steps[i] != steps[i - 1] + 1), step)
    assert steps[:k] == list(range(1, k + 1)) and k >= step
    assert steps[k:] == list(range(step + 1, STEPS + 1))


def test_a_gang_of_two_members_resumes_together_from_one_step_after_a_rank_dies(
    reference: dict[int, float], data_dir: Path, tmp_path: Path
) -> None:
    gang = Gang(tmp_path / "b", data_dir, free_port())
    try:
        first = eventually(
            lambda: past_a_checkpoint(gang), START_S, "every rank past a checkpoint", 0.05
        )
        before = [gang.ranks(member) for member in range(MEMBERS)]
        os.kill(first[1], signal.SIGKILL)  # member 1's local rank 1: global rank 3

        def restarted() -> list[dict[int, int]] | None:
            gang.alive()
            now = [gang.ranks(member) for member in range(MEMBERS)]
            new = all(
                len(ranks) == RANKS and not set(ranks.values()) & set(old.values())
                for ranks, old in zip(now, before, strict=True)
            )
            return now if new else None

        second = eventually(restarted, START_S, "every member's ranks restarted", 0.05)
        failure = read_rank_failure(gang.pods[1].supervisor_file)
        assert failure == RankFailure(rank=1, pid=first[1], signal="SIGKILL")

        eventually(lambda: gang.training(second), START_S, "every restarted rank training", 0.05)
        gang.finish()
    finally:
        gang.kill()

    # Both members restarted their ranks in place, once each, each for its own failure: the
    # relaunch follows the next generation (the one the operator then orders, restarting
    # nobody a second time).
    for member in range(MEMBERS):
        state = gang.state(member)
        assert len(state["history"]) == 2, state["history"]
        assert (state["gang_generation"], state["failed_generation"]) == (1, 0)
        assert state["last_gang_restart"] is None
    assert_resumed_together(gang, reference)


def test_a_member_blocked_by_a_vanished_peer_restarts_at_once_on_the_gangs_order(
    reference: dict[int, float], data_dir: Path, tmp_path: Path
) -> None:
    gang = Gang(tmp_path / "b", data_dir, free_port())
    frozen: list[int] = []  # process groups (launcher, ranks) of member 1, stopped

    def kill_frozen() -> None:
        for group in frozen:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, signal.SIGKILL)

    try:
        eventually(lambda: past_a_checkpoint(gang), START_S, "every rank past a checkpoint", 0.05)
        # Member 1's node vanishes: its supervisor, launcher and ranks all stop at once.
        supervisor = gang.members[1]
        launcher = read_supervised_child(gang.pods[1].supervisor_file)
        assert launcher is not None
        frozen += [launcher, *gang.ranks(1).values()]
        supervisor.send_signal(signal.SIGSTOP)
        for group in frozen:
            os.killpg(group, signal.SIGSTOP)
        before = gang.ranks(0)
        counted = gang.state(0)["restarts_without_progress"]
        # Member 0's ranks wait in their next collective: nothing fails, nothing restarts.
        holds(
            lambda: gang.ranks(0) == before and gang.state(0)["restarts"] == 0,
            3.0,
            "member 0 blocked, not restarted",
            0.1,
        )
        # The operator replaces member 1 and raises the gang's generation; member 0's agent
        # copies the order next to its supervisor.
        ordered_at = time.time()
        write_gang_order(gang.pods[0].gang_file, FIRST_GENERATION + 1)

        restart: dict[str, Any] = eventually(
            lambda: gang.state(0)["last_gang_restart"], 10, "member 0's launch ended", 0.05
        )
        assert (restart["generation"], restart["from"]) == (1, 0)
        assert restart["killed_at"] - ordered_at < 5
        # Relaunched at once (published with the new launcher), its old ranks gone before.
        eventually(
            lambda: gang.state(0)["attempt"] == 2 and gang.state(0)["child_pid"],
            15,
            "member 0 relaunched",
            0.05,
        )
        assert all(ended(pid)[0] for pid in before.values())
        state = gang.state(0)
        assert state["history"][1]["started_at"] - restart["killed_at"] < 15
        assert state["gang_generation"] == 1 and state["failed_generation"] == 0
        assert state["restarts_without_progress"] == counted and state["backoff_restarts"] == 0
        assert state["rank_failure"] is None
        # The vanished member is gone for good; its replacement starts on the gang's
        # generation, which its agent wrote at its first renewal.
        supervisor.kill()
        supervisor.wait(10)
        kill_frozen()
        gang.start(1, tmp_path / "b" / "member-1-replacement", FIRST_GENERATION + 1)

        def relaunched() -> list[dict[int, int]] | None:
            gang.alive()
            now = [gang.ranks(member) for member in range(MEMBERS)]
            return now if all(len(ranks) == RANKS for ranks in now) else None

        second = eventually(relaunched, START_S, "both members' ranks running", 0.05)
        assert not set(second[0].values()) & set(before.values())

        eventually(lambda: gang.training(second), START_S, "every relaunched rank training", 0.05)
        gang.finish()
    finally:
        gang.kill()
        kill_frozen()

    first, replacement = gang.state(0), gang.state(1)
    assert len(first["history"]) == 2 and first["restarts"] == 1
    assert (first["gang_generation"], first["failed_generation"]) == (1, 0)
    assert first["restarts_without_progress"] == 0
    # The replacement followed generation 1 from its start: no restart of its own.
    assert replacement["restarts"] == 0 and len(replacement["history"]) == 1
    assert replacement["gang_generation"] == 1 and replacement["failed_generation"] is None
    assert_resumed_together(gang, reference)


def test_a_sharded_gang_across_members_is_refused_before_it_trains(
    data_dir: Path, tmp_path: Path
) -> None:
    """FSDP over two members, each with its own L1 (its node's): refused before any step.

    Rank 0 cannot gather or verify the other member's shards, so every save would fail: every
    rank stops when its `ShardedSession` is built, naming the ways out (no checkpoint, no
    loss, in either member's L1).
    """
    gang = Gang(tmp_path, data_dir, free_port(), "--sharded")
    try:
        for member in range(MEMBERS):
            eventually(
                lambda member=member: gang.output(member).count(REFUSAL) >= RANKS,  # type: ignore[misc]
                START_S,
                f"member {member}'s ranks refusing",
                0.2,
            )
    finally:
        gang.kill()
    output = gang.output(0)
    assert "these 4 ranks run in 2 pods (2 each" in output, output[-4000:]
    assert "spec.trainer.nodes: 1" in output and "TrainingSession" in output
    for home in gang.homes:
        assert not list((home / "l1").glob("*")), list((home / "l1").iterdir())
    assert not gang.loss_log.exists() or not gang.loss_log.read_text().strip()


def test_a_sharded_gang_whose_members_mount_one_l1_trains_and_saves(
    data_dir: Path, tmp_path: Path
) -> None:
    """FSDP over two members that mount one L1: not refused; every checkpoint has 4 shards."""
    shared = tmp_path / "shared-l1"
    gang = Gang(tmp_path, data_dir, free_port(), "--sharded", l1=shared)
    try:
        gang.finish()
    finally:
        gang.kill()
    assert REFUSAL not in gang.output(0) + gang.output(1)
    assert sorted(step for step, _ in losses(gang.loss_log)) == list(range(1, STEPS + 1))
    newest = find_newest_valid(shared).newest
    assert newest is not None and newest.step == STEPS and newest.manifest is not None
    assert newest.manifest.world_size == MEMBERS * RANKS
    assert {entry.rank for entry in newest.manifest.files} == {None, *range(MEMBERS * RANKS)}
    assert not list(shared.glob(f"{PROBE_PREFIX}*"))  # the probe is gone
