"""Fixtures of a real S3 server (SeaweedFS on loopback), a plugin shared by test modules.

The remote-layer tests and the end-to-end scenarios that restore from S3 load it with
`pytest_plugins = ("integration.s3_fixtures",)`.

- `seaweedfs` (session): `weed server` installed by `hack/install-test-services.sh`, on free
  loopback ports with its data in a temporary directory; killed at the end of the session;
- `bucket`: a fresh bucket for one test.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from trainguard_dev.testing.servers import INSTALL_HINT, WEED, SeaweedFS


@pytest.fixture(scope="session")
def seaweedfs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedFS]:
    """The S3 server of the test session."""
    if not WEED.exists():
        pytest.fail(f"no SeaweedFS binary at {WEED}: {INSTALL_HINT}")
    server = SeaweedFS(tmp_path_factory.mktemp("seaweedfs"))
    server.start()
    try:
        yield server
    finally:
        # SeaweedFS drains for seconds on SIGTERM; its data is a temporary directory.
        server.kill()


@pytest.fixture
def bucket(seaweedfs: SeaweedFS) -> str:
    """A fresh bucket for one test."""
    name = f"tg-{uuid.uuid4().hex[:12]}"
    seaweedfs.client().create_bucket(Bucket=name)
    return name
