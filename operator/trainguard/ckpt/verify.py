"""Verifying checkpoints and scanning a checkpoint root.

Valid = the manifest parses, names this format version and a known hash algorithm, matches the
directory's step, and every listed file exists with the recorded size and hash. Every problem
of a checkpoint is collected (not just the first), each naming the file it concerns (none for
the checkpoint as a whole), so reports say everything that is wrong and where. A sharded
checkpoint verifies as one: a problem with any rank's file makes the whole checkpoint invalid,
and the problem names the rank that wrote the file.
Invalid checkpoints are reported and skipped by every reader here; nothing here deletes them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from pydantic import ValidationError

from trainguard.ckpt.hashing import UnknownHashAlgorithmError, hash_file, new_hasher
from trainguard.ckpt.layout import (
    DELETING_PREFIX,
    INVALID_PREFIX,
    PIN_PREFIX,
    TMP_PREFIX,
    parse_step_dirname,
)
from trainguard.ckpt.manifest import FORMAT_VERSION, MANIFEST_FILENAME, FileEntry, Manifest


class Problem(NamedTuple):
    """One thing wrong with a checkpoint: the file it concerns and what is wrong with it.

    `file` is the path within the checkpoint, None when the checkpoint as a whole is (its
    manifest missing or malformed, another step's).
    """

    file: str | None
    reason: str

    def __str__(self) -> str:
        return self.reason if self.file is None else f"{self.file}: {self.reason}"


@dataclass(frozen=True)
class Verification:
    """The result of verifying one checkpoint directory."""

    path: Path
    step: int | None
    manifest: Manifest | None
    problems: tuple[Problem, ...]

    @property
    def reasons(self) -> tuple[str, ...]:
        """Every problem as one line (`file: reason`)."""
        return tuple(str(problem) for problem in self.problems)

    @property
    def ok(self) -> bool:
        """True when the checkpoint is valid (no problems)."""
        return self.manifest is not None and not self.problems


def verify(
    path: str | os.PathLike[str], *, check_hashes: bool = True, direct: bool = False
) -> Verification:
    """Verify one checkpoint directory.

    With `check_hashes=False` only the manifest and the file sizes are checked: cheap enough to
    poll, but it cannot see a flipped byte. With `direct=True` files are read with O_DIRECT
    where supported (see `hash_file`): the device's bytes, not the page cache's.
    """
    directory = Path(path)
    step = parse_step_dirname(directory.name)
    try:
        raw = (directory / MANIFEST_FILENAME).read_bytes()
    except FileNotFoundError:
        return Verification(directory, step, None, (Problem(None, f"missing {MANIFEST_FILENAME}"),))
    except OSError as error:
        unreadable = Problem(None, f"unreadable {MANIFEST_FILENAME}: {error}")
        return Verification(directory, step, None, (unreadable,))
    try:
        manifest = Manifest.from_json_bytes(raw)
    except ValidationError as error:
        first = error.errors()[0]
        detail = f"{'.'.join(str(part) for part in first['loc'])}: {first['msg']}"
        malformed = Problem(None, f"malformed {MANIFEST_FILENAME}: {detail}")
        return Verification(directory, step, None, (malformed,))
    problems = _manifest_problems(manifest, step)
    if not problems:
        problems = _file_problems(directory, manifest, check_hashes=check_hashes, direct=direct)
    return Verification(directory, manifest.step, manifest, tuple(problems))


def _manifest_problems(manifest: Manifest, dir_step: int | None) -> list[Problem]:
    reasons = []
    if manifest.format_version != FORMAT_VERSION:
        reasons.append(f"unsupported format_version {manifest.format_version}")
    if dir_step is not None and dir_step != manifest.step:
        reasons.append(f"directory is step {dir_step} but the manifest says {manifest.step}")
    try:
        new_hasher(manifest.hash_algorithm)
    except UnknownHashAlgorithmError as error:
        reasons.append(str(error))
    return [Problem(None, reason) for reason in reasons]


def _file_problems(
    directory: Path, manifest: Manifest, *, check_hashes: bool, direct: bool
) -> list[Problem]:
    problems = []
    for entry in manifest.files:
        reason = _entry_problem(directory, manifest, entry, hashes=check_hashes, direct=direct)
        if reason is None:
            continue
        if entry.rank is not None:
            reason = f"{reason} (rank {entry.rank} of {manifest.world_size})"
        problems.append(Problem(entry.path, reason))
    return problems


def _entry_problem(
    directory: Path, manifest: Manifest, entry: FileEntry, *, hashes: bool, direct: bool
) -> str | None:
    """What is wrong with one listed file, or None."""
    file_path = directory / entry.path
    try:
        size = file_path.stat().st_size
    except FileNotFoundError:
        return "missing"
    except OSError as error:
        return f"unreadable: {error}"
    if size != entry.size:
        return f"size {size} != {entry.size} in the manifest"
    if not hashes:
        return None
    try:
        _, digest = hash_file(file_path, manifest.hash_algorithm, direct=direct)
    except OSError as error:
        return f"unreadable: {error}"
    if digest != entry.hash:
        return f"{manifest.hash_algorithm} hash mismatch"
    return None


@dataclass(frozen=True)
class Scan:
    """Everything found in a checkpoint root.

    `valid` and `invalid` are sorted by step, oldest first. `partial` lists hidden temporary
    directories (an interrupted save or removal: never a checkpoint, safe to remove);
    `quarantined` lists invalid checkpoints moved aside by a newer save of the same step;
    `pinned` lists pins (`pin`: a checkpoint a remote layer is shipping, never read here and
    not the writer's to remove).
    """

    root: Path
    valid: tuple[Verification, ...]
    invalid: tuple[Verification, ...]
    partial: tuple[Path, ...]
    quarantined: tuple[Path, ...]
    pinned: tuple[Path, ...] = ()

    @property
    def newest_valid(self) -> Verification | None:
        """The valid checkpoint with the highest step, if any."""
        return self.valid[-1] if self.valid else None


def list_checkpoint_dirs(root: str | os.PathLike[str]) -> list[tuple[int, Path]]:
    """(step, path) of every `step-<8 digits>` directory in `root`, newest first."""
    base = Path(root)
    if not base.is_dir():
        return []
    found = []
    for child in base.iterdir():
        step = parse_step_dirname(child.name)
        if step is not None and child.is_dir():
            found.append((step, child))
    return sorted(found, reverse=True)


def scan(root: str | os.PathLike[str], *, check_hashes: bool = True) -> Scan:
    """Verify every checkpoint in `root` (a missing root is an empty scan: a fresh run)."""
    base = Path(root)
    results = [verify(path, check_hashes=check_hashes) for _, path in list_checkpoint_dirs(base)]
    hidden = sorted(base.iterdir()) if base.is_dir() else []
    return Scan(
        root=base,
        valid=tuple(reversed([result for result in results if result.ok])),
        invalid=tuple(reversed([result for result in results if not result.ok])),
        partial=tuple(
            path for path in hidden if path.name.startswith((TMP_PREFIX, DELETING_PREFIX))
        ),
        quarantined=tuple(path for path in hidden if path.name.startswith(INVALID_PREFIX)),
        pinned=tuple(path for path in hidden if path.name.startswith(PIN_PREFIX)),
    )


@dataclass(frozen=True)
class Search:
    """The newest valid checkpoint of a root, and the newer invalid ones skipped to find it."""

    newest: Verification | None
    skipped: tuple[Verification, ...]


def find_newest_valid(root: str | os.PathLike[str], *, check_hashes: bool = True) -> Search:
    """Verify from the highest step down and stop at the first valid checkpoint.

    Cheaper than `scan()` when only the resume point is wanted: older checkpoints are not read.
    """
    skipped: list[Verification] = []
    for _, path in list_checkpoint_dirs(root):
        result = verify(path, check_hashes=check_hashes)
        if result.ok:
            return Search(newest=result, skipped=tuple(skipped))
        skipped.append(result)
    return Search(newest=None, skipped=tuple(skipped))
