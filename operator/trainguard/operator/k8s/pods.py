"""A run's pods: what the operator reads from them (phase, node, the scheduler's reason).

Also what the kubelet says about a pod that cannot start: containers waiting for an image,
and, read only while the pod's volumes are not set up, the pod's `FailedMount` Events (a
Secret that does not exist is told nowhere else; the operator never reads Secrets).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import replace
from datetime import datetime
from typing import Any

from trainguard.api.constants import (
    ANNOTATION_ENV_CONFIG,
    ANNOTATION_SPEC_HASH,
    LABEL_RUN,
    StagingPhase,
)
from trainguard.api.status import Preflight, Staging
from trainguard.operator.build.constants import FIELD_MANAGER, Container
from trainguard.operator.build.names import attempt_of, member_of
from trainguard.operator.conditions import preflight_condition, staging_condition
from trainguard.operator.k8s.client import METADATA_LIST, Kube, KubeError, object_path
from trainguard.operator.policies import initsteps, inputs
from trainguard.operator.policies.inputs import Waiting
from trainguard.operator.policies.lifecycle import PodView

log = logging.getLogger(__name__)
POD_SCHEDULED = "PodScheduled"
UNSCHEDULABLE = "Unschedulable"
# False until the pod's sandbox exists, which waits for every volume to be set up.
READY_TO_START = "PodReadyToStartContainers"
PENDING = "Pending"
FAILED_MOUNT = "FailedMount"


def _unschedulable(pod: dict[str, Any]) -> dict[str, Any] | None:
    for condition in pod.get("status", {}).get("conditions") or []:
        if (
            condition.get("type") == POD_SCHEDULED
            and condition.get("status") == "False"
            and condition.get("reason") == UNSCHEDULABLE
        ):
            return dict(condition)
    return None


def scheduler_message(pod: dict[str, Any]) -> str | None:
    """The scheduler's reason while the pod's PodScheduled condition is False/Unschedulable."""
    condition = _unschedulable(pod)
    return None if condition is None else str(condition.get("message") or UNSCHEDULABLE)


def _moment(text: object) -> datetime | None:
    """An apiserver timestamp (RFC 3339), or None when absent or malformed."""
    if not text:
        return None
    try:
        return datetime.fromisoformat(str(text).replace("Z", "+00:00"))
    except ValueError:
        return None


def unschedulable_since(pod: dict[str, Any]) -> datetime | None:
    """When the scheduler first found no node for the pod (its condition's transition time)."""
    condition = _unschedulable(pod)
    return _moment(None if condition is None else condition.get("lastTransitionTime"))


def preflight_exit(pod: dict[str, Any]) -> tuple[int | None, str | None]:
    """The preflight step's exit code once it terminated, and its termination message."""
    for status in pod.get("status", {}).get("initContainerStatuses") or []:
        terminated = (status.get("state") or {}).get("terminated")
        if status.get("name") == Container.PREFLIGHT and terminated:
            return terminated.get("exitCode"), terminated.get("message") or None
    return None, None


def step_message(pod: dict[str, Any], step: str) -> str | None:
    """The termination message an init step left, once it terminated."""
    return step_exit(pod, step)[1]


def step_exit(pod: dict[str, Any], step: str) -> tuple[int | None, str | None]:
    """An init step's exit code and termination message, once it terminated."""
    for status in pod.get("status", {}).get("initContainerStatuses") or []:
        terminated = (status.get("state") or {}).get("terminated")
        if status.get("name") == step and terminated:
            return terminated.get("exitCode"), terminated.get("message") or None
    return None, None


def failed_step(pod: dict[str, Any]) -> str | None:
    """The first init step that exited non-zero, in words (when it left no message)."""
    for status in pod.get("status", {}).get("initContainerStatuses") or []:
        terminated = (status.get("state") or {}).get("terminated") or {}
        if terminated.get("exitCode"):
            why = terminated.get("reason") or "no reason"
            return f"init step {status.get('name')} exited {terminated['exitCode']} ({why})"
    return None


def waiting(pod: dict[str, Any]) -> tuple[Waiting, ...]:
    """Containers (init ones first) waiting for something other than their turn."""
    found = []
    status = pod.get("status", {})
    for container in [
        *(status.get("initContainerStatuses") or []),
        *(status.get("containerStatuses") or []),
    ]:
        wait = (container.get("state") or {}).get("waiting") or {}
        reason = wait.get("reason")
        if reason and reason not in inputs.STARTING_REASONS:
            found.append(
                Waiting(
                    container.get("name") or "",
                    container.get("image") or "",
                    reason,
                    wait.get("message") or "",
                )
            )
    return tuple(found)


def volumes_pending(pod: dict[str, Any]) -> bool:
    """Whether the pod is on a node, Pending, and its sandbox waits (for its volumes)."""
    status = pod.get("status", {})
    if not pod.get("spec", {}).get("nodeName") or status.get("phase") != PENDING:
        return False
    return any(
        c.get("type") == READY_TO_START and c.get("status") == "False"
        for c in status.get("conditions") or []
    )


def pod_view(pod: dict[str, Any]) -> PodView | None:
    """The operator's view of a pod, or None when it carries no attempt label (not ours)."""
    meta = pod.get("metadata", {})
    attempt = attempt_of(meta.get("labels") or {})
    if attempt is None:
        return None
    exit_code, message = preflight_exit(pod)
    report = initsteps.parse(Preflight, message)
    staging_exit, staged = step_exit(pod, Container.STAGE_DATA)
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
        member=member_of(meta.get("labels") or {}),
        created=_moment(meta.get("creationTimestamp")),
        phase=pod.get("status", {}).get("phase") or "Pending",
        node=pod.get("spec", {}).get("nodeName") or None,
        deleting=meta.get("deletionTimestamp") is not None,
        spec_hash=(meta.get("annotations") or {}).get(ANNOTATION_SPEC_HASH),
        env_config=(meta.get("annotations") or {}).get(ANNOTATION_ENV_CONFIG),
        unschedulable=scheduler_message(pod),
        unschedulable_since=unschedulable_since(pod),
        preflight_exit=exit_code,
        message=evidence or pod.get("status", {}).get("message") or failed_step(pod),
        preflight_report=message,
        staging_report=staged,
        staging_exit=staging_exit,
        waiting=waiting(pod),
        volumes_pending=volumes_pending(pod),
    )


def mount_failure(kube: Kube, namespace: str, pod: str) -> str | None:
    """The newest `FailedMount` Event of a pod, in the kubelet's words; None if none or unread.

    An Event is evidence, not state: when it cannot be read (e.g. a chart without `list` on
    events) the run reports what the pod itself shows.
    """
    selector = f"involvedObject.kind=Pod,involvedObject.name={pod},reason={FAILED_MOUNT}"
    try:
        answer = kube.request(
            "GET", object_path("v1", "events", namespace, None), query={"fieldSelector": selector}
        )
    except KubeError as err:
        log.warning("cannot read the events of pod %s/%s: %s", namespace, pod, err)
        return None
    items = answer.get("items") or []
    newest = max(items, key=_event_time, default=None)
    return str(newest.get("message") or "") or None if newest is not None else None


def _event_time(event: dict[str, Any]) -> str:
    # RFC 3339 times of one format sort as text; the series' last, else the first.
    series = event.get("series") or {}
    return str(
        series.get("lastObservedTime") or event.get("lastTimestamp") or event.get("eventTime") or ""
    )


def with_mount_failures(
    kube: Kube, namespace: str, pods: tuple[PodView, ...]
) -> tuple[PodView, ...]:
    """The pods, each waiting for its volumes with the newest FailedMount Event about it."""
    return tuple(
        replace(p, mount_failure=mount_failure(kube, namespace, p.name))
        if inputs.needs_mount_check(p)
        else p
        for p in pods
    )


def create_pod(kube: Kube, manifest: dict[str, Any]) -> None:
    """Create a pod; one of that name already there is left as it is.

    A pod is created once and never changed (its spec is immutable): a plain create costs the
    apiserver less than a server-side apply, which a thousand members at once feel.
    """
    meta = manifest["metadata"]
    try:
        kube.request(
            "POST",
            object_path("v1", "pods", meta["namespace"], None),
            manifest,
            {"fieldManager": FIELD_MANAGER},
        )
    except KubeError as err:
        if err.status != 409:  # AlreadyExists: a cycle that saw an older list of pods
            raise


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


def current_pods(
    kube: Kube, namespace: str, run: str, watched: Iterable[PodView]
) -> tuple[PodView, ...]:
    """The run's pods as the apiserver has them now, not only as a watch last reported them.

    Asked for their metadata only: which pods exist is what a lagging watch gets wrong, and a
    thousand members' whole pods would be megabytes for the apiserver to send and for this
    process to decode. A pod the watch reported is taken as it reported it; one it has not
    delivered yet is taken from its metadata (just created: Pending, on no node); one the
    apiserver no longer has is gone. A pod the apiserver marks for deletion is deleting.
    """
    answer = kube.request(
        "GET",
        object_path("v1", "pods", namespace, None),
        query={"labelSelector": f"{LABEL_RUN}={run}"},
        accept=METADATA_LIST,
    )
    seen = {pod.name: pod for pod in watched}
    views: list[PodView] = []
    for item in answer.get("items") or []:
        now = pod_view(item)
        if now is None:
            continue
        before = seen.get(now.name)
        if before is None or before.created != now.created:  # not delivered yet, or a new pod
            views.append(now)
        else:
            views.append(replace(before, deleting=before.deleting or now.deleting))
    return tuple(views)
