"""The invalid-run table, rejected by the pydantic models at the field the apiserver names."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from api_cases import CASES, Case, base_run, names_field, pydantic_errors
from trainguard.api import TrainingRun

pytestmark = pytest.mark.unit

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_table_is_large_and_unique() -> None:
    assert len(CASES) >= 30
    assert len({case.id for case in CASES}) == len(CASES)


def test_base_run_is_valid() -> None:
    assert pydantic_errors(base_run()) == []


def test_py_spy_false_of_runs_stored_before_its_removal_is_still_valid() -> None:
    stored = base_run()
    stored["spec"]["monitor"] = {"pySpy": False}
    assert pydantic_errors(stored) == []


@pytest.mark.parametrize("example", ["minimal.yaml", "full.yaml", "multi-gpu.yaml", "gang.yaml"])
def test_examples_are_valid(example: str) -> None:
    assert pydantic_errors(yaml.safe_load((EXAMPLES / example).read_text())) == []


def test_full_example_uses_every_layer_kind() -> None:
    run = TrainingRun.from_object(yaml.safe_load((EXAMPLES / "full.yaml").read_text()))
    schemes = {layer.uri.split("://", 1)[0] for layer in run.spec.checkpoints.remote}
    assert schemes == {"file", "s3", "hf", "ssh"}


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.id)
def test_pydantic_rejects(case: Case) -> None:
    errors = pydantic_errors(case.run())
    at_field = [message for path, message in errors if names_field(path, case.field)]
    assert at_field, f"no error at {case.field}: {errors}"
    if case.says is not None:
        assert any(case.says in message for message in at_field), at_field
