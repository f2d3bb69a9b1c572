"""The chart installed with helm: its RBAC is minimal, and uninstall keeps CRDs and runs.

The release is installed for real into its own namespace. Its operator pod is pinned to a
node that does not exist, so it stays Pending: these tests judge the identity the chart
creates, not a running operator. The table asks the apiserver (`kubectl auth can-i --as`)
what the chart's ServiceAccount may do; a second set of requests uses the account's own
token, so authentication and the RBAC escalation check of Role creation are real too.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from chart import Obj, Release, helm, install, token_kubeconfig, uninstall
from trainguard.api.constants import CRD_NAME
from trainguard_dev.cluster.cluster import Cluster
from trainguard_dev.testing.runs import training_run

pytestmark = [pytest.mark.apiserver, pytest.mark.timeout(300)]

# Stands in for a namespace the operator has no business in; every cluster has it.
OTHER = "kube-system"


@pytest.fixture(scope="module")
def release(cluster: Cluster) -> Iterator[Release]:
    installed = install(cluster)
    yield installed
    uninstall(cluster, installed)


@pytest.fixture(scope="module")
def operator_kubeconfig(cluster: Cluster, release: Release, tmp_path_factory: Any) -> Path:
    """A kubeconfig with the chart's ServiceAccount token, nothing else."""
    return token_kubeconfig(cluster, release, tmp_path_factory.mktemp("token") / "kubeconfig")


def can_i(cluster: Cluster, release: Release, *args: str) -> bool:
    """Whether the apiserver lets the chart's ServiceAccount do this."""
    result = cluster.kubectl("auth", "can-i", *args, f"--as={release.user}", check=False)
    answer = result.stdout.strip()
    assert answer in ("yes", "no"), result.stderr
    return answer == "yes"


# (what, kubectl auth can-i arguments; "{ns}" is the release's namespace). Outside the
# operator's job: credentials, other workloads, nodes' existence, RBAC escalation, acting
# as someone else, the user's runs and volumes.
DENIED = [
    ("read Secrets in another namespace", "get secrets -n " + OTHER),
    ("list Secrets cluster-wide", "list secrets --all-namespaces"),
    ("read Secrets in its own namespace", "get secrets -n {ns}"),
    ("read ConfigMaps in another namespace", "get configmaps -n " + OTHER),
    ("delete nodes", "delete nodes"),
    ("create nodes", "create nodes"),
    ("create Deployments", "create deployments.apps -n {ns}"),
    ("modify Deployments of others", "patch deployments.apps -n " + OTHER),
    ("delete DaemonSets of others", "delete daemonsets.apps -n " + OTHER),
    ("delete StatefulSets", "delete statefulsets.apps -n {ns}"),
    ("create Jobs", "create jobs.batch -n {ns}"),
    ("create ClusterRoles", "create clusterroles.rbac.authorization.k8s.io"),
    ("bind ClusterRoles", "create clusterrolebindings.rbac.authorization.k8s.io"),
    ("escalate Roles", "escalate roles.rbac.authorization.k8s.io -n {ns}"),
    ("impersonate users", "impersonate users"),
    ("exec into pods", "create pods --subresource=exec -n {ns}"),
    ("mint tokens for other ServiceAccounts", "create serviceaccounts --subresource=token -n {ns}"),
    ("delete TrainingRuns", "delete trainingruns.trainguard.dev -n {ns}"),
    ("update TrainingRuns (their spec)", "update trainingruns.trainguard.dev -n {ns}"),
    ("change the CRD", "update customresourcedefinitions.apiextensions.k8s.io"),
    ("delete PersistentVolumeClaims", "delete persistentvolumeclaims -n {ns}"),
    ("delete PersistentVolumes", "delete persistentvolumes"),
    ("delete namespaces", "delete namespaces"),
    (
        "delete all pods at once",
        "deletecollection pods -n {ns}",
    ),
]
# What the operator does, from templates/rbac/.
ALLOWED = [
    ("watch TrainingRuns everywhere", "watch trainingruns.trainguard.dev --all-namespaces"),
    ("write a run's status", "patch trainingruns.trainguard.dev --subresource=status -n {ns}"),
    ("create training pods", "create pods -n {ns}"),
    ("delete superseded pods", "delete pods -n {ns}"),
    ("apply the heartbeat Lease", "patch leases.coordination.k8s.io -n {ns}"),
    ("apply the agent's Role", "create roles.rbac.authorization.k8s.io -n {ns}"),
    ("send Events", "create events -n {ns}"),
    ("list a pod's FailedMount Events", "list events -n {ns}"),
    ("taint nodes", "patch nodes"),
    ("read a hot-path PersistentVolume", "get persistentvolumes"),
    ("watch CRDs (kopf)", "watch customresourcedefinitions.apiextensions.k8s.io"),
]


@pytest.mark.parametrize(("what", "action"), DENIED, ids=[row[0] for row in DENIED])
def test_denied_outside_its_job(cluster: Cluster, release: Release, what: str, action: str) -> None:
    assert not can_i(cluster, release, *action.format(ns=release.namespace).split()), what


@pytest.mark.parametrize(("what", "action"), ALLOWED, ids=[row[0] for row in ALLOWED])
def test_allowed_for_its_job(cluster: Cluster, release: Release, what: str, action: str) -> None:
    assert can_i(cluster, release, *action.format(ns=release.namespace).split()), what


def as_operator(
    cluster: Cluster, kubeconfig: Path, *args: str, body: Obj | None = None
) -> subprocess.CompletedProcess[str]:
    """Run kubectl with only the ServiceAccount's token (server-side dry runs change nothing)."""
    return subprocess.run(
        [str(cluster.bin_dir / "kubectl"), "--kubeconfig", str(kubeconfig), *args],
        input=yaml.safe_dump(body) if body is not None else None,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def forbidden(result: subprocess.CompletedProcess[str]) -> bool:
    return result.returncode != 0 and "forbidden" in result.stderr.lower()


def agent_role(namespace: str, rules: list[dict[str, Any]]) -> Obj:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": f"agent-{uuid.uuid4().hex[:6]}", "namespace": namespace},
        "rules": rules,
    }


def test_token_is_refused_secrets_nodes_and_workloads(
    cluster: Cluster, release: Release, operator_kubeconfig: Path
) -> None:
    node = cluster.kubectl("get", "nodes", "-o", "jsonpath={.items[0].metadata.name}").stdout
    dry = "--dry-run=server"
    assert forbidden(as_operator(cluster, operator_kubeconfig, "get", "secrets", "-n", OTHER))
    assert forbidden(as_operator(cluster, operator_kubeconfig, "delete", "node", node, dry))
    deploy = ["create", "deployment", "x", "--image=busybox", "-n", release.namespace, dry]
    assert forbidden(as_operator(cluster, operator_kubeconfig, *deploy))
    # ... while what it needs works with the same token.
    listed = as_operator(cluster, operator_kubeconfig, "get", "trainingruns", "-A")
    assert listed.returncode == 0, listed.stderr


def test_token_can_grant_the_agent_its_role_but_nothing_more(
    cluster: Cluster, release: Release, operator_kubeconfig: Path
) -> None:
    lease = {
        "apiGroups": ["coordination.k8s.io"],
        "resources": ["leases"],
        "resourceNames": ["run-heartbeat"],
        "verbs": ["get", "update", "patch"],
    }
    events = {"apiGroups": ["", "events.k8s.io"], "resources": ["events"], "verbs": ["create"]}
    create = ["create", "--dry-run=server", "-f", "-"]
    granted = as_operator(
        cluster, operator_kubeconfig, *create, body=agent_role(release.namespace, [lease, events])
    )
    assert granted.returncode == 0, granted.stderr
    # RBAC's escalation check: a Role granting what the operator lacks is refused.
    secrets = {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}
    escalated = as_operator(
        cluster, operator_kubeconfig, *create, body=agent_role(release.namespace, [secrets])
    )
    assert forbidden(escalated)
    assert "permissions not currently held" in escalated.stderr


def test_watched_namespaces_limit_the_run_permissions(cluster: Cluster, namespace: str) -> None:
    scoped = install(cluster, {"operator": {"watchNamespaces": [namespace]}})
    try:
        assert can_i(cluster, scoped, "create", "pods", "-n", namespace)
        assert not can_i(cluster, scoped, "create", "pods", "-n", OTHER)
        assert not can_i(cluster, scoped, "list", "trainingruns.trainguard.dev", "-A")
        assert can_i(cluster, scoped, "list", "trainingruns.trainguard.dev", "-n", namespace)
        # Cluster-scoped needs stay: nodes for taints, namespaces for kopf.
        assert can_i(cluster, scoped, "patch", "nodes")
        assert can_i(cluster, scoped, "watch", "namespaces")
    finally:
        uninstall(cluster, scoped)


def test_uninstall_keeps_the_crd_and_the_runs(cluster: Cluster, namespace: str) -> None:
    installed = install(cluster)
    run = training_run("survivor", {"model": {"parameters": 1_000_000}}, namespace=namespace)
    cluster.kubectl("create", "-f", "-", input=json.dumps(run))
    # Helm does not track crds/ as part of the release, so it never deletes (or upgrades) it.
    manifest = helm(
        "get", "manifest", installed.name, "-n", installed.namespace, kubeconfig=cluster.kubeconfig
    ).stdout
    assert "CustomResourceDefinition" not in manifest
    uninstall(cluster, installed)
    cluster.kubectl("get", "crd", CRD_NAME)
    cluster.kubectl("get", "trainingrun", "survivor", "-n", namespace)
    for role in ("runs", "cluster"):
        gone = cluster.kubectl("get", "clusterrole", f"{installed.account}-{role}", check=False)
        assert gone.returncode != 0 and "NotFound" in gone.stderr
