"""Fixtures for the trainer-harness tests: synthetic shards, a size-limited disk, trainer runs.

These tests need torch (a required test dependency) but no GPU and no cluster.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from trainguard_harness.shards import write_synthetic_shards


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two small shards of synthetic tokens (vocabulary 256)."""
    directory = tmp_path_factory.mktemp("data")
    write_synthetic_shards(directory, shards=2, tokens_per_shard=8_192, seed=3)
    return directory


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Callable[[int], Path]]:
    """Mount small tmpfs disks (size in bytes) that fill up; all are unmounted afterwards."""
    mounted: list[Path] = []

    def mount(size: int) -> Path:
        point = tmp_path / f"disk{len(mounted)}"
        point.mkdir()
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(point)], check=True
        )
        mounted.append(point)
        return point

    yield mount
    for point in mounted:
        subprocess.run(["umount", "-l", str(point)], check=True)
