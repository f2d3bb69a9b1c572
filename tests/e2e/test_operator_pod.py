"""The minimal example becomes exactly one guarded pod on a GPU node; `kubectl get tr` says so."""

from __future__ import annotations

from typing import Any

import pytest
from operator_proc import apply, condition, get_json, pods_of, pool_run

from trainguard.api.constants import ANNOTATION_ENV_CONFIG
from trainguard.contract import env
from trainguard_dev.cluster.cluster import Cluster
from trainguard_dev.testing.podenv import config_map_data, container_environment
from trainguard_dev.testing.polling import eventually
from trainguard_dev.testing.processes import OperatorProcess

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]
pytest_plugins = ("operator_fixtures",)

RESTRICTED = {
    "allowPrivilegeEscalation": False,
    "runAsNonRoot": True,
    "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}


def _by_name(items: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {item["name"]: item for item in items}


def _running(cluster: Cluster, namespace: str) -> dict[str, Any] | None:
    run = get_json(cluster, "trainingrun", "minimal", "-n", namespace)
    return run if run.get("status", {}).get("phase") == "Running" else None


def test_minimal_example_yields_one_guarded_pod(
    cluster: Cluster, namespace: str, node_pool: str, operator: OperatorProcess
) -> None:
    excluded = f"{node_pool}-gpu-0"
    # A node the run must avoid (as recorded after a failure), written before the first pod.
    # The operator is stopped meanwhile: a running one keeps the status it wrote itself and
    # would not see the exclusion written beside it.
    operator.stop()
    apply(cluster, namespace, pool_run(node_pool))
    cluster.kubectl(
        "patch", "trainingrun", "minimal", "-n", namespace, "--subresource=status",
        "--type=merge", "-p",
        f'{{"status": {{"excludedNodes": [{{"node": "{excluded}", "reason": "GhostMemory",'
        f' "time": "2026-01-01T00:00:00Z"}}]}}}}',
    )  # fmt: skip
    operator.start()
    run = eventually(lambda: _running(cluster, namespace), 60, "the run to be Running")
    [pod] = pods_of(cluster, namespace, "minimal")
    meta, spec = pod["metadata"], pod["spec"]

    assert meta["name"] == "minimal-1"
    assert meta["labels"]["trainguard.dev/run"] == "minimal"
    assert meta["labels"]["trainguard.dev/attempt"] == "1"
    [owner] = meta["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"]) == (
        "TrainingRun",
        "minimal",
        run["metadata"]["uid"],
    )
    assert owner["controller"] is True and owner["blockOwnerDeletion"] is True
    fields = get_json(cluster, "pod", "minimal-1", "-n", namespace, "--show-managed-fields")
    # Created once by the operator's field manager (a create, not an apply: a pod never
    # changes once made), its spec included.
    ours = [m for m in fields["metadata"]["managedFields"] if m["manager"] == "trainguard"]
    assert [m["operation"] for m in ours] == ["Update"], ours
    assert "f:containers" in ours[0]["fieldsV1"]["f:spec"], ours

    # Placed on a GPU node of the pool, never on the excluded one.
    assert spec["nodeName"] == f"{node_pool}-gpu-1"
    assert spec["nodeSelector"] == {"trainguard.dev/test-pool": node_pool}
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"] == [
        {"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": [excluded]}]}
    ]

    assert spec["shareProcessNamespace"] is True
    assert spec["serviceAccountName"] == "minimal-trainguard"
    assert spec["restartPolicy"] == "Never"
    assert spec["securityContext"] == {
        "runAsNonRoot": True,
        "fsGroup": 65532,
        "fsGroupChangePolicy": "OnRootMismatch",
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    init = _by_name(spec["initContainers"])
    assert list(init) == ["agent", "preflight"]
    assert init["agent"]["restartPolicy"] == "Always"
    assert init["agent"]["command"] == ["trainguard", "agent"]
    assert init["preflight"]["command"] == ["trainguard", "preflight"]
    [trainer] = spec["containers"]
    assert trainer["command"] == ["trainguard", "supervise", "--", "python", "train.py"]
    for container in spec["initContainers"]:
        assert container["securityContext"] == RESTRICTED, container["name"]
    # The user's code may write under its home: the trainer's root stays writable.
    assert trainer["securityContext"] == {**RESTRICTED, "readOnlyRootFilesystem": False}
    # Only the agent holds the pod's API token.
    assert spec["automountServiceAccountToken"] is False
    holders = [
        c["name"]
        for c in [*spec["initContainers"], trainer]
        if any(m["name"] == "api-access" for m in c["volumeMounts"])
    ]
    assert holders == ["agent"]

    # 125M parameters x 16 B = 2 GB per checkpoint; keepLast 2 + 1 on disk, + margin.
    assert trainer["resources"]["requests"] == {
        "ephemeral-storage": "9081Mi",
        "nvidia.com/gpu": "1",
    }
    assert trainer["resources"]["limits"] == {"nvidia.com/gpu": "1"}
    volumes = _by_name(spec["volumes"])
    assert volumes["l1"]["emptyDir"] == {"sizeLimit": "5723Mi"}
    # L0 in pod memory: 2 kept checkpoints and the one being written.
    assert volumes["l0"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "5723Mi"}
    assert volumes["state"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "64Mi"}
    assert volumes["logs"]["emptyDir"] == {"sizeLimit": "2Gi"}
    # (The admission adds the service-account token; its Role is the run's narrow one.)
    mounts = {
        m["mountPath"]: m["name"]
        for m in trainer["volumeMounts"]
        if not m["name"].startswith("kube-api-access-")
    }
    assert mounts == {
        "/trainguard/l1": "l1",
        "/trainguard/l0": "l0",
        "/trainguard/state": "state",
        "/trainguard/logs": "logs",
    }

    # The variables every pod of the run shares come from its env ConfigMap (immutable, owned
    # by the run); the pod's own `env` adds what is its alone.
    config_name = meta["annotations"][ANNOTATION_ENV_CONFIG]
    config = get_json(cluster, "configmap", config_name, "-n", namespace)
    assert config["immutable"] is True
    assert config["metadata"]["ownerReferences"][0]["uid"] == run["metadata"]["uid"]
    assert trainer["envFrom"] == [{"configMapRef": {"name": config_name}}]
    variables: dict[str, Any] = container_environment(trainer, config_map_data(config))
    variables.update({e["name"]: e["valueFrom"] for e in trainer["env"] if "valueFrom" in e})
    assert variables[env.RUN_NAME] == "minimal"
    assert variables[env.RUN_UID] == run["metadata"]["uid"]
    assert variables[env.NAMESPACE] == namespace
    assert variables[env.ATTEMPT] == "1"
    assert variables[env.LEASE_NAME] == "minimal-heartbeat"
    assert variables[env.L1_DIR] == "/trainguard/l1"
    assert variables[env.L0_DIR] == "/trainguard/l0"
    assert variables[env.STATE_DIR] == "/trainguard/state"
    assert variables[env.HEARTBEAT_FILE] == "/trainguard/state/heartbeat.json"
    assert variables[env.NODE_NAME] == {
        "fieldRef": {"apiVersion": "v1", "fieldPath": "spec.nodeName"}
    }
    assert variables[env.POD_NAME] == {
        "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}
    }

    # The status and `kubectl get tr`.
    status = run["status"]
    assert (status["attempt"], status["node"]) == (1, f"{node_pool}-gpu-1")
    ready = condition(run, "Ready")
    assert ready is not None and (ready["status"], ready["reason"]) == ("True", "Training")
    table = cluster.kubectl("get", "tr", "-n", namespace).stdout.splitlines()
    header, row = table[0].split(), table[1].split()
    assert header[:3] == ["NAME", "PHASE", "STEP"] and "NODE" in header
    assert row[0] == "minimal" and row[1] == "Running" and f"{node_pool}-gpu-1" in row

    # The companions exist, owned by the run.
    for kind, name in (
        ("serviceaccount", "minimal-trainguard"),
        ("role", "minimal-trainguard"),
        ("rolebinding", "minimal-trainguard"),
        ("lease", "minimal-heartbeat"),
    ):
        child = get_json(cluster, kind, name, "-n", namespace)
        assert child["metadata"]["ownerReferences"][0]["uid"] == run["metadata"]["uid"], kind
