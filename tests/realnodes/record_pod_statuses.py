"""Record what a real kubelet says about pods that lack an input: the unit tests' fixture.

Writes `tests/unit/recorded/kubelet-pod-statuses.json`: for each case, the pod's status and
its Events (type, reason, message, count) as a real kubelet left them after a while. Cases:
a Secret volume whose Secret does not exist, a claim that does not exist, an init step
`stage-data` that exits 3, and an image that cannot be pulled, as a container and as a native
sidecar (`agent`). `tests/unit/test_bad_input.py` replays them through reconcile cycles.

Run it against a cluster with real nodes (and no other real-node cluster on the host):

    trainguard dev cluster up --name rn --nodes 0 --real-nodes 2
    python tests/realnodes/record_pod_statuses.py [--cluster rn] [--wait 40]

It creates its pods in namespace `default` and deletes them at the end.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from trainguard_dev.cluster import realnode
from trainguard_dev.cluster.cluster import Cluster

OUT = Path(__file__).resolve().parents[1] / "unit" / "recorded" / "kubelet-pod-statuses.json"
NAMESPACE = "default"
MISSING = "nosuch"
# Every registry of a real node is a closed port: an image never imported cannot be pulled.
NOT_BUILT = "trainguard.local/not-built:1"
EVENT_FIELDS = ("type", "reason", "message", "count")


def _pod(name: str, image: str, **spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "nodeSelector": {realnode.NODE_KIND_LABEL: realnode.NODE_KIND_REAL},
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 1,
        "containers": [_container("main", image, ["sleep", "600"])],
    }
    base.update(spec)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": base,
    }


def _container(name: str, image: str, command: list[str], **more: Any) -> dict[str, Any]:
    return {"name": name, "image": image, "imagePullPolicy": "Never", "command": command, **more}


def cases(image: str) -> list[dict[str, Any]]:
    """The pods, each lacking one input; `image` is one every real node holds."""
    sleep = ["sleep", "600"]
    return [
        _pod(
            "missing-secret",
            image,
            volumes=[{"name": "creds", "secret": {"secretName": MISSING}}],
            containers=[
                _container(
                    "main", image, sleep, volumeMounts=[{"name": "creds", "mountPath": "/creds"}]
                )
            ],
        ),
        _pod(
            "missing-claim",
            image,
            volumes=[{"name": "data", "persistentVolumeClaim": {"claimName": MISSING}}],
            containers=[
                _container(
                    "main", image, sleep, volumeMounts=[{"name": "data", "mountPath": "/data"}]
                )
            ],
        ),
        _pod(
            "init-fails",
            image,
            initContainers=[
                _container(
                    "stage-data", image, ["sh", "-c", "echo cannot reach source >&2; exit 3"]
                )
            ],
        ),
        _pod(
            "missing-image",
            image,
            containers=[{"name": "main", "image": NOT_BUILT, "command": sleep}],
        ),
        _pod(
            "missing-image-init",
            image,
            initContainers=[
                {"name": "agent", "image": NOT_BUILT, "restartPolicy": "Always", "command": sleep}
            ],
        ),
    ]


def record(cluster: Cluster, wait: float) -> dict[str, Any]:
    """Create the pods, let the kubelets work `wait` seconds, read statuses and Events."""
    tar, image = realnode.busybox_image()
    realnode.import_image_everywhere(cluster, tar, image)
    pods = cases(image)
    items = {"apiVersion": "v1", "kind": "List", "items": pods}
    cluster.kubectl("apply", "-f", "-", input=json.dumps(items))
    try:
        time.sleep(wait)
        out = {}
        for pod in pods:
            name = pod["metadata"]["name"]
            got = json.loads(
                cluster.kubectl("get", "pod", name, "-n", NAMESPACE, "-o", "json").stdout
            )
            events = json.loads(
                cluster.kubectl(
                    "get", "events", "-n", NAMESPACE,
                    "--field-selector", f"involvedObject.name={name}", "-o", "json",
                ).stdout
            )["items"]  # fmt: skip
            out[name] = {
                "status": got["status"],
                "events": [{k: e.get(k) for k in EVENT_FIELDS} for e in events],
            }
        return out
    finally:
        names = [p["metadata"]["name"] for p in pods]
        cluster.kubectl("delete", "pods", "-n", NAMESPACE, *names, "--wait=false", check=False)


def main() -> None:
    """Record and write the fixture; print a line per case."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cluster", default="rn", help="name of the dev cluster (default rn)")
    parser.add_argument("--wait", type=float, default=40.0, help="seconds to let kubelets work")
    args = parser.parse_args()
    out = record(Cluster(args.cluster), args.wait)
    OUT.write_text(json.dumps(out, indent=1) + "\n")
    for name, seen in out.items():
        status = seen["status"]
        containers = [
            *status.get("initContainerStatuses", []),
            *status.get("containerStatuses", []),
        ]
        states = [(c.get("name"), c.get("state")) for c in containers][:3]
        print(name, status.get("phase"), states, [e["reason"] for e in seen["events"]])


if __name__ == "__main__":
    main()
