"""Remote checkpoint layers behind one interface: put, list, fetch, verify, prune.

A layer lists a checkpoint only once the checkpoint's manifest is there, written last; every
put is verified against the remote copy before the layer reports it. Backends by URI scheme:
`file://` (a directory, e.g. a network volume used only as a backup destination) is here;
the others plug in through `open_layer`.

Where the destination directory of a `file://` layer is mounted is given to the agent as
``TRAINGUARD_LAYER_PATH_<NAME>`` (name upper-cased, '-' as '_'); without it the URI's path is
used as is.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol
from urllib.parse import urlparse

from trainguard.ckpt import (
    MANIFEST_FILENAME,
    Contents,
    FileEntry,
    copy_checkpoint,
    parse_step_dirname,
    prune,
    step_dirname,
    verify,
)

LAYER_PATH_ENV_PREFIX = "TRAINGUARD_LAYER_PATH_"
# Cost rank of a source when restoring: among equal steps the cheapest wins.
COST = {"l1": 0, "file": 1, "s3": 2, "ssh": 3, "hf": 4}


class LayerError(RuntimeError):
    """A layer operation failed (the message names the layer and the cause)."""


@dataclass(frozen=True)
class LayerConfig:
    """One remote layer as the run's spec declares it."""

    name: str
    uri: str
    contents: str = "full"
    every_steps: int = 0
    every_seconds: float = 0.0
    keep: int = 2

    @property
    def scheme(self) -> str:
        """The URI's scheme."""
        return urlparse(self.uri).scheme


class Layer(Protocol):
    """A place checkpoints are shipped to and restored from."""

    config: LayerConfig

    def steps(self) -> list[int]:
        """Steps whose checkpoint is complete on the layer (manifest present), ascending."""
        ...

    def put(self, checkpoint: Path) -> None:
        """Upload a verified local checkpoint and verify the remote copy."""
        ...

    def fetch(self, step: int, dest_root: Path) -> Path:
        """Download one checkpoint into `dest_root` (verified); return its directory."""
        ...

    def verify(self, step: int) -> list[str]:
        """Problems of the remote copy (empty when it verifies)."""
        ...

    def prune(self, keep: int) -> list[int]:
        """Delete all but the newest `keep` verified checkpoints; return the steps deleted."""
        ...


def layer_path_env(name: str) -> str:
    """The env variable naming where a file:// layer is mounted."""
    return LAYER_PATH_ENV_PREFIX + name.upper().replace("-", "_")


class FileLayer:
    """A directory layer (`file:///path`)."""

    def __init__(self, config: LayerConfig, root: Path) -> None:
        self.config = config
        self.root = root

    def steps(self) -> list[int]:
        """Complete checkpoints in the directory."""
        if not self.root.is_dir():
            return []
        found = []
        for entry in self.root.iterdir():
            step = parse_step_dirname(entry.name)
            if step is not None and (entry / MANIFEST_FILENAME).exists():
                found.append(step)
        return sorted(found)

    def put(self, checkpoint: Path) -> None:
        """Copy with verification; a weights layer gets the weight files only."""
        self.root.mkdir(parents=True, exist_ok=True)
        manifest = verify(checkpoint, check_hashes=False).manifest
        if manifest is None:
            raise LayerError(f"{self.config.name}: {checkpoint} has no valid manifest")
        if (self.root / step_dirname(manifest.step) / MANIFEST_FILENAME).exists():
            return
        paths = None
        contents = None
        if self.config.contents == Contents.WEIGHTS.value:
            paths = weight_files(manifest.files)
            contents = Contents.WEIGHTS
        try:
            copy_checkpoint(checkpoint, self.root, paths=paths, contents=contents)
        except (OSError, ValueError, RuntimeError) as err:
            raise LayerError(f"{self.config.name}: copy of step {manifest.step}: {err}") from err
        problems = self.verify(manifest.step)
        if problems:
            raise LayerError(f"{self.config.name}: remote copy does not verify: {problems}")

    def fetch(self, step: int, dest_root: Path) -> Path:
        """Copy one checkpoint back, verifying every byte."""
        try:
            committed = copy_checkpoint(self.root / step_dirname(step), dest_root)
        except (OSError, ValueError, RuntimeError) as err:
            raise LayerError(f"{self.config.name}: fetch of step {step}: {err}") from err
        return Path(committed.path)

    def verify(self, step: int) -> list[str]:
        """Verify the copy on the layer (sizes and hashes)."""
        result = verify(self.root / step_dirname(step))
        return list(result.reasons)

    def prune(self, keep: int) -> list[int]:
        """Keep-last-N on the layer (never the newest verified)."""
        if not self.root.is_dir():
            return []
        result = prune(self.root, keep)
        return [s for s in (parse_step_dirname(p.name) for p in result.deleted) if s is not None]


def weight_files(files: Iterable[FileEntry]) -> list[str]:
    """The paths of a checkpoint that hold model weights (the harness names them model*)."""
    return [
        e.path
        for e in files
        if Path(e.path).name.startswith("model") or e.path.endswith(".safetensors")
    ]


def open_layer(config: LayerConfig, environ: Mapping[str, str]) -> Layer:
    """The backend for a layer's URI scheme."""
    if config.scheme == "file":
        root = environ.get(layer_path_env(config.name)) or urlparse(config.uri).path
        return FileLayer(config, Path(root))
    raise LayerError(f"{config.name}: the {config.scheme}:// backend is not available here")
