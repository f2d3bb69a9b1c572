"""The companions of a run's pod: ServiceAccount, Role, RoleBinding and the heartbeat Lease."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from run_factory import make_run

from trainguard.api import TrainingRun
from trainguard.operator.build.lease import lease
from trainguard.operator.build.role import role
from trainguard.operator.build.rolebinding import role_binding
from trainguard.operator.build.serviceaccount import service_account

pytestmark = pytest.mark.unit

RUN = make_run({"monitor": {"leaseDurationSeconds": 30}})
OWNER = {
    "apiVersion": "trainguard.dev/v1alpha1",
    "kind": "TrainingRun",
    "name": "llm",
    "uid": "uid-1",
    "controller": True,
    "blockOwnerDeletion": True,
}

BUILDERS: list[tuple[Callable[[TrainingRun], dict[str, Any]], str, str, str, str]] = [
    (service_account, "v1", "ServiceAccount", "llm-trainguard", "rbac"),
    (role, "rbac.authorization.k8s.io/v1", "Role", "llm-trainguard", "rbac"),
    (role_binding, "rbac.authorization.k8s.io/v1", "RoleBinding", "llm-trainguard", "rbac"),
    (lease, "coordination.k8s.io/v1", "Lease", "llm-heartbeat", "heartbeat"),
]


@pytest.mark.parametrize(("build", "api_version", "kind", "name", "component"), BUILDERS)
def test_every_child_is_named_labelled_and_owned(
    build: Callable[[TrainingRun], dict[str, Any]],
    api_version: str,
    kind: str,
    name: str,
    component: str,
) -> None:
    manifest = build(RUN)
    assert manifest["apiVersion"] == api_version
    assert manifest["kind"] == kind
    meta = manifest["metadata"]
    assert meta["name"] == name
    assert meta["namespace"] == "team-a"
    assert meta["labels"] == {
        "trainguard.dev/run": "llm",
        "trainguard.dev/component": component,
        "app.kubernetes.io/managed-by": "trainguard",
    }
    assert meta["ownerReferences"] == [OWNER]


def test_role_grants_only_the_agents_needs() -> None:
    assert role(RUN)["rules"] == [
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": ["llm-heartbeat"],
            "verbs": ["get", "update", "patch"],
        },
        {"apiGroups": ["", "events.k8s.io"], "resources": ["events"], "verbs": ["create"]},
    ]


def test_role_binding_binds_the_runs_role_to_the_runs_account() -> None:
    binding = role_binding(RUN)
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": "llm-trainguard",
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "llm-trainguard", "namespace": "team-a"}
    ]


def test_lease_carries_the_duration_and_nothing_the_agent_writes() -> None:
    spec = lease(RUN)["spec"]
    assert spec == {"leaseDurationSeconds": 30}


def test_a_run_without_identity_cannot_own_children() -> None:
    anonymous = RUN.model_copy(update={"metadata": RUN.metadata.model_copy(update={"uid": None})})
    with pytest.raises(ValueError, match="uid"):
        service_account(anonymous)
