"""MANIFEST.json: the record that makes a directory a checkpoint.

A checkpoint directory is valid only when its manifest parses, names a supported format version
and hash algorithm, and every file it lists exists with the recorded size and hash. The manifest
is written last, so its presence means every listed file was already fsynced.

Example::

    {"format_version": 1, "step": 1200, "time": 1764720000.5, "contents": "full",
     "hash_algorithm": "xxh3-128",
     "files": [{"path": "model.safetensors", "size": 4096, "hash": "9f0c..."}],
     "metadata": {"producer": "trainguard-harness"}}
"""

from __future__ import annotations

import enum
import json
from pathlib import PurePosixPath
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, JsonValue, field_validator

FORMAT_VERSION = 1
MANIFEST_FILENAME = "MANIFEST.json"


class Contents(enum.StrEnum):
    """What a checkpoint holds: everything needed to resume, or model weights only."""

    FULL = "full"
    WEIGHTS = "weights"


class FileEntry(BaseModel):
    """One file of a checkpoint: its path relative to the checkpoint directory, size and hash."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    path: str
    size: Annotated[int, Field(ge=0)]
    hash: str

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

    @field_validator("files")
    @classmethod
    def _unique_paths(cls, value: tuple[FileEntry, ...]) -> tuple[FileEntry, ...]:
        paths = [entry.path for entry in value]
        if len(set(paths)) != len(paths):
            raise ValueError("file paths must be unique")
        return value

    @property
    def total_bytes(self) -> int:
        """Sum of the sizes of all listed files."""
        return sum(entry.size for entry in self.files)

    def to_json_bytes(self) -> bytes:
        """Serialise to the on-disk form (UTF-8 JSON, keys in model order, newline-terminated)."""
        return (json.dumps(self.model_dump(mode="json"), indent=1) + "\n").encode()

    @classmethod
    def from_json_bytes(cls, data: bytes) -> Manifest:
        """Parse the on-disk form; raises pydantic.ValidationError on any malformation."""
        return cls.model_validate_json(data)
