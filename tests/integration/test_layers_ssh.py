"""The ssh:// layer against OpenSSH's sshd on loopback (generated keys, its own config)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from layer_helpers import MIB, Counting, assert_same_checkpoint, save

from trainguard.agent.shipper import VERIFIED, Shipper
from trainguard.api.constants import (
    SECRET_KEY_SSH_CONFIG,
    SECRET_KEY_SSH_KNOWN_HOSTS,
    SECRET_KEY_SSH_PRIVATE_KEY,
)
from trainguard.ckpt import MANIFEST_FILENAME, Problem, scan, verify
from trainguard.initsteps.restore import restore
from trainguard.layers import (
    Layer,
    LayerConfig,
    LayerError,
    layer_secrets_env,
    open_layer,
)
from trainguard.layers.base import RemoteLayer
from trainguard.layers.lineage import CheckpointRef, Origin
from trainguard.layers.ssh import PARTIAL_SUFFIX
from trainguard_dev.testing.polling import eventually
from trainguard_dev.testing.servers import Sshd
from trainguard_harness.writer import CheckpointWriter

pytestmark = pytest.mark.e2e

# What a layer opened outside a pod ships as.
LOCAL = Origin.of("", None)


def ref(step: int) -> CheckpointRef:
    """A checkpoint shipped outside a pod."""
    return CheckpointRef(step, LOCAL)


def steps(layer: Layer) -> list[int]:
    """The steps of the complete checkpoints on the layer."""
    return [r.step for r in layer.checkpoints()]


def _secret_dir(server: Sshd, tmp_path: Path, known_hosts: bool = True) -> Path:
    """The layer's Secret as the operator mounts it: one file per key."""
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / SECRET_KEY_SSH_PRIVATE_KEY).write_text(server.client_key.read_text())
    if known_hosts:
        (secret / SECRET_KEY_SSH_KNOWN_HOSTS).write_text(server.known_hosts.read_text())
    return secret


def _layer(server: Sshd, tmp_path: Path, keep: int = 2, known_hosts: bool = True) -> RemoteLayer:
    uri = f"ssh://{server.user}@127.0.0.1:{server.port}{tmp_path / 'remote'}"
    config = LayerConfig("scp-backup", uri, keep=keep)
    environ = {layer_secrets_env("scp-backup"): str(_secret_dir(server, tmp_path, known_hosts))}
    layer = open_layer(config, environ)
    assert isinstance(layer, RemoteLayer)
    return layer


def test_put_verify_list_prune_fetch_restore(sshd: Sshd, tmp_path: Path) -> None:
    l1 = tmp_path / "l1"
    layer = _layer(sshd, tmp_path)
    checkpoints = {step: save(l1, step, model_bytes=3 * MIB) for step in (10, 20, 30)}
    for step in (10, 20):
        layer.put(checkpoints[step])
    shipper = Shipper(l1, [layer])
    shipper.ship_once()  # ships 30, then keep-2 removes 10
    assert steps(layer) == [20, 30]
    assert shipper.states()["scp-backup"]["state"] == "verified"
    assert (tmp_path / "remote" / ref(20).path).is_dir()
    assert not (tmp_path / "remote" / ref(10).path).exists()
    assert layer.verify(ref(30)) == []
    assert_same_checkpoint(checkpoints[30], layer.fetch(ref(30), tmp_path / "fetched"))
    result = restore(tmp_path / "fresh", [layer])
    assert (result.step, result.from_layer) == (30, "scp-backup")


def test_dropped_connection_resumes_at_the_offset(sshd: Sshd, tmp_path: Path) -> None:
    checkpoint = save(tmp_path / "l1", 3, model_bytes=12 * MIB)
    layer = _layer(sshd, tmp_path)
    partial = tmp_path / "remote" / ref(3).path / f"model.safetensors{PARTIAL_SUFFIX}"

    def drop_once_data_landed() -> None:
        # Writes are pipelined: wait until the server has stored some, then cut the line.
        eventually(
            lambda: partial.exists() and partial.stat().st_size, 10, "data on the server", 0.01
        )
        assert sshd.drop_connections() > 0

    with pytest.raises(LayerError):
        layer.put(checkpoint, Counting(after=4 * MIB, action=drop_once_data_landed))
    offset = partial.stat().st_size
    assert 0 < offset < 12 * MIB

    resumed = Counting()
    layer.put(checkpoint, resumed)
    assert resumed.resumed == offset  # the partial file was continued, not sent again
    assert resumed.sent == resumed.total - offset
    assert steps(layer) == [3]
    assert not partial.exists()
    assert_same_checkpoint(checkpoint, layer.fetch(ref(3), tmp_path / "fetched"))


def test_corrupt_remote_file_is_seen_by_the_remote_hash(sshd: Sshd, tmp_path: Path) -> None:
    l1 = tmp_path / "l1"
    layer = _layer(sshd, tmp_path)
    for step in (10, 20):
        layer.put(save(l1, step, model_bytes=MIB))
    victim = tmp_path / "remote" / ref(20).path / "model.safetensors"
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    assert layer.verify(ref(20)) == [
        Problem("model.safetensors", "changed on the layer since it was uploaded")
    ]
    result = restore(tmp_path / "fresh", [layer])
    assert (result.step, result.from_layer) == (10, "scp-backup")


def test_unknown_host_key_is_refused(sshd: Sshd, tmp_path: Path) -> None:
    layer = _layer(sshd, tmp_path, known_hosts=False)
    with pytest.raises(LayerError, match="not found in known_hosts"):
        layer.checkpoints()


def test_the_secrets_config_reaches_a_host_by_another_name_port_and_user(
    sshd: Sshd, tmp_path: Path
) -> None:
    # The URI names the backup host as users know it (user, host, port); the site reaches it
    # elsewhere (split DNS, a forwarded port): the Secret's OpenSSH client config says where.
    uri = f"ssh://backup@backup.example.com:22{tmp_path / 'remote'}"
    secret = _secret_dir(sshd, tmp_path)
    (secret / SECRET_KEY_SSH_CONFIG).write_text(
        f"Host backup.example.com\n  HostName 127.0.0.1\n  Port {sshd.port}\n  User {sshd.user}\n"
    )
    layer = open_layer(LayerConfig("backup", uri), {layer_secrets_env("backup"): str(secret)})
    layer.put(save(tmp_path / "l1", 10, model_bytes=MIB))
    assert steps(layer) == [10]
    assert layer.verify(ref(10)) == []
    assert (tmp_path / "remote" / ref(10).path / MANIFEST_FILENAME).is_file()


def _training_state(step: int) -> dict[str, object]:
    """A model (8 MiB) and its optimizer's moments (1 MiB): model.safetensors is uploaded first."""
    generator = torch.Generator().manual_seed(step)
    return {
        "model": {"w": torch.randn(2 * MIB, generator=generator)},
        "optimizer": {"exp_avg": torch.randn(MIB // 4, generator=generator)},
    }


@pytest.mark.timeout(120)
def test_an_upload_slower_than_the_cadence_survives_the_writers_keep_last_n(
    sshd: Sshd, tmp_path: Path
) -> None:
    l1 = tmp_path / "l1"
    writer = CheckpointWriter(l1, keep_last=1, on_event=lambda event: None)
    layer = _layer(sshd, tmp_path)
    name = layer.config.name
    # 9 MiB at 1 MiB/s: about 8 s, while the trainer saves twice more.
    shipper = Shipper(l1, [layer], poll_s=0.05, bandwidth_bytes_per_s=MIB)
    try:
        writer.save(10, _training_state(10))
        writer.wait()
        shipper.start()
        eventually(
            lambda: (
                shipper.states()[name]["uploading"] == 10
                and shipper.states()[name]["bytes_done"] > 0
            ),
            30,
            "the upload of step 10 under way",
            0.02,
        )
        for step in (20, 30):
            writer.save(step, _training_state(step))
            writer.wait()
            assert shipper.newest_verified() == step  # seen, as the shipper's poll would
        # Keep-last-1 removed step 10 (and 20) from L1 while step 10 was being uploaded.
        assert shipper.states()[name]["uploading"] == 10
        assert [v.step for v in scan(l1).valid] == [30]
        eventually(lambda: shipper.states()[name]["step"] == 30, 60, "step 30 shipped", 0.1)
    finally:
        shipper.stop()
        shipper.join(timeout=60)
        writer.close()
    assert steps(layer) == [10, 30]
    assert layer.verify(ref(10)) == []
    fetched = layer.fetch(ref(10), tmp_path / "fetched")  # every byte hashed on the way
    check = verify(fetched)
    assert check.ok and check.step == 10, check.reasons
    state = shipper.states()[name]
    assert (state["state"], state["error"]) == (VERIFIED, None)
    assert (state["shipped"], state["skipped"]) == (2, 1)  # 20 was superseded by 30
    assert scan(l1).pinned == ()
