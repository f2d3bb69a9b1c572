"""The e2e tier's recorder of TrainingRun statuses: what it reads, keeps and writes."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from trainguard.operator.build.constants import FIELD_MANAGER
from trainguard_dev.testing.polling import eventually
from trainguard_dev.testing.runs import training_run
from trainguard_dev.testing.statuses import (
    RECORDED_DURING,
    StatusRecorder,
    case_key,
    json_objects,
    read_recorded,
    record_paths,
    watch_command,
    written_by_operator,
)

pytestmark = pytest.mark.unit

Obj = dict[str, Any]

# Prints the objects of a JSON file the way `kubectl get --watch -o json` does, then exits.
FAKE_WATCH = """
import json, sys
for obj in json.load(open(sys.argv[1])):
    print(json.dumps(obj, indent=4), flush=True)
"""


def write(manager: str, time: str) -> Obj:
    """A managedFields entry for a write of the status subresource."""
    return {"manager": manager, "operation": "Apply", "time": time, "subresource": "status"}


def run(
    name: str = "llm",
    namespace: str = "t-1",
    generation: int = 1,
    status: Obj | None = None,
    writes: tuple[Obj, ...] = (write(FIELD_MANAGER, "2026-01-01T00:00:01Z"),),
    **meta: Any,
) -> Obj:
    """A TrainingRun as the apiserver serves it."""
    metadata = {"generation": generation, "managedFields": list(writes), **meta}
    return training_run(name, namespace=namespace, metadata=metadata, status=status)


def condition(kind: str, status: str, reason: str, generation: int = 1) -> Obj:
    """A condition in the apiserver's shape."""
    return {
        "type": kind,
        "status": status,
        "reason": reason,
        "message": "m",
        "lastTransitionTime": "2026-01-01T00:00:00Z",
        "observedGeneration": generation,
    }


TRAINING: Obj = {
    "observedGeneration": 1,
    "phase": "Running",
    "conditions": [condition("Ready", "True", "Training")],
}


def test_watch_output_is_split_into_objects() -> None:
    objs = [run(), run(status=TRAINING), run(name="other")]
    listed = {"apiVersion": "v1", "kind": "List", "items": objs[1:]}
    text = "".join(json.dumps(obj, indent=4) + "\n" for obj in (objs[0], listed))
    assert list(json_objects(text.splitlines(keepends=True))) == objs


def test_the_watch_command_lists_every_namespace_with_who_wrote_what() -> None:
    command = watch_command(["kubectl", "--kubeconfig", "k"])
    assert command[:3] == ["kubectl", "--kubeconfig", "k"]
    assert {"--all-namespaces", "--watch", "--show-managed-fields", "json"} <= set(command)


@pytest.mark.parametrize(
    ("changed", "same"),
    [
        ({"status": {**TRAINING, "step": 500}}, True),  # progress within a case
        ({"metadata": {"name": "other", "generation": 1}}, True),  # another run, the same case
        ({"status": {**TRAINING, "phase": "Pending"}}, False),
        ({"metadata": {"generation": 2}}, False),  # the status is now older than the spec
        ({"status": {**TRAINING, "conditions": [condition("Ready", "False", "Starting")]}}, False),
        (
            {"status": {**TRAINING, "conditions": [*TRAINING["conditions"],
                                                   condition("Preflight", "True", "Passed")]}},
            False,
        ),
    ],
)  # fmt: skip
def test_a_case_is_phase_staleness_and_conditions(changed: Obj, same: bool) -> None:
    base = run(status=TRAINING)
    other = {**base, **changed}
    assert (case_key(other) == case_key(base)) is same


def test_a_condition_set_for_an_older_spec_is_a_case_of_its_own() -> None:
    conditions = [
        condition("Ready", "True", "Training", 2),
        condition("RepeatedFailureAtStep", "True", "RepeatedFailureAtStep", 1),
    ]
    now = run(generation=2, status={**TRAINING, "observedGeneration": 2, "conditions": conditions})
    conditions[1]["observedGeneration"] = 2
    then = run(generation=2, status={**TRAINING, "observedGeneration": 2, "conditions": conditions})
    assert case_key(now) != case_key(then)


@pytest.mark.parametrize(
    ("status", "writes", "operator"),
    [
        (None, (), True),  # nobody wrote a status yet
        (TRAINING, (write(FIELD_MANAGER, "2026-01-01T00:00:01Z"),), True),
        (TRAINING, (write("kubectl-patch", "2026-01-01T00:00:01Z"),), False),
        (
            TRAINING,
            (write("kubectl-patch", "2026-01-01T00:00:01Z"),
             write(FIELD_MANAGER, "2026-01-01T00:00:02Z")),
            True,
        ),
        (
            TRAINING,
            (write(FIELD_MANAGER, "2026-01-01T00:00:01Z"),
             write("kubectl-patch", "2026-01-01T00:00:02Z")),
            False,
        ),
        (  # the same second: not known to be the operator's
            TRAINING,
            (write(FIELD_MANAGER, "2026-01-01T00:00:01Z"),
             write("kubectl-patch", "2026-01-01T00:00:01Z")),
            False,
        ),
    ],
)  # fmt: skip
def test_only_statuses_the_operator_wrote_count(
    status: Obj | None, writes: tuple[Obj, ...], operator: bool
) -> None:
    assert written_by_operator(run(status=status, writes=writes)) is operator


def test_the_recorder_writes_each_new_case_once_credited_to_its_test(tmp_path: Path) -> None:
    out = tmp_path / "recorded"
    recorder = StatusRecorder(["true"], out)
    recorder.test = "tests/e2e/test_a.py::test_a"
    assert recorder.offer(run()) is not None
    recorder.test = "tests/e2e/test_b.py::test_b"
    assert recorder.offer(run(status=TRAINING)) is not None  # t-1 was first seen during test_a
    assert recorder.offer(run(status={**TRAINING, "step": 9})) is None  # the same case
    assert recorder.offer(run(status=TRAINING, deletionTimestamp="2026-01-01T00:01:00Z")) is None
    other = run(namespace="t-2", status={**TRAINING, "phase": "Pending"})
    assert recorder.offer(other) is not None
    found = read_recorded(out)
    assert [(r.path.name, r.test) for r in found] == [
        ("0001.yaml", "tests/e2e/test_a.py::test_a"),
        ("0002.yaml", "tests/e2e/test_a.py::test_a"),
        ("0003.yaml", "tests/e2e/test_b.py::test_b"),
    ]
    assert found[1].obj == run(status=TRAINING)
    assert found[0].path.read_text().startswith(f"{RECORDED_DURING}tests/e2e/test_a.py")
    # Another session adds to the directory: what is there is not written again.
    again = StatusRecorder(["true"], out)
    assert again.offer(run(status=TRAINING)) is None
    assert again.offer(run(status={**TRAINING, "phase": "Suspended"})) == out / "0004.yaml"


def test_the_recorder_watches_until_stopped(tmp_path: Path) -> None:
    objs = tmp_path / "objs.json"
    objs.write_text(json.dumps([run(), run(status=TRAINING), run(status=TRAINING)]))
    out = tmp_path / "recorded"
    recorder = StatusRecorder([sys.executable, "-c", FAKE_WATCH, str(objs)], out)
    recorder.test = "tests/e2e/test_a.py::test_a"
    recorder.start()
    try:
        eventually(lambda: len(record_paths(out)) == 2, 10, "two cases recorded")
    finally:
        recorder.stop()
    # The watch ended and started again (listing every run again): nothing twice.
    assert [r.obj for r in read_recorded(out)] == [run(), run(status=TRAINING)]
