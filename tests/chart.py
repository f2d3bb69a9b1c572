"""The trainguard Helm chart for the tests: helm, rendering, installed releases, their identity.

helm is the pinned binary that hack/build-control-plane.sh builds with the control plane.
"""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from trainguard_dev.cluster.cluster import Cluster, default_home, ensure_binaries
from trainguard_dev.demo import env as demo_env

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "charts" / "trainguard"
HELM_TIMEOUT_SECONDS = 120
# Keeps the chart's own operator pod unscheduled: tests judge the identity the chart creates
# and run the operator themselves, so nothing else must run it.
NOWHERE = {"nodeSelector": {"trainguard.dev/test": "no-such-node"}}
TOKEN_DURATION = "30m"

Obj = dict[str, Any]


def helm_binary() -> Path:
    """The pinned helm (built with the control plane when missing)."""
    return ensure_binaries(default_home()) / "helm"


def helm(
    *args: str,
    values: Obj | None = None,
    kubeconfig: Path | None = None,
    check: bool = True,
) -> subprocess.CompletedProcess[str]:
    """Run helm; `values` go in on stdin as one more values file, after any given in args."""
    argv = [str(helm_binary()), *args]
    if values is not None:
        argv += ["--values", "-"]
    if kubeconfig is not None:
        argv += ["--kubeconfig", str(kubeconfig)]
    result = subprocess.run(
        argv,
        input=yaml.safe_dump(values) if values is not None else None,
        capture_output=True,
        text=True,
        timeout=HELM_TIMEOUT_SECONDS,
        check=False,
    )
    if check and result.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed:\n{result.stderr}")
    return result


def render_text(release: str, namespace: str, values: Obj | None = None) -> str:
    """`helm template` output: the chart's templates (not crds/) as one YAML stream."""
    return helm("template", release, str(CHART), "--namespace", namespace, values=values).stdout


def render(release: str, namespace: str, values: Obj | None = None) -> list[Obj]:
    """The objects the chart renders with these values."""
    return [d for d in yaml.safe_load_all(render_text(release, namespace, values)) if d]


def find(objects: Iterable[Obj], kind: str, name: str | None = None) -> list[Obj]:
    """The rendered objects of a kind (and name)."""
    return [
        o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)
    ]


def only(objects: Iterable[Obj], kind: str, name: str | None = None) -> Obj:
    """The one rendered object of a kind (and name)."""
    found = find(objects, kind, name)
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


@dataclass(frozen=True)
class Release:
    """An installed release of the chart."""

    name: str
    namespace: str

    @property
    def account(self) -> str:
        """The operator's ServiceAccount (the chart's full name)."""
        return f"{self.name}-trainguard"

    @property
    def user(self) -> str:
        """The ServiceAccount as the apiserver names the user."""
        return f"system:serviceaccount:{self.namespace}:{self.account}"


def install(cluster: Cluster, values: Obj | None = None) -> Release:
    """A fresh namespace and the chart installed into it (its operator pod never scheduled)."""
    release = Release(f"tg-{uuid.uuid4().hex[:6]}", f"tg-{uuid.uuid4().hex[:6]}")
    cluster.kubectl("create", "namespace", release.namespace)
    helm(
        "install",
        release.name,
        str(CHART),
        "--namespace",
        release.namespace,
        values={**NOWHERE, **(values or {})},
        kubeconfig=cluster.kubeconfig,
    )
    return release


def upgrade(cluster: Cluster, release: Release, values: Obj) -> None:
    """`helm upgrade` the release with these values (still never scheduled)."""
    helm(
        "upgrade",
        release.name,
        str(CHART),
        "--namespace",
        release.namespace,
        values={**NOWHERE, **values},
        kubeconfig=cluster.kubeconfig,
    )


def uninstall(cluster: Cluster, release: Release) -> None:
    """Remove the release (idempotent) and its namespace."""
    helm(
        "uninstall",
        release.name,
        "--namespace",
        release.namespace,
        "--ignore-not-found",
        kubeconfig=cluster.kubeconfig,
    )
    cluster.kubectl("delete", "namespace", release.namespace, "--wait=false", check=False)


def token_kubeconfig(cluster: Cluster, release: Release, path: Path) -> Path:
    """Write a kubeconfig that authenticates with the release's ServiceAccount token only."""
    return demo_env.token_kubeconfig(
        cluster, release.namespace, release.account, path, TOKEN_DURATION
    )
