"""A minimal JSON REST client for the local control plane's apiserver (test infrastructure).

The process-backed node runtime acts as a kubelet: it needs a handful of verbs (list, get,
patch status, delete, create) with the cluster's admin certificate. It talks REST directly so
that the dev cluster stays free of the Kubernetes client library, which only the operator's
and the agent's API clients import.
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

from trainguard_dev.cluster.pki import Pki

MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"


class ApiError(RuntimeError):
    """A non-2xx answer from the apiserver."""

    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"HTTP {status}: {body[:500]}")
        self.status = status


class Rest:
    """Authenticated JSON requests against one apiserver."""

    def __init__(self, server: str, pki: Pki, timeout: float = 10.0) -> None:
        self.server = server.rstrip("/")
        self.timeout = timeout
        self._context = ssl.create_default_context(cafile=str(pki.ca_cert))
        self._context.load_cert_chain(str(pki.cert), str(pki.key))

    def request(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        """Send one request; return the decoded JSON answer (empty dict when none)."""
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.server + path, data=data, method=method)
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(req, context=self._context, timeout=self.timeout) as r:
                raw = r.read()
        except urllib.error.HTTPError as err:
            raise ApiError(err.code, err.read().decode(errors="replace")) from err
        if not raw:
            return {}
        decoded: dict[str, Any] = json.loads(raw)
        return decoded

    def watch(self, path: str, resource_version: str, seconds: int) -> Iterator[dict[str, Any]]:
        """The watch events of a collection path after `resource_version`, one by one.

        Ends when the apiserver closes the watch (after `seconds`); an ERROR event (e.g. 410
        Gone: the version is too old) is yielded like the others, for the caller to list again.
        """
        sep = "&" if "?" in path else "?"
        query = f"watch=1&resourceVersion={resource_version}&timeoutSeconds={seconds}"
        req = urllib.request.Request(f"{self.server}{path}{sep}{query}", method="GET")
        req.add_header("Accept", "application/json")
        try:
            with urllib.request.urlopen(req, context=self._context, timeout=seconds + 30) as r:
                for line in r:
                    if line.strip():
                        yield json.loads(line)
        except urllib.error.HTTPError as err:
            raise ApiError(err.code, err.read().decode(errors="replace")) from err

    def get(self, path: str) -> dict[str, Any]:
        """GET a path."""
        return self.request("GET", path)

    def patch(self, path: str, body: dict[str, Any], content_type: str = MERGE_PATCH) -> None:
        """PATCH a path (JSON merge patch by default)."""
        self.request("PATCH", path, body, content_type)

    def create(self, path: str, body: dict[str, Any]) -> None:
        """POST a new object to a collection path."""
        self.request("POST", path, body)

    def delete(self, path: str, grace_seconds: int | None = None) -> None:
        """DELETE an object, optionally with a grace period; a missing object is fine."""
        body = None
        if grace_seconds is not None:
            body = {
                "kind": "DeleteOptions",
                "apiVersion": "v1",
                "gracePeriodSeconds": grace_seconds,
            }
        try:
            self.request("DELETE", path, body)
        except ApiError as err:
            if err.status != 404:
                raise
