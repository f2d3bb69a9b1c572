"""A run's env ConfigMaps (`trainguard.operator.build.envconfig`) on the apiserver.

The current one is applied before the pods that name it: the kubelet starts no container
whose ConfigMap is missing. An older one (the spec changed, so its content did) is deleted
when the cycle that deletes the last live pod naming it runs: a pod being deleted starts no
container, so it needs none. The names come from the pods' `env-config` annotations; the
operator never lists or reads ConfigMaps (the chart grants it no read of them). One missed
(the operator stopped in between) goes with the run, which owns it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from trainguard.operator.k8s.client import Kube, KubeError, concurrently, object_path
from trainguard.operator.policies.lifecycle import PodView

log = logging.getLogger(__name__)


def unused(pods: Iterable[PodView], kept: Iterable[PodView], current: str) -> list[str]:
    """The env ConfigMaps `pods` name that neither `current` nor a live pod of `kept` names."""
    named = {current, *(pod.env_config for pod in kept if not pod.deleting)}
    return sorted({pod.env_config for pod in pods if pod.env_config} - named)


def prune(kube: Kube, namespace: str, run: str, names: list[str]) -> None:
    """Delete the env ConfigMaps `names` (`unused`); one already gone is fine."""

    def delete(name: str) -> None:
        log.info("%s/%s: deleting env ConfigMap %s (no live pod names it)", namespace, run, name)
        try:
            kube.request("DELETE", object_path("v1", "configmaps", namespace, name))
        except KubeError as err:
            if not err.not_found:
                raise

    concurrently(delete, names)
