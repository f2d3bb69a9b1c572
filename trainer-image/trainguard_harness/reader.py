"""Checkpoint reader: load the newest checkpoint that verifies, report the ones that do not.

Candidates are tried from the highest step down. Each is checked cheaply first (manifest and
sizes), then read once into memory while hashing; only when every hash matches is any state
decoded, so a corrupt checkpoint is never used, even partially. Invalid checkpoints are
reported and skipped, never deleted.

Several layers (L0 in pod memory, L1 on local disk: `load_newest_of`) are one list of
candidates, the highest step first whichever layer holds it (at the same step, the layer named
first), so a corrupt L0 checkpoint falls back to the newest that verifies in either layer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from trainguard.ckpt import Manifest, Problem, Verification, new_hasher, verify
from trainguard.ckpt.hashing import CHUNK_BYTES
from trainguard.ckpt.layout import step_dirname
from trainguard.ckpt.verify import list_checkpoint_dirs
from trainguard_harness.tensorfile import FILE_SUFFIX, StateFormatError, decode_component


@dataclass(frozen=True)
class LoadedCheckpoint:
    """A verified checkpoint, decoded: component name -> state."""

    path: Path
    manifest: Manifest
    components: dict[str, object]

    @property
    def step(self) -> int:
        """The checkpoint's step."""
        return self.manifest.step


@dataclass(frozen=True)
class LoadResult:
    """The newest valid checkpoint (None on a fresh run) and the invalid ones skipped.

    `layer`: the name of the layer it was loaded from (`load_newest_of`); `skipped_layers`:
    the layer of each skipped one, in the same order.
    """

    loaded: LoadedCheckpoint | None
    skipped: tuple[Verification, ...]
    layer: str | None = None
    skipped_layers: tuple[str, ...] = ()


class CheckpointCorruptError(RuntimeError):
    """A checkpoint failed verification while it was being loaded: what, in which file."""

    def __init__(self, problem: Problem) -> None:
        super().__init__(str(problem))
        self.problem = problem


def _read_verified(root: Path, file: str, size: int, expected: str, algorithm: str) -> bytearray:
    data = bytearray(size)
    view = memoryview(data)
    hasher = new_hasher(algorithm)
    with (root / file).open("rb", buffering=0) as handle:
        position = 0
        while position < size:
            count = handle.readinto(view[position : position + CHUNK_BYTES])
            if not count:
                raise CheckpointCorruptError(Problem(file, f"shorter than {size} bytes"))
            hasher.update(view[position : position + count])
            position += count
        if handle.read(1):
            raise CheckpointCorruptError(Problem(file, f"longer than {size} bytes"))
    if hasher.hexdigest() != expected:
        raise CheckpointCorruptError(Problem(file, f"{algorithm} hash mismatch"))
    return data


def load_checkpoint(path: Path, manifest: Manifest) -> LoadedCheckpoint:
    """Read every component file of `path`, verifying hashes, then decode them."""
    raw: dict[str, bytearray] = {}
    for entry in manifest.files:
        if entry.path.endswith(FILE_SUFFIX):
            raw[entry.path.removesuffix(FILE_SUFFIX)] = _read_verified(
                path, entry.path, entry.size, entry.hash, manifest.hash_algorithm
            )
    try:
        components = {name: decode_component(data) for name, data in raw.items()}
    except (StateFormatError, ValueError, KeyError) as error:
        raise CheckpointCorruptError(Problem(None, f"undecodable component: {error}")) from error
    return LoadedCheckpoint(path, manifest, components)


def load_newest(
    root: Path, *, on_invalid: Callable[[Verification], None] | None = None
) -> LoadResult:
    """Load the newest valid checkpoint under `root`, skipping (and reporting) invalid ones."""
    report = None if on_invalid is None else (lambda _layer, result: on_invalid(result))
    return load_newest_of(((str(root), root),), on_invalid=report)


def load_newest_of(
    layers: Sequence[tuple[str, Path]],
    *,
    on_invalid: Callable[[str, Verification], None] | None = None,
) -> LoadResult:
    """Load the newest valid checkpoint of several layers (name, root), newest step first.

    At the same step the layer named first wins. Each invalid one is reported with its layer.
    """
    skipped: list[Verification] = []
    skipped_layers: list[str] = []

    def skip(layer: str, result: Verification) -> None:
        skipped.append(result)
        skipped_layers.append(layer)
        if on_invalid is not None:
            on_invalid(layer, result)

    candidates = sorted(
        (
            (-step, order, layer, path)
            for order, (layer, root) in enumerate(layers)
            for step, path in list_checkpoint_dirs(root)
        ),
        key=lambda candidate: candidate[:2],
    )
    for _, _, layer, path in candidates:
        quick = verify(path, check_hashes=False)
        if quick.manifest is None or not quick.ok:
            skip(layer, quick)
            continue
        try:
            loaded = load_checkpoint(path, quick.manifest)
        except CheckpointCorruptError as error:
            skip(layer, Verification(path, quick.step, quick.manifest, (error.problem,)))
            continue
        except OSError as error:
            problem = Problem(None, str(error))
            skip(layer, Verification(path, quick.step, quick.manifest, (problem,)))
            continue
        return LoadResult(loaded, tuple(skipped), layer, tuple(skipped_layers))
    return LoadResult(None, tuple(skipped), None, tuple(skipped_layers))


def load_step(root: Path, step: int) -> LoadedCheckpoint:
    """Load the checkpoint of `step` under `root`, verified (the one another rank chose).

    CheckpointCorruptError when it is absent or does not verify: a rank may not fall back to
    another step on its own.
    """
    path = root / step_dirname(step)
    quick = verify(path, check_hashes=False)
    if quick.manifest is None or not quick.ok:
        reasons = "; ".join(quick.reasons) or "no manifest"
        raise CheckpointCorruptError(Problem(None, f"step {step}: {reasons}"))
    return load_checkpoint(path, quick.manifest)
