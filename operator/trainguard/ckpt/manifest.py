"""MANIFEST.json: the record that makes a directory a checkpoint.

A checkpoint directory is valid only when its manifest parses, names a supported format version
and hash algorithm, and every file it lists exists with the recorded size and hash. The manifest
is written last, so its presence means every listed file was already fsynced.

Example::

    {"format_version": 1, "step": 1200, "time": 1764720000.5, "contents": "full",
     "hash_algorithm": "xxh3-128",
     "files": [{"path": "model.safetensors", "size": 4096, "hash": "9f0c..."}],
     "metadata": {"producer": "trainguard-harness"}}

A sharded checkpoint, written by several ranks (for example through `torch.distributed.checkpoint`),
is still one checkpoint with one manifest: `world_size` says how many ranks wrote it, and each file
a rank wrote lies under that rank's directory `rank-<5 digits>/` and names its `rank`. Files without
a rank are global, written by the coordinator, which writes the manifest last, once every
rank has reported its files written and fsynced (`txn.ShardWriter`). Any rank's file missing or
corrupt makes the whole checkpoint invalid, like any other file::

    {"format_version": 1, "step": 1200, ..., "world_size": 2,
     "files": [{"path": ".metadata", "size": 812, "hash": "..."},
               {"path": "rank-00000/__0_0.distcp", "size": 4096, "hash": "...", "rank": 0},
               {"path": "rank-00001/__1_0.distcp", "size": 4096, "hash": "...", "rank": 1}]}

Both fields are optional and left out of a single writer's manifest, which reads and verifies as
it always did (the same format version: an older reader refuses a sharded manifest as malformed,
so it never resumes from a checkpoint it cannot see whole).
"""

from __future__ import annotations

import enum
import json
from pathlib import PurePosixPath
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, JsonValue, field_validator, model_validator

from trainguard.ckpt.layout import parse_rank_dirname

FORMAT_VERSION = 1
MANIFEST_FILENAME = "MANIFEST.json"


class Contents(enum.StrEnum):
    """What a checkpoint holds: everything needed to resume, or model weights only."""

    FULL = "full"
    WEIGHTS = "weights"


class FileEntry(BaseModel):
    """One file of a checkpoint: its path relative to the checkpoint directory, size and hash.

    `rank`: in a sharded checkpoint, the rank that wrote the file (None: a global file, or a
    single writer's).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    path: str
    size: Annotated[int, Field(ge=0)]
    hash: str
    rank: Annotated[int, Field(ge=0)] | None = None

    @field_validator("path")
    @classmethod
    def _relative_inside(cls, value: str) -> str:
        # A manifest may come from a remote layer: never let it point outside its directory.
        pure = PurePosixPath(value)
        if not value or pure.is_absolute() or ".." in pure.parts or str(pure) != value:
            raise ValueError(f"file path must be a normalised relative path, got {value!r}")
        if value == MANIFEST_FILENAME:
            raise ValueError(f"{MANIFEST_FILENAME} cannot list itself")
        return value


class Manifest(BaseModel):
    """The manifest of one checkpoint (see the module docstring for an example)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    format_version: int
    step: Annotated[int, Field(ge=0)]
    time: float
    contents: Contents
    hash_algorithm: str
    files: tuple[FileEntry, ...]
    metadata: dict[str, JsonValue] = Field(default_factory=dict)
    # Set only for a sharded checkpoint (see the module docstring).
    world_size: Annotated[int, Field(ge=1)] | None = None

    @field_validator("files")
    @classmethod
    def _unique_paths(cls, value: tuple[FileEntry, ...]) -> tuple[FileEntry, ...]:
        paths = [entry.path for entry in value]
        if len(set(paths)) != len(paths):
            raise ValueError("file paths must be unique")
        return value

    @model_validator(mode="after")
    def _ranks_in_their_directories(self) -> Manifest:
        # A rank's files lie in its own directory, so two ranks never claim one path and a
        # problem's path alone says whose shard it is.
        for entry in self.files:
            top = parse_rank_dirname(entry.path.split("/", 1)[0]) if "/" in entry.path else None
            if self.world_size is None:
                if entry.rank is not None:
                    raise ValueError(f"{entry.path}: a rank is recorded but no world_size")
                continue
            if entry.rank is not None and entry.rank >= self.world_size:
                raise ValueError(f"{entry.path}: rank {entry.rank} >= world_size {self.world_size}")
            if top != entry.rank:
                raise ValueError(
                    f"{entry.path}: a file of rank {entry.rank} must lie in its rank directory"
                    if entry.rank is not None
                    else f"{entry.path}: a global file cannot lie in a rank directory"
                )
        return self

    @property
    def sharded(self) -> bool:
        """True for a checkpoint written by several ranks (`world_size` recorded)."""
        return self.world_size is not None

    @property
    def total_bytes(self) -> int:
        """Sum of the sizes of all listed files."""
        return sum(entry.size for entry in self.files)

    def to_json_bytes(self) -> bytes:
        """Serialise to the on-disk form (UTF-8 JSON, keys in model order, newline-terminated).

        The sharded fields are left out where unset: a single writer's manifest stays exactly
        what readers before them parse.
        """
        data = self.model_dump(mode="json")
        if self.world_size is None:
            del data["world_size"]
        for entry in data["files"]:
            if entry["rank"] is None:
                del entry["rank"]
        return (json.dumps(data, indent=1) + "\n").encode()

    @classmethod
    def from_json_bytes(cls, data: bytes) -> Manifest:
        """Parse the on-disk form; raises pydantic.ValidationError on any malformation."""
        return cls.model_validate_json(data)
