"""Names and numbers of the operator's children that the API does not define.

The API (`trainguard.api.constants`, `trainguard.contract.env`) owns the names every component
shares; this module adds the ones only the operator's builders and policies need: container
and volume names, the pod's fixed paths, sizing rules and the reasons of the reconcile loop.
"""

from __future__ import annotations

from enum import StrEnum

from trainguard import __version__

# Server-side apply: every write of the operator goes through this one field manager.
FIELD_MANAGER = "trainguard"

# The operator's own image runs the agent and the init steps; `trainguard operator
# --agent-image` overrides it (e.g. with a digest).
DEFAULT_AGENT_IMAGE = f"ghcr.io/trainguard/trainguard:{__version__}"

# The trainer runs under the supervisor, which the trainer image installs with the harness.
SUPERVISOR_COMMAND = ("trainguard", "supervise", "--")
AGENT_COMMAND = ("trainguard", "agent")


class Container:
    """Names of the containers of a training pod, in start order."""

    AGENT = "agent"
    PREFLIGHT = "preflight"
    STAGE_DATA = "stage-data"
    RESTORE = "restore"
    TRAINER = "trainer"


class Volume:
    """Volume names of a training pod; remote layers add `remote-<name>`, `credentials-<name>`."""

    DATA = "data"
    DATA_SOURCE = "data-source"
    # Not `credentials-<name>`: no remote layer's name can make its volume collide with it.
    DATA_SOURCE_CREDENTIALS = "data-source-credentials"
    L1 = "l1"
    L0 = "l0"
    STATE = "state"
    LOGS = "logs"
    API_ACCESS = "api-access"
    TMP = "tmp"


REMOTE_VOLUME_PREFIX = "remote-"
CREDENTIALS_VOLUME_PREFIX = "credentials-"

# Fixed paths inside a training pod (the spec chooses the data and L1 mount paths).
LOG_DIR = "/trainguard/logs"
DATA_SOURCE_DIR = "/trainguard/source"
DATA_SOURCE_CREDENTIALS_DIR = "/trainguard/source-credentials"
CREDENTIALS_DIR = "/trainguard/credentials"
# Where in-cluster clients look for the service account's token and the cluster's CA: the
# agent's container alone mounts them there (the pod does not automount its token).
API_ACCESS_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
# The agent's token is rotated by the kubelet; the client rereads the file (an hour, as the
# kubelet's own automounted token).
API_TOKEN_SECONDS = 3607
# The companion containers' root file systems are read-only; this is their scratch space.
TMP_DIR = "/tmp"


# Sizing. A full checkpoint holds weights, gradients' master copy and two Adam moments:
# about 16 bytes per parameter (bf16 weights + fp32 master + fp32 m and v, rounded up).
BYTES_PER_PARAMETER_FULL = 16
# Room beside data and checkpoints: the logs volume, the containers' writable layers and
# a checkpoint's temporary files before its rename.
LOG_VOLUME_BYTES = 2 * 2**30
MARGIN_FIXED_BYTES = 1 * 2**30
MARGIN_FRACTION = 0.05
STATE_VOLUME_BYTES = 64 * 2**20
TMP_VOLUME_BYTES = 128 * 2**20

# Companion containers are small; the trainer gets what the spec asks for.
AGENT_CPU = "100m"
AGENT_MEMORY = "128Mi"
AGENT_MEMORY_LIMIT = "512Mi"
INIT_CPU = "500m"
INIT_MEMORY = "256Mi"
INIT_MEMORY_LIMIT = "2Gi"

# Time for the trainer to finish an in-flight checkpoint and exit after SIGTERM. With remote
# layers, the pod's grace period adds spec.checkpoints.flushTimeoutSeconds: the agent, a
# sidecar stopped after the trainer, flushes the newest L1 checkpoint in that time.
TRAINER_STOP_SECONDS = 120


class OperatorReason(StrEnum):
    """Reasons of the reconcile loop that `trainguard.api.constants.Reason` lacks."""

    NETWORK_VOLUME_ON_HOT_PATH = "NetworkVolumeOnHotPath"
    UNSCHEDULABLE = "Unschedulable"
    STARTING = "Starting"
