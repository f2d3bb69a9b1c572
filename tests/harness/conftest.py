"""Fixtures for the trainer-harness tests: synthetic shards (`tmpfs` is in tests/conftest.py).

These tests need torch (a required test dependency) but no GPU and no cluster.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from trainguard_harness.shards import write_synthetic_shards


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two small shards of synthetic tokens (vocabulary 256)."""
    directory = tmp_path_factory.mktemp("data")
    write_synthetic_shards(directory, shards=2, tokens_per_shard=8_192, seed=3)
    return directory
