"""The Argo CD health check of TrainingRuns, run in gopher-lua as Argo CD runs it.

`hack/build-luahealth.sh` builds the runner (hack/tools/luahealth) from the pinned Go
modules; it evaluates `charts/trainguard/argocd/health.lua` against every fixture listed in
`health_test.yaml` (Argo CD's own test layout) and reports status and message per fixture.

The fixtures are statuses the operator wrote in e2e runs (`hack/record-argocd-fixtures.sh`);
each expectation is the rule of docs/argocd.md that decides the run (`RULES` of
`trainguard_dev.argocd_fixtures`). The generator itself is tested here on a recording made
from the operator's own status code, cycle by cycle.
"""

from __future__ import annotations

import json
import re
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from trainguard.api import TrainingRun, TrainingRunStatus
from trainguard.api.constants import ConditionType, Phase
from trainguard.operator.build.constants import FIELD_MANAGER
from trainguard.operator.build.pod import spec_hash
from trainguard.operator.conditions import advance, derive_phase
from trainguard.operator.policies import failures, ladder, lifecycle
from trainguard.operator.policies.failures import Found
from trainguard.operator.policies.ladder import Failure
from trainguard.operator.policies.lifecycle import PodView
from trainguard_dev import argocd_fixtures
from trainguard_dev.argocd_fixtures import (
    KEPT_METADATA,
    RULES,
    Fact,
    GenerationError,
    Rule,
    continues_after_repeated_failure,
    deciding,
    expected,
    generate,
    holds,
)
from trainguard_dev.testing.runs import merge, training_run
from trainguard_dev.testing.statuses import RECORDED_DURING, write_record

pytestmark = pytest.mark.unit

Obj = dict[str, Any]

REPO = Path(__file__).resolve().parents[2]
ARGOCD = REPO / "charts" / "trainguard" / "argocd"
SCRIPT = ARGOCD / "health.lua"
TESTS = ARGOCD / "health_test.yaml"
ARGOCD_CM = ARGOCD / "argocd-cm.yaml"
DOC = REPO / "docs" / "argocd.md"
# Argo CD's key for a custom health check of group trainguard.dev, kind TrainingRun.
HEALTH_KEY = "resource.customizations.health.trainguard.dev_TrainingRun"
MIN_FIXTURES = 10
# A cold build downloads gopher-lua from the module proxy; a warm one only checks the cache.
BUILD_TIMEOUT_SECONDS = 300
RUN_TIMEOUT_SECONDS = 60
ARGOCD_STATUSES = {"Healthy", "Progressing", "Degraded", "Suspended"}
# The rows of health.lua's rule list: {"<condition type>", "<status>", "<health>"}.
LUA_RULE = re.compile(r'^\s*\{"(\w+)", "(True|False)", "(\w+)"\},', re.MULTILINE)


def table(tests: Path = TESTS) -> list[dict[str, Any]]:
    """The fixtures of a health_test.yaml."""
    found: list[dict[str, Any]] = yaml.safe_load(tests.read_text())["tests"]
    return found


def load(case: dict[str, Any], base: Path = ARGOCD) -> Obj:
    """A fixture's TrainingRun."""
    obj: Obj = yaml.safe_load((base / case["inputPath"]).read_text())
    return obj


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


def check_valid(obj: Obj) -> None:
    """A fixture is a TrainingRun of the operator's API, its phase the one its conditions give."""
    TrainingRun.from_object(obj)
    status = TrainingRunStatus.from_object(obj.get("status") or {})
    if status.conditions:
        assert status.phase is derive_phase(status.conditions)


def missing_phases(objs: list[Obj]) -> set[Phase]:
    """Phases no fixture is in."""
    phases = {(obj.get("status") or {}).get("phase") for obj in objs}
    return {p for p in Phase if p.value not in phases}


def undecided(objs: list[Obj]) -> list[Rule]:
    """Rules that decide no fixture, bar those no e2e run records."""
    decided = {deciding(obj) for obj in objs}
    return [rule for rule in RULES if rule.unrecorded is None and rule not in decided]


# The fixtures checked in.


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
def test_expectation_is_the_documented_rule(case: dict[str, Any]) -> None:
    # The table says what the rules say, not what the script answered.
    assert case["healthStatus"] == expected(load(case))


@pytest.mark.parametrize("case", table(), ids=lambda case: Path(case["inputPath"]).stem)
def test_fixture_is_a_valid_trainingrun(case: dict[str, Any]) -> None:
    # The fixtures stand for what the apiserver serves: they must parse as the operator's API.
    check_valid(load(case))


def test_every_phase_has_a_fixture() -> None:
    assert not missing_phases([load(case) for case in table()])


def test_every_rule_decides_a_fixture() -> None:
    assert not undecided([load(case) for case in table()])


def test_a_run_going_on_after_a_repeated_failure_reads_degraded(
    results: dict[str, dict[str, Any]],
) -> None:
    going = [
        case["inputPath"]
        for case in table()
        if holds(load(case), ConditionType.REPEATED_FAILURE_AT_STEP)
        and not holds(load(case), ConditionType.FAILED)
    ]
    assert going
    assert {results[path]["actual"]["status"] for path in going} == {"Degraded"}


def test_script_has_the_documented_rules_in_their_order() -> None:
    rows = LUA_RULE.findall(SCRIPT.read_text())
    documented = [
        (str(r.condition), str(r.status), str(r.health)) for r in RULES if r.fact is Fact.HOLDS
    ]
    assert rows == documented
    assert {kind for kind, _, _ in rows} <= {str(t) for t in ConditionType}


def test_docs_table_is_the_rules() -> None:
    text = DOC.read_text()
    header = "| rule | health | why |"
    lines = text[text.index(header) :].split("\n\n", 1)[0].splitlines()[2:]
    rows = [[cell.strip() for cell in line.split(" | ")] for line in lines]
    assert [(row[0].removeprefix("| "), row[1].strip("*")) for row in rows] == [
        (rule.row, str(rule.health)) for rule in RULES
    ]


def test_argocd_cm_snippet_carries_the_script_verbatim() -> None:
    configmap = yaml.safe_load(ARGOCD_CM.read_text())
    assert configmap["metadata"]["name"] == "argocd-cm"
    assert configmap["data"][HEALTH_KEY] == SCRIPT.read_text(), (
        "copy charts/trainguard/argocd/health.lua into argocd-cm.yaml"
    )


def _healthy_fixture() -> dict[str, Any]:
    return next(c for c in table() if c["healthStatus"]["status"] == "Healthy")


def test_runner_reports_a_mismatch(luahealth: Path, tmp_path: Path) -> None:
    # Guards the guard: a runner that accepted anything would pass every fixture above.
    healthy = _healthy_fixture()
    (tmp_path / "run.yaml").write_text((ARGOCD / healthy["inputPath"]).read_text())
    wrong = {"healthStatus": {"status": "Degraded", "message": "no"}, "inputPath": "run.yaml"}
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
    (tmp_path / "run.yaml").write_text((ARGOCD / _healthy_fixture()["inputPath"]).read_text())
    case = {"healthStatus": {"status": "Healthy", "message": "1"}, "inputPath": "run.yaml"}
    tests = tmp_path / "health_test.yaml"
    tests.write_text(yaml.safe_dump({"tests": [case]}))
    code, found = run(luahealth, script, tests)
    assert code == 1
    assert "string" in found[0]["error"]


# The generator, on a recording made from the operator's own status code.

T0 = datetime(2026, 1, 1, tzinfo=UTC)
NAMESPACE = "t-record"
TEST_ID = "tests/e2e/test_operator_ladder.py::test_scene[admin]"
STATUS_WRITE = {
    "manager": FIELD_MANAGER,
    "operation": "Apply",
    "apiVersion": "trainguard.dev/v1alpha1",
    "time": "2026-01-01T00:00:00Z",
    "fieldsType": "FieldsV1",
    "fieldsV1": {},
    "subresource": "status",
}
SPEC_WRITE = {**STATUS_WRITE, "manager": "kubectl", "operation": "Update"}
del SPEC_WRITE["subresource"]
REPEATING = {"recovery": {"sameStepWindow": 10}}


class Recording:
    """A recording directory, written as the e2e tier's recorder writes it."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir()
        self.count = 0

    def write(self, obj: Obj) -> None:
        """One more record."""
        self.count += 1
        write_record(self.directory / f"{self.count:04d}.yaml", TEST_ID, obj)


class Life:
    """One run's statuses, cycle by cycle, from the operator's own decisions (no cluster)."""

    def __init__(self, recording: Recording, name: str, spec: Obj | None = None) -> None:
        self.recording = recording
        self.name = name
        self.spec = spec or {}
        self.generation = 1
        self.status: TrainingRunStatus | None = None
        self.recorded()

    def obj(self) -> Obj:
        """The run as the apiserver serves it."""
        writes = [SPEC_WRITE, *([STATUS_WRITE] if self.status is not None else [])]
        meta = {
            "uid": f"uid-{self.name}",
            "generation": self.generation,
            "resourceVersion": str(self.recording.count + 1),
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "managedFields": writes,
        }
        status = self.status.to_object() if self.status is not None else None
        return training_run(self.name, self.spec, namespace=NAMESPACE, metadata=meta, status=status)

    def run(self) -> TrainingRun:
        """The run, parsed."""
        return TrainingRun.from_object(self.obj())

    def pod(self, attempt: int = 1, **fields: Any) -> PodView:
        """A pod of the current spec."""
        desired = spec_hash(self.run().spec)
        return PodView(f"{self.name}-{attempt}", attempt, spec_hash=desired, **fields)

    def recorded(self) -> Life:
        """Record the run as it is now."""
        self.recording.write(self.obj())
        return self

    def cycle(self, *pods: PodView) -> Life:
        """One reconcile cycle over these pods: decide, report, record."""
        run = self.run()
        decision = lifecycle.decide(run, pods, spec_hash(run.spec))
        self.status = advance(
            run.status or TrainingRunStatus(),
            lifecycle.state(run, decision, None),
            lifecycle.observed(run, decision, None),
            self.generation,
            T0,
        )
        return self.recorded()

    def fail(self, pod: PodView, cause: str, step: int) -> Life:
        """A failure of the pod, climbed as the operator does, then its cycle."""
        run = self.run()
        status = run.status or TrainingRunStatus()
        found = Found(Failure(cause, step, True), pod.node, "evidence")
        recovery = run.spec.recovery
        decision = ladder.decide(found.failure, failures.history(status, found), recovery)
        self.status = failures.record(
            status, found, decision, status.attempt, self.generation, T0, recovery.backoff
        )
        return self.cycle(pod)

    def change(self, spec: Obj) -> Life:
        """A spec change, seen before the operator observes it."""
        self.spec = merge(self.spec, spec)
        self.generation += 1
        return self.recorded()


def running(life: Life, attempt: int = 1) -> PodView:
    """The run's pod of that attempt, running on a node."""
    return life.pod(attempt, node=f"gpu-{attempt}", phase="Running")


def lifecycle_life(recording: Recording) -> None:
    """Created, scheduled, training (twice: one fixture), suspended by a spec change."""
    life = Life(recording, "life").cycle()
    life.cycle(running(life)).cycle(running(life)).change({"suspend": True}).cycle()


def completed_life(recording: Recording) -> None:
    """A run whose pod succeeded."""
    life = Life(recording, "done")
    life.cycle(life.pod(node="gpu-1", phase="Succeeded"))


def unschedulable_life(recording: Recording) -> None:
    """A run whose pod no node can hold."""
    life = Life(recording, "stuck")
    life.cycle(life.pod(unschedulable="0/2 nodes are available: 2 Insufficient nvidia.com/gpu."))


def pod_failed_life(recording: Recording) -> None:
    """A failed pod seen before its failure is recorded (the one way to PodFailed)."""
    life = Life(recording, "lost")
    life.cycle(life.pod(node="gpu-1", phase="Failed"))


def repeated(recording: Recording, name: str, policy: str) -> Life:
    """A run that dies twice near step 100, with `onRepeatedFailure: <policy>`."""
    life = Life(recording, name, merge(REPEATING, {"recovery": {"onRepeatedFailure": policy}}))
    pod = running(life)
    return life.cycle(pod).fail(pod, "Dead", 100).cycle(pod).fail(pod, "Dead", 105)


def stopped_life(recording: Recording) -> None:
    """A repeated failure with Stop: Failed."""
    repeated(recording, "stop", "Stop")


def going_life(recording: Recording) -> None:
    """A repeated failure with Continue: trains on; then the spec changes (a new attempt)."""
    life = repeated(recording, "go", "Continue")
    old = running(life)
    life.change({"trainer": {"args": ["--lr", "1e-4"]}}).cycle(old).cycle(running(life, 2))


LIVES = {
    "life": lifecycle_life,
    "done": completed_life,
    "stuck": unschedulable_life,
    "lost": pod_failed_life,
    "stop": stopped_life,
    "go": going_life,
}


def record_lives(directory: Path, *skip: str) -> Path:
    """A recording of runs through every phase and rule; `skip` names lives to leave out."""
    recording = Recording(directory)
    for name, live in LIVES.items():
        if name not in skip:
            live(recording)
    return directory


@pytest.fixture
def generated(tmp_path: Path) -> tuple[Path, list[Path]]:
    """Fixtures generated from a complete recording: their directory and the paths written."""
    out = tmp_path / "argocd"
    return out, generate(record_lives(tmp_path / "recorded"), out)


def test_generated_fixtures_follow_the_rules_and_the_script_agrees(
    luahealth: Path, generated: tuple[Path, list[Path]]
) -> None:
    out, _ = generated
    code, found = run(luahealth, SCRIPT, out / argocd_fixtures.TESTS_FILE)
    assert code == 0, [r for r in found if not r["ok"]]
    cases = table(out / argocd_fixtures.TESTS_FILE)
    objs = [load(case, out) for case in cases]
    for obj in objs:
        check_valid(obj)
    assert not missing_phases(objs) and not undecided(objs)
    # Every phase, Recovering included: the operator's code writes PodFailed when told to.
    assert {obj.get("status", {}).get("phase") for obj in objs} >= {p.value for p in Phase}


def test_a_run_going_on_after_a_repeated_failure_is_generated_and_reads_degraded(
    luahealth: Path, generated: tuple[Path, list[Path]]
) -> None:
    out, _ = generated
    _, found = run(luahealth, SCRIPT, out / argocd_fixtures.TESTS_FILE)
    health = {r["inputPath"]: r["actual"] for r in found}
    going = "testdata/running-training-repeated-failure.yaml"
    obj = load({"inputPath": going}, out)
    assert continues_after_repeated_failure(obj)
    # What the operator writes once the trainer is restarted: Ready, not Degraded.
    conditions = {c["type"]: c["status"] for c in obj["status"]["conditions"]}
    assert (conditions["Ready"], conditions["Degraded"]) == ("True", "False")
    assert health[going]["status"] == "Degraded"
    assert health[going]["message"].startswith("RepeatedFailureAtStep: ")
    # Once the spec changed, the condition speaks of the older spec.
    later = "testdata/running-training-repeated-failure-of-older-spec.yaml"
    assert health[later]["status"] == "Healthy"
    assert health["testdata/failed-repeated-failure-at-step.yaml"]["status"] == "Degraded"


def test_generated_fixtures_are_named_cut_and_credited(generated: tuple[Path, list[Path]]) -> None:
    out, written = generated
    names = sorted(p.name for p in written)
    assert names == sorted(
        [
            "no-status.yaml",
            "pending-scheduling.yaml",
            "running-training.yaml",
            "running-training-stale.yaml",
            "suspended-suspended.yaml",
            "completed-completed.yaml",
            "pending-unschedulable.yaml",
            "recovering-pod-failed.yaml",
            "failed-repeated-failure-at-step.yaml",
            "running-training-repeated-failure.yaml",
            "running-training-repeated-failure-stale.yaml",
            "pending-spec-changed-repeated-failure-of-older-spec.yaml",
            "running-training-repeated-failure-of-older-spec.yaml",
            argocd_fixtures.TESTS_FILE,
        ]
    )
    for path in written[:-1]:
        text = path.read_text()
        assert text.startswith(f"# Recorded during {TEST_ID}.\n"), path
        obj = yaml.safe_load(text)
        assert set(obj["metadata"]) == set(KEPT_METADATA), path
        assert obj["metadata"]["namespace"] == NAMESPACE
    tests = (out / argocd_fixtures.TESTS_FILE).read_text()
    assert tests.count("\n# `RepeatedFailureAtStep=True`") == 1  # the rule above each entry


def test_generation_replaces_the_fixtures_there(tmp_path: Path) -> None:
    out = tmp_path / "argocd"
    (out / argocd_fixtures.TESTDATA).mkdir(parents=True)
    (out / argocd_fixtures.TESTDATA / "hand-made.yaml").write_text("kind: TrainingRun\n")
    generate(record_lives(tmp_path / "recorded"), out)
    assert not (out / argocd_fixtures.TESTDATA / "hand-made.yaml").exists()


@pytest.mark.parametrize(
    ("skip", "missing"),
    [
        (("go",), "no run that goes on after a repeated failure"),
        (("done",), "no run in phase Completed"),
        (("stuck",), 'no run that the rule "`Progressing=False`'),
    ],
)
def test_an_incomplete_recording_writes_nothing(
    tmp_path: Path, skip: tuple[str, ...], missing: str, capsys: pytest.CaptureFixture[str]
) -> None:
    recorded = record_lives(tmp_path / "recorded", *skip)
    out = tmp_path / "argocd"
    with pytest.raises(GenerationError, match=re.escape(missing)):
        generate(recorded, out)
    assert argocd_fixtures.main(["--recorded", str(recorded), "--out", str(out)]) == 1
    assert missing in capsys.readouterr().err
    assert not out.exists()


def test_a_record_outside_the_api_is_refused(tmp_path: Path) -> None:
    recorded = record_lives(tmp_path / "recorded")
    [first, *_] = sorted(recorded.glob("*.yaml"))
    obj = yaml.safe_load(first.read_text())
    obj["status"] = {"phase": "Running", "podFailed": True}  # no such status field
    write_record(first, TEST_ID, obj)
    with pytest.raises(GenerationError, match=first.name):
        generate(recorded, tmp_path / "argocd")


def test_the_command_writes_the_fixtures(tmp_path: Path) -> None:
    recorded = record_lives(tmp_path / "recorded")
    out = tmp_path / "argocd"
    assert argocd_fixtures.main(["--recorded", str(recorded), "--out", str(out)]) == 0
    assert (out / argocd_fixtures.TESTS_FILE).read_text().count("inputPath:") == 13
    assert (recorded / "0001.yaml").read_text().startswith(RECORDED_DURING)


@pytest.mark.parametrize(
    ("status", "health"),
    [
        # Statuses the operator does not write: the rules and the script agree on them too.
        ({"conditions": [{"type": "Progressing", "status": "Unknown"}]}, "Progressing"),
        (
            {"conditions": [{"type": "Degraded", "status": "True", "reason": "PodFailed"},
                            {"type": "Progressing", "status": "True", "reason": "Rescheduling"}]},
            "Degraded",
        ),
        ({"conditions": [{"type": "Ready", "status": "True", "message": ""}]}, "Healthy"),
    ],
)  # fmt: skip
def test_the_rules_and_the_script_agree_beyond_what_is_recorded(
    luahealth: Path, tmp_path: Path, status: Obj, health: str
) -> None:
    obj = training_run("llm", metadata={"generation": 1}, status=status)
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(obj))
    wanted = expected(obj)
    assert wanted["status"] == health
    case = {"healthStatus": wanted, "inputPath": "run.yaml"}
    (tmp_path / "health_test.yaml").write_text(yaml.safe_dump({"tests": [case]}))
    code, found = run(luahealth, SCRIPT, tmp_path / "health_test.yaml")
    assert code == 0, found
