"""The TrainingRun object as a whole: apiVersion, kind, metadata, spec and status."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import ConfigDict, Field

from trainguard.api.base import KubeModel, ObjectRule
from trainguard.api.constants import API_VERSION, KIND, MAX_NODES
from trainguard.api.spec import TrainingRunSpec
from trainguard.api.status import TrainingRunStatus
from trainguard.api.types import MAX_LABEL_LENGTH

# The run's name is the value of the trainguard.dev/run label on its children.
MAX_RUN_NAME_LENGTH = MAX_LABEL_LENGTH
# A gang's members are named `<run>-<index>` through a headless Service `<run>-gang`: both are
# DNS labels (the Service's an RFC 1035 one), so a gang's run name is one too, short enough for
# the longest member index.
MAX_GANG_RUN_NAME_LENGTH = MAX_LABEL_LENGTH - len(f"-{MAX_NODES - 1}")
GANG_RUN_NAME_RE = "^[a-z]([-a-z0-9]*[a-z0-9])?$"


class ObjectMeta(KubeModel):
    """The metadata fields trainguard reads; the apiserver's others are kept as they are."""

    model_config = ConfigDict(extra="allow", strict=False)

    name: str | None = Field(default=None, description="Name of the run.")
    namespace: str | None = Field(default=None, description="Namespace of the run.")
    uid: str | None = Field(default=None, description="UID, for owner references.")
    generation: int | None = Field(default=None, description="Spec generation.")
    resource_version: str | None = Field(default=None, description="Resource version.")
    labels: dict[str, str] = Field(default_factory=dict, description="Labels.")
    annotations: dict[str, str] = Field(default_factory=dict, description="Annotations.")


class TrainingRun(KubeModel):
    """A TrainingRun (trainguard.dev/v1alpha1)."""

    object_rules = (
        ObjectRule(
            cel=f"size(self.metadata.name) <= {MAX_RUN_NAME_LENGTH}",
            message=(
                f"metadata.name must be at most {MAX_RUN_NAME_LENGTH} characters: it labels "
                "every child of the run"
            ),
            check=lambda run: (
                run.metadata.name is None or len(run.metadata.name) <= MAX_RUN_NAME_LENGTH
            ),
            field="metadata.name",
        ),
        ObjectRule(
            cel=(
                "self.spec.trainer.nodes == 1 || "
                f"(size(self.metadata.name) <= {MAX_GANG_RUN_NAME_LENGTH} && "
                f"self.metadata.name.matches('{GANG_RUN_NAME_RE}'))"
            ),
            message=(
                "a gang's run (spec.trainer.nodes > 1) needs a name of at most "
                f"{MAX_GANG_RUN_NAME_LENGTH} lowercase letters, digits and '-', starting with a "
                "letter: its members' hostnames and Service are named after it"
            ),
            check=lambda run: (
                run.spec.trainer.nodes == 1
                or run.metadata.name is None
                or (
                    len(run.metadata.name) <= MAX_GANG_RUN_NAME_LENGTH
                    and re.fullmatch(GANG_RUN_NAME_RE, run.metadata.name) is not None
                )
            ),
            # The apiserver blames no field under metadata: the gang's size is blamed.
            field="spec.trainer.nodes",
        ),
    )

    api_version: Literal["trainguard.dev/v1alpha1"] = Field(
        default=API_VERSION, description="trainguard.dev/v1alpha1"
    )
    kind: Literal["TrainingRun"] = Field(default=KIND, description="TrainingRun")
    metadata: ObjectMeta = Field(default_factory=ObjectMeta, description="Object metadata.")
    spec: TrainingRunSpec = Field(description="What to run and how to keep it alive.")
    status: TrainingRunStatus | None = Field(default=None, description="Observed state.")
