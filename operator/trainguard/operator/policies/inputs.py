"""Bad input, pure: what the pod needs from the user and cannot get, in one state that names it.

A wrong image, a missing Secret or claim, or a data source the pod cannot read is not fixed
by another attempt or another node: a new pod would fail the same way. So none of these
starts an attempt or counts as a restart. The pod is kept and the state names what is
missing, told by one Event (the state's reason changes once):

- an image: a container or init container waiting `ErrImagePull`, `ImagePullBackOff`,
  `ErrImageNeverPull` or `InvalidImageName` -> `ImagePullFailed` (Progressing=False);
- a Secret: a `FailedMount` Event on the pod (`secret "x" not found`) while its volumes are
  not set up, or a container waiting `CreateContainerConfigError` with those words ->
  `SecretNotFound` (Progressing=False);
- a claim: PodScheduled False, Unschedulable, `persistentvolumeclaim "x" not found` ->
  `ClaimNotFound` (Progressing=False);
- the data source: the pod failed because `stage-data` exited 4 (a source read hung) or 5
  (the source cannot be listed or read) -> `DataSourceUnreachable` (Failed=True).

The first three wait on the kubelet or the scheduler, which retry by themselves: the pod goes
on as soon as the image, Secret or claim is there, without a new attempt. A failed pod cannot
go on: `DataSourceUnreachable` holds the run (no new attempt, the failed pod kept with its
logs) until the spec changes (a new attempt for the new spec), the run is suspended and
resumed, or the failed pod is deleted (the next attempt tries the source again).
The other exits of `stage-data` (3: a copy that keeps differing from the manifest, 6: the
local disk cannot be written) may be the node's fault, so they stay with the escalation
ladder (`PodFailed`, bounded by `recovery.maxRestarts` and the restart back-off).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from trainguard.api import TrainingRunSpec
from trainguard.api.constants import Reason
from trainguard.operator.build.constants import Container
from trainguard.operator.conditions import RunState

if TYPE_CHECKING:
    from trainguard.operator.policies.lifecycle import PodView

# Waiting reasons of a container whose image the kubelet cannot get.
IMAGE_PULL_REASONS = frozenset(
    {"ErrImagePull", "ImagePullBackOff", "ErrImageNeverPull", "InvalidImageName"}
)
# Waiting reasons of a pod on its way: nothing to report.
STARTING_REASONS = frozenset({"ContainerCreating", "PodInitializing"})
CREATE_CONFIG_ERROR = "CreateContainerConfigError"
# Exit codes of `trainguard stage-data` that blame the source (`ExitCode.SOURCE_HUNG`,
# `ExitCode.SOURCE_ERROR` in `trainguard.initsteps.stage_data`).
STAGING_SOURCE_EXITS = frozenset({4, 5})
FAILED = "Failed"
SECRET_NOT_FOUND = re.compile(r'secret "([^"]+)" not found')
CLAIM_NOT_FOUND = re.compile(r'persistentvolumeclaim "([^"]+)" not found')


@dataclass(frozen=True)
class Waiting:
    """A container of the pod (init or not) that waits for something other than its turn."""

    container: str
    image: str
    reason: str
    message: str = ""


def source_failed(pod: PodView) -> bool:
    """Whether the pod failed because `stage-data` could not read the data source."""
    return pod.phase == FAILED and pod.staging_exit in STAGING_SOURCE_EXITS


def needs_mount_check(pod: PodView) -> bool:
    """Whether the pod's Events are worth reading: on a node, its volumes not set up yet."""
    return pod.volumes_pending and not pod.deleting


def missing_secret(pod: PodView) -> str | None:
    """The Secret the pod waits for, named by the kubelet, if any."""
    texts = [pod.mount_failure or ""]
    texts += [w.message for w in pod.waiting if w.reason == CREATE_CONFIG_ERROR]
    found = next((m for m in map(SECRET_NOT_FOUND.search, texts) if m), None)
    return found.group(1) if found else None


def missing_claim(pod: PodView) -> str | None:
    """The claim the scheduler says does not exist, if any."""
    found = CLAIM_NOT_FOUND.search(pod.unschedulable or "")
    return found.group(1) if found else None


def image_pull(pod: PodView) -> Waiting | None:
    """The first container whose image the kubelet cannot pull."""
    return next((w for w in pod.waiting if w.reason in IMAGE_PULL_REASONS), None)


def _secret_use(spec: TrainingRunSpec, secret: str) -> str:
    uses = []
    data = spec.data
    source_secret = data.source.credentials_secret if data is not None else None
    if source_secret is not None and source_secret.name == secret:
        uses.append("the data source")
    layers = [
        layer.name
        for layer in spec.checkpoints.remote
        if layer.credentials_secret is not None and layer.credentials_secret.name == secret
    ]
    if layers:
        uses.append(f"remote layer {', '.join(layers)}")
    return f" (credentials of {' and '.join(uses)})" if uses else ""


def _claim_use(spec: TrainingRunSpec, claim: str) -> str:
    uses = []
    data = spec.data
    if data is not None and data.source.pvc is not None and data.source.pvc.claim_name == claim:
        uses.append("the data source")
    uses += [f"remote layer {r.name}" for r in spec.checkpoints.remote if r.claim_name == claim]
    return f" ({', '.join(uses)})" if uses else ""


def _image_fix(container: str) -> str:
    if container == Container.TRAINER:
        return "make it available to the node or change spec.trainer.image"
    return "make it available to the node or change the operator's --agent-image"


def state(spec: TrainingRunSpec, namespace: str, pod: PodView) -> RunState | None:
    """The state naming the input the pod lacks, or None when it lacks nothing we can see."""
    name = pod.name
    if source_failed(pod):
        return RunState(
            Reason.DATA_SOURCE_UNREACHABLE,
            f"pod {name} failed: {Container.STAGE_DATA} could not read the data source "
            f"(exit {pod.staging_exit}): {pod.message or 'no message'}; no new attempt while "
            f"the source is unchanged: fix spec.data, or delete pod {name} (or suspend and "
            "resume the run) to try the source again",
            failed=True,
            warning=True,
        )
    claim = missing_claim(pod)
    if claim is not None:
        return RunState(
            Reason.CLAIM_NOT_FOUND,
            f"pod {name} cannot be scheduled: PersistentVolumeClaim {claim}"
            f"{_claim_use(spec, claim)} not found in namespace {namespace}; the pod is "
            "scheduled once it exists",
            warning=True,
        )
    secret = missing_secret(pod)
    if secret is not None:
        return RunState(
            Reason.SECRET_NOT_FOUND,
            f"pod {name} cannot start: Secret {secret}{_secret_use(spec, secret)} not found "
            f"in namespace {namespace}; the pod starts once it exists",
            warning=True,
        )
    pull = image_pull(pod)
    if pull is not None:
        detail = f": {pull.message}" if pull.message else ""
        return RunState(
            Reason.IMAGE_PULL_FAILED,
            f"pod {name} cannot start: image {pull.image} of container {pull.container} "
            f"cannot be pulled ({pull.reason}{detail}); the kubelet retries: "
            f"{_image_fix(pull.container)}",
            warning=True,
        )
    return None
