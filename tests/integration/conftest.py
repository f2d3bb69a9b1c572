"""Fixtures of the remote-layer and remote-staging tests: SeaweedFS, sshd, a Hub stand-in.

The servers (see `trainguard_dev.testing.servers`) are installed by
`hack/install-test-services.sh`, run once per test session on free loopback ports with their
data in temporary directories, and are stopped at the end. The S3 server and its buckets are
`s3_fixtures`, a plugin shared with the end-to-end scenarios. A test can kill and restart the S3
server (same ports, same data) or drop every SSH connection. The Hugging Face Hub cannot run
here: `hub_standin` is a local stand-in of its API (model and dataset repositories), one per
test.
"""

from __future__ import annotations

from collections.abc import Iterator

import huggingface_hub.constants
import pytest
from hub_standin import HubServer, serving

from trainguard_dev.testing.servers import INSTALL_HINT, SSHD, Sshd, start_sshd

HF_TOKEN = "hf_trainguardTestToken0123456789"


@pytest.fixture(scope="session")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    if not SSHD.exists():
        pytest.fail(f"no sshd at {SSHD}: {INSTALL_HINT}")
    server = start_sshd(tmp_path_factory.mktemp("sshd"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch) -> Iterator[HubServer]:
    """The Hub stand-in (see hub_standin); the client's Xet path off, as the stand-in lacks it."""
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_DISABLE_XET", True)
    with serving(HF_TOKEN) as server:
        yield server
