"""Behaviour of the API models: defaults, JSON names, strictness, rules, status serialization."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any, get_args

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from trainguard.api import Condition, TrainingRun, TrainingRunSpec, TrainingRunStatus
from trainguard.api import constants as c
from trainguard.api.base import RULE_ERROR_TYPE
from trainguard.api.quantity import parse_quantity, quantity_bytes
from trainguard.api.spec import DEFAULT_DATA_DIR, DEFAULT_L1_DIR, Data, RemoteLayer, SecretRef
from trainguard.api.status import REASON_RE

pytestmark = pytest.mark.unit

MINIMAL: dict[str, Any] = {"trainer": {"image": "trainer:1", "command": ["python", "train.py"]}}


def test_defaults_follow_the_design() -> None:
    spec = TrainingRunSpec.from_object(MINIMAL)
    assert spec.monitor.interval_seconds == 1
    assert spec.placement.network_volumes is c.NetworkVolumes.FORBID
    assert spec.checkpoints.hash_algorithm is c.HashAlgorithm.XXH3
    assert spec.checkpoints.every_steps == 50
    assert spec.checkpoints.l1.keep_last == 2
    assert spec.checkpoints.l1.mount_path == DEFAULT_L1_DIR
    assert spec.checkpoints.l1.storage.empty_dir is not None
    assert spec.checkpoints.l1.storage.local_volume is None
    assert spec.recovery.in_place_restarts == 3
    assert spec.recovery.max_restarts == 10
    assert spec.recovery.on_repeated_failure is c.OnRepeatedFailure.STOP
    assert spec.trainer.resources.gpus == 1
    assert spec.trainer.resources.gpu_resource == c.GPU_RESOURCE
    assert spec.suspend is False


def test_data_defaults() -> None:
    data = Data.from_object({"source": {"pvc": {"claimName": "shards"}}})
    assert data.mount_path == DEFAULT_DATA_DIR
    assert data.stage is True


def test_json_names_are_camel_case_and_round_trip() -> None:
    spec = TrainingRunSpec.from_object(MINIMAL)
    obj = spec.to_object()
    assert obj["checkpoints"]["l1"]["keepLast"] == 2
    assert obj["monitor"]["ghostMemory"]["thresholdMiB"] == 2048
    assert "keep_last" not in str(obj)
    assert TrainingRunSpec.from_object(obj) == spec


def test_python_names_build_models_but_objects_need_json_names() -> None:
    layer = RemoteLayer(
        name="hub",
        uri="hf://org/repo",
        contents=c.Contents.WEIGHTS,
        credentials_secret=SecretRef(name="token"),
    )
    assert layer.to_object()["credentialsSecret"] == {"name": "token"}
    with pytest.raises(ValidationError) as raised:
        TrainingRunSpec.from_object({**MINIMAL, "checkpoints": {"every_steps": 10}})
    assert raised.value.errors()[0]["type"] == "extra_forbidden"


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("monitor", "intervalSeconds"), "1"),  # the apiserver refuses strings for integers
        (("suspend",), 1),
        (("trainer", "resources", "gpus"), True),
        (("trainer", "image"), 7),
    ],
)
def test_types_are_strict(path: tuple[str, ...], value: object) -> None:
    obj: dict[str, Any] = {**MINIMAL, "trainer": dict(MINIMAL["trainer"])}
    node = obj
    for key in path[:-1]:
        node = node.setdefault(key, {})
    node[path[-1]] = value
    with pytest.raises(ValidationError):
        TrainingRunSpec.from_object(obj)


def test_null_means_unset_like_the_apiserver_pruning_it() -> None:
    spec = TrainingRunSpec.from_object({**MINIMAL, "checkpoints": None, "model": None})
    assert spec.checkpoints.every_steps == 50
    assert spec.model is None


def test_rule_errors_carry_the_field_and_message() -> None:
    with pytest.raises(ValidationError) as raised:
        TrainingRunSpec.from_object({**MINIMAL, "monitor": {"slowAfterSeconds": 400}})
    (error,) = raised.value.errors()
    assert error["type"] == RULE_ERROR_TYPE
    assert error["loc"] == ("monitor", "slowAfterSeconds")
    assert "less than hangAfterSeconds" in error["msg"]


def test_every_failing_rule_of_an_object_is_reported() -> None:
    layer = {"name": "x", "uri": "hf://org/repo", "claimName": "pvc"}
    with pytest.raises(ValidationError) as raised:
        RemoteLayer.from_object(layer)
    assert {e["loc"] for e in raised.value.errors()} == {
        ("contents",),
        ("credentialsSecret",),
        ("claimName",),
    }


@pytest.mark.parametrize(
    "uri",
    [
        "file:///mnt/backup",
        "s3://bucket-name/prefix/deeper",
        "s3://bucket.with.dots",
        "hf://datasets/org/name",
        "hf://datasets/org/name@v1.0/train/en",
        "ssh://host/srv/ckpt",
        "ssh://user@host.example.com:2222/srv/ckpt",
    ],
)
def test_valid_uris(uri: str) -> None:
    secret = {} if uri.startswith("file://") else {"credentialsSecret": {"name": "creds"}}
    Data.from_object({"source": {"uri": uri, **secret}})
    layer = {"name": "l", "uri": uri, "contents": "weights", **secret}
    if uri.startswith("file://"):
        layer["claimName"] = "backup"
    RemoteLayer.from_object(layer)


def test_a_model_repository_is_a_layer_not_a_data_source() -> None:
    layer = {"name": "hub", "uri": "hf://org/repo", "contents": "weights"}
    RemoteLayer.from_object({**layer, "credentialsSecret": {"name": "hf-token"}})
    with pytest.raises(ValidationError, match="hf:// data source is a dataset repository"):
        Data.from_object({"source": {"uri": "hf://org/repo"}})


def test_uri_regexes_anchor_like_re2() -> None:
    # Python's `$` would also match before a trailing newline; RE2's does not.
    with pytest.raises(ValidationError):
        Data.from_object({"source": {"uri": "hf://org/repo\n"}, "mountPath": "/data"})
    with pytest.raises(ValidationError):
        Data.from_object({"source": {"pvc": {"claimName": "shards\n"}}})


def test_run_name_is_bounded_by_the_label_value_length() -> None:
    run = {"metadata": {"name": "r" * 63}, "spec": MINIMAL}
    assert TrainingRun.from_object(run).metadata.name == "r" * 63
    with pytest.raises(ValidationError) as raised:
        TrainingRun.from_object({"metadata": {"name": "r" * 64}, "spec": MINIMAL})
    assert raised.value.errors()[0]["loc"] == ("metadata", "name")


def test_run_keeps_unknown_metadata_and_knows_its_coordinates() -> None:
    run = TrainingRun.from_object(
        {
            "apiVersion": c.API_VERSION,
            "kind": c.KIND,
            "metadata": {"name": "r", "generation": 3, "managedFields": [{"manager": "kubectl"}]},
            "spec": MINIMAL,
        }
    )
    assert run.metadata.generation == 3
    assert run.to_object()["metadata"]["managedFields"] == [{"manager": "kubectl"}]
    with pytest.raises(ValidationError):
        TrainingRun.from_object(
            {"apiVersion": "trainguard.dev/v1", "kind": c.KIND, "spec": MINIMAL}
        )


def test_api_coordinates_are_consistent() -> None:
    assert f"{c.GROUP}/{c.VERSION}" == c.API_VERSION
    assert c.CRD_NAME == "trainingruns.trainguard.dev"
    assert get_args(TrainingRun.model_fields["api_version"].annotation) == (c.API_VERSION,)
    assert get_args(TrainingRun.model_fields["kind"].annotation) == (c.KIND,)
    for key in (c.LABEL_RUN, c.ANNOTATION_VERDICT, c.FINALIZER, c.TAINT_UNHEALTHY):
        assert key.startswith("trainguard.dev/")


@pytest.mark.parametrize("enum", [c.Reason, c.ConditionType, c.Verdict, c.Phase, c.ShippingState])
def test_reasons_and_types_are_camel_case(enum: type[c.StrEnum]) -> None:
    for member in enum:
        assert re.fullmatch(REASON_RE, member.value), member
        assert member.value[0].isupper(), member


def test_every_verdict_but_healthy_is_a_reason() -> None:
    assert {v.value for v in c.Verdict} <= {r.value for r in c.Reason}


def test_status_serializes_like_metav1() -> None:
    moment = datetime(2025, 1, 2, 3, 4, 5, 678000, tzinfo=timezone(timedelta(hours=2)))
    status = TrainingRunStatus(
        phase=c.Phase.RUNNING,
        conditions=[
            Condition(
                type=c.ConditionType.READY,
                status=c.ConditionStatus.TRUE,
                reason=c.Reason.TRAINING,
                message="step 322",
                last_transition_time=moment,
            )
        ],
        step=322,
    )
    obj = status.to_object()
    assert obj["phase"] == "Running"
    assert obj["conditions"][0] == {
        "type": "Ready",
        "status": "True",
        "reason": "Training",
        "message": "step 322",
        "lastTransitionTime": "2025-01-02T01:04:05Z",
    }
    parsed = TrainingRunStatus.from_object(obj)
    assert parsed.conditions[0].last_transition_time == datetime(2025, 1, 2, 1, 4, 5, tzinfo=UTC)


def test_condition_reason_must_be_camel_case() -> None:
    with pytest.raises(ValidationError):
        Condition.from_object(
            {
                "type": "Ready",
                "status": "True",
                "reason": "not camel case",
                "message": "",
                "lastTransitionTime": "2025-01-01T00:00:00Z",
            }
        )


@pytest.mark.parametrize(
    ("quantity", "value"),
    [
        (8, Decimal(8)),
        ("500m", Decimal("0.5")),
        ("100Gi", Decimal(100 * 2**30)),
        ("35G", Decimal(35 * 10**9)),
        ("1.5e9", Decimal("1.5e9")),
        ("1E", Decimal(10**18)),
        ("2Ki", Decimal(2048)),
    ],
)
def test_parse_quantity(quantity: int | str, value: Decimal) -> None:
    assert parse_quantity(quantity) == value


@pytest.mark.parametrize("quantity", [-1, "-1Gi", "ten", "1 Gi", ""])
def test_parse_quantity_refuses(quantity: int | str) -> None:
    with pytest.raises(ValueError):
        parse_quantity(quantity)


def test_quantity_bytes_rounds_up() -> None:
    assert quantity_bytes("1500m") == 2
    assert quantity_bytes("1Ki") == 1024


@settings(max_examples=60, deadline=None)
@given(
    steps=st.integers(0, 500),
    seconds=st.integers(0, 500),
    keep=st.integers(1, 5),
    names=st.lists(st.sampled_from(["a", "b", "c", "hub"]), max_size=3),
)
def test_accepted_specs_round_trip(steps: int, seconds: int, keep: int, names: list[str]) -> None:
    obj = {
        **MINIMAL,
        "checkpoints": {
            "everySteps": steps,
            "everySeconds": seconds,
            "remote": [{"name": n, "uri": f"s3://bucket-{n}x/p", "keep": keep} for n in names],
        },
    }
    try:
        spec = TrainingRunSpec.from_object(obj)
    except ValidationError:
        assert (steps == 0 and seconds == 0) or len(set(names)) < len(names)
        return
    assert TrainingRunSpec.from_object(spec.to_object()) == spec
