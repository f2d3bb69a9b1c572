"""The hf:// layer: the real huggingface_hub client against a local stand-in of the Hub's API.

No Hub server can run here; `hub_standin.HubServer` stands in for it (see its docstring).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
from hub_standin import HubServer
from layer_helpers import Counting
from safetensors.numpy import load_file, save_file

from conftest import HF_TOKEN
from trainguard.agent.shipper import Shipper
from trainguard.api.constants import SECRET_KEY_HF_TOKEN
from trainguard.ckpt import CheckpointTransaction, Contents, verify
from trainguard.layers import Layer, LayerConfig, LayerError, layer_secrets_env, open_layer
from trainguard.layers.hf import HfLayer
from trainguard.layers.lineage import CheckpointRef, Origin

pytestmark = pytest.mark.e2e

REPO = "acme/llm-3b"
TENSOR_BYTES = 256 * 1024

# What a layer opened outside a pod ships as.
LOCAL = Origin.of("", None)


def ref(step: int) -> CheckpointRef:
    """A checkpoint shipped outside a pod."""
    return CheckpointRef(step, LOCAL)


def steps(layer: Layer) -> list[int]:
    """The steps of the complete checkpoints on the layer."""
    return [r.step for r in layer.checkpoints()]


def _weights(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        f"layers.{i}.weight": rng.standard_normal(TENSOR_BYTES // 4, np.float32) for i in range(6)
    }


def _save(l1: Path, step: int, tmp_path: Path) -> Path:
    """A full checkpoint: a 1.5 MiB model.safetensors (6 tensors) and an optimizer file."""
    model = tmp_path / f"model-{step}.safetensors"
    save_file(_weights(step), str(model), metadata={"format": "pt"})
    with CheckpointTransaction(l1, step, contents=Contents.FULL) as txn:
        txn.write_file("model.safetensors", model.read_bytes())
        txn.write_file("optimizer.safetensors", b"\1" * 4096)
        return Path(txn.commit().path)


def _layer(hub: HubServer, tmp_path: Path, token: str = HF_TOKEN, keep: int = 2) -> HfLayer:
    secret = tmp_path / "hf-secret"
    secret.mkdir(exist_ok=True)
    (secret / SECRET_KEY_HF_TOKEN).write_text(token + "\n")
    environ = {layer_secrets_env("hub"): str(secret), "HF_ENDPOINT": hub.url}
    layer = open_layer(
        LayerConfig("hub", f"hf://{REPO}/checkpoints", contents="weights", keep=keep), environ
    )
    assert isinstance(layer, HfLayer)
    layer.max_shard_bytes = 4 * TENSOR_BYTES  # the 6 tensors go up as 2 shards
    return layer


def test_weights_sharded_committed_in_batches_verified_and_fetched(
    hub: HubServer, tmp_path: Path
) -> None:
    l1 = tmp_path / "l1"
    layer = _layer(hub, tmp_path, keep=1)
    shipper = Shipper(l1, [layer])
    _save(l1, 100, tmp_path)
    shipper.ship_once()
    assert shipper.states()["hub"]["state"] == "verified"
    files = hub.state.repos[REPO]
    folder = f"checkpoints/{ref(100).path}"
    assert sorted(p.removeprefix(folder + "/") for p in files) == [
        "FINGERPRINTS.json",
        "MANIFEST.json",
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        "model.safetensors.index.json",
    ]
    # Weights only: no optimizer; the shards are LFS files, checked by sha256.
    assert files[f"{folder}/model-00001-of-00002.safetensors"].lfs_oid is not None
    # One commit with the data, then one with fingerprints and manifest, the manifest last.
    data_commit, manifest_commit = (lines for _, lines in hub.state.commits)
    assert all("MANIFEST" not in str(line) for line in data_commit)
    assert manifest_commit[-1]["value"]["path"].endswith("MANIFEST.json")
    assert steps(layer) == [100]
    assert layer.verify(ref(100)) == []
    # The real client's path: preupload, LFS batch, PUT of each shard, commit.
    requests = hub.state.requests
    assert f"POST /{REPO}.git/info/lfs/objects/batch" in requests
    assert sum(r.startswith("PUT /lfs/") for r in requests) == 2

    fetched = layer.fetch(ref(100), tmp_path / "fetched")
    result = verify(fetched)
    assert result.ok and result.manifest is not None
    assert result.manifest.contents == Contents.WEIGHTS
    loaded: dict[str, np.ndarray] = {}
    for shard in sorted(fetched.glob("model-*.safetensors")):
        loaded.update(load_file(str(shard)))
    original = _weights(100)
    assert loaded.keys() == original.keys()
    assert all(np.array_equal(loaded[k], original[k]) for k in original)
    assert not list(l1.glob(".upload-*"))  # the staged shards are gone

    # keep=1: the next checkpoint replaces this one, removed in one commit.
    _save(l1, 200, tmp_path)
    shipper.ship_once()
    assert steps(layer) == [200]
    assert hub.state.commits[-1][1][-1]["key"] == "deletedFolder"


def test_rate_limited_commit_is_retried(hub: HubServer, tmp_path: Path) -> None:
    checkpoint = _save(tmp_path / "l1", 1, tmp_path)
    layer = _layer(hub, tmp_path)
    hub.state.fail_commits = [429]
    started = time.monotonic()
    progress = Counting()
    layer.put(checkpoint, progress)
    assert time.monotonic() - started >= 1.0  # Retry-After was honoured
    assert steps(layer) == [1]
    assert progress.sent == progress.total > 0


def test_a_repository_that_exists_already_is_shipped_to(hub: HubServer, tmp_path: Path) -> None:
    # Created on the Hub before the run, or by an earlier attempt's agent: every new layer
    # asks to create it again, and the Hub answers 409 with the repository's url.
    hub.state.repos[REPO] = {}
    layer = _layer(hub, tmp_path)
    layer.put(_save(tmp_path / "l1", 1, tmp_path))
    assert steps(layer) == [1]
    assert "POST /api/repos/create" in hub.state.requests


def test_file_replaced_on_the_hub_is_detected(hub: HubServer, tmp_path: Path) -> None:
    layer = _layer(hub, tmp_path)
    layer.put(_save(tmp_path / "l1", 1, tmp_path))
    path = f"checkpoints/{ref(1).path}/model-00002-of-00002.safetensors"
    files = hub.state.repos[REPO]
    other = next(oid for oid in hub.state.lfs if oid != files[path].lfs_oid)
    files[path].lfs_oid = other  # as if another writer committed different content
    assert any("changed on the layer" in p.reason for p in layer.verify(ref(1)))
    with pytest.raises(LayerError, match="hash or size differs"):
        layer.fetch(ref(1), tmp_path / "fetched")


def test_bad_token_fails_without_showing_it(
    hub: HubServer, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    wrong = "hf_notTheRightToken987654321"
    layer = _layer(hub, tmp_path, token=wrong)
    shipper = Shipper(tmp_path / "l1", [layer])
    _save(tmp_path / "l1", 1, tmp_path)
    shipper.ship_once()
    state = shipper.states()["hub"]
    assert state["state"] == "failed"
    assert "401" in state["error"] or "Unauthorized" in state["error"]
    out, err = capfd.readouterr()
    for text in (str(state), out, err):
        assert wrong not in text
        assert HF_TOKEN not in text
