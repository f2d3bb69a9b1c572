"""The environment of a training pod's containers: every variable, one writer, one reader.

The operator's pod builder writes the contract into every container of the pod; the agent,
the init steps, the supervisor and the harness read `PodEnv.from_env()`. What all of a run's
pods share (`PodEnv.shared_env()`: every variable but `MEMBER_VARIABLES` and the downward
API's) travels in the run's env ConfigMap, which every container takes whole (`envFrom`); the
container's own `env` holds the rest (`PodEnv.env_vars()`, less what the ConfigMap carries:
`trainguard.operator.build.envconfig`). The variables are defined here and nowhere else (a
test fails when product code spells one elsewhere), and every default is the API's own
(`trainguard.api.spec`), so a trainer run by hand and a pod built from an empty spec see the
same values.

| variable | field | meaning |
|---|---|---|
| TRAINGUARD_RUN_NAME | run_name | name of the TrainingRun |
| TRAINGUARD_RUN_UID | run_uid | UID of the TrainingRun (Events from the agent refer to it) |
| TRAINGUARD_NAMESPACE | namespace | its namespace |
| TRAINGUARD_ATTEMPT | attempt | attempt number k (1-based); a new pod is a new attempt |
| TRAINGUARD_FENCES | fences | superseded attempts -> newest step each reported (JSON; null: none) |
| TRAINGUARD_LEASE_NAME | lease_name | its heartbeat Lease (`<run>-heartbeat[-<member m > 0>]`) |
| TRAINGUARD_POD_NAME | pod_name | the pod's name (downward API; the Lease holder) |
| TRAINGUARD_NODE_NAME | node_name | node the pod runs on (downward API) |
| TRAINGUARD_L1_DIR | l1_dir | L1 checkpoint directory on local disk (emptyDir or local PV) |
| TRAINGUARD_L0_DIR | l0_dir | L0 checkpoint directory in pod memory (absent: L0 off) |
| TRAINGUARD_DATA_DIR | data_dir | local copy of the data shards (absent: the run has no data) |
| TRAINGUARD_STATE_DIR | state_dir | shared in-memory volume (`trainguard.contract.files`) |
| TRAINGUARD_HEARTBEAT_FILE | heartbeat_file | heartbeat JSON written by the harness |
| TRAINGUARD_GPU_FILE | gpu_file | GPU readings published by the supervisor |
| TRAINGUARD_LOG_FILE | log_file | the trainer's output file (log age is a slowness signal only) |
| TRAINGUARD_PROCS_PER_NODE | procs_per_node | ranks per pod (started by torchrun when > 1) |
| TRAINGUARD_NNODES | nnodes | members (pods) of the run's gang; 1: a one-pod run |
| TRAINGUARD_NODE_RANK | node_rank | this member's index in the gang (0 hosts the rendezvous) |
| TRAINGUARD_MASTER_ADDR | master_addr | member 0's stable name (hostname.subdomain); gangs only |
| TRAINGUARD_MASTER_PORT | master_port | the rendezvous port on member 0 |
| TRAINGUARD_KEEP_LAST | keep_last | L1 keep-last-N |
| TRAINGUARD_CKPT_EVERY_STEPS | every_steps | checkpoint cadence in steps (0: off) |
| TRAINGUARD_CKPT_EVERY_SECONDS | every_seconds | checkpoint cadence in seconds (0: off) |
| TRAINGUARD_HASH | hash_algorithm | checkpoint hash algorithm name (see trainguard.ckpt) |
| TRAINGUARD_MONITOR | monitor | the run's `spec.monitor`, as JSON (camelCase, as in the API) |
| TRAINGUARD_RECOVERY | recovery | the run's `spec.recovery`, as JSON: restarts and back-off |
| TRAINGUARD_LAYERS | layers | the run's remote layers (`spec.checkpoints.remote`), JSON list |
| TRAINGUARD_FLUSH_TIMEOUT_SECONDS | flush_timeout_seconds | bound on the flush at deletion |
| TRAINGUARD_DATA_SOURCE | data_source | source of `stage-data`: a directory (PVC mount) or a URI |
| TRAINGUARD_DATA_SECRETS | data_secrets | the data source's Secret's mount (stage-data only) |
| TRAINGUARD_DATA_BYTES | data_bytes | expected size of the staged data (`preflight` free space) |
| TRAINGUARD_CKPT_BYTES | checkpoint_bytes | size of one full checkpoint (`preflight`) |
| TRAINGUARD_LAYER_PATH_<NAME> | layer_paths | where a `file://` layer's volume is mounted |
| TRAINGUARD_LAYER_SECRETS_<NAME> | layer_secrets | a layer's Secret's mount (agent, restore) |

`<NAME>` is the layer's name upper-cased with '-' as '_' (`layer_variable`).

A node, not the operator, provides the last few (`NODE_PROVIDED`): a node class's preflight
bandwidth floors, the file that stands in for the per-container termination log where a
runtime has none, the GPU simulator's state file (test nodes only: never set on a real node)
and the test-only fault injections of the init steps. Each is read by one program.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from trainguard.api.spec import (
    DEFAULT_EVERY_STEPS,
    DEFAULT_FLUSH_TIMEOUT_SECONDS,
    DEFAULT_KEEP_LAST,
    DEFAULT_L1_DIR,
    Monitor,
    Recovery,
    RemoteLayer,
)
from trainguard.contract.files import (
    GANG_FILENAME,
    GPU_FILENAME,
    HEARTBEAT_FILENAME,
    KILL_REQUEST_FILENAME,
    LAUNCH_RESULT_FILENAME,
    RANK_HEARTBEAT_FILENAME_PATTERN,
    STACKS_FILENAME_PATTERN,
    SUPERVISOR_FILENAME,
)

RUN_NAME = "TRAINGUARD_RUN_NAME"
RUN_UID = "TRAINGUARD_RUN_UID"
NAMESPACE = "TRAINGUARD_NAMESPACE"
ATTEMPT = "TRAINGUARD_ATTEMPT"
FENCES = "TRAINGUARD_FENCES"
LEASE_NAME = "TRAINGUARD_LEASE_NAME"
POD_NAME = "TRAINGUARD_POD_NAME"
NODE_NAME = "TRAINGUARD_NODE_NAME"
L1_DIR = "TRAINGUARD_L1_DIR"
L0_DIR = "TRAINGUARD_L0_DIR"
DATA_DIR = "TRAINGUARD_DATA_DIR"
STATE_DIR = "TRAINGUARD_STATE_DIR"
HEARTBEAT_FILE = "TRAINGUARD_HEARTBEAT_FILE"
GPU_FILE = "TRAINGUARD_GPU_FILE"
LOG_FILE = "TRAINGUARD_LOG_FILE"
PROCS_PER_NODE = "TRAINGUARD_PROCS_PER_NODE"
NNODES = "TRAINGUARD_NNODES"
NODE_RANK = "TRAINGUARD_NODE_RANK"
MASTER_ADDR = "TRAINGUARD_MASTER_ADDR"
MASTER_PORT = "TRAINGUARD_MASTER_PORT"
KEEP_LAST = "TRAINGUARD_KEEP_LAST"
CKPT_EVERY_STEPS = "TRAINGUARD_CKPT_EVERY_STEPS"
CKPT_EVERY_SECONDS = "TRAINGUARD_CKPT_EVERY_SECONDS"
HASH = "TRAINGUARD_HASH"
MONITOR = "TRAINGUARD_MONITOR"
RECOVERY = "TRAINGUARD_RECOVERY"
LAYERS = "TRAINGUARD_LAYERS"
FLUSH_TIMEOUT_SECONDS = "TRAINGUARD_FLUSH_TIMEOUT_SECONDS"
DATA_SOURCE = "TRAINGUARD_DATA_SOURCE"
DATA_BYTES = "TRAINGUARD_DATA_BYTES"
DATA_SECRETS = "TRAINGUARD_DATA_SECRETS"
CKPT_BYTES = "TRAINGUARD_CKPT_BYTES"
LAYER_PATH_PREFIX = "TRAINGUARD_LAYER_PATH_"
LAYER_SECRETS_PREFIX = "TRAINGUARD_LAYER_SECRETS_"

# Provided by the node (see the module's docstring), never by the operator.
PREFLIGHT_MIN_WRITE_MBPS = "TRAINGUARD_PREFLIGHT_MIN_WRITE_MBPS"
PREFLIGHT_MIN_READ_MBPS = "TRAINGUARD_PREFLIGHT_MIN_READ_MBPS"
TERMINATION_LOG = "TRAINGUARD_TERMINATION_LOG"
GPU_SIMULATION = "TRAINGUARD_GPU_SIMULATION"
PREFLIGHT_INJECT = "TRAINGUARD_PREFLIGHT_INJECT"
STAGING_INJECT = "TRAINGUARD_STAGING_INJECT"
NODE_PROVIDED = (
    PREFLIGHT_MIN_WRITE_MBPS,
    PREFLIGHT_MIN_READ_MBPS,
    TERMINATION_LOG,
    GPU_SIMULATION,
    PREFLIGHT_INJECT,
    STAGING_INJECT,
)

# The shared state volume's mount path in every container (`trainguard.contract.files`).
DEFAULT_STATE_DIR = "/trainguard/state"
# L0, the checkpoint layer in pod memory (a memory-backed emptyDir the operator mounts into
# the trainer and, read-only, the agent): where the operator mounts it, and how many
# checkpoints it keeps (the newest verified one is never removed before a newer verified).
DEFAULT_L0_DIR = "/trainguard/l0"
L0_KEEP_LAST = 2
# The port member 0 of a gang hosts torchrun's rendezvous on (PyTorch's own default).
DEFAULT_MASTER_PORT = 29500
# The run's heartbeat Lease is `<run>` + this suffix.
LEASE_SUFFIX = "-heartbeat"
# Fields whose values the kubelet fills in (downward API), not the operator.
DOWNWARD_API = {POD_NAME: "metadata.name", NODE_NAME: "spec.nodeName"}
# Variables that differ between the pods of one run (a gang's members, successive attempts):
# they stay in each pod's containers, never in the run's shared env ConfigMap.
MEMBER_VARIABLES = frozenset({ATTEMPT, FENCES, LEASE_NAME, NODE_RANK})


class ContractError(ValueError):
    """A variable of the pod contract holds a value its reader cannot use; names the variable."""


def lease_name(run: str, member: int = 0) -> str:
    """The run's heartbeat Lease: the agent renews it, the operator reads it.

    Each member of a gang renews its own (no two agents fight over one): member 0's is the
    run's `<run>-heartbeat`, member m's `<run>-heartbeat-<m>`.
    """
    return f"{run}{LEASE_SUFFIX}" if member == 0 else f"{run}{LEASE_SUFFIX}-{member}"


def layer_variable(prefix: str, layer: str) -> str:
    """A per-layer variable: `prefix` + the layer's name upper-cased, '-' as '_'."""
    return prefix + layer.upper().replace("-", "_")


def layer_path_env(layer: str) -> str:
    """The variable that tells the agent where a `file://` layer's volume is mounted."""
    return layer_variable(LAYER_PATH_PREFIX, layer)


def layer_secrets_env(layer: str) -> str:
    """The variable that tells the agent and `restore` where a layer's Secret is mounted."""
    return layer_variable(LAYER_SECRETS_PREFIX, layer)


class PodEnv(BaseModel):
    """What a training pod's containers are told, typed; `to_env()`/`from_env()` cross the wall.

    Every default is the API's (or, for paths the API does not name, this contract's), so a
    program run by hand with no variable set behaves as in a pod built from an empty spec.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    run_name: str = ""
    run_uid: str = ""
    namespace: str = "default"
    attempt: int | None = Field(default=None, ge=1)
    # Restore and prune never use a superseded attempt's checkpoints above its fence
    # (`trainguard.layers.lineage`).
    fences: dict[int, int | None] = Field(default_factory=dict)
    lease_name: str = ""
    pod_name: str = ""
    node_name: str = ""
    l1_dir: Path = Path(DEFAULT_L1_DIR)
    # None: no L0 (a trainer run by hand; the supervisor gives its child one of its own).
    l0_dir: Path | None = None
    data_dir: Path | None = None
    state_dir: Path = Path(DEFAULT_STATE_DIR)
    heartbeat_file: Path | None = None
    gpu_file: Path | None = None
    log_file: Path | None = None
    # Ranks per pod: the API's `spec.trainer.procsPerNode`, resolved (one per GPU when omitted).
    procs_per_node: int = Field(default=1, ge=1)
    # A gang of `nnodes` member pods (`spec.trainer.nodes`): this member's index and where
    # member 0 hosts the rendezvous. One pod: nnodes 1, no master address (torchrun standalone).
    nnodes: int = Field(default=1, ge=1)
    node_rank: int = Field(default=0, ge=0)
    master_addr: str | None = None
    master_port: int = Field(default=DEFAULT_MASTER_PORT, ge=1, le=65535)
    keep_last: int = Field(default=DEFAULT_KEEP_LAST, ge=1)
    every_steps: int = Field(default=DEFAULT_EVERY_STEPS, ge=0)
    every_seconds: float = Field(default=0.0, ge=0)
    # None: the checkpoint format's default (`trainguard.ckpt.DEFAULT_ALGORITHM`, which the
    # API's default names by its alias); the hasher refuses an unknown name.
    hash_algorithm: str | None = None
    monitor: Monitor = Field(default_factory=Monitor)
    recovery: Recovery = Field(default_factory=Recovery)
    layers: tuple[RemoteLayer, ...] = ()
    flush_timeout_seconds: float = Field(default=DEFAULT_FLUSH_TIMEOUT_SECONDS, gt=0)
    data_source: str | None = None
    # Where the data source's credentialsSecret is mounted: set in the stage-data step only.
    data_secrets: Path | None = None
    data_bytes: int | None = Field(default=None, ge=0)
    checkpoint_bytes: int | None = Field(default=None, ge=0)
    layer_paths: dict[str, str] = Field(default_factory=dict)
    layer_secrets: dict[str, str] = Field(default_factory=dict)

    # -- derived paths: an unset file lives in the state directory, wherever that is --------

    @property
    def lease(self) -> str:
        """The heartbeat Lease's name (`<run>-heartbeat` unless the pod names another)."""
        return self.lease_name or lease_name(self.run_name)

    @property
    def heartbeat(self) -> Path:
        """The heartbeat file."""
        return self.heartbeat_file or self.state_dir / HEARTBEAT_FILENAME

    @property
    def gpu(self) -> Path:
        """The GPU readings file."""
        return self.gpu_file or self.state_dir / GPU_FILENAME

    def rank_heartbeat(self, local_rank: int) -> Path:
        """The heartbeat of one rank of a multi-rank pod: next to the heartbeat."""
        return self.heartbeat.parent / RANK_HEARTBEAT_FILENAME_PATTERN.format(rank=local_rank)

    @property
    def rank_heartbeats(self) -> tuple[Path, ...]:
        """Every rank's heartbeat (none in a one-rank pod, which writes `heartbeat` only)."""
        if self.procs_per_node == 1:
            return ()
        return tuple(self.rank_heartbeat(rank) for rank in range(self.procs_per_node))

    @property
    def launch_result_file(self) -> Path:
        """Where the rank launcher leaves its account of a launch for the supervisor."""
        return self.heartbeat.parent / LAUNCH_RESULT_FILENAME

    @property
    def supervisor_file(self) -> Path:
        """The supervisor's state file: next to the heartbeat."""
        return self.heartbeat.parent / SUPERVISOR_FILENAME

    @property
    def kill_request_file(self) -> Path:
        """Where the agent asks the supervisor to kill a hung trainer: next to the heartbeat."""
        return self.heartbeat.parent / KILL_REQUEST_FILENAME

    @property
    def gang_file(self) -> Path:
        """Where the agent tells a gang member's supervisor the operator's restart generation."""
        return self.heartbeat.parent / GANG_FILENAME

    def stacks_file(self, pid: int) -> Path:
        """Where the harness dumps the stacks of trainer process `pid` (in the state dir)."""
        return self.state_dir / STACKS_FILENAME_PATTERN.format(pid=pid)

    def report_file(self, name: str) -> Path:
        """A report of `trainguard.contract.files` (preflight, staging, restore) by file name."""
        return self.state_dir / name

    # -- writer -------------------------------------------------------------------------------

    def to_env(self) -> dict[str, str]:
        """The variables with literal values (unset fields are left out), in table order."""
        values: dict[str, str] = {}
        for field, variable, _, render in _FIELDS:
            value = getattr(self, field)
            if value is None or value == "" or value == {} or field in _DOWNWARD_FIELDS:
                continue
            values[variable] = render(value)
        for name, path in self.layer_paths.items():
            values[layer_path_env(name)] = path
        for name, path in self.layer_secrets.items():
            values[layer_secrets_env(name)] = path
        return values

    def shared_env(self) -> dict[str, str]:
        """The variables every pod of the run has alike: `to_env()` less `MEMBER_VARIABLES`."""
        return {k: v for k, v in self.to_env().items() if k not in MEMBER_VARIABLES}

    def env_vars(self) -> list[dict[str, Any]]:
        """The container `env` list: `to_env()` plus the downward API's pod and node names."""
        items: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in self.to_env().items()]
        for variable, field_path in DOWNWARD_API.items():
            items.append({"name": variable, "valueFrom": {"fieldRef": {"fieldPath": field_path}}})
        return items

    # -- reader -------------------------------------------------------------------------------

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> PodEnv:
        """Read the contract from `environ`; an unset or empty variable takes the default.

        ContractError, naming the variable and its value, when a value is malformed.
        """
        values: dict[str, Any] = {}
        for field, variable, parse, _ in _FIELDS:
            raw = environ.get(variable)
            if raw:
                values[field] = _parsed(variable, raw, parse)
        for layer in values.get("layers", ()):
            for field, variable in (
                ("layer_paths", layer_path_env(layer.name)),
                ("layer_secrets", layer_secrets_env(layer.name)),
            ):
                if environ.get(variable):
                    values.setdefault(field, {})[layer.name] = environ[variable]
        try:
            return cls.model_validate(values)
        except ValidationError as err:
            error = err.errors()[0]
            field = str(error["loc"][0])
            variable = _VARIABLE_OF.get(field, field)
            raise ContractError(
                f"{variable}={environ.get(variable, '')!r}: {error['msg']}"
            ) from None


def _parsed(variable: str, raw: str, parse: Callable[[str], Any]) -> Any:
    try:
        return parse(raw)
    except (ValueError, ValidationError) as err:
        reason = err.errors()[0]["msg"] if isinstance(err, ValidationError) else str(err)
        raise ContractError(f"{variable}={raw!r}: {reason}") from None


def _compact(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _layers(raw: str) -> tuple[RemoteLayer, ...]:
    items = json.loads(raw)
    if not isinstance(items, list):
        raise ValueError("a JSON list of layers")
    return tuple(RemoteLayer.model_validate(item) for item in items)


def _fences(raw: str) -> dict[int, int | None]:
    items = json.loads(raw)
    if not isinstance(items, dict):
        raise ValueError("a JSON object of attempt -> step or null")
    fences: dict[int, int | None] = {}
    for attempt, step in items.items():
        if not (step is None or (isinstance(step, int) and step >= 0)):
            raise ValueError(f"attempt {attempt}: a step or null, got {step!r}")
        fences[int(attempt)] = step
    return fences


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


_FIELDS: tuple[tuple[str, str, Callable[[str], Any], Callable[[Any], str]], ...] = (
    ("run_name", RUN_NAME, str, str),
    ("run_uid", RUN_UID, str, str),
    ("namespace", NAMESPACE, str, str),
    ("attempt", ATTEMPT, int, str),
    ("fences", FENCES, _fences, lambda v: _compact({str(k): s for k, s in sorted(v.items())})),
    ("lease_name", LEASE_NAME, str, str),
    ("pod_name", POD_NAME, str, str),
    ("node_name", NODE_NAME, str, str),
    ("l1_dir", L1_DIR, Path, str),
    ("l0_dir", L0_DIR, Path, str),
    ("data_dir", DATA_DIR, Path, str),
    ("state_dir", STATE_DIR, Path, str),
    ("heartbeat_file", HEARTBEAT_FILE, Path, str),
    ("gpu_file", GPU_FILE, Path, str),
    ("log_file", LOG_FILE, Path, str),
    ("procs_per_node", PROCS_PER_NODE, int, str),
    ("nnodes", NNODES, int, str),
    ("node_rank", NODE_RANK, int, str),
    ("master_addr", MASTER_ADDR, str, str),
    ("master_port", MASTER_PORT, int, str),
    ("keep_last", KEEP_LAST, int, str),
    ("every_steps", CKPT_EVERY_STEPS, int, str),
    ("every_seconds", CKPT_EVERY_SECONDS, float, _number),
    ("hash_algorithm", HASH, str, str),
    ("monitor", MONITOR, Monitor.model_validate_json, lambda v: _compact(v.to_object())),
    ("recovery", RECOVERY, Recovery.model_validate_json, lambda v: _compact(v.to_object())),
    ("layers", LAYERS, _layers, lambda v: _compact([layer.to_object() for layer in v])),
    ("flush_timeout_seconds", FLUSH_TIMEOUT_SECONDS, float, _number),
    ("data_source", DATA_SOURCE, str, str),
    ("data_secrets", DATA_SECRETS, Path, str),
    ("data_bytes", DATA_BYTES, int, str),
    ("checkpoint_bytes", CKPT_BYTES, int, str),
)
_DOWNWARD_FIELDS = frozenset({"pod_name", "node_name"})
_VARIABLE_OF = {field: variable for field, variable, _, _ in _FIELDS}
