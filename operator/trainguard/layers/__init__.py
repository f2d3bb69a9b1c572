"""Remote checkpoint layers behind one interface: put, list, fetch, verify, prune.

A layer lists a checkpoint only once the checkpoint's manifest is there, written last; every
put is verified against the remote copy before the layer reports it. Every checkpoint is bound
to the attempt that shipped it (`trainguard.layers.lineage`): a layer is opened for one
`Origin` (the pod's run UID and attempt), puts under it, and lists, fetches and prunes
`CheckpointRef`s of every origin, pruning only within the run's `Lineage`. Backends by URI scheme:
`file://` (a directory, e.g. a network volume used only as a backup destination) is here;
`s3://`, `ssh://` and `hf://` live in this package's `s3`, `ssh` and `hf` modules (on the
shared contract of `base`) and plug in through `open_layer`, which imports only the one in use.
The agent ships through these layers and the `restore` init step reads from them.

Where the destination directory of a `file://` layer (its claim, which the API requires) is
mounted is given to the agent by the pod contract (`trainguard.contract.env.layer_path_env`);
without it (outside a pod) the URI's path is used as is.

Credentials come only from the layer's Secret (`credentialsSecret` in the spec). The operator
mounts it read-only into the agent and the restore step, one file per key (the key names are
`SECRET_KEY_*` in `trainguard.api.constants`), and names the directory in the pod contract's
`layer_secrets_env` variable. A layer without that variable has no
Secret: an `s3://` layer then uses the pod's identity (boto3's default credential chain).
The data source's Secret (`spec.data.source.credentialsSecret`, the same keys) is read the same
way (`Credentials.from_directory`) by the `stage-data` step, the only container that mounts it.
Credential values never reach logs, status, Events or exception messages: every error a
remote layer raises passes through `Credentials.redact`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol
from urllib.parse import urlparse

from trainguard.api.constants import (
    SECRET_KEY_S3_ENDPOINT_URL,
    SECRET_KEY_SSH_CONFIG,
    SECRET_KEY_SSH_KNOWN_HOSTS,
    UriScheme,
)
from trainguard.api.spec import DEFAULT_REMOTE_KEEP, RemoteLayer
from trainguard.ckpt import (
    MANIFEST_FILENAME,
    CheckpointInvalidError,
    Contents,
    FileEntry,
    Problem,
    copy_checkpoint,
    list_checkpoint_dirs,
    remove_checkpoint_dir,
    verify,
)
from trainguard.contract.env import layer_path_env, layer_secrets_env
from trainguard.layers.lineage import (
    LEGACY,
    CheckpointRef,
    Lineage,
    Origin,
    Pruning,
    parse_origin,
    prune_plan,
)

REDACTED = "***"
# Keys a credentials Secret may hold that are not secret: an error may name them.
NOT_SECRET_KEYS = frozenset(
    {SECRET_KEY_S3_ENDPOINT_URL, SECRET_KEY_SSH_KNOWN_HOSTS, SECRET_KEY_SSH_CONFIG}
)
# Shorter values (a region, "true") would turn ordinary words of a message into the placeholder.
MIN_REDACTED_LENGTH = 6
# The harness names the model component's file(s) model*.safetensors.
WEIGHTS_PREFIX = "model"
# Cost rank of a source when restoring: among equal steps the cheapest wins.
COST = {"l1": 0, "file": 1, "s3": 2, "ssh": 3, "hf": 4}


class LayerError(RuntimeError):
    """A layer operation failed (the message names the layer and the cause)."""


class InvalidCheckpointError(LayerError):
    """A checkpoint on the layer does not verify (a fetch, or the copy a put left there).

    Unlike other layer errors it is a finding about the checkpoint, not about the layer's
    reachability: `step` and `problems` (each naming a file) say which and what.
    """

    def __init__(self, layer: str, step: int, problems: tuple[Problem, ...]) -> None:
        super().__init__(f"{layer}: step {step}: " + "; ".join(str(p) for p in problems))
        self.layer = layer
        self.step = step
        self.problems = problems


@dataclass(frozen=True)
class LayerConfig:
    """One remote layer as the run's spec declares it (`from_spec`); tests build them by hand."""

    name: str
    uri: str
    contents: str = Contents.FULL.value
    every_steps: int = 0
    every_seconds: float = 0.0
    keep: int = DEFAULT_REMOTE_KEEP

    @classmethod
    def from_spec(cls, layer: RemoteLayer) -> LayerConfig:
        """The layer of `spec.checkpoints.remote`, as the pod contract hands it over."""
        return cls(
            name=layer.name,
            uri=layer.uri,
            contents=layer.contents.value,
            every_steps=layer.every_steps,
            every_seconds=float(layer.every_seconds),
            keep=layer.keep,
        )

    @property
    def scheme(self) -> str:
        """The URI's scheme."""
        return urlparse(self.uri).scheme


class Transfer(Protocol):
    """Where a layer reports the progress of one put; `advance` may block to cap bandwidth."""

    def begin(self, total_bytes: int) -> None:
        """The put will move (or find already there) `total_bytes`."""
        ...

    def advance(self, nbytes: int, *, sent: bool = True) -> None:
        """`nbytes` more are done; `sent=False` when they were already on the layer (resumed)."""
        ...


class NoTransfer:
    """A `Transfer` that records nothing and never waits."""

    def begin(self, total_bytes: int) -> None:
        """Nothing to record."""

    def advance(self, nbytes: int, *, sent: bool = True) -> None:
        """Nothing to record."""


class Layer(Protocol):
    """A place checkpoints are shipped to and restored from."""

    config: LayerConfig
    origin: Origin  # the attempt whose checkpoints `put` ships

    def checkpoints(self) -> list[CheckpointRef]:
        """Checkpoints complete on the layer (manifest present), of every origin, oldest first."""
        ...

    def put(self, checkpoint: Path, transfer: Transfer | None = None) -> CheckpointRef:
        """Upload a verified local checkpoint under `origin` and verify the remote copy."""
        ...

    def fetch(self, ref: CheckpointRef, dest_root: Path) -> Path:
        """Download one checkpoint into `dest_root` (verified); return its directory."""
        ...

    def verify(self, ref: CheckpointRef) -> list[Problem]:
        """Problems of the remote copy (empty when it verifies)."""
        ...

    def prune(self, keep: int, lineage: Lineage | None = None) -> Pruning:
        """Delete all but the newest `keep` verified checkpoints of the lineage.

        Never an invalid one: those are kept, and returned beside the ones deleted.
        """
        ...


class Credentials:
    """The keys of one layer's credentials Secret, read from its mounted directory.

    Its repr names the keys, never the values, and `redact` scrubs the values out of any text
    before it can reach a log, the status or an exception message.
    """

    def __init__(self, values: Mapping[str, str], directory: Path | None = None) -> None:
        self._values = dict(values)
        self._directory = directory

    @classmethod
    def from_env(cls, name: str, environ: Mapping[str, str]) -> Credentials:
        """The Secret of layer `name` as mounted by the operator (empty when it has none)."""
        directory = environ.get(layer_secrets_env(name))
        return cls.from_directory(Path(directory), name) if directory else cls({})

    @classmethod
    def from_directory(cls, root: Path, name: str) -> Credentials:
        """A Secret mounted at `root`, one file per key (`name` says whose in an error)."""
        if not root.is_dir():
            raise LayerError(f"{name}: the credentials directory {root} is not mounted")
        # A mounted Secret also holds hidden `..data` links; only the plain key files count.
        values = {
            path.name: path.read_text().strip()
            for path in root.iterdir()
            if not path.name.startswith(".") and path.is_file()
        }
        return cls(values, root)

    def get(self, key: str) -> str | None:
        """The value of `key`, or None when the Secret lacks it."""
        return self._values.get(key) or None

    def file(self, key: str) -> Path | None:
        """The mounted file of `key` (for clients that read keys from files), if there is one."""
        if self._directory is None or self.get(key) is None:
            return None
        return self._directory / key

    def redact(self, text: str) -> str:
        """`text` with every credential value (and every line of one) replaced by a placeholder."""
        values = [v for k, v in self._values.items() if k not in NOT_SECRET_KEYS]
        secrets = set(values)
        secrets.update(line.strip() for value in values for line in value.splitlines())
        for secret in sorted(secrets, key=len, reverse=True):
            if len(secret) >= MIN_REDACTED_LENGTH:
                text = text.replace(secret, REDACTED)
        return text

    def __repr__(self) -> str:
        return f"Credentials(keys={sorted(self._values)})"


class FileLayer:
    """A directory layer (`file:///path`): `<root>/run-<uid>/attempt-<k>/step-<8 digits>/`.

    Each origin's directory is a checkpoint root like L1 (hidden temporary names while a copy
    or a removal is under way), so nothing half-written is ever listed.
    """

    def __init__(self, config: LayerConfig, root: Path, origin: Origin | None = None) -> None:
        self.config = config
        self.root = root
        self.origin = origin or Origin.of("", None)

    def _found(self) -> dict[CheckpointRef, Path]:
        """Every checkpoint directory under the root (complete or not), by ref."""
        found: dict[CheckpointRef, Path] = {}
        if not self.root.is_dir():
            return found
        for step, path in list_checkpoint_dirs(self.root):
            found[CheckpointRef(step, LEGACY)] = path
        for run_dir in self.root.iterdir():
            if not run_dir.is_dir():
                continue
            for attempt_dir in run_dir.iterdir():
                origin = parse_origin(run_dir.name, attempt_dir.name)
                if origin is None or not attempt_dir.is_dir():
                    continue
                for step, path in list_checkpoint_dirs(attempt_dir):
                    found[CheckpointRef(step, origin)] = path
        return found

    def checkpoints(self) -> list[CheckpointRef]:
        """Complete checkpoints in the directory, of every origin."""
        return sorted(r for r, path in self._found().items() if (path / MANIFEST_FILENAME).exists())

    def put(self, checkpoint: Path, transfer: Transfer | None = None) -> CheckpointRef:
        """Copy with verification; a weights layer gets the weight files only."""
        manifest = verify(checkpoint, check_hashes=False).manifest
        if manifest is None:
            raise LayerError(f"{self.config.name}: {checkpoint} has no valid manifest")
        ref = CheckpointRef(manifest.step, self.origin)
        if (self.root / ref.path / MANIFEST_FILENAME).exists():
            # Shipped before (an earlier try of this attempt): it counts only if it verifies.
            problems = self.verify(ref)
            if problems:
                raise InvalidCheckpointError(self.config.name, ref.step, tuple(problems))
            return ref
        paths = None
        contents = None
        if self.config.contents == Contents.WEIGHTS.value:
            paths = weight_files(manifest.files)
            contents = Contents.WEIGHTS
        try:
            destination = self.root / self.origin.path
            destination.mkdir(parents=True, exist_ok=True)
            copy_checkpoint(checkpoint, destination, paths=paths, contents=contents)
        except (OSError, ValueError, RuntimeError) as err:
            raise LayerError(f"{self.config.name}: copy of step {manifest.step}: {err}") from err
        problems = self.verify(ref)
        if problems:
            raise InvalidCheckpointError(self.config.name, ref.step, tuple(problems))
        if transfer is not None:
            shipped = (e.size for e in manifest.files if paths is None or e.path in paths)
            total = sum(shipped)
            transfer.begin(total)
            transfer.advance(total)
        return ref

    def fetch(self, ref: CheckpointRef, dest_root: Path) -> Path:
        """Copy one checkpoint back, verifying every byte."""
        try:
            committed = copy_checkpoint(self.root / ref.path, dest_root)
        except CheckpointInvalidError as err:
            raise InvalidCheckpointError(self.config.name, ref.step, err.problems) from err
        except (OSError, ValueError, RuntimeError) as err:
            raise LayerError(f"{self.config.name}: fetch of {ref}: {err}") from err
        return Path(committed.path)

    def verify(self, ref: CheckpointRef) -> list[Problem]:
        """Verify the copy on the layer (sizes and hashes)."""
        return list(verify(self.root / ref.path).problems)

    def prune(self, keep: int, lineage: Lineage | None = None) -> Pruning:
        """Keep-N over the lineage's checkpoints (`lineage.prune_plan`).

        The kept ones are hashed; an older one only needs its manifest and sizes to be gone.
        A copy appears whole under its name (`copy_checkpoint`), so a step directory without
        its manifest is no upload under way but a damaged checkpoint: invalid, kept.
        """
        paths = self._found()
        plan = prune_plan(
            dict.fromkeys(paths, True),
            keep,
            lineage or Lineage(self.origin),
            lambda ref, deep: verify(paths[ref], check_hashes=deep).problems,
        )
        for ref in plan.deleted:
            remove_checkpoint_dir(paths[ref], ref.step)
        return Pruning(sorted(plan.deleted), plan.invalid)


def weight_files(files: Iterable[FileEntry]) -> list[str]:
    """The paths of a checkpoint that hold model weights.

    The harness writes one `<component>.safetensors` per component, so the model's weights are
    the files named `model*` (model.safetensors, or its shards model-00001-of-00002.safetensors);
    the other safetensors files (optimizer, scheduler, ...) are not weights.
    """
    return [e.path for e in files if Path(e.path).name.startswith(WEIGHTS_PREFIX)]


def open_layer(
    config: LayerConfig, environ: Mapping[str, str], origin: Origin | None = None
) -> Layer:
    """The backend for a layer's URI scheme (a remote backend's client is imported on use).

    `origin`: the attempt whose checkpoints the layer ships (None: outside a pod).
    """
    if config.scheme == UriScheme.FILE:
        root = environ.get(layer_path_env(config.name)) or urlparse(config.uri).path
        return FileLayer(config, Path(root), origin)
    credentials = Credentials.from_env(config.name, environ)
    if config.scheme == UriScheme.S3:
        from trainguard.layers.s3 import open_s3

        return open_s3(config, credentials, environ, origin=origin)
    if config.scheme == UriScheme.SSH:
        from trainguard.layers.ssh import open_ssh

        return open_ssh(config, credentials, origin)
    if config.scheme == UriScheme.HF:
        from trainguard.layers.hf import open_hf

        return open_hf(config, credentials, environ, origin=origin)
    raise LayerError(f"{config.name}: no backend for {config.scheme}:// layers")
