"""RemoteLayer's contract over an in-memory store, credentials, the factory and the shard split."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from trainguard.api.constants import (
    SECRET_KEY_HF_TOKEN,
    SECRET_KEY_S3_ACCESS_KEY_ID,
    SECRET_KEY_S3_ENDPOINT_URL,
    SECRET_KEY_S3_SECRET_ACCESS_KEY,
    SECRET_KEY_SSH_CONFIG,
    SECRET_KEY_SSH_PRIVATE_KEY,
)
from trainguard.ckpt import MANIFEST_FILENAME, CheckpointTransaction, FileEntry, Problem, verify
from trainguard.initsteps.restore import restore
from trainguard.layers import (
    REDACTED,
    Credentials,
    LayerConfig,
    LayerError,
    Transfer,
    layer_secrets_env,
    open_layer,
    weight_files,
)
from trainguard.layers.base import FINGERPRINTS_FILENAME, RemoteLayer, Uploads
from trainguard.layers.hf import HfLayer
from trainguard.layers.lineage import CheckpointRef, Origin, checkpoint_key, parse_key
from trainguard.layers.s3 import S3Store
from trainguard.layers.shards import ShardError, split
from trainguard.layers.ssh import SshStore, ssh_target

pytestmark = pytest.mark.unit

SECRET = "very-secret-access-key-123"


class MemoryStore:
    """A Store in a dict; fingerprints are the content's length and first bytes."""

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}
        self.log: list[str] = []
        self.fail_with: Exception | None = None

    @staticmethod
    def fingerprint(data: bytes) -> str:
        return f"{len(data)}:{data[:8].hex()}:{data[-8:].hex()}"

    def list_checkpoints(self) -> dict[CheckpointRef, bool]:
        found: dict[CheckpointRef, bool] = {}
        for key in self.objects:
            parsed = parse_key(key)
            assert parsed is not None, key
            ref, name = parsed
            found[ref] = found.get(ref, False) or name == MANIFEST_FILENAME
        return found

    def read(self, key: str) -> bytes | None:
        return self.objects.get(key)

    def upload(self, files: Uploads, transfer: Transfer) -> dict[str, str]:
        if self.fail_with is not None:
            raise self.fail_with
        result = {}
        for source, key in files:
            self.objects[key] = source.read_bytes()
            self.log.append(f"upload {key}")
            transfer.advance(len(self.objects[key]))
            result[key] = self.fingerprint(self.objects[key])
        return result

    def write_last(self, items: list[tuple[str, bytes]]) -> None:
        for key, data in items:
            self.objects[key] = data
            self.log.append(f"write {key}")

    def stats(self, keys: list[str]) -> dict[str, tuple[int, str] | None]:
        return {
            k: (len(self.objects[k]), self.fingerprint(self.objects[k]))
            if k in self.objects
            else None
            for k in keys
        }

    @contextmanager
    def download(self, key: str) -> Iterator[Iterator[bytes]]:
        yield iter([self.objects[key]])

    def delete(self, ref: CheckpointRef) -> None:
        prefix = f"{ref.path}/"
        self.objects.pop(prefix + MANIFEST_FILENAME, None)
        for key in [k for k in self.objects if k.startswith(prefix)]:
            del self.objects[key]


# What a layer opened outside a pod ships as.
LOCAL = Origin.of("", None)


def ref(step: int) -> CheckpointRef:
    """A checkpoint shipped outside a pod."""
    return CheckpointRef(step, LOCAL)


def step_key(step: int, name: str) -> str:
    """The key of a file of a checkpoint shipped outside a pod."""
    return checkpoint_key(ref(step), name)


def _layer(contents: str = "full", secret: str = SECRET) -> tuple[RemoteLayer, MemoryStore]:
    store = MemoryStore()
    credentials = Credentials({SECRET_KEY_S3_SECRET_ACCESS_KEY: secret})
    config = LayerConfig("mem", "s3://bucket/prefix", contents=contents)
    return RemoteLayer(config, store, credentials), store


def steps(layer: RemoteLayer) -> list[int]:
    """The steps of the complete checkpoints on the layer."""
    return [r.step for r in layer.checkpoints()]


def _save(root: Path, step: int) -> Path:
    with CheckpointTransaction(root, step) as txn:
        txn.write_file("model.safetensors", b"w" * 3000 + step.to_bytes(2, "little"))
        txn.write_file("optimizer.safetensors", b"o" * 5000)
        return Path(txn.commit().path)


def test_files_first_then_fingerprints_then_the_manifest(tmp_path: Path) -> None:
    layer, store = _layer()
    layer.put(_save(tmp_path, 4))
    assert store.log == [
        f"upload {step_key(4, 'model.safetensors')}",
        f"upload {step_key(4, 'optimizer.safetensors')}",
        f"write {step_key(4, FINGERPRINTS_FILENAME)}",
        f"write {step_key(4, MANIFEST_FILENAME)}",
    ]
    assert steps(layer) == [4]
    assert step_key(4, MANIFEST_FILENAME) == "run-local/attempt-0/step-00000004/MANIFEST.json"
    assert layer.verify(ref(4)) == []
    layer.put(_save(tmp_path, 4))  # already there: nothing is sent again
    assert len(store.log) == 4


def test_a_step_without_manifest_is_not_listed(tmp_path: Path) -> None:
    layer, store = _layer()
    layer.put(_save(tmp_path, 4))
    del store.objects[step_key(4, MANIFEST_FILENAME)]
    assert steps(layer) == []
    assert layer.verify(ref(4)) == [Problem(None, f"missing {MANIFEST_FILENAME}")]


def test_weights_layer_ships_the_model_only(tmp_path: Path) -> None:
    layer, store = _layer(contents="weights")
    layer.put(_save(tmp_path, 4))
    manifest = json.loads(store.objects[step_key(4, MANIFEST_FILENAME)])
    assert manifest["contents"] == "weights"
    assert [f["path"] for f in manifest["files"]] == ["model.safetensors"]
    assert step_key(4, "optimizer.safetensors") not in store.objects


def test_fetch_hashes_every_byte_and_restore_falls_back(tmp_path: Path) -> None:
    layer, store = _layer()
    for step in (1, 2):
        layer.put(_save(tmp_path / "l1", step))
    key = step_key(2, "optimizer.safetensors")
    data = bytearray(store.objects[key])
    data[100] ^= 1  # same length, same ends: the fingerprint cannot see it
    store.objects[key] = bytes(data)
    assert layer.verify(ref(2)) == []
    with pytest.raises(LayerError, match="hash or size differs"):
        layer.fetch(ref(2), tmp_path / "dest")
    assert not list((tmp_path / "dest").glob("step-*"))
    result = restore(tmp_path / "fresh", [layer])
    assert (result.step, result.from_layer) == (1, "mem")
    assert verify(tmp_path / "fresh" / "step-00000001").ok


def test_prune_keeps_newest_verified_and_leaves_invalid_ones(tmp_path: Path) -> None:
    layer, store = _layer()
    for step in (1, 2, 3, 4):
        layer.put(_save(tmp_path / "l1", step))
    store.objects.pop(step_key(4, "model.safetensors"))  # newest is broken: never counted
    store.objects[step_key(0, "model.safetensors")] = b"abandoned partial upload"
    fresh = RemoteLayer(layer.config, store, layer.credentials)  # no memory of its puts
    pruned = fresh.prune(2)
    assert pruned.deleted == [ref(1)]
    assert pruned.invalid == {ref(4): (Problem("model.safetensors", "missing"),)}
    assert steps(fresh) == [2, 3, 4]
    assert ref(0) not in store.list_checkpoints()
    with pytest.raises(ValueError):
        fresh.prune(0)


def test_errors_are_layer_errors_without_credentials(tmp_path: Path) -> None:
    layer, store = _layer()
    try:
        raise OSError(f"signed with {SECRET}")
    except OSError as cause:
        store.fail_with = RuntimeError("upload failed")
        store.fail_with.__cause__ = cause
    with pytest.raises(LayerError) as raised:
        layer.put(_save(tmp_path, 1))
    message = str(raised.value)
    assert SECRET not in message and REDACTED in message
    assert "RuntimeError: upload failed <- OSError" in message
    assert raised.value.__cause__ is None  # the original, unredacted, is not chained


def test_credentials_from_the_mounted_secret(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    (secret / "..data").mkdir(parents=True)
    (secret / SECRET_KEY_HF_TOKEN).write_text("hf_abcdefghijklmnop\n")
    (secret / SECRET_KEY_SSH_PRIVATE_KEY).write_text(
        "-----BEGIN-----\nAAAAline-one\nBBBBline-two\n"
    )
    (secret / SECRET_KEY_S3_ENDPOINT_URL).write_text("http://minio.storage:9000")
    credentials = Credentials.from_env(
        "my-layer", {"TRAINGUARD_LAYER_SECRETS_MY_LAYER": str(secret)}
    )
    assert layer_secrets_env("my-layer") == "TRAINGUARD_LAYER_SECRETS_MY_LAYER"
    assert credentials.get(SECRET_KEY_HF_TOKEN) == "hf_abcdefghijklmnop"
    assert credentials.file(SECRET_KEY_SSH_PRIVATE_KEY) == secret / SECRET_KEY_SSH_PRIVATE_KEY
    assert credentials.get("..data") is None
    assert "hf_abc" not in repr(credentials)
    text = "token hf_abcdefghijklmnop, key line BBBBline-two, at http://minio.storage:9000"
    assert credentials.redact(text) == "token ***, key line ***, at http://minio.storage:9000"
    assert Credentials.from_env("none", {}).get(SECRET_KEY_HF_TOKEN) is None
    with pytest.raises(LayerError, match="not mounted"):
        Credentials.from_env("x", {layer_secrets_env("x"): str(tmp_path / "missing")})


def test_weight_files_are_the_model_files() -> None:
    entries = [
        FileEntry(path=p, size=1, hash="0")
        for p in ("model.safetensors", "model-00001-of-00002.safetensors", "optimizer.safetensors")
    ]
    assert weight_files(entries) == ["model.safetensors", "model-00001-of-00002.safetensors"]


def test_open_layer_picks_the_backend_by_scheme(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.mkdir()
    for key, value in {
        SECRET_KEY_S3_ACCESS_KEY_ID: "AKIAEXAMPLE",
        SECRET_KEY_S3_SECRET_ACCESS_KEY: SECRET,
        SECRET_KEY_SSH_PRIVATE_KEY: "key",
        SECRET_KEY_HF_TOKEN: "hf_token_value",
    }.items():
        (secret / key).write_text(value)

    def opened(name: str, uri: str, contents: str = "full") -> object:
        env = {layer_secrets_env(name): str(secret)}
        return open_layer(LayerConfig(name, uri, contents=contents), env)

    s3 = opened("a", "s3://bucket/runs/x")
    assert isinstance(s3, RemoteLayer) and isinstance(s3.store, S3Store)
    assert (s3.store.bucket, s3.store.prefix) == ("bucket", "runs/x/")
    ssh = opened("b", "ssh://backup@nas.local:2222/srv/ckpt")
    assert isinstance(ssh, RemoteLayer) and isinstance(ssh.store, SshStore)
    assert (ssh.store.host, ssh.store.port, ssh.store.username) == ("nas.local", 2222, "backup")
    hf = opened("c", "hf://acme/llm/ckpts", contents="weights")
    assert isinstance(hf, HfLayer)
    assert (hf.store.repo_id, hf.store.prefix) == ("acme/llm", "ckpts/")
    with pytest.raises(LayerError, match="weights only"):
        opened("d", "hf://acme/llm")
    with pytest.raises(LayerError, match="no backend"):
        opened("e", "gs://bucket")
    with pytest.raises(LayerError, match="ssh-privatekey"):
        open_layer(LayerConfig("f", "ssh://h/p"), {})


MAPPED = "Host backup.example.com\n  HostName 10.0.0.5\n  Port 2222\n  User root\n"


@pytest.mark.parametrize(
    ("uri", "config", "reached"),
    [
        # The config's HostName, Port and User replace the URI's, its :22 too.
        ("ssh://backup@backup.example.com:22/srv/x", MAPPED, ("10.0.0.5", 2222, "root")),
        # Only what it sets (a pattern, `Keyword=value`); the rest stays the URI's.
        ("ssh://backup@backup.example.com/srv/x", "Host *.example.com\n  Port=2200\n",
         ("backup.example.com", 2200, "backup")),
        # Another host's block changes nothing.
        ("ssh://backup@nas.local:2022/srv/x", MAPPED, ("nas.local", 2022, "backup")),
        # The first value wins, across blocks; comments and other keywords are passed over.
        ("ssh://backup.example.com/srv/x",
         "# split DNS\nHost backup.example.com\n  ProxyCommand nc %h %p\n"
         "  HostName 10.0.0.5\nHost *\n  HostName 10.9.9.9\n  User nobody\n",
         ("10.0.0.5", 22, "nobody")),
    ],
)  # fmt: skip
def test_the_secrets_ssh_config_says_where_the_uris_host_is(
    tmp_path: Path, uri: str, config: str, reached: tuple[str, int, str]
) -> None:
    values = {SECRET_KEY_SSH_PRIVATE_KEY: "key", SECRET_KEY_SSH_CONFIG: config}
    target = ssh_target(uri, Credentials(values, tmp_path), "backup")
    assert (target.host, target.port, target.username) == reached
    assert (target.root, target.key_file) == ("/srv/x", tmp_path / SECRET_KEY_SSH_PRIVATE_KEY)


@pytest.mark.parametrize(
    ("config", "why"),
    [
        # paramiko would run a `Match exec` command, in the agent.
        ('Match exec "touch {ran}"\n  HostName 10.0.0.5\n', "Match blocks are not supported"),
        ("Host backup.example.com\n  Port ssh\n", "Port 'ssh' is not a number"),
    ],
)
def test_an_ssh_config_that_cannot_be_honoured_is_refused(
    tmp_path: Path, config: str, why: str
) -> None:
    ran = tmp_path / "ran"
    values = {SECRET_KEY_SSH_PRIVATE_KEY: "key", SECRET_KEY_SSH_CONFIG: config.format(ran=ran)}
    with pytest.raises(LayerError, match=f"backup: the Secret's config: {why}"):
        ssh_target("ssh://backup.example.com/srv/x", Credentials(values, tmp_path), "backup")
    assert not ran.exists()


def test_split_safetensors_into_loadable_shards(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    tensors = {
        "a": rng.standard_normal((64, 32)).astype(np.float32),
        "b": np.arange(1000, dtype=np.int64),
        "c": rng.standard_normal(3000).astype(np.float16),
        "d": np.ones((10, 10), dtype=np.float64),
    }
    source = tmp_path / "model.safetensors"
    save_file(tensors, str(source), metadata={"format": "pt"})
    files = split(source, tmp_path / "shards", max_bytes=9000)
    names = [f.name for f in files]
    assert names[-1] == "model.safetensors.index.json"
    assert all(n.startswith("model-0000") for n in names[:-1]) and len(names) > 2
    loaded: dict[str, np.ndarray] = {}
    for shard in files[:-1]:
        assert shard.stat().st_size <= 9000 + 1024  # data under the limit, plus a small header
        loaded.update(load_file(str(shard)))
    assert all(np.array_equal(loaded[k], v) for k, v in tensors.items())
    index = json.loads(files[-1].read_text())
    assert set(index["weight_map"]) == set(tensors)
    assert index["metadata"]["total_size"] == sum(t.nbytes for t in tensors.values())
    with pytest.raises(ShardError, match="alone is over"):
        split(source, tmp_path / "tiny", max_bytes=100)
