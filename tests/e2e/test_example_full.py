"""examples/full.yaml, applied as is but for site values: its data source and every layer work.

The example documents a real run: a 3B model on an H200, its shards staged from S3 with a
Secret of their own, checkpoints shipped to the Hugging Face Hub (weights), to S3 with the
pod's identity, to a backup host over SSH and to a backup volume. The test gives it what a
user's cluster gives it:

- the Secrets it names, holding the test servers' endpoints and keys (SeaweedFS for the data;
  the Hub stand-in's token; the sshd's client key, its host key, and an OpenSSH client config
  saying where the example's backup host is reached);
- its buckets on SeaweedFS (the shards under the data source's prefix), its repository on the
  Hub stand-in (`tests/integration/hub_standin.py`), the sshd serving the example's directory
  (`/srv` is a directory of the test's, in the sshd's own mount namespace), and its claim, a
  volume every process-backed node shares, as network storage is;
- the pod's identity, as instance credentials are: the nodes' environment (`env.json`) holds
  the S3 keys and endpoint the `s3` layer uses without a Secret, and the Hub's endpoint;
- GPU nodes as the example expects them: labelled with the product it selects, tainted with
  `nvidia.com/gpu`, which it tolerates. (Its `localStorageClassName` names the class of a
  local-volume L1; its L1 is an emptyDir, so no StorageClass is read.)

A user's image, a 71 GB dataset and example.com hosts cannot exist here: `SITE` lists the
values that change (the trainer, the sizes preflight checks against this machine's disk, the
throughput floor of an H200, the nodes whose pods run), and the test asserts that the stored
run differs from the file in those keys alone, so the example cannot drift from what is tested.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
import yaml
from operator_proc import apply, condition, get_json

from integration.hub_standin import HubServer, serving
from trainguard.api.constants import (
    SECRET_KEY_HF_TOKEN,
    SECRET_KEY_S3_ACCESS_KEY_ID,
    SECRET_KEY_S3_ENDPOINT_URL,
    SECRET_KEY_S3_SECRET_ACCESS_KEY,
    SECRET_KEY_SSH_CONFIG,
    SECRET_KEY_SSH_KNOWN_HOSTS,
    SECRET_KEY_SSH_PRIVATE_KEY,
)
from trainguard.ckpt import MANIFEST_FILENAME
from trainguard.initsteps import stage_data as staging
from trainguard.layers.lineage import Origin, parse_key
from trainguard_dev.cluster.cluster import Cluster
from trainguard_dev.cluster.nodes import PROCESS_NODE_LABEL
from trainguard_dev.cluster.procnode import ENV_FILENAME, claim_dir, shared_claim
from trainguard_dev.demo.env import create_claim
from trainguard_dev.testing.polling import eventually
from trainguard_dev.testing.processes import OperatorProcess
from trainguard_dev.testing.runs import (
    EXAMPLES,
    REFERENCE_IMAGE,
    REFERENCE_MIN_STEP_SECONDS,
    REFERENCE_STEPS,
    SHARDS_SIZE,
    make_shards,
    reference_command,
)
from trainguard_dev.testing.servers import (
    INSTALL_HINT,
    S3_ACCESS_KEY,
    S3_SECRET_KEY,
    SSHD,
    SeaweedFS,
    Sshd,
    start_sshd,
)

pytest_plugins = ("operator_fixtures", "integration.s3_fixtures")
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

EXAMPLE = EXAMPLES / "full.yaml"
HF_TOKEN = "hf_trainguardExampleToken0123456789"
# What GPU node pools carry (GKE, AKS), and the example tolerates.
GPU_TAINT = "nvidia.com/gpu=present:NoSchedule"
SHARDS = 8
# The reference trainer's full checkpoint is about 2 MB; sized as `reference_run` sizes it.
REFERENCE_CHECKPOINT_SIZE = "16Mi"
# Its tokens/s on one CPU thread (512 a step, a step at least every 0.1 s), with room for a
# busy machine; the example's 15000 is the 3B model's on an H200.
REFERENCE_MIN_TOKENS_PER_SECOND = 100
SHIPPED_TIMEOUT_S = 200
OPTIMIZER_FILE = "optimizer.safetensors"

REMOVED = "<removed>"
# The site's values, by key path in the spec: all that differs from the file.
SITE: dict[tuple[str, ...], Any] = {
    # The trainer: the reference trainer instead of the user's image and its configuration.
    ("trainer", "image"): REFERENCE_IMAGE,
    ("trainer", "command"): reference_command(REFERENCE_STEPS, REFERENCE_MIN_STEP_SECONDS),
    ("trainer", "args"): REMOVED,
    ("trainer", "workingDir"): REMOVED,
    ("monitor", "minTokensPerSecond"): REFERENCE_MIN_TOKENS_PER_SECOND,
    # Sizes: preflight checks that this machine's disk holds the data and the checkpoints.
    ("data", "size"): SHARDS_SIZE,
    ("checkpoints", "size"): REFERENCE_CHECKPOINT_SIZE,
    # The kwok nodes carry the same GPU labels, but run nothing.
    ("placement", "nodeSelector", PROCESS_NODE_LABEL): "true",
}


def example() -> dict[str, Any]:
    """The checked-in example, as a user copies it."""
    checked_in: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
    return checked_in


def remote_layers() -> list[dict[str, Any]]:
    """The example's remote layers."""
    layers: list[dict[str, Any]] = example()["spec"]["checkpoints"]["remote"]
    return layers


def leaves(obj: Any, path: tuple[str, ...] = ()) -> dict[tuple[str, ...], Any]:
    """Every value by its key path; a list of objects by index (`[i]`), other lists whole.

    The apiserver fills in defaults the file leaves out, in list items too: compared over the
    file's paths, only what the file says counts.
    """
    if isinstance(obj, list) and obj and all(isinstance(item, dict) for item in obj):
        obj = {f"[{index}]": item for index, item in enumerate(obj)}
    if not isinstance(obj, dict):
        return {path: obj}
    found: dict[tuple[str, ...], Any] = {}
    for key, value in obj.items():
        found.update(leaves(value, (*path, key)))
    return found


def with_site_values(checked_in: dict[str, Any]) -> dict[str, Any]:
    """The example's run with `SITE` applied."""
    run = copy.deepcopy(checked_in)
    for path, value in SITE.items():
        parent = run["spec"]
        for key in path[:-1]:
            parent = parent.setdefault(key, {})
        if value == REMOVED:
            del parent[path[-1]]
        else:
            parent[path[-1]] = value
    return run


def secret(name: str, data: dict[str, str]) -> dict[str, Any]:
    """A Secret holding `data`."""
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "stringData": data}


def checkpoints_in(keys: Iterable[str], origin: Origin) -> dict[int, set[str]]:
    """The files of each complete checkpoint of `origin` among a layer's keys (root-relative)."""
    found: dict[int, set[str]] = {}
    for key in keys:
        parsed = parse_key(key)
        if parsed is not None and parsed[0].origin == origin:
            found.setdefault(parsed[0].step, set()).add(parsed[1])
    return {step: names for step, names in found.items() if MANIFEST_FILENAME in names}


def files_under(root: Path) -> list[str]:
    """Every file below `root`, relative to it (os.walk passes over what vanishes meanwhile)."""
    return [
        (Path(directory) / name).relative_to(root).as_posix()
        for directory, _, names in os.walk(root)
        for name in names
    ]


def upload_shards(s3: Any, uri: str, shards: Path) -> list[Path]:
    """The shards, uploaded under an ``s3://bucket/prefix`` (the bucket created); the files."""
    where = urlparse(uri)
    s3.create_bucket(Bucket=where.netloc)
    files = sorted(p for p in shards.rglob("*") if p.is_file())
    for path in files:
        key = f"{where.path.strip('/')}/{path.relative_to(shards).as_posix()}"
        s3.put_object(Bucket=where.netloc, Key=key, Body=path.read_bytes())
    return files


def s3_objects(s3: Any, uri: str) -> list[str]:
    """The keys under an ``s3://bucket/prefix``, relative to the prefix."""
    where = urlparse(uri)
    prefix = where.path.strip("/") + "/"
    listed = s3.list_objects_v2(Bucket=where.netloc, Prefix=prefix).get("Contents", [])
    return [item["Key"].removeprefix(prefix) for item in listed]


def ssh_keys(sshd: Sshd, host: str) -> dict[str, str]:
    """A Secret of the sshd's client key and host key, and a config that leads `host` to it."""
    config = f"Host {host}\n  HostName 127.0.0.1\n  Port {sshd.port}\n  User {sshd.user}\n"
    return {
        SECRET_KEY_SSH_PRIVATE_KEY: sshd.client_key.read_text(),
        SECRET_KEY_SSH_KNOWN_HOSTS: sshd.known_hosts.read_text(),
        SECRET_KEY_SSH_CONFIG: config,
    }


@pytest.fixture
def hub() -> Iterator[HubServer]:
    """The Hub stand-in, serving from a thread of this process."""
    with serving(HF_TOKEN) as server:
        yield server


@pytest.fixture
def backup_host(tmp_path: Path) -> Iterator[tuple[Sshd, Path]]:
    """The sshd, with `/srv` a directory of the test's: the server and that directory."""
    if not SSHD.exists():
        pytest.fail(f"no sshd at {SSHD}: {INSTALL_HINT}")
    srv = tmp_path / "srv"
    srv.mkdir()
    (tmp_path / "sshd").mkdir()
    server = start_sshd(tmp_path / "sshd", mounts={"/srv": srv})
    try:
        yield server, srv
    finally:
        server.stop()


@pytest.fixture
def backup_claim(cluster: Cluster, namespace: str) -> Iterator[str]:
    """The claim of the example's `file://` layer, on a volume every node reaches; its PV goes."""
    (claim,) = (layer["claimName"] for layer in remote_layers() if "claimName" in layer)
    create_claim(cluster, namespace, claim)
    try:
        yield claim
    finally:
        volume = shared_claim(cluster.root, namespace, claim)[0]["metadata"]["name"]
        cluster.kubectl("delete", "pv", volume, "--wait=false", check=False)


@pytest.fixture
def gpu_nodes(cluster: Cluster, process_nodes: list[str]) -> Iterator[list[str]]:
    """The process-backed nodes, tainted as GPU node pools are; untainted afterwards."""
    for node in process_nodes:
        cluster.kubectl("taint", "node", node, GPU_TAINT, "--overwrite")
    try:
        yield process_nodes
    finally:
        for node in process_nodes:
            cluster.kubectl("taint", "node", node, f"{GPU_TAINT}-", check=False)


@pytest.mark.parametrize("operator", ["chart-rbac"], indirect=True)
def test_the_full_example_stages_its_data_and_ships_to_every_layer(
    cluster: Cluster,
    namespace: str,
    gpu_nodes: list[str],
    operator: OperatorProcess,
    seaweedfs: SeaweedFS,
    hub: HubServer,
    backup_host: tuple[Sshd, Path],
    backup_claim: str,
    tmp_path: Path,
) -> None:
    checked_in = example()
    spec = checked_in["spec"]
    layers = {layer["name"]: layer for layer in remote_layers()}
    uris = {name: urlparse(layer["uri"]) for name, layer in layers.items()}
    assert {name: uri.scheme for name, uri in uris.items()} == {
        "hub": "hf", "s3": "s3", "ssh": "ssh", "nfs": "file"
    }  # fmt: skip
    s3 = seaweedfs.client()
    sshd, srv = backup_host

    # The data's bucket with the shards; the keys and endpoint in the source's own Secret.
    source = spec["data"]["source"]
    shards = make_shards(tmp_path / "shards", shards=SHARDS, tokens=20_000, seed=7)
    objects = upload_shards(s3, source["uri"], shards)
    s3_secret = {
        SECRET_KEY_S3_ACCESS_KEY_ID: S3_ACCESS_KEY,
        SECRET_KEY_S3_SECRET_ACCESS_KEY: S3_SECRET_KEY,
        SECRET_KEY_S3_ENDPOINT_URL: seaweedfs.endpoint,
    }
    # hub: the repository; s3: the bucket (no Secret: the pod's identity); ssh: where the
    # backup host is, in its Secret; nfs: `backup_claim`.
    repo = f"{uris['hub'].netloc}{uris['hub'].path}"
    hub.state.repos[repo] = {}
    assert "credentialsSecret" not in layers["s3"]
    s3.create_bucket(Bucket=uris["s3"].netloc)
    assert uris["ssh"].hostname is not None and uris["ssh"].path.startswith("/srv/")
    assert layers["nfs"]["claimName"] == backup_claim
    secrets = [
        secret(source["credentialsSecret"]["name"], s3_secret),
        secret(layers["hub"]["credentialsSecret"]["name"], {SECRET_KEY_HF_TOKEN: HF_TOKEN}),
        secret(layers["ssh"]["credentialsSecret"]["name"], ssh_keys(sshd, uris["ssh"].hostname)),
    ]
    # The pod's identity, as instance credentials give it to every process on the node.
    identity = {
        "AWS_ACCESS_KEY_ID": S3_ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": S3_SECRET_KEY,
        "AWS_ENDPOINT_URL": seaweedfs.endpoint,
        "HF_ENDPOINT": hub.url,
        "HF_HUB_DISABLE_XET": "1",  # the stand-in speaks the LFS protocol only
    }
    for node in gpu_nodes:
        (cluster.root / "procnodes" / node / ENV_FILENAME).write_text(json.dumps(identity))

    name = checked_in["metadata"]["name"]
    apply(cluster, namespace, *secrets, with_site_values(checked_in))

    def shipped_everywhere() -> dict[str, Any] | None:
        current = get_json(cluster, "tr", name, "-n", namespace)
        shipped = {
            entry["layer"]
            for entry in current.get("status", {}).get("checkpoints", [])
            if entry.get("verified") and (entry.get("shipping") or {}).get("shipped", 0) >= 1
        }
        return current if shipped >= layers.keys() else None

    current = eventually(
        shipped_everywhere, SHIPPED_TIMEOUT_S, "a checkpoint verified on every remote layer"
    )

    # The run is the file's but for the site's values.
    stored, original = leaves(current["spec"]), leaves(spec)
    changed = {
        path
        for path in original.keys() | SITE.keys()
        if stored.get(path, REMOVED) != original.get(path, REMOVED)
    }
    assert changed == SITE.keys(), changed ^ SITE.keys()
    assert {path: stored.get(path, REMOVED) for path in SITE} == SITE

    status = current["status"]
    assert status["node"] in gpu_nodes, status["node"]
    assert status["preflight"]["passed"], status["preflight"]
    assert status.get("verdict") == "Healthy", status.get("verdict")
    # Staged from S3: every object, verified.
    done = status["staging"]
    assert done["phase"] == staging.COMPLETE, done
    assert done["filesDone"] == done["filesTotal"] == len(objects), done
    assert done["bytesDone"] == sum(p.stat().st_size for p in objects), done
    staged = condition(current, "DataStaged")
    assert staged is not None and staged["status"] == "True", staged

    # Each layer's status, and its checkpoints where they really are.
    origin = Origin.of(current["metadata"]["uid"], status["attempt"])
    with hub.state.lock:
        hub_keys = list(hub.state.repos[repo])
    on_server = {
        "hub": checkpoints_in(hub_keys, origin),
        "s3": checkpoints_in(s3_objects(s3, layers["s3"]["uri"]), origin),
        "ssh": checkpoints_in(files_under(srv / uris["ssh"].path.removeprefix("/srv/")), origin),
        "nfs": checkpoints_in(
            files_under(claim_dir(cluster.root, namespace, backup_claim)), origin
        ),
    }
    entries = {entry["layer"]: entry for entry in status["checkpoints"]}
    for layer, declared in layers.items():
        found, reported = on_server[layer], entries[layer]["step"]
        # keep-N may have replaced the reported checkpoint with a newer one since.
        assert found and max(found) >= reported, (layer, reported, sorted(found))
        newest = found[max(found)]
        weights_only = declared["contents"] == "weights"
        assert (OPTIMIZER_FILE not in newest) == weights_only, (layer, sorted(newest))
        assert any(n.startswith("model") for n in newest), (layer, sorted(newest))
