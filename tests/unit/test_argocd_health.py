"""The Argo CD health check of TrainingRuns, run in gopher-lua as Argo CD runs it.

`hack/build-luahealth.sh` builds the runner (hack/tools/luahealth) from the pinned Go
modules; it evaluates `charts/trainguard/argocd/health.lua` against every fixture listed in
`health_test.yaml` (Argo CD's own test layout) and reports status and message per fixture.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from trainguard.api import TrainingRun
from trainguard.api.constants import ConditionType

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
ARGOCD = REPO / "charts" / "trainguard" / "argocd"
SCRIPT = ARGOCD / "health.lua"
TESTS = ARGOCD / "health_test.yaml"
ARGOCD_CM = ARGOCD / "argocd-cm.yaml"
# Argo CD's key for a custom health check of group trainguard.dev, kind TrainingRun.
HEALTH_KEY = "resource.customizations.health.trainguard.dev_TrainingRun"
MIN_FIXTURES = 10
# A cold build downloads gopher-lua from the module proxy; a warm one only checks the cache.
BUILD_TIMEOUT_SECONDS = 300
RUN_TIMEOUT_SECONDS = 60
ARGOCD_STATUSES = {"Healthy", "Progressing", "Degraded", "Suspended"}


def table() -> list[dict[str, Any]]:
    """The fixtures of health_test.yaml."""
    tests: list[dict[str, Any]] = yaml.safe_load(TESTS.read_text())["tests"]
    return tests


@pytest.fixture(scope="module")
def luahealth() -> Path:
    """The runner, built (or found in the cache) by hack/build-luahealth.sh."""
    built = subprocess.run(
        ["bash", str(REPO / "hack" / "build-luahealth.sh")],
        capture_output=True,
        text=True,
        check=True,
        timeout=BUILD_TIMEOUT_SECONDS,
    )
    return Path(built.stdout.strip().splitlines()[-1])


def run(luahealth: Path, script: Path, tests: Path) -> tuple[int, list[dict[str, Any]]]:
    """The runner's exit status and its result per fixture."""
    done = subprocess.run(
        [str(luahealth), "-script", str(script), "-tests", str(tests)],
        capture_output=True,
        text=True,
        check=False,
        timeout=RUN_TIMEOUT_SECONDS,
    )
    assert done.returncode in (0, 1), done.stderr
    return done.returncode, [json.loads(line) for line in done.stdout.splitlines()]


@pytest.fixture(scope="module")
def results(luahealth: Path) -> dict[str, dict[str, Any]]:
    """The health check's result for every fixture, by input path."""
    _, found = run(luahealth, SCRIPT, TESTS)
    return {r["inputPath"]: r for r in found}


def test_the_table_covers_every_argocd_status() -> None:
    tests = table()
    assert len(tests) >= MIN_FIXTURES
    assert {t["healthStatus"]["status"] for t in tests} == ARGOCD_STATUSES
    assert all(t["healthStatus"]["message"] for t in tests)


@pytest.mark.parametrize("case", table(), ids=lambda case: Path(case["inputPath"]).stem)
def test_health_of_fixture(case: dict[str, Any], results: dict[str, dict[str, Any]]) -> None:
    result = results[case["inputPath"]]
    assert result.get("error") is None
    assert result["actual"] == case["healthStatus"]


@pytest.mark.parametrize("case", table(), ids=lambda case: Path(case["inputPath"]).stem)
def test_fixture_is_a_valid_trainingrun(case: dict[str, Any]) -> None:
    # The fixtures stand for what the apiserver serves: they must parse as the operator's API.
    obj = yaml.safe_load((ARGOCD / case["inputPath"]).read_text())
    TrainingRun.from_object(obj)


def test_script_names_only_known_condition_types() -> None:
    named = set(re.findall(r'(?:holds|find)\(conditions, "(\w+)"\)', SCRIPT.read_text()))
    assert named
    assert named <= {str(t) for t in ConditionType}


def test_argocd_cm_snippet_carries_the_script_verbatim() -> None:
    configmap = yaml.safe_load(ARGOCD_CM.read_text())
    assert configmap["metadata"]["name"] == "argocd-cm"
    assert configmap["data"][HEALTH_KEY] == SCRIPT.read_text(), (
        "copy charts/trainguard/argocd/health.lua into argocd-cm.yaml"
    )


def test_runner_reports_a_mismatch(luahealth: Path, tmp_path: Path) -> None:
    # Guards the guard: a runner that accepted anything would pass every fixture above.
    (tmp_path / "completed.yaml").write_text((ARGOCD / "testdata" / "completed.yaml").read_text())
    wrong = {"healthStatus": {"status": "Degraded", "message": "no"}, "inputPath": "completed.yaml"}
    tests = tmp_path / "health_test.yaml"
    tests.write_text(yaml.safe_dump({"tests": [wrong]}))
    code, found = run(luahealth, SCRIPT, tests)
    assert code == 1
    assert found[0]["ok"] is False
    assert found[0]["actual"]["status"] == "Healthy"


def test_runner_opens_only_the_libraries_argocd_opens(luahealth: Path, tmp_path: Path) -> None:
    # Argo CD runs argocd-cm scripts without the string library: such a script must fail here.
    script = tmp_path / "health.lua"
    script.write_text('return {status = "Healthy", message = string.format("%d", 1)}\n')
    (tmp_path / "run.yaml").write_text((ARGOCD / "testdata" / "completed.yaml").read_text())
    case = {"healthStatus": {"status": "Healthy", "message": "1"}, "inputPath": "run.yaml"}
    tests = tmp_path / "health_test.yaml"
    tests.write_text(yaml.safe_dump({"tests": [case]}))
    code, found = run(luahealth, script, tests)
    assert code == 1
    assert "string" in found[0]["error"]
