"""The real apiserver rejects every invalid run of the shared table, naming the field."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from api_cases import CASES, Case, base_run
from trainguard.api import TrainingRun

pytestmark = pytest.mark.apiserver

ServerCreate = Callable[[dict[str, Any]], subprocess.CompletedProcess[str]]
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_base_run_is_accepted(server_create: ServerCreate) -> None:
    result = server_create(base_run())
    assert result.returncode == 0, result.stderr


def test_py_spy_false_of_runs_stored_before_its_removal_is_still_accepted(
    server_create: ServerCreate,
) -> None:
    stored = base_run()
    stored["spec"]["monitor"] = {"pySpy": False}
    result = server_create(stored)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["spec"]["monitor"]["pySpy"] is False


@pytest.mark.parametrize("example", ["minimal.yaml", "full.yaml", "multi-gpu.yaml", "gang.yaml"])
def test_examples_are_accepted_and_defaulted_like_the_models(
    server_create: ServerCreate, example: str
) -> None:
    obj = yaml.safe_load((EXAMPLES / example).read_text())
    result = server_create(obj)
    assert result.returncode == 0, result.stderr
    stored = json.loads(result.stdout)
    assert TrainingRun.from_object(stored).spec == TrainingRun.from_object(obj).spec


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.id)
def test_apiserver_rejects(server_create: ServerCreate, case: Case) -> None:
    result = server_create(case.run())
    assert result.returncode != 0, f"accepted: {case.run()}"
    assert case.field in result.stderr, result.stderr
    if case.says is not None:
        assert case.says in result.stderr, result.stderr


@pytest.mark.parametrize(
    ("resources", "procs", "stored_nodes"),
    [({"gpus": 2}, 2, 1), ({"gpus": 0}, 4, 1), ({"gpus": 8}, None, 1)],
    ids=["one-rank-per-gpu", "cpu-ranks", "ranks-omitted"],
)
def test_ranks_within_the_gpu_count_are_accepted_with_one_node(
    server_create: ServerCreate, resources: dict[str, int], procs: int | None, stored_nodes: int
) -> None:
    run = base_run()
    run["spec"]["trainer"]["resources"] = resources
    if procs is not None:
        run["spec"]["trainer"]["procsPerNode"] = procs
    result = server_create(run)
    assert result.returncode == 0, result.stderr
    stored = json.loads(result.stdout)["spec"]["trainer"]
    assert stored["nodes"] == stored_nodes  # the default, as the models have it
    assert stored.get("procsPerNode") == procs
    assert TrainingRun.from_object(json.loads(result.stdout)).spec.trainer.ranks_per_node == (
        procs or max(1, resources["gpus"])
    )
