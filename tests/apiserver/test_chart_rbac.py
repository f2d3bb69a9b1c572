"""The chart installed with helm, in both install modes: its permissions are minimal.

A release is installed for real into its own namespace, once watching every namespace
(cluster-wide) and once watching one namespace (`operator.watchNamespaces`). Its operator
pod is pinned to a node that does not exist, so it stays Pending: these tests judge the
identity the chart creates, not a running operator. The RBAC table asks the apiserver
(`kubectl auth can-i --as`) what the chart's ServiceAccount may do; the admission table sends
real requests (server-side dry runs) with the account's own token, so authentication, RBAC
and the chart's admission policies all answer; the heartbeat test writes a run's Lease as
the run's agent, the operator, a tenant and another run's agent.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from chart import Obj, Release, helm, install, token_kubeconfig, uninstall
from trainguard.api.constants import CRD_NAME
from trainguard.contract.env import lease_name
from trainguard.operator.build.names import rbac_name
from trainguard_dev.cluster.cluster import Cluster
from trainguard_dev.demo import env as demo_env
from trainguard_dev.testing.runs import training_run

pytestmark = [pytest.mark.apiserver, pytest.mark.timeout(300)]

# Stands in for a namespace the operator has no business in; every cluster has it.
OTHER = "kube-system"


CLUSTER_WIDE = "cluster-wide"
NAMESPACED = "namespaced"


@dataclass(frozen=True)
class Install:
    """A release in one mode, and the namespace its runs live in (watched in namespaced mode)."""

    mode: str
    release: Release
    runs: str

    def format(self, action: str) -> str:
        return action.format(ns=self.release.namespace, runs=self.runs)


@pytest.fixture(scope="module", params=[CLUSTER_WIDE, NAMESPACED])
def install_mode(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[Install]:
    runs = f"runs-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", runs)
    values = {"operator": {"watchNamespaces": [runs]}} if request.param == NAMESPACED else {}
    installed = install(cluster, values)
    yield Install(request.param, installed, runs)
    uninstall(cluster, installed)
    cluster.kubectl("delete", "namespace", runs, "--wait=false", check=False)


@pytest.fixture(scope="module")
def release(install_mode: Install) -> Release:
    return install_mode.release


@pytest.fixture(scope="module")
def operator_kubeconfig(cluster: Cluster, release: Release, tmp_path_factory: Any) -> Path:
    """A kubeconfig with the chart's ServiceAccount token, nothing else."""
    return token_kubeconfig(cluster, release, tmp_path_factory.mktemp("token") / "kubeconfig")


def can_i(cluster: Cluster, release: Release, *args: str) -> bool:
    """Whether the apiserver's RBAC lets the chart's ServiceAccount do this."""
    result = cluster.kubectl("auth", "can-i", *args, f"--as={release.user}", check=False)
    answer = result.stdout.strip()
    assert answer in ("yes", "no"), result.stderr
    return answer == "yes"


# (what, kubectl auth can-i arguments). "{ns}" is the release's namespace, "{runs}" the
# namespace of the runs. Outside the operator's job: credentials, other workloads, nodes'
# existence, RBAC escalation, acting as someone else, the user's runs and volumes.
DENIED = [
    ("read Secrets in another namespace", "get secrets -n " + OTHER),
    ("list Secrets cluster-wide", "list secrets --all-namespaces"),
    ("read Secrets in its own namespace", "get secrets -n {ns}"),
    ("read Secrets where runs are", "get secrets -n {runs}"),
    ("read ConfigMaps in another namespace", "get configmaps -n " + OTHER),
    ("read ConfigMaps where runs are", "get configmaps -n {runs}"),
    ("list ConfigMaps where runs are", "list configmaps -n {runs}"),
    ("delete nodes", "delete nodes"),
    ("create nodes", "create nodes"),
    ("update nodes (only patch, for taints)", "update nodes"),
    ("change a node's status", "patch nodes --subresource=status"),
    ("watch nodes", "watch nodes"),
    ("create Deployments", "create deployments.apps -n {ns}"),
    ("modify Deployments of others", "patch deployments.apps -n " + OTHER),
    ("delete DaemonSets of others", "delete daemonsets.apps -n " + OTHER),
    ("delete StatefulSets", "delete statefulsets.apps -n {ns}"),
    ("create Jobs", "create jobs.batch -n {ns}"),
    ("create ClusterRoles", "create clusterroles.rbac.authorization.k8s.io"),
    ("bind ClusterRoles", "create clusterrolebindings.rbac.authorization.k8s.io"),
    ("escalate Roles", "escalate roles.rbac.authorization.k8s.io -n {ns}"),
    ("impersonate users", "impersonate users"),
    ("exec into pods", "create pods --subresource=exec -n {runs}"),
    ("evict pods", "create pods --subresource=eviction -n {runs}"),
    (
        "mint tokens for other ServiceAccounts",
        "create serviceaccounts --subresource=token -n {runs}",
    ),
    ("delete TrainingRuns", "delete trainingruns.trainguard.dev -n {runs}"),
    ("update TrainingRuns (their spec)", "update trainingruns.trainguard.dev -n {runs}"),
    ("change the CRD", "update customresourcedefinitions.apiextensions.k8s.io"),
    (
        "change admission policies",
        "delete validatingadmissionpolicies.admissionregistration.k8s.io",
    ),
    ("delete PersistentVolumeClaims", "delete persistentvolumeclaims -n {runs}"),
    ("delete PersistentVolumes", "delete persistentvolumes"),
    ("delete namespaces", "delete namespaces"),
    ("delete all pods at once", "deletecollection pods -n {runs}"),
]
# What the operator does, from templates/rbac/, in the namespaces it watches.
ALLOWED = [
    ("watch TrainingRuns where runs are", "watch trainingruns.trainguard.dev -n {runs}"),
    ("write a run's status", "patch trainingruns.trainguard.dev --subresource=status -n {runs}"),
    ("create training pods", "create pods -n {runs}"),
    ("delete superseded pods", "delete pods -n {runs}"),
    ("apply the heartbeat Lease", "patch leases.coordination.k8s.io -n {runs}"),
    ("apply the agent's Role", "create roles.rbac.authorization.k8s.io -n {runs}"),
    ("apply a run's env ConfigMap", "patch configmaps -n {runs}"),
    ("delete an outdated env ConfigMap", "delete configmaps -n {runs}"),
    ("send Events", "create events -n {runs}"),
    ("list a pod's FailedMount Events", "list events -n {runs}"),
    ("taint nodes", "patch nodes"),
    ("list the nodes it holds", "list nodes"),
    ("run node checks in its own namespace", "create pods -n {ns}"),
    ("remove a finished node check", "delete pods -n {ns}"),
    ("send Events on nodes (kept in default)", "create events -n default"),
    ("read a hot-path PersistentVolume", "get persistentvolumes"),
    ("watch CRDs (kopf)", "watch customresourcedefinitions.apiextensions.k8s.io"),
]
# Where the modes differ: (what, action, cluster-wide, namespaced). A namespaced install holds
# Roles in its watched namespaces only; a cluster-wide one is granted every namespace by RBAC
# (its writes in the system namespaces are refused by admission: the next table).
BY_MODE = [
    ("watch TrainingRuns everywhere", "watch trainingruns.trainguard.dev -A", True, False),
    ("create pods outside the watched namespaces", "create pods -n default", True, False),
    (
        "write Leases outside the watched namespaces",
        "patch leases.coordination.k8s.io -n {ns}",
        True,
        False,
    ),
    ("watch namespaces (kopf, namespaced mode)", "watch namespaces", False, True),
]


@pytest.mark.parametrize(("what", "action"), DENIED, ids=[row[0] for row in DENIED])
def test_denied_outside_its_job(
    cluster: Cluster, install_mode: Install, what: str, action: str
) -> None:
    assert not can_i(cluster, install_mode.release, *install_mode.format(action).split()), what


@pytest.mark.parametrize(("what", "action"), ALLOWED, ids=[row[0] for row in ALLOWED])
def test_allowed_for_its_job(
    cluster: Cluster, install_mode: Install, what: str, action: str
) -> None:
    assert can_i(cluster, install_mode.release, *install_mode.format(action).split()), what


@pytest.mark.parametrize(
    ("what", "action", "cluster_wide", "namespaced"), BY_MODE, ids=[row[0] for row in BY_MODE]
)
def test_permissions_follow_the_install_mode(
    cluster: Cluster,
    install_mode: Install,
    what: str,
    action: str,
    cluster_wide: bool,
    namespaced: bool,
) -> None:
    expected = cluster_wide if install_mode.mode == CLUSTER_WIDE else namespaced
    assert can_i(cluster, install_mode.release, *install_mode.format(action).split()) is expected


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
    cluster: Cluster, install_mode: Install, operator_kubeconfig: Path
) -> None:
    release = install_mode.release
    node = cluster.kubectl("get", "nodes", "-o", "jsonpath={.items[0].metadata.name}").stdout
    dry = "--dry-run=server"
    assert forbidden(as_operator(cluster, operator_kubeconfig, "get", "secrets", "-n", OTHER))
    assert forbidden(as_operator(cluster, operator_kubeconfig, "delete", "node", node, dry))
    deploy = ["create", "deployment", "x", "--image=busybox", "-n", release.namespace, dry]
    assert forbidden(as_operator(cluster, operator_kubeconfig, *deploy))
    # ... while what it needs works with the same token.
    listed = as_operator(
        cluster, operator_kubeconfig, "get", "trainingruns", "-n", install_mode.runs
    )
    assert listed.returncode == 0, listed.stderr


def test_token_can_grant_the_agent_its_role_but_nothing_more(
    cluster: Cluster, install_mode: Install, operator_kubeconfig: Path
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
        cluster, operator_kubeconfig, *create, body=agent_role(install_mode.runs, [lease, events])
    )
    assert granted.returncode == 0, granted.stderr
    # RBAC's escalation check: a Role granting what the operator lacks is refused.
    secrets = {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}
    escalated = as_operator(
        cluster, operator_kubeconfig, *create, body=agent_role(install_mode.runs, [secrets])
    )
    assert forbidden(escalated)
    assert "permissions not currently held" in escalated.stderr


def pod(name: str) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
    }


def lease(name: str, annotations: dict[str, str] | None = None) -> Obj:
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": name, "annotations": annotations or {}},
        "spec": {"holderIdentity": "someone"},
    }


# Real requests with the operator's token (server-side dry runs: admitted, never stored):
# (what, namespace, object, allowed cluster-wide, allowed namespaced). "{runs}" and "{ns}" as
# above. Refused in the system namespaces by admission (cluster-wide) or RBAC (namespaced).
REQUESTS = [
    ("create a pod where runs are", "{runs}", pod("p"), True, True),
    ("create a heartbeat Lease where runs are", "{runs}", lease("r-heartbeat"), True, True),
    ("create a pod in kube-system", OTHER, pod("p"), False, False),
    ("create a Lease in kube-system", OTHER, lease("l"), False, False),
    ("create a pod in kube-public", "kube-public", pod("p"), False, False),
    ("create a node check pod in its own namespace", "{ns}", pod("p"), True, True),
    ("create a pod in default (not watched)", "default", pod("p"), True, False),
]


@pytest.mark.parametrize(
    ("what", "namespace", "obj", "cluster_wide", "namespaced"),
    REQUESTS,
    ids=[row[0] for row in REQUESTS],
)
def test_requests_with_the_operators_token(
    cluster: Cluster,
    install_mode: Install,
    operator_kubeconfig: Path,
    what: str,
    namespace: str,
    obj: Obj,
    cluster_wide: bool,
    namespaced: bool,
) -> None:
    expected = cluster_wide if install_mode.mode == CLUSTER_WIDE else namespaced
    target = install_mode.format(namespace)
    result = as_operator(
        cluster, operator_kubeconfig, "create", "--dry-run=server", "-n", target, "-f", "-",
        body=obj,
    )  # fmt: skip
    if expected:
        assert result.returncode == 0, f"{what}: {result.stderr}"
    else:
        assert forbidden(result), f"{what}: {result.returncode} {result.stderr}"


OURS = {"key": "trainguard.dev/unhealthy", "value": "GhostMemory", "effect": "NoSchedule"}
# Changes of a node with the operator's token (dry runs): its own taint, labels and
# annotations only; RBAC allows any patch of a node, the chart's policy narrows it.
NODE_PATCHES = [
    ("taint with its own key", {"spec": {"taints": [OURS]}}, True),
    ("label and annotate under trainguard.dev/", {
        "metadata": {
            "labels": {"trainguard.dev/node-health": "suspect"},
            "annotations": {"trainguard.dev/unhealthy-reason": "GhostMemory reported by ..."},
        }
    }, True),
    ("taint with another key", {"spec": {"taints": [{**OURS, "key": "other"}]}}, False),
    ("cordon", {"spec": {"unschedulable": True}}, False),
    ("change another label", {"metadata": {"labels": {"team": "mine"}}}, False),
    ("change another annotation", {"metadata": {"annotations": {"owner": "me"}}}, False),
]  # fmt: skip


@pytest.mark.parametrize(
    ("what", "patch", "allowed"), NODE_PATCHES, ids=[row[0] for row in NODE_PATCHES]
)
def test_node_changes_with_the_operators_token(
    cluster: Cluster,
    install_mode: Install,
    operator_kubeconfig: Path,
    what: str,
    patch: Obj,
    allowed: bool,
) -> None:
    node = cluster.kubectl("get", "nodes", "-o", "jsonpath={.items[0].metadata.name}").stdout
    result = as_operator(
        cluster, operator_kubeconfig, "patch", "node", node, "--dry-run=server",
        "--type=merge", "-p", json.dumps(patch),
    )  # fmt: skip
    if allowed:
        assert result.returncode == 0, f"{what}: {result.stderr}"
    else:
        assert forbidden(result), f"{what}: {result.returncode} {result.stderr}"
        assert "the trainguard operator" in result.stderr


def account_kubeconfig(
    cluster: Cluster, namespace: str, account: str, rules: list[Obj], directory: Path
) -> Path:
    """A ServiceAccount with a Role of these rules in `namespace`; its token kubeconfig."""
    cluster.kubectl("create", "serviceaccount", account, "-n", namespace)
    role = {**agent_role(namespace, rules), "metadata": {"name": account, "namespace": namespace}}
    cluster.kubectl("apply", "-f", "-", input=json.dumps(role))
    cluster.kubectl(
        "create", "rolebinding", account, "-n", namespace, f"--role={account}",
        f"--serviceaccount={namespace}:{account}",
    )  # fmt: skip
    return demo_env.token_kubeconfig(cluster, namespace, account, directory / account)


def test_only_the_runs_agent_and_the_operator_write_its_heartbeat(
    cluster: Cluster, install_mode: Install, operator_kubeconfig: Path, tmp_path: Path
) -> None:
    namespace, run = install_mode.runs, f"r{uuid.uuid4().hex[:6]}"
    leases = [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["*"]}]
    # The run's agent: its ServiceAccount is named as the operator names it.
    agent = account_kubeconfig(cluster, namespace, rbac_name(run), leases, tmp_path)
    # A tenant of the namespace allowed to write every Lease, and another run's agent.
    tenant = account_kubeconfig(cluster, namespace, "tenant", leases, tmp_path)
    other = account_kubeconfig(cluster, namespace, rbac_name(f"{run}x"), leases, tmp_path)

    forged = json.dumps({"metadata": {"annotations": {"trainguard.dev/verdict": "GhostMemory"}}})
    renewed = json.dumps({"metadata": {"annotations": {"trainguard.dev/verdict": "Healthy"}}})
    # The run's own Lease, and a gang member's (member 3 of a gang).
    for heartbeat in (lease_name(run), lease_name(run, 3)):
        created = as_operator(
            cluster, operator_kubeconfig, "create", "-n", namespace, "-f", "-",
            body=lease(heartbeat),
        )  # fmt: skip
        assert created.returncode == 0, created.stderr
        for who in (tenant, other):
            refused = as_operator(
                cluster, who, "patch", "lease", heartbeat, "-n", namespace, "-p", forged
            )
            assert forbidden(refused), refused.stderr
            assert f"only the agent of run {run} " in refused.stderr
        # The admin of the cluster (the tests' own identity) is refused too: the agent's word.
        admin = cluster.kubectl(
            "patch", "lease", heartbeat, "-n", namespace, "-p", forged, check=False
        )
        assert admin.returncode != 0 and "only the agent of run" in admin.stderr
        written = cluster.kubectl("get", "lease", heartbeat, "-n", namespace, "-o", "json").stdout
        assert "GhostMemory" not in written
        accepted = as_operator(
            cluster, agent, "patch", "lease", heartbeat, "-n", namespace, "-p", renewed
        )
        assert accepted.returncode == 0, accepted.stderr
        # The operator writes a gang's restart generation there.
        told = json.dumps({"metadata": {"annotations": {"trainguard.dev/gang-generation": "2"}}})
        ordered = as_operator(
            cluster, operator_kubeconfig, "patch", "lease", heartbeat, "-n", namespace,
            "--type=merge", "-p", told,
        )  # fmt: skip
        assert ordered.returncode == 0, ordered.stderr
    # Other Leases in the namespace are the tenant's business.
    own = as_operator(cluster, tenant, "create", "-n", namespace, "-f", "-", body=lease("mine"))
    assert own.returncode == 0, own.stderr


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
