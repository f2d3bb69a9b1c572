"""Invalid TrainingRuns shared by the pydantic tests and the apiserver tests.

Each case edits a valid base run in one place and names the field the rejection must point at
(`spec.checkpoints.remote[0].keep`, the apiserver's notation). `says`, when given, is a phrase
both rejections must contain: for rules it is the rule's message, which proves the two sides
reject for the same reason and not merely at the same place.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from trainguard.api import TrainingRun
from trainguard_dev.testing.runs import training_run

Obj = dict[str, Any]
_DELETE = object()
_STEP = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


def base_run() -> Obj:
    """A valid run with something of everything the cases edit."""
    spec = {
        "trainer": {
            "image": "registry.example.com/train:1",
            "command": ["python", "train.py"],
            "env": [{"name": "A", "value": "1"}],
        },
        "data": {"source": {"uri": "s3://bucket-a/shards"}, "size": "10Gi"},
        "checkpoints": {
            "remote": [
                {
                    "name": "hub",
                    "uri": "hf://org/model",
                    "contents": "weights",
                    "credentialsSecret": {"name": "hf-token"},
                },
                {"name": "backup", "uri": "s3://bucket-b/ckpt"},
            ]
        },
        "placement": {
            "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}]
        },
    }
    return training_run("case", spec, base={})


def steps(path: str) -> list[str | int]:
    """`spec.a[0].b` as ["spec", "a", 0, "b"]."""
    return [int(index) if index else name for name, index in _STEP.findall(path)]


def edit(obj: Obj, path: str, value: Any) -> None:
    """Set (or, with _DELETE, remove) the value at `path`, creating objects on the way."""
    *parents, last = steps(path)
    node: Any = obj
    for step in parents:
        node = node[step] if isinstance(step, int) else node.setdefault(step, {})
    if value is _DELETE:
        del node[last]
    else:
        node[last] = value


@dataclass(frozen=True)
class Case:
    """An invalid run: the base with `edits` applied, rejected at `field`."""

    id: str
    field: str
    edits: tuple[tuple[str, Any], ...]
    says: str | None = None

    def run(self) -> Obj:
        """The invalid run as a JSON-ready object."""
        obj = base_run()
        for path, value in self.edits:
            edit(obj, path, value if value is _DELETE else copy.deepcopy(value))
        return obj


def case(id: str, field: str, *edits: tuple[str, Any], says: str | None = None) -> Case:
    """A case rejected at `field` after `edits` (path, value; _DELETE removes the path)."""
    return Case(id=id, field=field, edits=edits, says=says)


def layers(count: int) -> list[Obj]:
    """`count` valid remote layers with distinct names."""
    return [{"name": f"l{i + 2}", "uri": f"s3://bucket-b/l{i}"} for i in range(count)]


R0 = "spec.checkpoints.remote[0]"
R1 = "spec.checkpoints.remote[1]"
L1 = "spec.checkpoints.l1"
MON = "spec.monitor"
TOL = "spec.placement.tolerations[0]"

CASES: tuple[Case, ...] = (
    # Wrong types.
    case("image-number", "spec.trainer.image", ("spec.trainer.image", 42), says="string"),
    case(
        "interval-string", f"{MON}.intervalSeconds", (f"{MON}.intervalSeconds", "1"), says="integer"
    ),
    case("suspend-string", "spec.suspend", ("spec.suspend", "yes"), says="boolean"),
    case("command-string", "spec.trainer.command", ("spec.trainer.command", "python train.py")),
    case(
        "gpus-fraction",
        "spec.trainer.resources.gpus",
        ("spec.trainer.resources.gpus", 1.5),
        says="integer",
    ),
    case(
        "ratio-string",
        f"{MON}.ghostMemory.ratio",
        (f"{MON}.ghostMemory.ratio", "high"),
        says="number",
    ),
    case("env-not-object", "spec.trainer.env[0]", ("spec.trainer.env", ["A=1"])),
    case("size-boolean", "spec.data.size", ("spec.data.size", True)),
    # Out of range.
    case("keep-zero", f"{R1}.keep", (f"{R1}.keep", 0), says="greater than or equal to 1"),
    case(
        "keep-last-zero", f"{L1}.keepLast", (f"{L1}.keepLast", 0), says="greater than or equal to 1"
    ),
    case(
        "interval-zero",
        f"{MON}.intervalSeconds",
        (f"{MON}.intervalSeconds", 0),
        says="greater than or equal to 1",
    ),
    case(
        "interval-too-long",
        f"{MON}.intervalSeconds",
        (f"{MON}.intervalSeconds", 61),
        says="less than or equal to 60",
    ),
    case(
        "gpus-negative",
        "spec.trainer.resources.gpus",
        ("spec.trainer.resources.gpus", -1),
        says="greater than or equal to 0",
    ),
    case(
        "gpus-too-many",
        "spec.trainer.resources.gpus",
        ("spec.trainer.resources.gpus", 65),
        says="less than or equal to 64",
    ),
    case(
        "ghost-ratio-one",
        f"{MON}.ghostMemory.ratio",
        (f"{MON}.ghostMemory.ratio", 1.0),
        says="greater than 1",
    ),
    case(
        "max-restarts-negative",
        "spec.recovery.maxRestarts",
        ("spec.recovery.maxRestarts", -1),
        says="greater than or equal to 0",
    ),
    case(
        "backoff-reset-zero",
        "spec.recovery.backoff.resetAfterSeconds",
        ("spec.recovery.backoff.resetAfterSeconds", 0),
        says="greater than or equal to 1",
    ),
    case(
        "every-steps-negative",
        "spec.checkpoints.everySteps",
        ("spec.checkpoints.everySteps", -5),
        says="greater than or equal to 0",
    ),
    case(
        "parameters-zero",
        "spec.model.parameters",
        ("spec.model", {"parameters": 0}),
        says="greater than or equal to 1",
    ),
    case(
        "too-many-layers",
        "spec.checkpoints.remote",
        ("spec.checkpoints.remote", layers(9)),
        says="at most 8 items",
    ),
    case("layer-name-too-long", f"{R1}.name", (f"{R1}.name", "a" * 64)),
    case("image-empty", "spec.trainer.image", ("spec.trainer.image", "")),
    case(
        "command-empty",
        "spec.trainer.command",
        ("spec.trainer.command", []),
        says="at least 1 item",
    ),
    case(
        "command-empty-string",
        "spec.trainer.command[0]",
        ("spec.trainer.command", [""]),
        says="at least 1 char",
    ),
    case(
        "command-empty-argument",
        "spec.trainer.command[1]",
        ("spec.trainer.command", ["python", "", "train.py"]),
        says="at least 1 char",
    ),
    # Unknown enum values.
    case(
        "network-volumes-unknown",
        "spec.placement.networkVolumes",
        ("spec.placement.networkVolumes", "Block"),
        says="Warn",
    ),
    case(
        "hash-unknown",
        "spec.checkpoints.hashAlgorithm",
        ("spec.checkpoints.hashAlgorithm", "md5"),
        says="blake3",
    ),
    case("contents-unknown", f"{R1}.contents", (f"{R1}.contents", "optimizer"), says="weights"),
    case(
        "on-repeated-failure-unknown",
        "spec.recovery.onRepeatedFailure",
        ("spec.recovery.onRepeatedFailure", "Retry"),
        says="Continue",
    ),
    case(
        "toleration-operator-unknown", f"{TOL}.operator", (f"{TOL}.operator", "In"), says="Exists"
    ),
    case(
        "toleration-effect-unknown", f"{TOL}.effect", (f"{TOL}.effect", "NoRun"), says="NoExecute"
    ),
    # Missing required fields; unknown fields.
    case("spec-missing", "spec", ("spec", _DELETE)),
    case("image-missing", "spec.trainer.image", ("spec.trainer.image", _DELETE)),
    case("command-missing", "spec.trainer.command", ("spec.trainer.command", _DELETE)),
    case("trainer-missing", "spec.trainer", ("spec.trainer", _DELETE)),
    case("layer-uri-missing", f"{R1}.uri", (f"{R1}.uri", _DELETE)),
    case("layer-name-missing", f"{R1}.name", (f"{R1}.name", _DELETE)),
    case("env-name-missing", "spec.trainer.env[0].name", ("spec.trainer.env[0]", {"value": "x"})),
    case("data-source-missing", "spec.data.source", ("spec.data.source", _DELETE)),
    case(
        "pvc-claim-missing",
        "spec.data.source.pvc.claimName",
        ("spec.data.source", {"pvc": {"subPath": "x"}}),
    ),
    case(
        "local-volume-size-missing",
        f"{L1}.storage.localVolume.size",
        (f"{L1}.storage", {"localVolume": {"storageClassName": "local"}}),
    ),
    case("secret-name-missing", f"{R0}.credentialsSecret.name", (f"{R0}.credentialsSecret", {})),
    case("unknown-field", "spec.trainer.imag", ("spec.trainer.imag", "x")),
    case("unknown-field-in-layer", f"{R1}.bucket", (f"{R1}.bucket", "x")),
    # Remote layers.
    case(
        "layer-names-duplicate",
        "spec.checkpoints.remote",
        (f"{R1}.name", "hub"),
        says="remote layer names must be unique",
    ),
    case(
        "hf-full-contents",
        f"{R0}.contents",
        (f"{R0}.contents", "full"),
        says="an hf:// layer holds model weights only",
    ),
    case(
        "hf-default-contents",
        f"{R0}.contents",
        (f"{R0}.contents", _DELETE),
        says="an hf:// layer holds model weights only",
    ),
    case(
        "hf-without-credentials",
        f"{R0}.credentialsSecret",
        (f"{R0}.credentialsSecret", _DELETE),
        says="need credentialsSecret",
    ),
    case(
        "ssh-without-credentials",
        f"{R1}.credentialsSecret",
        (f"{R1}.uri", "ssh://backup@host.example/ckpt"),
        says="need credentialsSecret",
    ),
    case(
        "file-with-credentials",
        f"{R1}.credentialsSecret",
        (f"{R1}.uri", "file:///mnt/backup"),
        (f"{R1}.claimName", "backup"),
        (f"{R1}.credentialsSecret", {"name": "x"}),
        says="file:// layers take no credentialsSecret",
    ),
    case(
        "file-without-claim",
        f"{R1}.claimName",
        (f"{R1}.uri", "file:///mnt/backup"),
        says="a file:// layer needs claimName",
    ),
    case(
        "claim-on-s3",
        f"{R1}.claimName",
        (f"{R1}.claimName", "backup"),
        says="claimName is only for file:// layers",
    ),
    case(
        "layer-named-l1", f"{R1}.name", (f"{R1}.name", "l1"), says="reserved for the local layers"
    ),
    case(
        "layer-named-l0", f"{R1}.name", (f"{R1}.name", "l0"), says="reserved for the local layers"
    ),
    case(
        "layer-name-not-dns", f"{R1}.name", (f"{R1}.name", "Backup_1"), says="must be a DNS label"
    ),
    case(
        "secret-name-not-dns",
        f"{R0}.credentialsSecret.name",
        (f"{R0}.credentialsSecret.name", "HF_TOKEN"),
        says="must be a Kubernetes object name",
    ),
    # Malformed URIs.
    case(
        "uri-unknown-scheme",
        f"{R1}.uri",
        (f"{R1}.uri", "gs://bucket/x"),
        says="scheme file://, s3://, hf:// or ssh://",
    ),
    case(
        "uri-without-scheme",
        f"{R1}.uri",
        (f"{R1}.uri", "bucket-b/ckpt"),
        says="scheme file://, s3://, hf:// or ssh://",
    ),
    case(
        "uri-with-space", f"{R1}.uri", (f"{R1}.uri", "s3://bucket-b/my ckpt"), says="without spaces"
    ),
    case(
        "file-uri-relative",
        f"{R1}.uri",
        (f"{R1}.uri", "file://mnt/backup"),
        (f"{R1}.claimName", "backup"),
        says="a file:// URI needs an absolute path",
    ),
    case(
        "file-uri-dot-dot",
        f"{R1}.uri",
        (f"{R1}.uri", "file:///mnt/../etc"),
        (f"{R1}.claimName", "backup"),
        says="must not contain '.' or '..'",
    ),
    case(
        "s3-uri-bad-bucket",
        f"{R1}.uri",
        (f"{R1}.uri", "s3://B/x"),
        says="an s3:// URI is s3://<bucket>",
    ),
    case(
        "hf-uri-without-repo",
        f"{R0}.uri",
        (f"{R0}.uri", "hf://org"),
        says="an hf:// URI is hf://<owner>/<repository>",
    ),
    case(
        "ssh-uri-without-path",
        f"{R1}.uri",
        (f"{R1}.uri", "ssh://host.example"),
        (f"{R1}.credentialsSecret", {"name": "key"}),
        says="an ssh:// URI is ssh://",
    ),
    case(
        "data-uri-http",
        "spec.data.source.uri",
        ("spec.data.source.uri", "http://example.com/data"),
        says="scheme file://, s3://, hf:// or ssh://",
    ),
    # Paths.
    case(
        "working-dir-relative",
        "spec.trainer.workingDir",
        ("spec.trainer.workingDir", "workspace"),
        says="must be an absolute path",
    ),
    case(
        "data-mount-relative",
        "spec.data.mountPath",
        ("spec.data.mountPath", "data"),
        says="must be an absolute path",
    ),
    case(
        "l1-mount-dot-dot",
        f"{L1}.mountPath",
        (f"{L1}.mountPath", "/trainguard/../l1"),
        says="must be an absolute path",
    ),
    case(
        "l1-mount-trailing-slash",
        f"{L1}.mountPath",
        (f"{L1}.mountPath", "/trainguard/l1/"),
        says="must be an absolute path",
    ),
    case(
        "sub-path-absolute",
        "spec.data.source.pvc.subPath",
        ("spec.data.source", {"pvc": {"claimName": "shards", "subPath": "/abs"}}),
        says="must be a relative path",
    ),
    case(
        "mounts-nested",
        "spec.data.mountPath",
        ("spec.data.mountPath", "/trainguard/l1/data"),
        says="neither inside the other",
    ),
    case(
        "mounts-equal",
        "spec.data.mountPath",
        ("spec.data.mountPath", "/trainguard/l1"),
        says="neither inside the other",
    ),
    # Data.
    case(
        "data-two-sources",
        "spec.data.source",
        ("spec.data.source.pvc", {"claimName": "shards"}),
        says="set exactly one of pvc and uri",
    ),
    case(
        "data-no-source",
        "spec.data.source",
        ("spec.data.source", {}),
        says="set exactly one of pvc and uri",
    ),
    case(
        "data-uri-not-staged",
        "spec.data.stage",
        ("spec.data.stage", False),
        says="needs source.pvc",
    ),
    case(
        "data-hf-model-repository",
        "spec.data.source.uri",
        ("spec.data.source.uri", "hf://org/model"),
        says="an hf:// data source is a dataset repository",
    ),
    case(
        "data-hf-space",
        "spec.data.source.uri",
        ("spec.data.source.uri", "hf://spaces/org/demo"),
        says="spaces and buckets are not supported as data sources",
    ),
    case(
        "data-ssh-without-secret",
        "spec.data.source.credentialsSecret",
        ("spec.data.source.uri", "ssh://data@files.example/srv/shards"),
        says="an ssh:// data source needs credentialsSecret",
    ),
    case(
        "data-pvc-with-secret",
        "spec.data.source.credentialsSecret",
        ("spec.data.source", {"pvc": {"claimName": "shards"}, "credentialsSecret": {"name": "s"}}),
        says="a pvc or file:// source takes none",
    ),
    case(
        "data-file-with-secret",
        "spec.data.source.credentialsSecret",
        ("spec.data.source.uri", "file:///mnt/shards"),
        ("spec.data.source.credentialsSecret", {"name": "s"}),
        says="a pvc or file:// source takes none",
    ),
    case(
        "data-secret-without-name",
        "spec.data.source.credentialsSecret.name",
        ("spec.data.source.credentialsSecret", {}),
    ),
    case(
        "size-not-quantity",
        "spec.data.size",
        ("spec.data.size", "ten gigs"),
        says="non-negative Kubernetes quantity",
    ),
    case(
        "size-negative",
        "spec.data.size",
        ("spec.data.size", -1),
        says="non-negative Kubernetes quantity",
    ),
    case(
        "size-negative-string",
        "spec.data.size",
        ("spec.data.size", "-1Gi"),
        says="non-negative Kubernetes quantity",
    ),
    # Checkpoints.
    case(
        "no-cadence",
        "spec.checkpoints.everySteps",
        ("spec.checkpoints.everySteps", 0),
        ("spec.checkpoints.everySeconds", 0),
        says="at least one checkpoint cadence",
    ),
    case(
        "l1-two-volumes",
        f"{L1}.storage",
        (
            f"{L1}.storage",
            {"emptyDir": {}, "localVolume": {"storageClassName": "local", "size": "1Gi"}},
        ),
        says="exactly one of emptyDir and localVolume",
    ),
    case(
        "l1-no-volume",
        f"{L1}.storage",
        (f"{L1}.storage", {}),
        says="exactly one of emptyDir and localVolume",
    ),
    case(
        "local-volume-no-class",
        f"{L1}.storage.localVolume",
        (f"{L1}.storage", {"localVolume": {"size": "100Gi"}}),
        says="needs a storageClassName",
    ),
    # Monitor and recovery.
    case(
        "slow-not-below-hang",
        f"{MON}.slowAfterSeconds",
        (f"{MON}.slowAfterSeconds", 300),
        (f"{MON}.hangAfterSeconds", 300),
        says="less than hangAfterSeconds",
    ),
    case(
        "py-spy-removed",
        f"{MON}.pySpy",
        (f"{MON}.pySpy", True),
        says="the stacks of a hung trainer come from the harness's signal handler",
    ),
    case(
        "lease-too-short",
        f"{MON}.leaseDurationSeconds",
        (f"{MON}.leaseDurationSeconds", 3),
        (f"{MON}.intervalSeconds", 2),
        says="at least 2 x intervalSeconds",
    ),
    case(
        "in-place-above-max",
        "spec.recovery.inPlaceRestarts",
        ("spec.recovery.inPlaceRestarts", 5),
        ("spec.recovery.maxRestarts", 2),
        says="must not exceed maxRestarts",
    ),
    case(
        "backoff-inverted",
        "spec.recovery.backoff.initialSeconds",
        ("spec.recovery.backoff", {"initialSeconds": 600, "maxSeconds": 60}),
        says="must not exceed maxSeconds",
    ),
    # Placement.
    case(
        "toleration-exists-with-value",
        f"{TOL}.value",
        (f"{TOL}.value", "x"),
        says="value must be empty when operator is Exists",
    ),
    case(
        "toleration-seconds-without-no-execute",
        f"{TOL}.tolerationSeconds",
        (f"{TOL}.tolerationSeconds", 30),
        says="needs effect: NoExecute",
    ),
    case(
        "toleration-equal-without-key",
        f"{TOL}.key",
        (TOL, {"operator": "Equal", "value": "x"}),
        says="key is required unless operator is Exists",
    ),
    case(
        "node-selector-value-too-long",
        "spec.placement.nodeSelector.zone",
        ("spec.placement.nodeSelector", {"zone": "z" * 64}),
    ),
    # Trainer.
    case(
        "env-names-duplicate",
        "spec.trainer.env",
        ("spec.trainer.env", [{"name": "A"}, {"name": "A", "value": "2"}]),
        says="env names must be unique",
    ),
    case(
        "env-name-invalid",
        "spec.trainer.env[0].name",
        ("spec.trainer.env[0].name", "1 A"),
        says="must be an environment variable name",
    ),
    case(
        "gpu-resource-invalid",
        "spec.trainer.resources.gpuResource",
        ("spec.trainer.resources.gpuResource", "nvidia.com/gpu/x"),
        says="must be a qualified name",
    ),
    case(
        "cpu-not-quantity",
        "spec.trainer.resources.cpu",
        ("spec.trainer.resources.cpu", "8 cores"),
        says="non-negative Kubernetes quantity",
    ),
    # Ranks: gangs of at most MAX_NODES members, at most one rank per GPU.
    case(
        "nodes-above-the-largest-gang",
        "spec.trainer.nodes",
        ("spec.trainer.nodes", 4097),
        says="nodes 4097 exceeds the largest gang, 4096 members",
    ),
    case(
        "gang-run-name-too-long",
        "spec.trainer.nodes",
        ("spec.trainer.nodes", 2),
        ("metadata.name", "g" * 59),
        says="a gang's run (spec.trainer.nodes > 1) needs a name of at most 58",
    ),
    case(
        "gang-run-name-with-a-dot",
        "spec.trainer.nodes",
        ("spec.trainer.nodes", 2),
        ("metadata.name", "llm.v2"),
        says="starting with a letter",
    ),
    case(
        "nodes-zero",
        "spec.trainer.nodes",
        ("spec.trainer.nodes", 0),
        says="greater than or equal to 1",
    ),
    case(
        "procs-per-node-above-gpus",
        "spec.trainer.procsPerNode",
        ("spec.trainer.resources.gpus", 2),
        ("spec.trainer.procsPerNode", 4),
        says="procsPerNode 4 exceeds the GPU count 2",
    ),
    case(
        "procs-per-node-zero",
        "spec.trainer.procsPerNode",
        ("spec.trainer.procsPerNode", 0),
        says="greater than or equal to 1",
    ),
    # The run itself.
    case(
        "run-name-too-long",
        "metadata.name",
        ("metadata.name", "r" * 64),
        says="must be at most 63 characters",
    ),
)


def kube_path(loc: tuple[int | str, ...]) -> str:
    """A pydantic error location in the apiserver's notation: ("a", 0, "b") -> "a[0].b"."""
    text = ""
    for step in loc:
        text += f"[{step}]" if isinstance(step, int) else f".{step}" if text else str(step)
    return text


def names_field(path: str, field: str) -> bool:
    """Whether an error at `path` points at `field` (or inside it: a union member, a key)."""
    return path == field or path.startswith((f"{field}.", f"{field}["))


def pydantic_errors(obj: Obj) -> list[tuple[str, str]]:
    """(path, message) of every error pydantic reports for `obj`; empty when it is valid."""
    try:
        TrainingRun.from_object(obj)
    except ValidationError as error:
        return [(kube_path(tuple(e["loc"])), e["msg"]) for e in error.errors()]
    return []
