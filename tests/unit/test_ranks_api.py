"""Ranks per pod in the API: defaults, the two refusals, the spec hash and the env contract."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError
from run_factory import make_run

from trainguard.api import TrainingRunSpec
from trainguard.api.constants import MAX_NODES
from trainguard.contract import env
from trainguard.contract.env import PodEnv
from trainguard.operator.build.pod import (
    ADDED_DEFAULTS,
    PodInputs,
    pods_env_config,
    spec_hash,
    training_pod,
)
from trainguard_dev.testing.podenv import config_map_data, container_environment

pytestmark = pytest.mark.unit

TRAINER: dict[str, Any] = {"image": "trainer:1", "command": ["python", "train.py"]}
# The spec hashes of the small valid run (`run_factory.make_run`) before ranks were added: a
# pod built then must not look changed to the operator after an upgrade.
HASH_BEFORE_RANKS = "c56e48b7ceebd5b1"
HASH_BEFORE_RANKS_TWO_GPUS = "61bf0da3a8afc981"


def trainer(**fields: Any) -> dict[str, Any]:
    return {"trainer": {**TRAINER, **fields}}


@pytest.mark.parametrize(
    ("fields", "ranks"),
    [
        ({}, 1),  # one GPU by default: one rank
        ({"resources": {"gpus": 4}}, 4),  # omitted: one rank per GPU
        ({"resources": {"gpus": 0}}, 1),  # a CPU-only run: one rank
        ({"resources": {"gpus": 4}, "procsPerNode": 2}, 2),
        ({"resources": {"gpus": 4}, "procsPerNode": 4}, 4),
        ({"resources": {"gpus": 0}, "procsPerNode": 3}, 3),  # CPU ranks are not bounded by GPUs
    ],
)
def test_ranks_per_pod_default_to_the_gpu_count(fields: dict[str, Any], ranks: int) -> None:
    spec = TrainingRunSpec.from_object(trainer(**fields))
    assert spec.trainer.ranks_per_node == ranks
    assert spec.trainer.nodes == 1


def test_more_ranks_than_gpus_is_refused_naming_both_numbers() -> None:
    with pytest.raises(ValidationError) as error:
        TrainingRunSpec.from_object(trainer(resources={"gpus": 2}, procsPerNode=3))
    (detail,) = error.value.errors()
    assert detail["loc"] == ("trainer", "procsPerNode")
    assert "procsPerNode 3 exceeds the GPU count 2" in detail["msg"]


def test_gangs_up_to_the_largest_are_accepted_and_larger_ones_refused() -> None:
    assert TrainingRunSpec.from_object(trainer(nodes=2)).trainer.nodes == 2
    assert TrainingRunSpec.from_object(trainer(nodes=MAX_NODES)).trainer.nodes == MAX_NODES
    with pytest.raises(ValidationError) as error:
        TrainingRunSpec.from_object(trainer(nodes=MAX_NODES + 1))
    (detail,) = error.value.errors()
    assert detail["loc"] == ("trainer", "nodes")
    assert f"nodes {MAX_NODES + 1} exceeds the largest gang, {MAX_NODES} members" in detail["msg"]


def test_the_spec_hash_of_a_run_without_ranks_is_what_it_was_before_them() -> None:
    assert spec_hash(make_run().spec) == HASH_BEFORE_RANKS
    two = {"trainer": {"resources": {"gpus": 2}}}
    assert spec_hash(make_run(two).spec) == HASH_BEFORE_RANKS_TWO_GPUS
    # The apiserver stores the new default (nodes: 1) into every run: the hash is unchanged.
    assert spec_hash(make_run({"trainer": {"nodes": 1}}).spec) == HASH_BEFORE_RANKS
    # A gang is a different spec: its pods are not a one-pod run's.
    assert spec_hash(make_run({"trainer": {"nodes": 2}}).spec) != HASH_BEFORE_RANKS
    assert {path for path, _ in ADDED_DEFAULTS} == {
        ("trainer", "nodes"),
        ("trainer", "procsPerNode"),
    }


def test_setting_ranks_is_a_spec_change() -> None:
    ranks = make_run({"trainer": {"resources": {"gpus": 2}, "procsPerNode": 1}})
    assert spec_hash(ranks.spec) != HASH_BEFORE_RANKS_TWO_GPUS


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({}, "1"),
        ({"resources": {"gpus": 4}}, "4"),
        ({"resources": {"gpus": 4}, "procsPerNode": 2}, "2"),
    ],
)
def test_the_trainer_is_told_its_ranks_per_pod(fields: dict[str, Any], expected: str) -> None:
    run = make_run({"trainer": fields})
    manifest = training_pod(run, PodInputs(1, agent_image="agent:1"))
    (trainer_container,) = manifest["spec"]["containers"]
    config = config_map_data(pods_env_config(run, 1))
    values = container_environment(trainer_container, config)
    assert values[env.PROCS_PER_NODE] == expected
    assert PodEnv.from_env(values).procs_per_node == int(expected)


def test_rank_heartbeats_lie_next_to_the_heartbeat() -> None:
    pod = PodEnv.from_env({env.STATE_DIR: "/s", env.PROCS_PER_NODE: "2"})
    assert [str(p) for p in pod.rank_heartbeats] == ["/s/heartbeat-0.json", "/s/heartbeat-1.json"]
    assert PodEnv.from_env({env.STATE_DIR: "/s"}).rank_heartbeats == ()
    with pytest.raises(env.ContractError, match=env.PROCS_PER_NODE):
        PodEnv.from_env({env.PROCS_PER_NODE: "0"})
