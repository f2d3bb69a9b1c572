"""The pod agent's API access: renew the run's heartbeat Lease and create Events.

A renewal answers with the Lease as stored, which carries what the operator tells the pod: a
gang's restart generation.

This is all the agent's Role allows (get/update its own Lease, create Events), so it is all
this client does. Credentials: in-cluster service account, or ``KUBECONFIG`` where set (the
local process-backed nodes hand each pod a token kubeconfig).

The agent's container alone holds the token (the pod builder mounts it there and nowhere
else), and the agent makes itself non-dumpable (`keep_credentials_private`): the trainer,
whose processes it shares a process namespace with, cannot read its memory, environment or
root (`/proc/<pid>/root/...`) to find the token, even when the trainer's image runs as the
agent's user.
"""

from __future__ import annotations

import ctypes
import os
import sys
from dataclasses import dataclass
from datetime import UTC, datetime

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

EVENT_MESSAGE_LIMIT = 1000  # Event messages stay under 1 KiB
PR_SET_DUMPABLE = 4  # prctl(2)


def keep_credentials_private() -> bool:
    """Make this process non-dumpable: its /proc entries become root's, ptrace is refused.

    False where the kernel call is not available (not Linux); the agent then still runs.
    """
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    return bool(libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) == 0)


class AgentApiError(RuntimeError):
    """The API could not be reached or refused the request (retried by the caller)."""


def _load() -> client.ApiClient:
    try:
        if os.environ.get("KUBECONFIG"):
            return config.new_client_from_config(config_file=os.environ["KUBECONFIG"])
        config.load_incluster_config()
        return client.ApiClient()
    except (config.ConfigException, OSError) as err:
        raise AgentApiError(f"no API credentials: {err}") from err


@dataclass(frozen=True)
class RunRef:
    """The TrainingRun the agent reports about."""

    namespace: str
    name: str
    uid: str
    api_version: str
    kind: str


class AgentClient:
    """Lease renewal and Events for one run."""

    def __init__(self, run: RunRef, lease_name: str, holder: str, timeout: float = 2.0) -> None:
        self.run = run
        self.lease_name = lease_name
        self.holder = holder
        self.timeout = timeout
        self._api = _load()
        self._coordination = client.CoordinationV1Api(self._api)
        self._core = client.CoreV1Api(self._api)

    def renew(self, duration_s: int, annotations: dict[str, str]) -> dict[str, str]:
        """Renew the Lease now, carrying the verdict and its evidence as annotations.

        Returns the Lease's annotations as stored, the operator's among them (a gang's restart
        generation).
        """
        now = datetime.now(UTC)
        body = {
            "metadata": {"annotations": annotations},
            "spec": {
                "holderIdentity": self.holder,
                "leaseDurationSeconds": duration_s,
                "renewTime": now.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            },
        }
        try:
            stored = self._coordination.patch_namespaced_lease(
                self.lease_name, self.run.namespace, body, _request_timeout=self.timeout
            )
        except (ApiException, OSError) as err:
            raise AgentApiError(f"renewing Lease {self.lease_name}: {_brief(err)}") from err
        metadata = getattr(stored, "metadata", None)
        return dict(getattr(metadata, "annotations", None) or {})

    def event(self, reason: str, message: str, warning: bool = False) -> None:
        """Create an Event on the TrainingRun."""
        now = datetime.now(UTC)
        body = client.CoreV1Event(
            metadata=client.V1ObjectMeta(generate_name=f"{self.run.name}-agent-"),
            involved_object=client.V1ObjectReference(
                api_version=self.run.api_version,
                kind=self.run.kind,
                name=self.run.name,
                namespace=self.run.namespace,
                uid=self.run.uid or None,
            ),
            reason=reason,
            message=message[:EVENT_MESSAGE_LIMIT],
            type="Warning" if warning else "Normal",
            source=client.V1EventSource(component="trainguard-agent", host=self.holder),
            first_timestamp=now,
            last_timestamp=now,
            count=1,
            reporting_component="trainguard.dev/agent",
            reporting_instance=self.holder,
        )
        try:
            self._core.create_namespaced_event(
                self.run.namespace, body, _request_timeout=self.timeout
            )
        except (ApiException, OSError) as err:
            raise AgentApiError(f"creating Event {reason}: {_brief(err)}") from err


def _brief(err: Exception) -> str:
    if isinstance(err, ApiException):
        return f"HTTP {err.status} {err.reason}"
    return str(err)
