"""A container's environment as the kubelet sets it, for tests that read a pod's contract.

The kubelet takes every key of each `envFrom` ConfigMap first, then the container's `env`,
whose entries win; it starts no container whose ConfigMap is missing (a KeyError here).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def container_environment(
    container: Mapping[str, Any],
    config_maps: Mapping[str, Mapping[str, str]],
    fields: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """`container`'s variables given the ConfigMaps' data by name and downward API `fields`.

    A downward API field missing from `fields` is left out.
    """
    result: dict[str, str] = {}
    for source in container.get("envFrom", []):
        result.update(config_maps[source["configMapRef"]["name"]])
    for item in container.get("env", []):
        if "valueFrom" in item:
            field = item["valueFrom"]["fieldRef"]["fieldPath"]
            if fields is not None and field in fields:
                result[item["name"]] = fields[field]
        else:
            result[item["name"]] = item["value"]
    return result


def config_map_data(*config_maps: Mapping[str, Any]) -> dict[str, dict[str, str]]:
    """ConfigMap manifests (or stored objects) as `container_environment` takes them."""
    return {c["metadata"]["name"]: dict(c.get("data") or {}) for c in config_maps}
