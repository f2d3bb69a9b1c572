"""The Helm chart without a cluster: lint, render, and the properties the rendering must keep.

Hardened pod, one replica replaced with Recreate, probes on kopf's health endpoint, RBAC that
grants what the operator does (a comment on each rule) and nothing from the forbidden list,
documented values, and optional objects only when asked for.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from run_factory import make_run

from chart import CHART, Obj, find, helm, only, render, render_text
from trainguard.api.constants import CRD_NAME
from trainguard.contract.env import lease_name
from trainguard.operator.build.names import rbac_name
from trainguard.operator.build.role import role
from trainguard_dev.crdgen import CRD_FILE

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
RELEASE = "tg"
NAMESPACE = "trainguard-system"
APP_VERSION = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
FULLNAME = f"{RELEASE}-trainguard"
EVERYTHING: Obj = {
    "metrics": {"serviceMonitor": {"enabled": True}},
    "networkPolicy": {"enabled": True, "apiServerCIDRs": ["10.0.0.1/32"]},
    "dashboard": {"enabled": True},
    "alerts": {"enabled": True},
}
NAMESPACED: Obj = {"operator": {"watchNamespaces": ["team-a", "team-b"]}}
# Never granted, in any mode: reading credentials, changing who may do what, acting as
# someone else, and touching workloads that are not training pods.
FORBIDDEN_RESOURCES = {
    "secrets",
    "deployments",
    "statefulsets",
    "daemonsets",
    "replicasets",
    "jobs",
    "cronjobs",
    "clusterroles",
    "clusterrolebindings",
    "pods/exec",
    "pods/attach",
    "pods/portforward",
    "serviceaccounts/token",
    "namespaces/finalize",
}
FORBIDDEN_VERBS = {"*", "escalate", "bind", "impersonate", "deletecollection"}
# Never read, in any mode (users keep configuration in them): the operator writes and deletes
# its runs' env ConfigMaps by name, blind.
UNREAD_RESOURCES = {"configmaps"}
READ_VERBS = {"get", "list", "watch"}
# Objects the operator must never delete: the user's runs, nodes, claims and volumes.
NEVER_DELETED = {"trainingruns", "nodes", "persistentvolumeclaims", "persistentvolumes"}
METRICS = (
    "trainguard_runs",
    "trainguard_verdicts_total",
    "trainguard_actions_total",
    "trainguard_detection_latency_seconds",
    "trainguard_restarts_total",
    "trainguard_reschedules_total",
    "trainguard_checkpoint_age_seconds",
    "trainguard_nodes_excluded",
)


def rules(objects: list[Obj]) -> list[dict[str, Any]]:
    """Every rule of every ClusterRole and Role the chart renders."""
    return [r for o in objects if o["kind"] in ("ClusterRole", "Role") for r in o["rules"]]


def granted(objects: list[Obj]) -> set[tuple[str, str, str]]:
    """(apiGroup, resource, verb) triples the chart's roles grant."""
    return {
        (group, resource, verb)
        for rule in rules(objects)
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


@pytest.fixture(scope="module")
def default() -> list[Obj]:
    return render(RELEASE, NAMESPACE)


@pytest.fixture(scope="module")
def deployment(default: list[Obj]) -> Obj:
    return only(default, "Deployment")


def container(deployment: Obj) -> Obj:
    containers: list[Obj] = deployment["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


@pytest.mark.parametrize("values", [{}, EVERYTHING, NAMESPACED], ids=["default", "all", "ns"])
def test_helm_lint_passes(values: Obj) -> None:
    result = helm("lint", "--strict", str(CHART), values=values)
    assert "0 chart(s) failed" in result.stdout


def test_chart_ships_the_generated_crd() -> None:
    assert (CHART / "crds" / f"{CRD_NAME}.yaml").read_text() == (REPO / CRD_FILE).read_text()


def test_one_replica_replaced_with_recreate(deployment: Obj) -> None:
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}


def test_pod_is_hardened(deployment: Obj) -> None:
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    security = container(deployment)["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert "privileged" not in security


def test_probes_use_kopfs_health_endpoint(deployment: Obj) -> None:
    operator = container(deployment)
    port = next(p["containerPort"] for p in operator["ports"] if p["name"] == "health")
    assert f"--liveness=http://0.0.0.0:{port}/healthz" in operator["args"]
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert operator[probe]["httpGet"] == {"path": "/healthz", "port": "health"}


def test_runs_trainguard_operator_with_its_own_image_as_agent(deployment: Obj) -> None:
    operator = container(deployment)
    image = f"ghcr.io/trainguard/trainguard:{APP_VERSION}"
    assert operator["image"] == image
    assert operator["command"] == ["trainguard"]
    assert operator["args"][:2] == ["operator", "--all-namespaces"]
    assert f"--agent-image={image}" in operator["args"]
    assert operator["resources"]["requests"] and operator["resources"]["limits"]["memory"]
    # Taints for every run only on the operator's own evidence, its checks in its namespace.
    assert "--taint-policy=confirmed" in operator["args"]
    assert f"--node-check-namespace={NAMESPACE}" in operator["args"]


def test_an_unknown_taint_policy_is_refused() -> None:
    result = helm(
        "template", RELEASE, str(CHART), values={"operator": {"taintPolicy": "sometimes"}},
        check=False,
    )  # fmt: skip
    assert result.returncode != 0
    assert "operator.taintPolicy must be confirmed, immediate or never" in result.stderr


def test_digest_pins_the_image() -> None:
    digest = "sha256:" + "a" * 64
    objects = render(RELEASE, NAMESPACE, {"image": {"digest": digest}})
    operator = container(only(objects, "Deployment"))
    assert operator["image"] == f"ghcr.io/trainguard/trainguard@{digest}"
    assert f"--agent-image=ghcr.io/trainguard/trainguard@{digest}" in operator["args"]


def test_operator_uses_the_charts_service_account(default: list[Obj], deployment: Obj) -> None:
    account = only(default, "ServiceAccount")["metadata"]["name"]
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == account
    for binding in find(default, "ClusterRoleBinding"):
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}
        ]


def test_every_rbac_rule_says_why() -> None:
    for template in sorted((CHART / "templates" / "rbac").glob("*role-*.yaml")):
        lines = template.read_text().splitlines()
        for number, line in enumerate(lines):
            if line.strip().startswith("- apiGroups:"):
                above = lines[number - 1].strip()
                assert above.startswith("#"), f"{template.name}:{number + 1} has no comment"


@pytest.mark.parametrize("values", [{}, NAMESPACED, EVERYTHING], ids=["default", "ns", "all"])
def test_rbac_grants_nothing_from_the_forbidden_list(values: Obj) -> None:
    objects = render(RELEASE, NAMESPACE, values)
    triples = granted(objects)
    assert triples
    assert not {t for t in triples if t[1] in FORBIDDEN_RESOURCES or t[1] == "*"}
    assert not {t for t in triples if t[2] in FORBIDDEN_VERBS}
    assert not {t for t in triples if t[1] in UNREAD_RESOURCES and t[2] in READ_VERBS}
    assert not {t for t in triples if t[1] in NEVER_DELETED and t[2] == "delete"}
    assert not {t for t in triples if t[0] == "*"}
    # Only status and bookkeeping of runs are written: never their spec by update.
    assert ("trainguard.dev", "trainingruns", "update") not in triples


def test_operator_holds_every_permission_it_grants_the_agent(default: list[Obj]) -> None:
    # Kubernetes lets a subject create a Role only with permissions the subject holds itself
    # (no `escalate`), so the agent's Role must be a subset of the operator's run permissions.
    runs = only(default, "ClusterRole", f"{FULLNAME}-runs")
    held = granted([runs])
    for rule in role(make_run())["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    assert (group, resource, verb) in held


def test_all_namespaces_binds_run_permissions_cluster_wide(default: list[Obj]) -> None:
    bound = {b["roleRef"]["name"] for b in find(default, "ClusterRoleBinding")}
    assert bound == {f"{FULLNAME}-runs", f"{FULLNAME}-cluster"}
    # Its RoleBindings: the node checks in its own namespace, Events on Nodes in default.
    bindings = {
        (b["metadata"]["namespace"], b["roleRef"]["kind"], b["roleRef"]["name"])
        for b in find(default, "RoleBinding")
    }
    assert bindings == {
        (NAMESPACE, "Role", f"{FULLNAME}-node-checks"),
        ("default", "Role", f"{FULLNAME}-node-events"),
    }
    events = only(default, "Role", f"{FULLNAME}-node-events")
    assert events["rules"] == [{"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}]
    assert ("", "namespaces", "list") not in granted(default)


def test_watched_namespaces_get_role_bindings_only_there() -> None:
    objects = render(RELEASE, NAMESPACE, NAMESPACED)
    operator = container(only(objects, "Deployment"))
    assert "--all-namespaces" not in operator["args"]
    assert {"--namespace=team-a", "--namespace=team-b"} <= set(operator["args"])
    bindings = [b for b in find(objects, "RoleBinding") if b["roleRef"]["kind"] == "ClusterRole"]
    assert {b["metadata"]["namespace"] for b in bindings} == {"team-a", "team-b"}
    assert {b["roleRef"]["name"] for b in bindings} == {f"{FULLNAME}-runs"}
    cluster_bound = {b["roleRef"]["name"] for b in find(objects, "ClusterRoleBinding")}
    assert cluster_bound == {f"{FULLNAME}-cluster"}
    # kopf lists namespaces to follow the watched ones (cluster-wide it needs not).
    assert ("", "namespaces", "watch") in granted(objects)


def test_optional_objects_only_when_enabled(default: list[Obj]) -> None:
    kinds = {o["kind"] for o in default}
    assert kinds == {
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "Deployment",
        "Service",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    }
    everything = {o["kind"] for o in render(RELEASE, NAMESPACE, EVERYTHING)}
    assert {"ServiceMonitor", "NetworkPolicy", "ConfigMap", "PrometheusRule"} <= everything
    off = {"create": False, "admissionPolicies": False}
    bare = render(RELEASE, NAMESPACE, {"metrics": {"enabled": False}, "rbac": off})
    assert {o["kind"] for o in bare} == {"ServiceAccount", "Deployment"}


def test_heartbeat_policy_names_the_runs_agent_as_the_operator_names_it(default: list[Obj]) -> None:
    policy = only(default, "ValidatingAdmissionPolicy", f"{FULLNAME}-heartbeats")
    text = json.dumps(policy["spec"])
    # The names the operator gives a run's Lease (a gang member's too) and its agent's
    # ServiceAccount.
    (condition,) = policy["spec"]["matchConditions"]
    pattern = re.search(r"matches\('([^']+)'\)", condition["expression"])
    assert pattern is not None, condition
    for name in (lease_name("llm"), lease_name("llm", 3), lease_name("x-heartbeat", 12)):
        assert re.search(pattern.group(1), name), name
    for other in ("llm", "llm-heartbeats", "llm-heartbeat-x", "heartbeat-llm"):
        assert not re.search(pattern.group(1), other), other
    assert "lastIndexOf('-heartbeat')" in text
    assert f"'{rbac_name('')}'" in text
    operator = f"system:serviceaccount:{NAMESPACE}:{FULLNAME}"
    assert f"'{operator}'" in text
    assert policy["spec"]["failurePolicy"] == "Fail"
    assert "namespaceSelector" not in policy["spec"]["matchConstraints"]  # every namespace
    binding = only(default, "ValidatingAdmissionPolicyBinding", f"{FULLNAME}-heartbeats")
    assert binding["spec"]["validationActions"] == ["Deny"]
    system = only(default, "ValidatingAdmissionPolicy", f"{FULLNAME}-system-namespaces")
    selector = system["spec"]["matchConstraints"]["namespaceSelector"]["matchExpressions"][0]
    assert selector["values"] == ["kube-system", "kube-public", "kube-node-lease"]
    # Namespaced objects only: tainting nodes (cluster-scoped) stays admitted.
    assert system["spec"]["matchConstraints"]["resourceRules"][0]["scope"] == "Namespaced"


def test_namespaced_mode_guards_the_watched_namespaces_only() -> None:
    objects = render(RELEASE, NAMESPACE, NAMESPACED)
    policy = only(objects, "ValidatingAdmissionPolicy", f"{FULLNAME}-heartbeats")
    selector = policy["spec"]["matchConstraints"]["namespaceSelector"]["matchExpressions"][0]
    assert selector == {
        "key": "kubernetes.io/metadata.name",
        "operator": "In",
        "values": ["team-a", "team-b"],
    }
    # RBAC alone keeps a namespaced operator out of the system namespaces.
    assert not find(objects, "ValidatingAdmissionPolicy", f"{FULLNAME}-system-namespaces")


def test_network_policy_needs_apiserver_addresses() -> None:
    result = helm(
        "template", RELEASE, str(CHART), values={"networkPolicy": {"enabled": True}}, check=False
    )
    assert result.returncode != 0
    assert "networkPolicy.apiServerCIDRs is required" in result.stderr


def test_metrics_service_targets_the_operator(default: list[Obj], deployment: Obj) -> None:
    service = only(default, "Service")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    assert service["spec"]["ports"][0]["targetPort"] == "metrics"
    operator = container(deployment)
    assert {"name": "metrics", "containerPort": 9090, "protocol": "TCP"} in operator["ports"]


def test_dashboard_configmap_carries_a_panel_per_metric() -> None:
    configmap = only(render(RELEASE, NAMESPACE, EVERYTHING), "ConfigMap")
    dashboard = json.loads(configmap["data"]["trainguard.json"])
    assert dashboard == json.loads((CHART / "dashboards" / "trainguard.json").read_text())
    queries = " ".join(
        target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])
    )
    for metric in METRICS:
        assert metric in queries, f"no panel shows {metric}"


def test_every_value_is_documented() -> None:
    # Every leaf value has a comment line right above it or above a key it is nested in.
    lines = (CHART / "values.yaml").read_text().splitlines()
    keys = [
        (number, len(m.group(1)), m.group(2), bool(m.group(3).strip()))
        for number, line in enumerate(lines)
        if (m := re.match(r"^( *)([A-Za-z][\w.-]*):(.*)$", line))
    ]
    documented: list[tuple[int, bool]] = []  # (indent, documented) of the enclosing keys
    undocumented = []
    for index, (number, indent, name, inline) in enumerate(keys):
        documented = [d for d in documented if d[0] < indent]
        commented = lines[number - 1].strip().startswith("#") or any(d for _, d in documented)
        documented.append((indent, commented))
        following = keys[index + 1][1] if index + 1 < len(keys) else -1
        leaf = inline or following <= indent
        if leaf and not commented:
            undocumented.append(name)
    assert not undocumented, f"values without a comment: {undocumented}"


def test_render_has_no_empty_or_null_fields() -> None:
    text = render_text(RELEASE, NAMESPACE, EVERYTHING)
    assert ": null" not in text
    assert "<no value>" not in text
