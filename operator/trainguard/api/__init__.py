"""The TrainingRun API (trainguard.dev/v1alpha1): pydantic models, the CRD's single source.

This is the bottom layer: it imports nothing else from trainguard and never the Kubernetes
client. `TrainingRun.from_object(obj)` parses an object as the apiserver stores it.
"""

from trainguard.api.spec import TrainingRunSpec
from trainguard.api.status import Condition, TrainingRunStatus
from trainguard.api.trainingrun import TrainingRun

__all__ = ["Condition", "TrainingRun", "TrainingRunSpec", "TrainingRunStatus"]
