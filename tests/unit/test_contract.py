"""The pod contract: one writer, one reader, the API's defaults, and no name spelled twice.

The round trip goes the way a real pod does: the operator's builder writes every container's
`env` from a TrainingRun (`examples/full.yaml`, every section set), the kubelet resolves the
downward API, and each program's reader (`PodEnv.from_env`) must get back exactly what the
spec said.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

from trainguard.agent.verdicts import Thresholds
from trainguard.api import TrainingRun
from trainguard.api.constants import ANNOTATION_ENV_CONFIG
from trainguard.api.spec import DEFAULT_DATA_DIR, Monitor, Recovery
from trainguard.contract import env, files
from trainguard.contract.env import ContractError, PodEnv
from trainguard.operator.build.pod import PodInputs, pod_env, pods_env_config, training_pod
from trainguard_dev.testing.podenv import config_map_data, container_environment
from trainguard_dev.testing.runs import example_run, training_run
from trainguard_harness.settings import HarnessSettings

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
PRODUCT = [REPO / "operator" / "trainguard", REPO / "trainer-image" / "trainguard_harness"]
CONTRACT_DIR = REPO / "operator" / "trainguard" / "contract"
POD, NODE = "full-3", "gpu-node-7"


def full_run() -> TrainingRun:
    # Off the defaults wherever the example keeps one, so that no field reads back by luck.
    changes = {
        "checkpoints": {
            "l1": {"mountPath": "/local/l1", "keepLast": 3},
            "flushTimeoutSeconds": 120,
            "everySteps": 40,
        },
        "data": {"mountPath": "/local/data"},
        "recovery": {"backoff": {"initialSeconds": 7}},
        "trainer": {"resources": {"gpus": 4}},  # ranks: one per GPU
    }
    run = example_run("full", spec=changes, namespace="team-a")
    run["metadata"]["uid"] = "0f6c-uid"
    # Attempt 3's predecessors: one fenced at the step it reported, one that reported none.
    run["status"] = {
        "attempt": 2,
        "fences": [
            {"attempt": 1, "step": 120, "time": "2026-12-01T10:00:00Z"},
            {"attempt": 2, "time": "2026-12-01T11:00:00Z"},
        ],
    }
    return TrainingRun.from_object(run)


def as_kubelet_sets_it(container: dict[str, Any], config: dict[str, Any]) -> dict[str, str]:
    """The container's environment once the kubelet has resolved the ConfigMap and downward API."""
    fields = {"metadata.name": POD, "spec.nodeName": NODE}
    return container_environment(container, config_map_data(config), fields)


def expected_from_spec(
    run: TrainingRun, with_secrets: bool, with_data_secrets: bool = False
) -> dict[str, Any]:
    """Every PodEnv field, as the spec (and the pod's fixed paths) says it must read."""
    spec = run.spec
    assert spec.data is not None
    state = Path(env.DEFAULT_STATE_DIR)
    return {
        "run_name": "full",
        "run_uid": "0f6c-uid",
        "namespace": "team-a",
        "attempt": 3,
        "fences": {1: 120, 2: None},
        "lease_name": "full-heartbeat",
        "pod_name": POD,
        "node_name": NODE,
        "l1_dir": Path(spec.checkpoints.l1.mount_path),
        "l0_dir": Path(env.DEFAULT_L0_DIR),
        "data_dir": Path(spec.data.mount_path),
        "state_dir": state,
        "heartbeat_file": state / files.HEARTBEAT_FILENAME,
        "gpu_file": state / files.GPU_FILENAME,
        "log_file": Path("/trainguard/logs") / files.LOG_FILENAME,
        "procs_per_node": 4,
        # One pod, not a gang (the example is a one-pod run): the gang's fields keep defaults.
        "nnodes": 1,
        "node_rank": 0,
        "master_addr": None,
        "master_port": env.DEFAULT_MASTER_PORT,
        "keep_last": spec.checkpoints.l1.keep_last,
        "every_steps": spec.checkpoints.every_steps,
        "every_seconds": spec.checkpoints.every_seconds,
        "hash_algorithm": spec.checkpoints.hash_algorithm.value,
        "monitor": spec.monitor,
        "recovery": spec.recovery,
        "layers": tuple(spec.checkpoints.remote),
        "flush_timeout_seconds": spec.checkpoints.flush_timeout_seconds,
        "data_source": str(spec.data.source.uri),
        "data_secrets": Path("/trainguard/source-credentials") if with_data_secrets else None,
        "data_bytes": 71 * 2**30,
        "checkpoint_bytes": 35 * 2**30,
        "layer_paths": {
            layer.name: layer.uri.removeprefix("file://")
            for layer in spec.checkpoints.remote
            if layer.claim_name is not None
        },
        "layer_secrets": {
            layer.name: f"/trainguard/credentials/{layer.name}"
            for layer in spec.checkpoints.remote
            if with_secrets and layer.credentials_secret is not None
        },
    }


# A gang member's fields: a one-pod run leaves them at their defaults.
ONE_POD_FIELDS = {"nnodes", "node_rank", "master_addr", "master_port"}


@pytest.mark.parametrize("container", ["agent", "preflight", "stage-data", "restore", "trainer"])
def test_spec_to_env_to_reader_gives_back_every_field(container: str) -> None:
    run = full_run()
    manifest = training_pod(run, PodInputs(3, agent_image="trainguard:test"))
    spec = manifest["spec"]
    by_name = {c["name"]: c for c in [*spec["initContainers"], *spec["containers"]]}
    config = pods_env_config(run, 3)
    assert manifest["metadata"]["annotations"][ANNOTATION_ENV_CONFIG] == config["metadata"]["name"]
    read = PodEnv.from_env(as_kubelet_sets_it(by_name[container], config))
    expected = expected_from_spec(
        run,
        with_secrets=container in ("agent", "restore"),
        with_data_secrets=container == "stage-data",
    )
    # Every field of the contract is covered, and none is vacuous: the full example sets
    # each one to something other than its default (the state volume's mount is the pod's
    # own and fixed; the next test moves it).
    assert set(expected) == set(PodEnv.model_fields)
    defaults = PodEnv()
    for field, value in expected.items():
        if field in ONE_POD_FIELDS:
            continue
        if field == "state_dir" or (field in ("layer_secrets", "data_secrets") and not value):
            continue  # the steps without a Secret mount have none
        assert value != getattr(defaults, field), field
    assert {field: getattr(read, field) for field in expected} == expected


def test_a_contract_written_and_read_back_is_the_same() -> None:
    written = pod_env(full_run(), 2).model_copy(
        update={
            "pod_name": POD,
            "node_name": NODE,
            "state_dir": Path("/elsewhere/state"),
            "layer_secrets": {"s3": "/secrets/s3"},
        }
    )
    assert written.state_dir != PodEnv().state_dir
    values = written.to_env()
    values.update({env.POD_NAME: POD, env.NODE_NAME: NODE})  # the downward API's part
    assert PodEnv.from_env(values) == written


def test_the_downward_api_fills_the_pod_and_node_names() -> None:
    items = {item["name"]: item for item in pod_env(full_run(), 1).env_vars()}
    assert items[env.POD_NAME]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert items[env.NODE_NAME]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"


@pytest.mark.parametrize(
    ("variable", "raw"),
    [
        (env.ATTEMPT, "two"),
        (env.ATTEMPT, "0"),
        (env.KEEP_LAST, "0"),
        (env.CKPT_EVERY_STEPS, "-1"),
        (env.CKPT_EVERY_SECONDS, "often"),
        (env.MONITOR, "{not json"),
        (env.MONITOR, '{"intervalSeconds": -1}'),
        (env.RECOVERY, '{"maxRestarts": "many"}'),
        (env.LAYERS, '{"name": "s3"}'),
        (env.LAYERS, '[{"name": "s3"}]'),
        (env.FLUSH_TIMEOUT_SECONDS, "0"),
        (env.DATA_BYTES, "-5"),
        (env.CKPT_BYTES, "35Gi"),
    ],
)
def test_a_malformed_value_is_refused_naming_the_variable(variable: str, raw: str) -> None:
    with pytest.raises(ContractError) as caught:
        PodEnv.from_env({variable: raw})
    assert str(caught.value).startswith(f"{variable}={raw!r}: ")


def test_unset_and_empty_variables_take_the_defaults() -> None:
    assert PodEnv.from_env({}) == PodEnv()
    assert PodEnv.from_env(dict.fromkeys(PodEnv().to_env(), "")) == PodEnv()


def test_the_defaults_are_the_apis() -> None:
    minimal = TrainingRun.from_object(training_run("m", namespace="default", metadata={"uid": "u"}))
    built = pod_env(minimal, 1)
    defaults = PodEnv()
    for field in ("l1_dir", "keep_last", "every_steps", "every_seconds", "monitor", "recovery"):
        assert getattr(defaults, field) == getattr(built, field), field
    assert defaults.flush_timeout_seconds == built.flush_timeout_seconds
    assert defaults.monitor == Monitor() and defaults.recovery == Recovery()
    # The harness, run by hand, starts from the same values.
    by_hand = HarnessSettings()
    assert (by_hand.keep_last, by_hand.every_steps) == (built.keep_last, built.every_steps)
    assert by_hand.l1_dir == built.l1_dir and by_hand.data_dir == Path(DEFAULT_DATA_DIR)


def test_the_agents_thresholds_are_the_api_defaults() -> None:
    # Both bounds had drifted once (10 s release, 0 s start-up grace): now they cannot.
    assert Thresholds() == Thresholds.from_monitor(Monitor())
    monitor = Monitor()
    assert Thresholds().release_after_death_s == monitor.ghost_memory.release_timeout_seconds
    assert Thresholds().startup_grace_s == monitor.startup_grace_seconds


# -- no name of the contract is spelled outside it -------------------------------------------


def contract_names() -> set[str]:
    """Every variable, prefix, state-file name and the Lease suffix the contract defines."""
    names = {
        value
        for module in (env, files)
        for key, value in vars(module).items()
        if key.isupper()
        and isinstance(value, str)
        and (value.startswith("TRAINGUARD_") or key.endswith(("FILENAME", "FILENAME_PATTERN")))
    }
    return names | {env.LEASE_SUFFIX, files.STACKS_FILENAME_PATTERN.split("{")[0]}


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                found.add(id(body[0].value))
    return found


def spellings(path: Path, names: set[str]) -> list[str]:
    """`file:line: name` for each string in the code (not docstrings) that spells a name."""
    tree = ast.parse(path.read_text(), str(path))
    skip = _docstrings(tree)
    hits = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            hits += [
                f"{path}:{node.lineno}: {n}"
                for n in sorted(names)
                # A suffix ("-heartbeat") counts where a string ends with it, not in "--flag-name".
                if (node.value.endswith(n) if n.startswith("-") else n in node.value)
            ]
    return hits


def test_no_contract_name_is_spelled_elsewhere_in_the_product() -> None:
    names = contract_names()
    assert {"TRAINGUARD_L1_DIR", "heartbeat.json", "restore.json", "-heartbeat"} <= names
    files_scanned = [
        path
        for root in PRODUCT
        for path in sorted(root.rglob("*.py"))
        if CONTRACT_DIR not in path.parents
    ]
    assert len(files_scanned) > 50
    hits = [hit for path in files_scanned for hit in spellings(path, names)]
    assert not hits, "spell these through trainguard.contract:\n" + "\n".join(hits)


def test_the_spelling_check_finds_what_it_looks_for(tmp_path: Path) -> None:
    # The contract itself spells every name; a planted copy is caught, a docstring is not.
    in_contract = {h.split(": ")[-1] for h in spellings(CONTRACT_DIR / "env.py", contract_names())}
    assert "TRAINGUARD_MONITOR" in in_contract
    planted = tmp_path / "planted.py"
    planted.write_text('"""Reads TRAINGUARD_L1_DIR."""\n\nLEASE = f"{run}-heartbeat"\n')
    assert spellings(planted, contract_names()) == [f"{planted}:3: -heartbeat"]
