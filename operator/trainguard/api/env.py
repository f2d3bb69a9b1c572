"""The environment contract between the operator, the pod agent and the trainer harness.

The operator sets these variables on every container of a training pod; the agent and the
harness read them (with the defaults below when run by hand). This module is the one place
where the names, meanings and default paths are defined: import the constants, never
spell the strings elsewhere.

| variable | meaning |
|---|---|
| TRAINGUARD_RUN_NAME | name of the TrainingRun |
| TRAINGUARD_NAMESPACE | its namespace |
| TRAINGUARD_ATTEMPT | attempt number k (1-based); a new pod is a new attempt |
| TRAINGUARD_NODE_NAME | node the pod runs on (downward API) |
| TRAINGUARD_L1_DIR | L1 checkpoint directory on local disk (emptyDir or local PV) |
| TRAINGUARD_DATA_DIR | local copy of the data shards |
| TRAINGUARD_STATE_DIR | shared in-memory volume: heartbeat, GPU readings, stack dumps |
| TRAINGUARD_HEARTBEAT_FILE | heartbeat JSON written by the harness (in the state dir) |
| TRAINGUARD_GPU_FILE | GPU readings published by the supervisor (in the state dir) |
| TRAINGUARD_LOG_FILE | the trainer's output file (log age is a slowness signal only) |
| TRAINGUARD_KEEP_LAST | L1 keep-last-N |
| TRAINGUARD_CKPT_EVERY_STEPS | checkpoint cadence in steps (0: off) |
| TRAINGUARD_CKPT_EVERY_SECONDS | checkpoint cadence in seconds (0: off) |
| TRAINGUARD_HASH | checkpoint hash algorithm name (see trainguard.ckpt) |
| TRAINGUARD_RUN_UID | UID of the TrainingRun (Events from the agent refer to it) |
| TRAINGUARD_POD_NAME | the pod's name (downward API; the Lease holder) |
| TRAINGUARD_LEASE_NAME | the run's heartbeat Lease (`<run>-heartbeat`) |
| TRAINGUARD_MONITOR | the run's `spec.monitor`, as JSON (camelCase keys, as in the API) |
| TRAINGUARD_RECOVERY | the run's `spec.recovery`, as JSON: the supervisor's restarts and back-off |
| TRAINGUARD_LAYERS | the run's remote layers (`spec.checkpoints.layers`), as a JSON list |
| TRAINGUARD_DATA_SOURCE | data source of `stage-data`: a directory (source PVC mount) or URI |
| TRAINGUARD_DATA_BYTES | expected size of the staged data, bytes (`preflight` free space) |
| TRAINGUARD_CKPT_BYTES | size of one full checkpoint, bytes (`preflight` test file, free space) |
| TRAINGUARD_FLUSH_TIMEOUT_SECONDS | bound on the flush to a remote layer when the pod is deleted |
"""

from __future__ import annotations

RUN_NAME = "TRAINGUARD_RUN_NAME"
NAMESPACE = "TRAINGUARD_NAMESPACE"
ATTEMPT = "TRAINGUARD_ATTEMPT"
NODE_NAME = "TRAINGUARD_NODE_NAME"
L1_DIR = "TRAINGUARD_L1_DIR"
DATA_DIR = "TRAINGUARD_DATA_DIR"
STATE_DIR = "TRAINGUARD_STATE_DIR"
HEARTBEAT_FILE = "TRAINGUARD_HEARTBEAT_FILE"
GPU_FILE = "TRAINGUARD_GPU_FILE"
LOG_FILE = "TRAINGUARD_LOG_FILE"
KEEP_LAST = "TRAINGUARD_KEEP_LAST"
CKPT_EVERY_STEPS = "TRAINGUARD_CKPT_EVERY_STEPS"
CKPT_EVERY_SECONDS = "TRAINGUARD_CKPT_EVERY_SECONDS"
HASH = "TRAINGUARD_HASH"
RUN_UID = "TRAINGUARD_RUN_UID"
POD_NAME = "TRAINGUARD_POD_NAME"
LEASE_NAME = "TRAINGUARD_LEASE_NAME"
MONITOR = "TRAINGUARD_MONITOR"
RECOVERY = "TRAINGUARD_RECOVERY"
LAYERS = "TRAINGUARD_LAYERS"
DATA_SOURCE = "TRAINGUARD_DATA_SOURCE"
DATA_BYTES = "TRAINGUARD_DATA_BYTES"
CKPT_BYTES = "TRAINGUARD_CKPT_BYTES"
FLUSH_TIMEOUT_SECONDS = "TRAINGUARD_FLUSH_TIMEOUT_SECONDS"

# Default mount paths inside a training pod.
DEFAULT_L1_DIR = "/trainguard/l1"
DEFAULT_DATA_DIR = "/trainguard/data"
DEFAULT_STATE_DIR = "/trainguard/state"
HEARTBEAT_FILENAME = "heartbeat.json"
GPU_FILENAME = "gpu.json"
LOG_FILENAME = "trainer.log"
# Stack dumps of one trainer process (faulthandler on SIGUSR1), in the state dir.
STACKS_FILENAME_PATTERN = "stacks-{pid}.txt"
SUPERVISOR_FILENAME = "supervisor.json"
