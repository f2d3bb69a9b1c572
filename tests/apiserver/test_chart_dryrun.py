"""The chart's rendered manifests pass a server-side dry run on the real apiserver.

The apiserver validates every object against its schema (and admission), so a field that
`helm template` renders but Kubernetes rejects fails here. The ServiceMonitor is left out:
the control plane has no Prometheus Operator CRDs (its rendering is checked in the unit tier).
"""

from __future__ import annotations

import uuid

import pytest
import yaml

from chart import Obj, render_text
from trainguard_dev.cluster.cluster import Cluster

pytestmark = [pytest.mark.apiserver, pytest.mark.timeout(300)]

EXTRAS: Obj = {
    "networkPolicy": {"enabled": True, "apiServerCIDRs": ["127.0.0.1/32"]},
    "dashboard": {"enabled": True},
    "podAnnotations": {"example.com/team": "ml-platform"},
    "priorityClassName": "system-cluster-critical",
}


@pytest.mark.parametrize("variant", ["default", "namespaced", "extras"])
def test_rendered_manifests_pass_server_side_dry_run(
    cluster: Cluster, namespace: str, variant: str
) -> None:
    values: Obj = {
        "default": {},
        "namespaced": {"operator": {"watchNamespaces": [namespace]}},
        "extras": EXTRAS,
    }[variant]
    manifests = render_text(f"dry-{uuid.uuid4().hex[:6]}", namespace, values)
    # As helm installs them: into the release's namespace, unless an object names its own
    # (the Role for Events on Nodes lives in default).
    objects = [o for o in yaml.safe_load_all(manifests) if o]
    elsewhere = [o for o in objects if o["metadata"].get("namespace", namespace) != namespace]
    here = [o for o in objects if o not in elsewhere]
    created = []
    for target, group in ((namespace, here), (None, elsewhere)):
        where = ["-n", target] if target else []
        result = cluster.kubectl(
            "apply", "--dry-run=server", *where, "-f", "-",
            input=yaml.safe_dump_all(group), check=False,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        created += result.stdout.splitlines()
    kinds = {line.split("/")[0] for line in created}
    assert {"deployment.apps", "serviceaccount", "clusterrole.rbac.authorization.k8s.io"} <= kinds
    assert all(line.endswith("(server dry run)") for line in created)
