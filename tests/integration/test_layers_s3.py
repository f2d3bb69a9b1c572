"""The s3:// layer against a real S3-compatible server (SeaweedFS on loopback)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from layer_helpers import MIB, Counting, assert_same_checkpoint, save

from trainguard.agent.shipper import FAILED, Shipper
from trainguard.api.constants import (
    SECRET_KEY_S3_ACCESS_KEY_ID,
    SECRET_KEY_S3_ENDPOINT_URL,
    SECRET_KEY_S3_SECRET_ACCESS_KEY,
)
from trainguard.ckpt import MANIFEST_FILENAME, step_dirname
from trainguard.initsteps.restore import restore
from trainguard.layers import COST, Credentials, FileLayer, Layer, LayerConfig, LayerError
from trainguard.layers.base import FINGERPRINTS_FILENAME, RemoteLayer
from trainguard.layers.lineage import CheckpointRef, Origin, checkpoint_key
from trainguard.layers.s3 import MIN_PART_BYTES, open_s3
from trainguard_dev.testing.servers import S3_ACCESS_KEY, S3_SECRET_KEY, SeaweedFS

pytest_plugins = ("integration.s3_fixtures",)
pytestmark = pytest.mark.e2e

# What a layer opened outside a pod ships as.
LOCAL = Origin.of("", None)


def ref(step: int) -> CheckpointRef:
    """A checkpoint shipped outside a pod."""
    return CheckpointRef(step, LOCAL)


def steps(layer: Layer) -> list[int]:
    """The steps of the complete checkpoints on the layer."""
    return [r.step for r in layer.checkpoints()]


def step_key(step: int, name: str) -> str:
    """The key of a file of a checkpoint shipped outside a pod."""
    return checkpoint_key(ref(step), name)


def _layer(
    server: SeaweedFS, bucket: str, name: str = "s3", keep: int = 2, secret: str = S3_SECRET_KEY
) -> RemoteLayer:
    credentials = Credentials(
        {
            SECRET_KEY_S3_ACCESS_KEY_ID: S3_ACCESS_KEY,
            SECRET_KEY_S3_SECRET_ACCESS_KEY: secret,
            SECRET_KEY_S3_ENDPOINT_URL: server.endpoint,
        }
    )
    config = LayerConfig(name, f"s3://{bucket}/runs/demo", keep=keep)
    return open_s3(config, credentials, {}, part_bytes=MIN_PART_BYTES)


def test_put_verify_list_prune_fetch_restore(
    seaweedfs: SeaweedFS, bucket: str, tmp_path: Path
) -> None:
    l1 = tmp_path / "l1"
    layer = _layer(seaweedfs, bucket, keep=2)
    checkpoints = {step: save(l1, step) for step in (10, 20, 30)}
    shipper = Shipper(l1, [layer])
    shipper.ship_once()
    state = shipper.states()["s3"]
    assert (state["state"], state["step"]) == ("verified", 30)
    assert state["bytes_done"] == state["bytes_total"] > 12 * MIB
    for step in (10, 20):
        layer.put(checkpoints[step])
    layer.prune(2)
    assert steps(layer) == [20, 30]
    assert layer.verify(ref(30)) == []

    # Multipart with per-part MD5: the 12 MiB model went up as 3 parts of 5 MiB.
    stats = layer.store.stats([step_key(30, "model.safetensors")])
    assert stats[step_key(30, "model.safetensors")][1].endswith("-3")  # type: ignore[index]

    fetched = layer.fetch(ref(30), tmp_path / "fetched")
    assert_same_checkpoint(checkpoints[30], fetched)

    result = restore(tmp_path / "fresh-l1", [layer])
    assert (result.step, result.from_layer) == (30, "s3")
    assert_same_checkpoint(checkpoints[30], tmp_path / "fresh-l1" / step_dirname(30))


def test_manifest_only_lists_a_checkpoint(
    seaweedfs: SeaweedFS, bucket: str, tmp_path: Path
) -> None:
    layer = _layer(seaweedfs, bucket)
    layer.put(save(tmp_path / "l1", 5, model_bytes=MIB))
    client = seaweedfs.client()
    client.delete_object(Bucket=bucket, Key=f"runs/demo/{step_key(5, MANIFEST_FILENAME)}")
    assert steps(layer) == []


def test_server_killed_mid_upload_resumes(
    seaweedfs: SeaweedFS, bucket: str, tmp_path: Path
) -> None:
    checkpoint = save(tmp_path / "l1", 7)
    layer = _layer(seaweedfs, bucket)
    # The server dies right after the first 5 MiB part was stored.
    crash = Counting(after=MIN_PART_BYTES, action=seaweedfs.kill)
    with pytest.raises(LayerError):
        layer.put(checkpoint, crash)
    assert crash.sent == MIN_PART_BYTES
    seaweedfs.start()

    resumed = Counting()
    layer.put(checkpoint, resumed)
    assert resumed.resumed == MIN_PART_BYTES  # the stored part was not sent again
    assert resumed.sent == resumed.total - MIN_PART_BYTES
    assert steps(layer) == [7]
    assert layer.verify(ref(7)) == []
    assert_same_checkpoint(checkpoint, layer.fetch(ref(7), tmp_path / "fetched"))


def _overwrite(server: SeaweedFS, bucket: str, step: int, path: str) -> None:
    client = server.client()
    key = f"runs/demo/{step_key(step, path)}"
    size = client.head_object(Bucket=bucket, Key=key)["ContentLength"]
    client.put_object(Bucket=bucket, Key=key, Body=b"\0" * size)


def test_corrupt_object_is_detected_and_restore_falls_back(
    seaweedfs: SeaweedFS, bucket: str, tmp_path: Path
) -> None:
    l1 = tmp_path / "l1"
    layer = _layer(seaweedfs, bucket)
    for step in (10, 20):
        layer.put(save(l1, step, model_bytes=MIB))
    _overwrite(seaweedfs, bucket, 20, "optimizer.safetensors")
    assert any("changed on the layer" in p.reason for p in layer.verify(ref(20)))
    result = restore(tmp_path / "fresh", [layer])
    assert (result.step, result.from_layer) == (10, "s3")
    assert any("s3 step 20" in line for line in result.skipped)


def test_corruption_only_the_manifest_hash_sees_falls_back_to_another_layer(
    seaweedfs: SeaweedFS, bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server's own record matches the damaged object: the fetch's hash catches it."""
    l1 = tmp_path / "l1"
    checkpoint = save(l1, 20, model_bytes=MIB)
    s3 = _layer(seaweedfs, bucket)
    s3.put(checkpoint)
    backup = FileLayer(LayerConfig("backup", f"file://{tmp_path / 'nfs'}"), tmp_path / "nfs")
    backup.put(checkpoint)
    _overwrite(seaweedfs, bucket, 20, "model.safetensors")
    # Record the damaged object's ETag as if it had been uploaded that way.
    key = step_key(20, "model.safetensors")
    fingerprints = s3.store.read(step_key(20, FINGERPRINTS_FILENAME))
    assert fingerprints is not None
    stat = s3.store.stats([key])[key]
    assert stat is not None
    patched = fingerprints.decode().replace(json.loads(fingerprints)[key], stat[1])
    s3.store.write_last([(step_key(20, FINGERPRINTS_FILENAME), patched.encode())])
    assert s3.verify(ref(20)) == []
    with pytest.raises(LayerError, match="hash or size differs"):
        s3.fetch(ref(20), tmp_path / "probe")
    assert not (tmp_path / "probe" / step_dirname(20)).exists()

    # S3 is tried first here (listed as cheaper), fails on the hash, the file layer serves.
    monkeypatch.setitem(COST, "s3", 0)
    monkeypatch.setitem(COST, "file", 5)
    result = restore(tmp_path / "fresh", [s3, backup])
    assert (result.step, result.from_layer) == (20, "backup")
    assert any("s3 step 20" in line and "hash" in line for line in result.skipped)


def test_credentials_never_reach_errors_state_or_logs(
    seaweedfs: SeaweedFS, bucket: str, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    l1 = tmp_path / "l1"
    save(l1, 1, model_bytes=MIB)
    wrong = "not-the-secret-but-still-a-secret-42"
    layer = _layer(seaweedfs, bucket, secret=wrong)
    shipper = Shipper(l1, [layer])
    shipper.ship_once()
    state = shipper.states()["s3"]
    assert state["state"] == FAILED
    assert "SignatureDoesNotMatch" in state["error"] or "AccessDenied" in state["error"]
    with pytest.raises(LayerError) as raised:
        layer.put(l1 / step_dirname(1))
    out, err = capfd.readouterr()
    texts = (str(state), str(raised.value), repr(raised.value), out, err, repr(layer.credentials))
    for text in texts:
        assert wrong not in text
        assert S3_ACCESS_KEY not in text
