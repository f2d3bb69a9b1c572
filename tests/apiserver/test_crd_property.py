"""Property: the pydantic models and the apiserver accept exactly the same TrainingRuns.

Runs are drawn from strategies that mix valid values with near misses (bounds, reserved and
duplicate names, malformed URIs and paths, unknown enum values), so that a bounded sample holds
both accepted and rejected runs. For each run: the models accept it if and only if the server
does, and what the server stores (with its defaults) parses to the same spec as the models'.
"""

from __future__ import annotations

import json
import operator
import subprocess
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from api_cases import base_run, pydantic_errors
from trainguard.api import TrainingRun
from trainguard_dev.testing.runs import training_run

pytestmark = pytest.mark.apiserver

ServerCreate = Callable[[dict[str, Any]], subprocess.CompletedProcess[str]]
Draw = st.SearchStrategy[Any]
ABSENT = object()
MAX_EXAMPLES = 40


def maybe(strategy: Draw) -> Draw:
    """The value, or the field left out."""
    return st.one_of(st.just(ABSENT), strategy)


def obj(**fields: Draw) -> Draw:
    """An object whose fields are drawn independently; ABSENT ones are left out."""
    return st.fixed_dictionaries(fields).map(
        lambda drawn: {key: value for key, value in drawn.items() if value is not ABSENT}
    )


def fuzz(prefixes: list[str], alphabet: str, max_size: int = 12) -> Draw:
    return st.builds(
        operator.add, st.sampled_from(prefixes), st.text(alphabet=alphabet, max_size=max_size)
    )


def small(low: int, high: int) -> Draw:
    return st.integers(min_value=low, max_value=high)


def mostly(valid: Draw, other: Draw) -> Draw:
    """Three times in four from `valid`: enough runs pass for the accepting side to be tested."""
    return st.sampled_from([True, True, True, False]).flatmap(lambda ok: valid if ok else other)


names = mostly(
    st.sampled_from(["a", "hub", "backup"]), st.sampled_from(["l1", "B", "x-", "", "a" * 64])
)
paths = mostly(
    st.sampled_from(["/data", "/trainguard/l1", "/trainguard/l1/x", "/w"]),
    fuzz(["/", "", "/a/"], "a./", 6),
)
uris = mostly(
    st.sampled_from(
        [
            "s3://bucket-b/ckpt",
            "hf://org/repo",
            "ssh://u@host/srv",
            "file:///backup/run",
            "file://backup",
        ]
    ),
    fuzz(["file://", "s3://", "hf://", "ssh://", "gs://", ""], "ab1/.-_@: ", 12),
)
quantities = mostly(
    st.one_of(small(0, 10**6), st.sampled_from(["10Gi", "500m", "1.5e9", "1E"])),
    st.one_of(small(-2, -1), st.sampled_from(["-1Gi", "ten", "", "1 Gi"])),
)
secrets = maybe(obj(name=st.sampled_from(["hf-token", "Bad_Name", "key.a"])))

layers = obj(
    name=names,
    uri=uris,
    contents=maybe(st.sampled_from(["full", "weights", "diff"])),
    keep=maybe(small(0, 3)),
    everySteps=maybe(small(-1, 100)),
    credentialsSecret=secrets,
    claimName=maybe(st.sampled_from(["backup", "Bad"])),
)

specs = obj(
    trainer=obj(
        image=mostly(
            st.sampled_from(["trainer:1", "registry.example.com/t@sha256:a"]), st.just("")
        ),
        command=mostly(
            st.lists(st.sampled_from(["python", "train.py"]), min_size=1),
            st.sampled_from([[], [""], ["python", ""]]),
        ),
        env=maybe(st.lists(obj(name=st.sampled_from(["A", "B", "1x", "a.b"])), max_size=2)),
        workingDir=maybe(paths),
        resources=maybe(obj(gpus=maybe(mostly(small(0, 8), small(-1, 65))), cpu=maybe(quantities))),
    ),
    data=maybe(
        obj(
            source=mostly(
                st.one_of(
                    obj(uri=uris),
                    obj(pvc=obj(claimName=st.just("shards"), subPath=maybe(fuzz([""], "a./", 5)))),
                ),
                st.sampled_from([{}, {"pvc": {"claimName": "s", "subPath": "/a"}}]),
            ),
            size=maybe(quantities),
            mountPath=maybe(paths),
            stage=maybe(st.booleans()),
        )
    ),
    checkpoints=maybe(
        obj(
            everySteps=maybe(small(-1, 100)),
            everySeconds=maybe(small(-1, 100)),
            l1=maybe(obj(keepLast=maybe(small(0, 3)), mountPath=maybe(paths))),
            remote=maybe(st.lists(layers, max_size=3)),
        )
    ),
    monitor=maybe(
        obj(
            intervalSeconds=maybe(mostly(small(1, 5), small(0, 62))),
            hangAfterSeconds=maybe(small(1, 400)),
            slowAfterSeconds=maybe(small(1, 400)),
            leaseDurationSeconds=maybe(small(1, 30)),
            ghostMemory=maybe(obj(ratio=maybe(st.floats(0.5, 3.0, allow_nan=False)))),
            pySpy=maybe(st.booleans()),
        )
    ),
    recovery=maybe(obj(inPlaceRestarts=maybe(small(-1, 12)), maxRestarts=maybe(small(-1, 12)))),
    placement=maybe(
        obj(
            networkVolumes=maybe(
                mostly(st.sampled_from(["Forbid", "Warn", "Allow"]), st.just("Block"))
            ),
            tolerations=maybe(
                st.lists(
                    obj(
                        key=maybe(st.just("gpu")),
                        operator=maybe(st.sampled_from(["Exists", "Equal"])),
                        value=maybe(st.sampled_from(["", "x"])),
                        effect=maybe(st.sampled_from(["NoSchedule", "NoExecute"])),
                        tolerationSeconds=maybe(small(0, 5)),
                    ),
                    max_size=1,
                )
            ),
        )
    ),
    suspend=maybe(st.booleans()),
)


def as_run(spec: dict[str, Any]) -> dict[str, Any]:
    return training_run("prop", spec, base={})


def test_models_and_apiserver_accept_the_same_runs(server_create: ServerCreate) -> None:
    outcomes: list[bool] = []

    @settings(
        max_examples=MAX_EXAMPLES,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
    @given(spec=specs)
    @example(spec=base_run()["spec"])
    @example(spec={"trainer": {"image": "t:1", "command": []}})
    def check(spec: dict[str, Any]) -> None:
        run = as_run(spec)
        errors = pydantic_errors(run)
        result = server_create(run)
        model_accepts, server_accepts = not errors, result.returncode == 0
        assert model_accepts == server_accepts, (
            f"models {'accept' if model_accepts else errors}; "
            f"server {'accepts' if server_accepts else result.stderr}"
        )
        outcomes.append(server_accepts)
        if server_accepts:
            stored = TrainingRun.from_object(json.loads(result.stdout))
            assert stored.spec == TrainingRun.from_object(run).spec

    check()
    assert True in outcomes and False in outcomes, outcomes
