"""examples/full.yaml applied as is but for site values: its data source and every layer work.

The example documents a real run: a 3B model on an H200, its shards staged from S3 with a
Secret of their own, checkpoints shipped to the Hugging Face Hub (weights), to S3 with the
pod's identity, to a backup host over SSH and to a backup volume. `ships_everywhere` gives it
what a user's cluster gives it, and checks that it works; `tests/e2e/test_example_full.py`
(process-backed nodes) and `tests/realnodes/test_signals_real.py` (real nodes, the chart's
operator in-cluster) run it, each with its own servers and nodes (`ExampleSite`):

- the Secrets it names, holding the test servers' endpoints and keys (SeaweedFS for the data;
  the Hub stand-in's token; the sshd's client key, its host key, and an OpenSSH client config
  saying where the example's backup host is reached);
- its buckets on SeaweedFS (the shards under the data source's prefix), its repository on the
  Hub stand-in (`tests/integration/hub_standin.py`), the sshd serving the example's directory
  (`/srv` is a directory of the test's, in the sshd's own mount namespace), and its claim, a
  volume every node reaches, as network storage is (the site creates it);
- the pod's identity, as instance credentials are: the nodes' environment (``env.json``, a
  process-backed node's or a real node's, removed afterwards) holds the S3 keys and endpoint
  the `s3` layer uses without a Secret, and the Hub's endpoint;
- GPU nodes as the example expects them: labelled with the product it selects, tainted with
  `nvidia.com/gpu` (which it tolerates) by the site. (Its `localStorageClassName` names the
  class of a local-volume L1; its L1 is an emptyDir, so no StorageClass is read.)

A user's image, a 71 GB dataset and example.com hosts cannot exist here: `site_values` lists
the values that change (the trainer, the sizes preflight checks against this machine's disk,
the throughput floor of an H200, the nodes whose pods run, and what else a site names), and
the stored run must differ from the file in those keys alone, so the example cannot drift from
what is tested.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import yaml

from integration.hub_standin import HubServer
from trainguard.api.constants import (
    LABEL_RUN,
    SECRET_KEY_HF_TOKEN,
    SECRET_KEY_SSH_CONFIG,
    SECRET_KEY_SSH_KNOWN_HOSTS,
    SECRET_KEY_SSH_PRIVATE_KEY,
)
from trainguard.ckpt import MANIFEST_FILENAME
from trainguard.layers.lineage import Origin, parse_key
from trainguard_dev.cluster.cluster import Cluster
from trainguard_dev.testing.polling import eventually
from trainguard_dev.testing.runs import (
    EXAMPLES,
    REFERENCE_MIN_STEP_SECONDS,
    REFERENCE_STEPS,
    SHARDS_SIZE,
    make_shards,
    reference_command,
)
from trainguard_dev.testing.servers import S3_ACCESS_KEY, S3_SECRET_KEY, SeaweedFS, Sshd
from trainguard_dev.testing.signals import assert_staged

Obj = dict[str, Any]
SitePath = tuple[str, ...]

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


def site_values(image: str, more: Mapping[SitePath, Any]) -> dict[SitePath, Any]:
    """A site's values, by key path in the spec: all that differs from the file.

    The trainer (the reference trainer in `image` instead of the user's image and its
    configuration) and the sizes (preflight checks that this machine's disk holds the data and
    the checkpoints) change on every site; `more` names the rest (its nodes, at least).
    """
    return {
        ("trainer", "image"): image,
        ("trainer", "command"): reference_command(REFERENCE_STEPS, REFERENCE_MIN_STEP_SECONDS),
        ("trainer", "args"): REMOVED,
        ("trainer", "workingDir"): REMOVED,
        ("monitor", "minTokensPerSecond"): REFERENCE_MIN_TOKENS_PER_SECOND,
        ("data", "size"): SHARDS_SIZE,
        ("checkpoints", "size"): REFERENCE_CHECKPOINT_SIZE,
        **more,
    }


def example() -> Obj:
    """The checked-in example, as a user copies it."""
    checked_in: Obj = yaml.safe_load(EXAMPLE.read_text())
    return checked_in


def remote_layers() -> list[Obj]:
    """The example's remote layers."""
    layers: list[Obj] = example()["spec"]["checkpoints"]["remote"]
    return layers


def backup_claim() -> str:
    """The claim of the example's `file://` layer, which the site creates."""
    (claim,) = (layer["claimName"] for layer in remote_layers() if "claimName" in layer)
    return str(claim)


def leaves(obj: Any, path: SitePath = ()) -> dict[SitePath, Any]:
    """Every value by its key path; a list of objects by index (`[i]`), other lists whole.

    The apiserver fills in defaults the file leaves out, in list items too: compared over the
    file's paths, only what the file says counts.
    """
    if isinstance(obj, list) and obj and all(isinstance(item, dict) for item in obj):
        obj = {f"[{index}]": item for index, item in enumerate(obj)}
    if not isinstance(obj, dict):
        return {path: obj}
    found: dict[SitePath, Any] = {}
    for key, value in obj.items():
        found.update(leaves(value, (*path, key)))
    return found


def with_site_values(checked_in: Obj, site: Mapping[SitePath, Any]) -> Obj:
    """The example's run with `site` applied."""
    run = copy.deepcopy(checked_in)
    for path, value in site.items():
        parent = run["spec"]
        for key in path[:-1]:
            parent = parent.setdefault(key, {})
        if value == REMOVED:
            del parent[path[-1]]
        else:
            parent[path[-1]] = value
    return run


def secret(name: str, data: Mapping[str, str]) -> Obj:
    """A Secret holding `data`."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name},
        "stringData": dict(data),
    }


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
    """The shards, uploaded under an existing ``s3://bucket/prefix``; the files."""
    where = urlparse(uri)
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
    config = f"Host {host}\n  HostName {sshd.host}\n  Port {sshd.port}\n  User {sshd.user}\n"
    return {
        SECRET_KEY_SSH_PRIVATE_KEY: sshd.client_key.read_text(),
        SECRET_KEY_SSH_KNOWN_HOSTS: sshd.known_hosts.read_text(),
        SECRET_KEY_SSH_CONFIG: config,
    }


@contextlib.contextmanager
def node_environment(files: Iterable[Path], environment: Mapping[str, str]) -> Iterator[None]:
    """`environment` in the nodes' env files while the block runs; the files gone after."""
    written = list(files)
    try:
        for path in written:
            path.write_text(json.dumps(dict(environment)))
        yield
    finally:
        for path in written:
            path.unlink(missing_ok=True)


@dataclass(frozen=True)
class ExampleSite:
    """What a site gives the example: its values, nodes, servers and the backup volume.

    `nodes` are the nodes its pod may run on; `env_files` their environment files (every
    process or container of their pods gets what they hold); `backup_dir` is the directory of
    the backup claim, which the site has created and bound.
    """

    cluster: Cluster
    namespace: str
    values: Mapping[SitePath, Any]
    nodes: list[str]
    env_files: list[Path]
    seaweedfs: SeaweedFS
    hub: HubServer
    sshd: Sshd
    srv: Path
    backup_dir: Path


def _apply(site: ExampleSite, *objects: Obj) -> None:
    docs = {"apiVersion": "v1", "kind": "List", "items": list(objects)}
    site.cluster.kubectl("apply", "-n", site.namespace, "-f", "-", input=json.dumps(docs))


def _get(site: ExampleSite, name: str) -> Obj:
    run: Obj = json.loads(
        site.cluster.kubectl("get", "tr", name, "-n", site.namespace, "-o", "json").stdout
    )
    return run


def _diagnosis(site: ExampleSite, name: str) -> str:
    """The run's status and how its pods' containers ended, for a failed wait."""
    pods = json.loads(
        site.cluster.kubectl(
            "get", "pods", "-n", site.namespace, "-l", f"{LABEL_RUN}={name}", "-o", "json",
            check=False,
        ).stdout or "{}"
    )  # fmt: skip
    ended = [
        (pod["metadata"]["name"], c["name"], c.get("lastState") or c.get("state"))
        for pod in pods.get("items", [])
        for c in [
            *pod["status"].get("initContainerStatuses", []),
            *pod["status"].get("containerStatuses", []),
        ]
    ]
    status = json.dumps(_get(site, name).get("status"))[:3000]
    return f"{status}\ncontainers: {json.dumps(ended)[:4000]}"


def ships_everywhere(site: ExampleSite, workdir: Path) -> None:
    """Apply the example on the site; it stages its data and ships to every remote layer."""
    checked_in = example()
    spec = checked_in["spec"]
    layers = {layer["name"]: layer for layer in remote_layers()}
    uris = {name: urlparse(layer["uri"]) for name, layer in layers.items()}
    assert {name: uri.scheme for name, uri in uris.items()} == {
        "hub": "hf", "s3": "s3", "ssh": "ssh", "nfs": "file"
    }  # fmt: skip
    s3 = site.seaweedfs.client()

    # The data's bucket with the shards; the keys and endpoint in the source's own Secret.
    source = spec["data"]["source"]
    shards = make_shards(workdir / "shards", shards=SHARDS, tokens=20_000, seed=7)
    s3.create_bucket(Bucket=urlparse(source["uri"]).netloc)
    objects = upload_shards(s3, source["uri"], shards)
    # hub: the repository; s3: the bucket (no Secret: the pod's identity); ssh: where the
    # backup host is, in its Secret; nfs: the site's claim.
    repo = f"{uris['hub'].netloc}{uris['hub'].path}"
    site.hub.state.repos[repo] = {}
    assert "credentialsSecret" not in layers["s3"]
    s3.create_bucket(Bucket=uris["s3"].netloc)
    assert uris["ssh"].hostname is not None and uris["ssh"].path.startswith("/srv/")
    assert layers["nfs"]["claimName"] == backup_claim()
    secrets = [
        secret(source["credentialsSecret"]["name"], site.seaweedfs.secret_data()),
        secret(layers["hub"]["credentialsSecret"]["name"], {SECRET_KEY_HF_TOKEN: HF_TOKEN}),
        secret(
            layers["ssh"]["credentialsSecret"]["name"], ssh_keys(site.sshd, uris["ssh"].hostname)
        ),
    ]
    # The pod's identity, as instance credentials give it to every process on the node.
    identity = {
        "AWS_ACCESS_KEY_ID": S3_ACCESS_KEY,
        "AWS_SECRET_ACCESS_KEY": S3_SECRET_KEY,
        "AWS_ENDPOINT_URL": site.seaweedfs.endpoint,
        "HF_ENDPOINT": site.hub.url,
        "HF_HUB_DISABLE_XET": "1",  # the stand-in speaks the LFS protocol only
    }
    name = checked_in["metadata"]["name"]

    def shipped_everywhere() -> Obj | None:
        current = _get(site, name)
        shipped = {
            entry["layer"]
            for entry in current.get("status", {}).get("checkpoints", [])
            if entry.get("verified") and (entry.get("shipping") or {}).get("shipped", 0) >= 1
        }
        return current if shipped >= layers.keys() else None

    with node_environment(site.env_files, identity):
        _apply(site, *secrets, with_site_values(checked_in, site.values))
        current = eventually(
            shipped_everywhere,
            SHIPPED_TIMEOUT_S,
            "a checkpoint verified on every remote layer",
            detail=lambda: _diagnosis(site, name),
        )

    # The run is the file's but for the site's values.
    stored, original = leaves(current["spec"]), leaves(spec)
    changed = {
        path
        for path in original.keys() | site.values.keys()
        if stored.get(path, REMOVED) != original.get(path, REMOVED)
    }
    assert changed == site.values.keys(), changed ^ site.values.keys()
    assert {path: stored.get(path, REMOVED) for path in site.values} == site.values

    status = current["status"]
    assert status["node"] in site.nodes, status["node"]
    assert status["preflight"]["passed"], status["preflight"]
    assert status.get("verdict") == "Healthy", status.get("verdict")
    # Staged from S3: every object, verified.
    assert_staged(current, objects)

    # Each layer's status, and its checkpoints where they really are.
    origin = Origin.of(current["metadata"]["uid"], status["attempt"])
    with site.hub.state.lock:
        hub_keys = list(site.hub.state.repos[repo])
    on_server = {
        "hub": checkpoints_in(hub_keys, origin),
        "s3": checkpoints_in(s3_objects(s3, layers["s3"]["uri"]), origin),
        "ssh": checkpoints_in(
            files_under(site.srv / uris["ssh"].path.removeprefix("/srv/")), origin
        ),
        "nfs": checkpoints_in(files_under(site.backup_dir), origin),
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
