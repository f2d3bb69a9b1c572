"""Events about a run, as `kubectl describe tr` shows them."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from trainguard.api.constants import API_VERSION, KIND
from trainguard.api.trainingrun import ObjectMeta
from trainguard.operator.build.constants import FIELD_MANAGER
from trainguard.operator.conditions import EventSpec
from trainguard.operator.k8s.client import Kube, object_path

NORMAL = "Normal"
WARNING = "Warning"


def send(kube: Kube, meta: ObjectMeta, event: EventSpec, instance: str) -> None:
    """Record one Event on the run (core/v1, which kubectl describe lists)."""
    name = meta.name or ""
    namespace = meta.namespace or ""
    now = datetime.now(UTC)
    body = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{name}.{uuid.uuid4().hex[:12]}", "namespace": namespace},
        "involvedObject": {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "name": name,
            "namespace": namespace,
            "uid": meta.uid,
        },
        "reason": event.reason,
        "message": event.message,
        "type": WARNING if event.warning else NORMAL,
        "source": {"component": FIELD_MANAGER},
        "reportingComponent": FIELD_MANAGER,
        "reportingInstance": instance,
        "firstTimestamp": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "lastTimestamp": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "count": 1,
    }
    kube.request("POST", object_path("v1", "events", namespace, None), body)
