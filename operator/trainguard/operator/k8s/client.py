"""The connection to the apiserver: one configured client, JSON in and out, typed errors.

Requests go through the official client's transport (auth, TLS, connection pool) but skip
its model classes: the operator builds and reads plain manifests, so bodies stay dicts.
The client blocks; call it from kopf's sync handlers (a thread pool), never from a coroutine.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import quote

from kubernetes import client as k8s_client
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

JSON = "application/json"
APPLY_PATCH = "application/apply-patch+yaml"
MERGE_PATCH = "application/merge-patch+json"
# A list answered with each object's metadata only (its name, labels, times), not its body.
METADATA_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
# Errors worth retrying with a delay: conflicts, throttling, the apiserver's own failures.
TRANSIENT_STATUSES = frozenset({409, 429, 500, 502, 503, 504})
REQUEST_TIMEOUT_SECONDS = 30.0
SERVICE_ACCOUNT_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"
T = TypeVar("T")


class KubeError(RuntimeError):
    """The apiserver refused or failed a request."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message

    @property
    def transient(self) -> bool:
        """Whether a retry after a delay may succeed (connection errors are status 0)."""
        return self.status == 0 or self.status in TRANSIENT_STATUSES

    @property
    def not_found(self) -> bool:
        """Whether the object does not exist."""
        return self.status == 404


# A gang's members are applied and deleted this many at a time: one by one, a thousand pods
# take seconds; the client's connection pool (one connection per worker) serves them.
CONCURRENT_REQUESTS = 8


def concurrently(work: Callable[[T], object], items: Sequence[T]) -> None:
    """`work(item)` for every item, a few at a time; the first error is raised once all ended."""
    if len(items) <= 1:
        for item in items:
            work(item)
        return
    with ThreadPoolExecutor(min(CONCURRENT_REQUESTS, len(items))) as pool:
        for _ in pool.map(work, items):
            pass


@dataclass(frozen=True)
class Kube:
    """A configured API client: `request()` and the helpers of the other k8s modules."""

    api: Any

    @classmethod
    def connect(cls, kubeconfig: str | None = None, pool_size: int = 16) -> Kube:
        """Connect with a kubeconfig (argument, $KUBECONFIG, ~/.kube/config) or in-cluster."""
        configuration = k8s_client.Configuration()
        path = kubeconfig or os.environ.get("KUBECONFIG")
        if path is None and os.path.exists(SERVICE_ACCOUNT_TOKEN):
            k8s_config.load_incluster_config(client_configuration=configuration)
        else:
            k8s_config.load_kube_config(config_file=path, client_configuration=configuration)
        # Handlers run in a thread pool: one connection per worker avoids waiting on the pool.
        configuration.connection_pool_maxsize = pool_size
        return cls(k8s_client.ApiClient(configuration))

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        query: dict[str, str] | None = None,
        content_type: str = JSON,
        accept: str = JSON,
    ) -> dict[str, Any]:
        """Send one request; return the decoded answer or raise KubeError."""
        headers = {"Accept": accept, "Content-Type": content_type}
        try:
            status, reason, data = self._send(
                method, path, list((query or {}).items()), headers, body
            )
        except ApiException as err:
            raise _error(err.status or 0, err.reason or "", err.body) from err
        except (OSError, HTTPError) as err:  # connection refused, reset, timed out
            raise KubeError(0, "ConnectionError", str(err)) from err
        if not 200 <= status <= 299:
            raise _error(status, reason, data)
        decoded: dict[str, Any] = json.loads(data) if data else {}
        return decoded

    def _send(
        self,
        method: str,
        path: str,
        query: list[tuple[str, str]],
        headers: dict[str, str],
        body: Any,
    ) -> tuple[int, str, bytes]:
        # The client's transport changed shape in release 37 (openapi-generator 7); both are
        # in use (pyproject allows >= 31), so each gets its own two calls.
        if hasattr(self.api, "param_serialize"):
            serialized = self.api.param_serialize(
                method=method,
                resource_path=path,
                query_params=query,
                header_params=headers,
                body=body,
                auth_settings=["BearerToken"],
            )
            response = self.api.call_api(*serialized[:4], _request_timeout=REQUEST_TIMEOUT_SECONDS)
            data = response.read()
        else:
            response = self.api.call_api(
                path,
                method,
                query_params=query,
                header_params=headers,
                body=body,
                auth_settings=["BearerToken"],
                _return_http_data_only=True,
                _preload_content=False,
                _request_timeout=REQUEST_TIMEOUT_SECONDS,
            )
            data = response.data
        return int(response.status), str(response.reason or ""), bytes(data or b"")

    def get(self, path: str) -> dict[str, Any] | None:
        """The object at `path`, or None when it does not exist."""
        try:
            return self.request("GET", path)
        except KubeError as err:
            if err.not_found:
                return None
            raise


def _error(status: int, reason: str, body: Any) -> KubeError:
    message = body.decode(errors="replace") if isinstance(body, bytes) else str(body or "")
    with contextlib.suppress(ValueError, AttributeError):
        message = str(json.loads(message).get("message", message))
    return KubeError(status, reason, message)


def object_path(api_version: str, plural: str, namespace: str | None, name: str | None) -> str:
    """The REST path of an object (or of a collection, when `name` is None)."""
    base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    if namespace is not None:
        base += f"/namespaces/{quote(namespace)}"
    base += f"/{plural}"
    return base if name is None else f"{base}/{quote(name)}"
