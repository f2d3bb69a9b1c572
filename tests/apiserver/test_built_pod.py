"""The pods the operator builds are accepted by the real apiserver (server-side dry run).

Unit tables check the builder field by field; only the apiserver knows all of its own
validation rules (e.g. a `matchFields` requirement takes exactly one value).
"""

from __future__ import annotations

import json
import uuid

import pytest

from trainguard.api import TrainingRun
from trainguard.api.constants import MAX_NODES
from trainguard.api.trainingrun import MAX_GANG_RUN_NAME_LENGTH
from trainguard.operator.build.lease import lease
from trainguard.operator.build.pod import PodInputs, pods_env_config, training_pod
from trainguard.operator.build.role import role
from trainguard.operator.build.service import gang_service
from trainguard_dev.cluster.cluster import Cluster
from trainguard_dev.testing.runs import training_run

pytestmark = [pytest.mark.apiserver, pytest.mark.timeout(120)]

# The small valid run, with a remote layer whose credentials the pod mounts.
SPEC = {
    "checkpoints": {
        "remote": [
            {"name": "s3", "uri": "s3://ckpts/llm", "credentialsSecret": {"name": "s3-creds"}}
        ]
    },
}


@pytest.mark.parametrize("excluded", [(), ("gpu-a",), ("gpu-a", "gpu-b", "gpu-c")])
def test_a_built_pod_passes_the_apiservers_validation(
    cluster: Cluster, excluded: tuple[str, ...]
) -> None:
    namespace = f"t-{uuid.uuid4().hex[:8]}"
    run = TrainingRun.model_validate(
        training_run("llm", SPEC, namespace=namespace, metadata={"uid": str(uuid.uuid4())})
    )
    manifest = training_pod(
        run, PodInputs(3, agent_image="trainguard:test", excluded_nodes=excluded)
    )
    cluster.kubectl("create", "namespace", namespace)
    try:
        # The ServiceAccount the operator creates beside the pod (admission looks it up).
        account = manifest["spec"]["serviceAccountName"]
        cluster.kubectl("create", "serviceaccount", account, "-n", namespace)
        result = cluster.kubectl(
            "create", "--dry-run=server", "-o", "json", "-f", "-",
            input=json.dumps(manifest), check=False,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        accepted = json.loads(result.stdout)
        terms = accepted["spec"].get("affinity", {}).get("nodeAffinity", {})
        required = terms.get("requiredDuringSchedulingIgnoredDuringExecution", {})
        fields = [
            value
            for term in required.get("nodeSelectorTerms", [])
            for requirement in term.get("matchFields", [])
            for value in requirement["values"]
        ]
        assert sorted(fields) == sorted(excluded)
    finally:
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def test_the_longest_gangs_children_pass_the_apiservers_validation(cluster: Cluster) -> None:
    # The longest gang run name and the highest member index: every name is still valid.
    namespace = f"t-{uuid.uuid4().hex[:8]}"
    name = "g" * MAX_GANG_RUN_NAME_LENGTH
    run = TrainingRun.model_validate(
        training_run(
            name,
            {"trainer": {"nodes": MAX_NODES}},
            namespace=namespace,
            metadata={"uid": str(uuid.uuid4())},
        )
    )
    pod = training_pod(run, PodInputs(3, agent_image="trainguard:test", member=MAX_NODES - 1))
    config = pods_env_config(run, 3)
    children = [gang_service(run), lease(run, MAX_NODES - 1), role(run), config, pod]
    cluster.kubectl("create", "namespace", namespace)
    try:
        cluster.kubectl(
            "create", "serviceaccount", pod["spec"]["serviceAccountName"], "-n", namespace
        )
        for child in children:
            result = cluster.kubectl(
                "create", "--dry-run=server", "-o", "json", "-f", "-",
                input=json.dumps(child), check=False,
            )  # fmt: skip
            assert result.returncode == 0, f"{child['kind']}: {result.stderr}"
        accepted = json.loads(result.stdout)
        assert accepted["spec"]["hostname"] == f"{name}-{MAX_NODES - 1}"
        assert accepted["spec"]["subdomain"] == f"{name}-gang"
    finally:
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
