"""A run's pods: what the operator reads from them (phase, node, the scheduler's reason)."""

from __future__ import annotations

from typing import Any

from trainguard.api.constants import ANNOTATION_SPEC_HASH, LABEL_RUN, StagingPhase
from trainguard.api.status import Preflight, Staging
from trainguard.operator.build.constants import Container
from trainguard.operator.build.names import attempt_of
from trainguard.operator.conditions import preflight_condition, staging_condition
from trainguard.operator.k8s.client import Kube, KubeError, object_path
from trainguard.operator.policies import initsteps
from trainguard.operator.policies.lifecycle import PodView

POD_SCHEDULED = "PodScheduled"
UNSCHEDULABLE = "Unschedulable"


def scheduler_message(pod: dict[str, Any]) -> str | None:
    """The scheduler's reason while the pod's PodScheduled condition is False/Unschedulable."""
    for condition in pod.get("status", {}).get("conditions") or []:
        if (
            condition.get("type") == POD_SCHEDULED
            and condition.get("status") == "False"
            and condition.get("reason") == UNSCHEDULABLE
        ):
            return str(condition.get("message") or UNSCHEDULABLE)
    return None


def preflight_exit(pod: dict[str, Any]) -> tuple[int | None, str | None]:
    """The preflight step's exit code once it terminated, and its termination message."""
    for status in pod.get("status", {}).get("initContainerStatuses") or []:
        terminated = (status.get("state") or {}).get("terminated")
        if status.get("name") == Container.PREFLIGHT and terminated:
            return terminated.get("exitCode"), terminated.get("message") or None
    return None, None


def step_message(pod: dict[str, Any], step: str) -> str | None:
    """The termination message an init step left, once it terminated."""
    for status in pod.get("status", {}).get("initContainerStatuses") or []:
        terminated = (status.get("state") or {}).get("terminated")
        if status.get("name") == step and terminated:
            return terminated.get("message") or None
    return None


def pod_view(pod: dict[str, Any]) -> PodView | None:
    """The operator's view of a pod, or None when it carries no attempt label (not ours)."""
    meta = pod.get("metadata", {})
    attempt = attempt_of(meta.get("labels") or {})
    if attempt is None:
        return None
    exit_code, message = preflight_exit(pod)
    report = initsteps.parse(Preflight, message)
    staged = step_message(pod, Container.STAGE_DATA)
    staging = initsteps.parse(Staging, staged)
    # The evidence of a failed step, in words: the failed checks and figures, or the error.
    evidence = message
    if report is not None:
        evidence = preflight_condition(report)[2] if not report.passed else None
    if staging is not None and staging.phase is StagingPhase.FAILED:
        evidence = staging_condition(staging)[2]
    return PodView(
        name=meta["name"],
        attempt=attempt,
        phase=pod.get("status", {}).get("phase") or "Pending",
        node=pod.get("spec", {}).get("nodeName") or None,
        deleting=meta.get("deletionTimestamp") is not None,
        spec_hash=(meta.get("annotations") or {}).get(ANNOTATION_SPEC_HASH),
        unschedulable=scheduler_message(pod),
        preflight_exit=exit_code,
        message=evidence or pod.get("status", {}).get("message") or None,
        preflight_report=message,
        staging_report=staged,
    )


def delete_pod(kube: Kube, namespace: str, name: str, force: bool = False) -> None:
    """Delete a pod; one already gone is fine.

    `force` removes it at once (grace period 0): only for a pod whose node is NotReady or
    gone, where no kubelet will ever confirm the deletion and the pod would stay Terminating.
    """
    body = {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0}
    try:
        kube.request("DELETE", object_path("v1", "pods", namespace, name), body if force else None)
    except KubeError as err:
        if not err.not_found:
            raise


def list_pods(kube: Kube, namespace: str, run: str) -> tuple[PodView, ...]:
    """The run's pods as the apiserver has them now (not as a watch last reported them)."""
    answer = kube.request(
        "GET",
        object_path("v1", "pods", namespace, None),
        query={"labelSelector": f"{LABEL_RUN}={run}"},
    )
    views = (pod_view(item) for item in answer.get("items") or [])
    return tuple(view for view in views if view is not None)
