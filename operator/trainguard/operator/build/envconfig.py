"""The run's env ConfigMap: the pod contract's variables that all of its pods share.

Every container of every training pod takes the ConfigMap whole (`envFrom`) and carries in its
own `env` only what differs between pods (`trainguard.contract.env.MEMBER_VARIABLES`: attempt,
fences, Lease, node rank), the downward API's names and what only that container is told (a
Secret's mount). Written into each of three containers of each of a gang's thousand members,
the shared variables made most of a pod's bytes, and so of every pod write, watch event and
decode in the control plane; once per run they cost nothing per pod.

Its name carries a digest of its content (`<run>-env-<digest>`) and it is immutable: a pod
reads its variables when a container starts, so the values a pod was built with must not
change under it. A spec change (or an operator that renders a variable differently) makes a
new ConfigMap; the old one is deleted by the cycle that deletes the last live pod naming it
(`k8s.envconfigs`), and the run's deletion takes any left (they are owned by the run).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from trainguard.api import TrainingRun
from trainguard.api.constants import COMPONENT_POD_ENV
from trainguard.contract.env import PodEnv
from trainguard.operator.build.meta import child_meta, run_name
from trainguard.operator.build.names import env_config_name, run_labels

DIGEST_LENGTH = 10


def config_name(run: str, shared: dict[str, str]) -> str:
    """The name of the ConfigMap holding exactly `shared` (a digest of it in the name)."""
    encoded = json.dumps(shared, sort_keys=True, separators=(",", ":")).encode()
    return env_config_name(run, hashlib.sha256(encoded).hexdigest()[:DIGEST_LENGTH])


def env_config(run: TrainingRun, contract: PodEnv) -> dict[str, Any]:
    """The immutable ConfigMap of `contract.shared_env()`, named by its digest."""
    name = run_name(run)
    shared = contract.shared_env()
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": child_meta(run, config_name(name, shared), run_labels(name, COMPONENT_POD_ENV)),
        "immutable": True,
        "data": shared,
    }


def take_shared(containers: list[dict[str, Any]], config: str, shared: dict[str, str]) -> None:
    """Each container takes the ConfigMap `config` whole and keeps in `env` what it lacks.

    An `env` entry wins over the ConfigMap's variable of the same name in the kubelet, so a
    container told a value of its own (none today but a Secret's mount) still sees it.
    """
    for container in containers:
        container["envFrom"] = [{"configMapRef": {"name": config}}]
        container["env"] = [
            item
            for item in container.get("env", [])
            if "value" not in item or shared.get(item["name"]) != item["value"]
        ]
