"""The demo's pieces that need no cluster: its runs, the chart's RBAC it applies, its output."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, cast

import pytest
import yaml

from trainguard.api import TrainingRun
from trainguard_dev.cluster.cluster import Cluster, default_home, ensure_binaries
from trainguard_dev.cluster.procnode import (
    NodeRuntime,
    claim_dir,
    network_volume_dir,
    shared_claim,
)
from trainguard_dev.cluster.rest import Rest
from trainguard_dev.demo import env as demo_env
from trainguard_dev.demo.main import evidence_reason, summary_table
from trainguard_dev.demo.nodes import REAL_NODE_SELECTOR, SHARDS_CLAIM, RealNodes, real_node_run
from trainguard_dev.demo.watch import Checkpoints, PodFiles, PodView, progress_line

pytestmark = [pytest.mark.unit, pytest.mark.timeout(120)]

REPO = Path(__file__).resolve().parents[2]


def test_the_checked_in_demo_run_is_valid_and_says_what_the_demo_changes() -> None:
    text = (REPO / "examples" / "demo.yaml").read_text()
    run = TrainingRun.model_validate(yaml.safe_load(text))
    assert run.spec.data is not None and str(run.spec.data.source.uri).startswith("file://")
    (layer,) = run.spec.checkpoints.remote
    assert layer.uri.startswith("file://") and layer.claim_name == demo_env.backup_claim()
    assert "trainguard demo` writes its own path" in text
    assert f"creates the PVC `{layer.claim_name}`" in text


def test_the_demo_run_gets_the_demos_data_and_stays_valid(tmp_path: Path) -> None:
    shards = tmp_path / "shards"
    manifest = demo_env.demo_run("demo-x", shards)
    run = TrainingRun.model_validate(manifest)
    assert run.metadata.name == "demo-x"
    assert run.spec.data is not None and str(run.spec.data.source.uri) == f"file://{shards}"
    (layer,) = run.spec.checkpoints.remote
    assert layer.claim_name == demo_env.backup_claim()


def test_the_backup_claim_is_kept_where_process_nodes_serve_it(tmp_path: Path) -> None:
    claim = demo_env.backup_claim()
    volume, pvc = shared_claim(tmp_path, "ns", claim)
    directory = claim_dir(tmp_path, "ns", claim)
    assert directory == tmp_path / "network-volumes" / f"ns-{claim}"
    # Bound to its own PV, which a process node serves from the claim's directory.
    assert pvc["metadata"] == {"name": claim, "namespace": "ns"}
    assert pvc["spec"]["volumeName"] == volume["metadata"]["name"]
    assert volume["spec"]["claimRef"] == {"namespace": "ns", "name": claim}
    assert network_volume_dir(tmp_path, volume["metadata"]["name"]) == directory
    assert volume["spec"]["hostPath"]["path"] == str(directory)


def test_process_node_pods_run_the_code_the_node_runtime_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A checkout on PYTHONPATH (a work tree beside the one the environment installed): the
    # pods' agent and trainer must run its code, as the operator the tests start does.
    monkeypatch.setenv("PYTHONPATH", "/checkout/operator:/checkout/dev")
    runtime = NodeRuntime(cast(Rest, None), tmp_path, ["proc-node-0"])
    pod = {"metadata": {"uid": "uid-1"}, "spec": {"automountServiceAccountToken": False}}
    env = runtime._base_env("proc-node-0", pod, tmp_path / "pod")
    assert env["PYTHONPATH"] == "/checkout/operator:/checkout/dev"
    monkeypatch.delenv("PYTHONPATH")
    assert "PYTHONPATH" not in runtime._base_env("proc-node-0", pod, tmp_path / "pod")


def test_the_operator_identity_is_the_charts_rbac_for_the_demo_namespace() -> None:
    helm = ensure_binaries(default_home()) / "helm"
    objects = demo_env.chart_rbac(REPO, helm, "ns-watched")
    kinds = sorted({o["kind"] for o in objects})
    assert kinds == [
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "ServiceAccount",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    ]
    (account,) = [o for o in objects if o["kind"] == "ServiceAccount"]
    assert account["metadata"]["namespace"] == demo_env.OPERATOR_NAMESPACE
    bindings = [
        o for o in objects if o["kind"] == "RoleBinding" and o["roleRef"]["kind"] == "ClusterRole"
    ]
    # Run permissions only in the watched namespace, for the chart's ServiceAccount.
    assert [b["metadata"]["namespace"] for b in bindings] == ["ns-watched"]
    assert bindings[0]["subjects"][0]["name"] == account["metadata"]["name"]
    # The run's heartbeat Leases: the agent's and the operator's to write, in that namespace.
    (policy,) = [
        o
        for o in objects
        if o["kind"] == "ValidatingAdmissionPolicy" and o["metadata"]["name"].endswith("heartbeats")
    ]
    selector = policy["spec"]["matchConstraints"]["namespaceSelector"]["matchExpressions"][0]
    assert selector["values"] == ["ns-watched"]


def test_progress_line_reads_the_heartbeat_and_the_layers() -> None:
    status = {
        "node": "proc-node-0",
        "attempt": 1,
        "verdict": "Healthy",
        "checkpoints": [
            {"layer": "backup", "step": 40, "verified": True, "shipping": {"state": "Uploading"}}
        ],
    }
    beat = {"step": 57, "tokens_per_s": 12345.6, "last_checkpoint_step": 40}
    line = progress_line(status, beat)
    assert line == (
        "step 57 | 12,346 tokens/s | checkpoints l1@40 backup@40 (verified, uploading) | "
        "node proc-node-0 | attempt 1 | Healthy"
    )
    assert progress_line({}, None).startswith("step - | - tokens/s | checkpoints none yet")


def test_checkpoints_counts_each_verified_step_once_per_layer() -> None:
    seen = Checkpoints()
    verified = {"checkpoints": [{"layer": "backup", "step": 20, "verified": True}]}
    seen.observe(verified, {"last_checkpoint_step": 20})
    seen.observe(verified, {"last_checkpoint_step": 40})
    seen.observe({"checkpoints": [{"layer": "backup", "step": 40, "verified": False}]})
    assert seen.counts() == {"backup": 1, "l1": 2}


def test_evidence_reason_is_the_sentence_of_the_evidence() -> None:
    failure = {"message": json.dumps({"reason": "trainer process absent", "alive": "false"})}
    assert evidence_reason(failure) == "trainer process absent"
    assert evidence_reason({"message": "node gone"}) == "node gone"


def _recovery(**fields: Any) -> dict[str, Any]:
    base = {
        "scenario": "silent-death", "cause": "Dead", "detect_s": 0.7, "resume_s": 31.4,
        "steps_lost": 14, "from_layer": "l1", "node_before": "n0", "node_after": "n0",
    }  # fmt: skip
    return {**base, **fields}


def test_summary_table_shows_each_recovery_and_the_totals() -> None:
    summary = {
        "checkpoint_every_steps": 20,
        "recoveries": [
            _recovery(),
            _recovery(
                scenario="ghost-memory",
                cause="GhostMemory",
                node_after="n1",
                from_layer="backup",
                detect_s=30.8,
                resume_s=82.7,
                steps_lost=7,
            ),
        ],
        "totals": {
            "checkpoints_verified": {"backup": 5, "l1": 6},
            "final_step": 120,
            "restarts": 3,
            "excluded_nodes": ["n0"],
            "wall_s": 164.7,
        },
    }
    lines = summary_table(summary).splitlines()
    assert lines[0].split() == ["#", "failure", "cause", "detected", "resumed", "steps", "lost",
                                "from", "node"]  # fmt: skip
    assert lines[2].split() == ["1", "silent-death", "Dead", "0.7", "s", "31.4", "s", "14",
                                "(<=", "20)", "l1", "n0", "(in", "place)"]  # fmt: skip
    assert lines[3].split()[-3:] == ["n0", "->", "n1"]
    assert "verified checkpoints seen per layer: backup 5, l1 6" in lines
    assert lines[-1].startswith("final step 120, restarts 3, excluded nodes: n0")


def test_the_real_node_run_is_the_demo_with_the_built_image_and_data_from_a_claim() -> None:
    manifest = real_node_run("demo-x", "trainguard.local/trainguard-trainer:abc")
    run = TrainingRun.model_validate(manifest)
    assert run.spec.trainer.image == "trainguard.local/trainguard-trainer:abc"
    assert manifest["spec"]["data"]["source"] == {"pvc": {"claimName": SHARDS_CLAIM}}
    # Only the real nodes: the process-backed label of examples/demo.yaml is gone.
    assert manifest["spec"]["placement"]["nodeSelector"] == REAL_NODE_SELECTOR
    (layer,) = run.spec.checkpoints.remote
    assert layer.claim_name == demo_env.backup_claim()


def test_the_trainer_output_is_read_from_each_of_its_log_files(tmp_path: Path) -> None:
    logs = tmp_path / "ns_demo-0_uid" / "trainer"
    logs.mkdir(parents=True)
    # The kubelet's CRI log format: one file per container start, a prefix on every line.
    (logs / "0.log").write_text("2026-12-03T17:00:00Z stdout F resumed; steps 41..1000000\n")
    (logs / "1.log").write_text("2026-12-03T17:01:00Z stdout F resumed; steps 81..1000000\n")
    files = PodFiles(tmp_path / "state", logs.parent, "trainer/*.log")
    pod = PodView("demo-0", "uid", "real-node-0", files, deleting=False)
    assert pod.start_steps() == [40, 80]
    assert pod.heartbeat() is None and pod.restore() is None


def test_a_real_nodes_trainer_is_alive_while_its_heartbeat_is_fresh() -> None:
    nodes = RealNodes(Cluster("unit-demo"))
    assert nodes.trainer_alive({"pid": 7, "time": time.time() - 1})
    assert not nodes.trainer_alive({"pid": 7, "time": time.time() - 60})
    assert not nodes.trainer_alive({"pid": 7})
