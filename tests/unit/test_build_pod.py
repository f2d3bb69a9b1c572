"""The training pod of attempt k, field by field, and one table row per spec switch."""

from __future__ import annotations

from typing import Any

import pytest
from run_factory import UID, make_run

from trainguard.api import TrainingRun
from trainguard.contract import env
from trainguard.contract.env import ContractError, PodEnv, layer_path_env, layer_secrets_env
from trainguard.layers import Credentials
from trainguard.operator.build.pod import (
    PodInputs,
    pod_env,
    pods_env_config,
    spec_hash,
    training_pod,
)
from trainguard_dev.testing.podenv import config_map_data, container_environment

# The builder and the agent share the contract's one spelling of the per-layer variables.
built_secrets_env = layer_secrets_env
LAYER_PATH_ENV_PREFIX = AGENT_LAYER_PATH_PREFIX = env.LAYER_PATH_PREFIX


def flush_timeout_from_env(values: dict[str, str]) -> float:
    """What the agent bounds its flush with, read as every program reads the contract."""
    return PodEnv.from_env(values).flush_timeout_seconds


pytestmark = pytest.mark.unit

IMAGE = "registry.example/trainguard:test"
GI = 2**30
# Every variable the operator sets, read from the module that defines it: all but the per-layer
# prefixes and the variables a node provides.
CONTRACT = {
    value
    for key, value in vars(env).items()
    if key.isupper()
    and isinstance(value, str)
    and value.startswith("TRAINGUARD_")
    and not value.endswith("_")
    and value not in env.NODE_PROVIDED
    and value != env.DATA_SECRETS  # only in stage-data, and only with a Secret to mount
    and value != env.MASTER_ADDR  # only in a gang's members
}
RESTRICTED = {
    "allowPrivilegeEscalation": False,
    "runAsNonRoot": True,
    "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}
# The trainer runs the user's code, which may write caches under its home directory.
RESTRICTED_TRAINER = {**RESTRICTED, "readOnlyRootFilesystem": False}
API_ACCESS = "/var/run/secrets/kubernetes.io/serviceaccount"
BACKUP_LAYER = {
    "name": "backup",
    "uri": "file:///mnt/backup/llm",
    "claimName": "nfs-backup",
}
S3_LAYER = {"name": "s3", "uri": "s3://ckpts/llm", "credentialsSecret": {"name": "s3-creds"}}


# The env ConfigMaps of the pods built here, by name: what the kubelet would find.
CONFIGS: dict[str, dict[str, str]] = {}


def built(run: TrainingRun, inputs: PodInputs) -> dict[str, Any]:
    """The pod, its env ConfigMap kept in CONFIGS."""
    CONFIGS.update(config_map_data(pods_env_config(run, inputs.attempt)))
    return training_pod(run, inputs)


def pod(spec: dict[str, Any] | None = None, attempt: int = 1, **inputs: Any) -> dict[str, Any]:
    return built(make_run(spec), PodInputs(attempt, agent_image=IMAGE, **inputs))


def containers(manifest: dict[str, Any]) -> dict[str, dict[str, Any]]:
    spec = manifest["spec"]
    return {c["name"]: c for c in [*spec["initContainers"], *spec["containers"]]}


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    """The container's variables (its ConfigMap's, then its own); a downward one as its source."""
    values: dict[str, Any] = container_environment(container, CONFIGS)
    values.update({e["name"]: e["valueFrom"] for e in container["env"] if "valueFrom" in e})
    return values


def mounts(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {m["mountPath"]: m for m in container["volumeMounts"]}


def volumes(manifest: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in manifest["spec"]["volumes"]}


def test_minimal_pod_field_by_field() -> None:
    manifest = pod(attempt=3)
    meta, spec = manifest["metadata"], manifest["spec"]
    assert meta["name"] == "llm-3"
    assert meta["namespace"] == "team-a"
    assert meta["labels"] == {
        "trainguard.dev/run": "llm",
        "trainguard.dev/attempt": "3",
        "trainguard.dev/component": "training-pod",
        "app.kubernetes.io/managed-by": "trainguard",
    }
    assert meta["annotations"] == {
        "trainguard.dev/spec-hash": spec_hash(make_run().spec),
        "trainguard.dev/env-config": pods_env_config(make_run(), 3)["metadata"]["name"],
    }
    assert meta["ownerReferences"] == [
        {
            "apiVersion": "trainguard.dev/v1alpha1",
            "kind": "TrainingRun",
            "name": "llm",
            "uid": UID,
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    assert spec["serviceAccountName"] == "llm-trainguard"
    assert spec["automountServiceAccountToken"] is False
    assert spec["restartPolicy"] == "Never"
    assert spec["shareProcessNamespace"] is True
    assert spec["terminationGracePeriodSeconds"] == 120
    # One group for every container's user: shared volumes and Secrets are readable (and the
    # volumes writable) through it, whatever users the agent's and the trainer's images declare.
    assert spec["securityContext"] == {
        "runAsNonRoot": True,
        "fsGroup": 65532,
        "fsGroupChangePolicy": "OnRootMismatch",
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert "affinity" not in spec and "nodeSelector" not in spec and "tolerations" not in spec
    assert [c["name"] for c in spec["initContainers"]] == ["agent", "preflight"]
    assert [c["name"] for c in spec["containers"]] == ["trainer"]

    agent = spec["initContainers"][0]
    assert agent["restartPolicy"] == "Always"  # a native sidecar
    assert agent["image"] == IMAGE
    assert agent["command"] == ["trainguard", "agent"]

    trainer = spec["containers"][0]
    assert trainer["image"] == "trainer:1"
    assert trainer["command"] == ["trainguard", "supervise", "--", "python", "train.py"]
    assert "args" not in trainer
    # 1e9 parameters x 16 B = 16 GB per checkpoint, 3 on disk, + 3 GiB + 5 % margin.
    assert trainer["resources"] == {
        "requests": {"ephemeral-storage": "51138Mi", "nvidia.com/gpu": "1"},
        "limits": {"nvidia.com/gpu": "1"},
    }
    assert mounts(trainer) == {
        "/trainguard/l1": {"name": "l1", "mountPath": "/trainguard/l1"},
        "/trainguard/l0": {"name": "l0", "mountPath": "/trainguard/l0"},
        "/trainguard/state": {"name": "state", "mountPath": "/trainguard/state"},
        "/trainguard/logs": {"name": "logs", "mountPath": "/trainguard/logs"},
    }
    # L0 in pod memory: 2 kept checkpoints and the one being written, 16 GB each.
    assert volumes(manifest) == {
        "l1": {"name": "l1", "emptyDir": {"sizeLimit": "45777Mi"}},
        "l0": {"name": "l0", "emptyDir": {"medium": "Memory", "sizeLimit": "45777Mi"}},
        "state": {"name": "state", "emptyDir": {"medium": "Memory", "sizeLimit": "64Mi"}},
        "logs": {"name": "logs", "emptyDir": {"sizeLimit": "2048Mi"}},
        "tmp": {"name": "tmp", "emptyDir": {"sizeLimit": "128Mi"}},
        "api-access": {
            "name": "api-access",
            "projected": {
                "defaultMode": 0o440,
                "sources": [
                    {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}},
                    {
                        "configMap": {
                            "name": "kube-root-ca.crt",
                            "items": [{"key": "ca.crt", "path": "ca.crt"}],
                        }
                    },
                    {
                        "downwardAPI": {
                            "items": [
                                {
                                    "path": "namespace",
                                    "fieldRef": {"fieldPath": "metadata.namespace"},
                                }
                            ]
                        }
                    },
                ],
            },
        },
    }


def test_every_container_is_restricted() -> None:
    every = pod(
        {"data": {"source": {"uri": "s3://shards/x"}}, "checkpoints": {"remote": [BACKUP_LAYER]}}
    )
    for name, container in containers(every).items():
        expected = RESTRICTED_TRAINER if name == "trainer" else RESTRICTED
        assert container["securityContext"] == expected, name
        if name != "trainer":
            # Read-only root: the companions' scratch space is a volume of the pod.
            assert mounts(container)["/tmp"] == {"name": "tmp", "mountPath": "/tmp"}, name


def test_only_the_agent_holds_the_api_token() -> None:
    every = pod(
        {"data": {"source": {"uri": "s3://shards/x"}}, "checkpoints": {"remote": [BACKUP_LAYER]}}
    )
    assert every["spec"]["automountServiceAccountToken"] is False
    holders = {
        name
        for name, container in containers(every).items()
        if any(m["name"] == "api-access" for m in container["volumeMounts"])
    }
    assert holders == {"agent"}
    assert mounts(containers(every)["agent"])[API_ACCESS] == {
        "name": "api-access",
        "mountPath": API_ACCESS,
        "readOnly": True,
    }


def test_every_container_gets_the_whole_env_contract() -> None:
    run = make_run({"data": {"source": {"uri": "s3://shards/x"}, "size": "2Gi"}}).to_object()
    run["status"] = {"fences": [{"attempt": 1, "step": 40, "time": "2026-12-01T10:00:00Z"}]}
    manifest = built(TrainingRun.from_object(run), PodInputs(2, agent_image=IMAGE))
    for container in containers(manifest).values():
        names = [e["name"] for e in container["env"]]
        assert len(names) == len(set(names)), container["name"]
        assert set(env_of(container)) >= CONTRACT, container["name"]
    values = env_of(containers(manifest)["trainer"])
    assert values[env.RUN_NAME] == "llm"
    assert values[env.RUN_UID] == UID
    assert values[env.NAMESPACE] == "team-a"
    assert values[env.ATTEMPT] == "2"
    assert values[env.FENCES] == '{"1":40}'
    assert values[env.LEASE_NAME] == "llm-heartbeat"
    assert values[env.NODE_NAME] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert values[env.POD_NAME] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert values[env.L1_DIR] == "/trainguard/l1"
    assert values[env.DATA_DIR] == "/trainguard/data"
    assert values[env.DATA_SOURCE] == "s3://shards/x"
    assert values[env.DATA_BYTES] == str(2 * GI)
    assert values[env.CKPT_BYTES] == str(16 * 10**9)
    assert values[env.HEARTBEAT_FILE] == "/trainguard/state/heartbeat.json"
    assert values[env.GPU_FILE] == "/trainguard/state/gpu.json"
    assert values[env.LOG_FILE] == "/trainguard/logs/trainer.log"
    assert values[env.KEEP_LAST] == "2"
    assert values[env.CKPT_EVERY_STEPS] == "50"
    assert values[env.CKPT_EVERY_SECONDS] == "0"
    assert values[env.HASH] == "xxh3"
    assert '"hangAfterSeconds":300' in values[env.MONITOR]
    assert values[env.LAYERS] == "[]"
    assert values[env.FLUSH_TIMEOUT_SECONDS] == "600"


def test_sizes_the_run_does_not_declare_are_left_out() -> None:
    values = env_of(containers(pod({"model": {"parameters": None}}))["preflight"])
    assert not {env.CKPT_BYTES, env.DATA_BYTES, env.DATA_SOURCE, env.DATA_DIR} & set(values)


def test_the_shared_variables_travel_once_in_an_immutable_configmap_owned_by_the_run() -> None:
    run = make_run({"checkpoints": {"remote": [S3_LAYER]}})
    config = pods_env_config(run, 2)
    name = config["metadata"]["name"]
    assert config["kind"] == "ConfigMap" and config["immutable"] is True
    assert name.startswith("llm-env-") and config["metadata"]["namespace"] == "team-a"
    assert config["metadata"]["labels"]["trainguard.dev/component"] == "pod-env"
    assert config["metadata"]["ownerReferences"][0]["uid"] == UID
    assert config["data"] == pod_env(run, 2).shared_env()
    assert not env.MEMBER_VARIABLES & set(config["data"])
    manifest = built(run, PodInputs(2, agent_image=IMAGE))
    for container in containers(manifest).values():
        assert container["envFrom"] == [{"configMapRef": {"name": name}}], container["name"]
        own = {e["name"] for e in container["env"]}
        # Only what differs between pods, the downward API's names and a Secret's mount.
        assert own <= {*env.MEMBER_VARIABLES, *env.DOWNWARD_API, built_secrets_env("s3")}
        assert own >= {env.ATTEMPT, env.LEASE_NAME, env.NODE_RANK, *env.DOWNWARD_API}
    assert env_of(containers(manifest)["agent"])[built_secrets_env("s3")]
    assert built_secrets_env("s3") not in env_of(containers(manifest)["trainer"])


def test_the_configmap_is_named_by_its_content() -> None:
    fenced = {"fences": [{"attempt": 1, "step": 40, "time": "2026-12-01T10:00:00Z"}]}
    name = pods_env_config(make_run(), 1)["metadata"]["name"]
    # Attempts and fences stay in the pods: every attempt of a spec shares one ConfigMap.
    assert pods_env_config(make_run(status=fenced), 5)["metadata"]["name"] == name
    changed = make_run({"checkpoints": {"l1": {"keepLast": 4}}})
    assert pods_env_config(changed, 1)["metadata"]["name"] != name


def test_user_env_is_kept_but_cannot_override_the_contract() -> None:
    manifest = pod(
        {
            "trainer": {
                "env": [
                    {"name": "NCCL_DEBUG", "value": "INFO"},
                    {"name": env.ATTEMPT, "value": "99"},
                    {"name": env.KEEP_LAST, "value": "99"},
                ]
            }
        }
    )
    trainer = containers(manifest)["trainer"]
    assert trainer["env"][0] == {"name": "NCCL_DEBUG", "value": "INFO"}
    assert env_of(trainer)[env.ATTEMPT] == "1"
    # A variable the ConfigMap carries is not in `env`, where it would win over the ConfigMap.
    assert env.KEEP_LAST not in {e["name"] for e in trainer["env"]}
    assert env_of(trainer)[env.KEEP_LAST] == "2"


INIT_STEPS: list[tuple[str, dict[str, Any], list[str]]] = [
    ("minimal", {}, ["agent", "preflight"]),
    (
        "staged uri data",
        {"data": {"source": {"uri": "s3://shards/x"}}},
        ["agent", "preflight", "stage-data"],
    ),
    (
        "data read in place",
        {"data": {"source": {"pvc": {"claimName": "shards"}}, "stage": False}},
        ["agent", "preflight"],
    ),
    ("remote layer", {"checkpoints": {"remote": [S3_LAYER]}}, ["agent", "preflight", "restore"]),
    (
        "local-volume L1",
        {
            "checkpoints": {
                "l1": {"storage": {"localVolume": {"storageClassName": "lv", "size": "1Ti"}}}
            }
        },
        ["agent", "preflight", "restore"],
    ),
    (
        "everything",
        {"data": {"source": {"uri": "s3://shards/x"}}, "checkpoints": {"remote": [S3_LAYER]}},
        ["agent", "preflight", "stage-data", "restore"],
    ),
]


@pytest.mark.parametrize(
    ("changes", "expected"), [c[1:] for c in INIT_STEPS], ids=[c[0] for c in INIT_STEPS]
)
def test_init_steps_follow_the_spec(changes: dict[str, Any], expected: list[str]) -> None:
    manifest = pod(changes)
    assert [c["name"] for c in manifest["spec"]["initContainers"]] == expected
    for step in manifest["spec"]["initContainers"][1:]:
        assert step["command"] == ["trainguard", step["name"]]
        assert step["image"] == IMAGE
        assert "restartPolicy" not in step  # runs to completion, in order


def test_staging_from_a_pvc_copies_it_to_a_local_volume() -> None:
    manifest = pod(
        {
            "data": {
                "source": {"pvc": {"claimName": "shards", "subPath": "v3"}},
                "size": "71Gi",
            }
        }
    )
    stage = containers(manifest)["stage-data"]
    assert env_of(stage)[env.DATA_SOURCE] == "/trainguard/source"
    assert env_of(stage)[env.DATA_BYTES] == str(71 * GI)
    assert mounts(stage) == {
        "/trainguard/data": {"name": "data", "mountPath": "/trainguard/data"},
        # Its progress report goes to the agent through the state volume.
        "/trainguard/state": {"name": "state", "mountPath": "/trainguard/state"},
        "/tmp": {"name": "tmp", "mountPath": "/tmp"},
        "/trainguard/source": {
            "name": "data-source",
            "mountPath": "/trainguard/source",
            "readOnly": True,
            "subPath": "v3",
        },
    }
    assert volumes(manifest)["data"] == {"name": "data", "emptyDir": {"sizeLimit": "72704Mi"}}
    assert volumes(manifest)["data-source"] == {
        "name": "data-source",
        "persistentVolumeClaim": {"claimName": "shards", "readOnly": True},
    }
    trainer = containers(manifest)["trainer"]
    assert mounts(trainer)["/trainguard/data"] == {
        "name": "data",
        "mountPath": "/trainguard/data",
        "readOnly": True,
    }


def test_staging_from_a_uri_passes_it_on() -> None:
    stage = containers(pod({"data": {"source": {"uri": "s3://shards/v3"}}}))["stage-data"]
    assert env_of(stage)[env.DATA_SOURCE] == "s3://shards/v3"
    assert env.DATA_BYTES not in env_of(stage)  # no size declared: nothing to check against


def test_the_data_sources_secret_reaches_the_stage_data_step_only(tmp_path: Any) -> None:
    source = {"uri": "ssh://data@files.example/srv/shards", "credentialsSecret": {"name": "key"}}
    manifest = pod({"data": {"source": source}, "checkpoints": {"remote": [S3_LAYER]}})
    by_name = containers(manifest)
    stage = by_name["stage-data"]
    assert env_of(stage)[env.DATA_SECRETS] == "/trainguard/source-credentials"
    assert mounts(stage)["/trainguard/source-credentials"] == {
        "name": "data-source-credentials",
        "mountPath": "/trainguard/source-credentials",
        "readOnly": True,
    }
    # Root-owned, readable through the pod's group, like a layer's Secret.
    assert volumes(manifest)["data-source-credentials"] == {
        "name": "data-source-credentials",
        "secret": {"secretName": "key", "defaultMode": 0o440},
    }
    for name, container in by_name.items():
        if name == "stage-data":
            continue
        assert env.DATA_SECRETS not in env_of(container), name
        assert "/trainguard/source-credentials" not in mounts(container), name
    # The step reads the keys where the variable says, as a layer's.
    (tmp_path / "ssh-privatekey").write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    read = PodEnv.from_env({env.DATA_SECRETS: str(tmp_path)}).data_secrets
    assert read is not None
    assert Credentials.from_directory(read, "the data source").file("ssh-privatekey") == (
        tmp_path / "ssh-privatekey"
    )


def test_a_data_source_without_a_secret_mounts_none() -> None:
    manifest = pod({"data": {"source": {"uri": "s3://shards/v3"}}})
    assert env.DATA_SECRETS not in env_of(containers(manifest)["stage-data"])
    assert "data-source-credentials" not in volumes(manifest)


def test_data_read_in_place_mounts_the_claim_into_the_trainer() -> None:
    manifest = pod(
        {
            "data": {
                "source": {"pvc": {"claimName": "shards", "subPath": "v3"}},
                "mountPath": "/data",
                "stage": False,
            }
        }
    )
    trainer = containers(manifest)["trainer"]
    assert mounts(trainer)["/data"] == {
        "name": "data",
        "mountPath": "/data",
        "readOnly": True,
        "subPath": "v3",
    }
    assert volumes(manifest)["data"]["persistentVolumeClaim"] == {
        "claimName": "shards",
        "readOnly": True,
    }


def test_local_volume_l1_is_a_claim_of_the_local_class_made_with_the_pod() -> None:
    manifest = pod(
        {
            "placement": {"localStorageClassName": "local-path"},
            "checkpoints": {"l1": {"storage": {"localVolume": {"size": "200Gi"}}}},
        }
    )
    assert volumes(manifest)["l1"]["ephemeral"] == {
        "volumeClaimTemplate": {
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": "local-path",
                "resources": {"requests": {"storage": "204800Mi"}},
            }
        }
    }


def test_remote_layer_volumes_are_mounted_into_the_agent_and_restore_only() -> None:
    manifest = pod({"checkpoints": {"remote": [BACKUP_LAYER, S3_LAYER]}})
    by_name = containers(manifest)
    agent_mounts, restore_mounts = mounts(by_name["agent"]), mounts(by_name["restore"])
    assert agent_mounts["/mnt/backup/llm"] == {
        "name": "remote-backup",
        "mountPath": "/mnt/backup/llm",
    }
    assert restore_mounts["/mnt/backup/llm"]["readOnly"] is True
    for where in (agent_mounts, restore_mounts):
        assert where["/trainguard/credentials/s3"] == {
            "name": "credentials-s3",
            "mountPath": "/trainguard/credentials/s3",
            "readOnly": True,
        }
    for name in ("trainer", "preflight"):
        names = {m["name"] for m in by_name[name]["volumeMounts"]}
        assert not names & {"remote-backup", "credentials-s3"}, name
    assert volumes(manifest)["remote-backup"]["persistentVolumeClaim"] == {
        "claimName": "nfs-backup"
    }
    assert volumes(manifest)["credentials-s3"]["secret"] == {
        "secretName": "s3-creds",
        "defaultMode": 0o440,  # root:<fsGroup>: the agent reads it through the group
    }
    # The agent finds the volume where it is mounted (the local process nodes rewrite it).
    assert env_of(by_name["agent"])["TRAINGUARD_LAYER_PATH_BACKUP"] == "/mnt/backup/llm"


def test_a_deleted_pod_has_time_to_flush_to_a_remote_layer() -> None:
    remote = {"checkpoints": {"remote": [S3_LAYER], "flushTimeoutSeconds": 300}}
    assert pod(remote)["spec"]["terminationGracePeriodSeconds"] == 120 + 300
    assert pod()["spec"]["terminationGracePeriodSeconds"] == 120  # nowhere to flush to


HF_LAYER = {
    "name": "hub-weights",
    "uri": "hf://org/llm",
    "contents": "weights",
    "credentialsSecret": {"name": "hf-token"},
}


def test_layer_secrets_reach_the_agent_and_restore_only() -> None:
    manifest = pod({"checkpoints": {"remote": [BACKUP_LAYER, S3_LAYER, HF_LAYER]}})
    by_name = containers(manifest)
    expected = {
        "TRAINGUARD_LAYER_SECRETS_S3": "/trainguard/credentials/s3",
        "TRAINGUARD_LAYER_SECRETS_HUB_WEIGHTS": "/trainguard/credentials/hub-weights",
    }
    for name in ("agent", "restore"):
        values = env_of(by_name[name])
        found = {k: v for k, v in values.items() if k.startswith("TRAINGUARD_LAYER_SECRETS_")}
        assert found == expected, name
        # Each variable names a directory where that layer's Secret is mounted, read-only.
        for path in expected.values():
            assert mounts(by_name[name])[path]["readOnly"] is True, (name, path)
    for name in ("trainer", "preflight"):
        values = env_of(by_name[name])
        assert not [k for k in values if k.startswith("TRAINGUARD_LAYER_SECRETS_")], name
        paths = {m["mountPath"] for m in by_name[name]["volumeMounts"]}
        assert not [p for p in paths if p.startswith("/trainguard/credentials")], name
    assert volumes(manifest)["credentials-hub-weights"]["secret"]["secretName"] == "hf-token"


def test_a_layer_without_a_secret_gets_no_secrets_variable() -> None:
    manifest = pod({"checkpoints": {"remote": [BACKUP_LAYER]}})
    for container in containers(manifest).values():
        assert not [k for k in env_of(container) if "LAYER_SECRETS" in k], container["name"]


def test_layer_secrets_variable_is_the_one_the_agent_reads(tmp_path: Any) -> None:
    for name in ("s3", "off-site", "hub-weights"):
        assert built_secrets_env(name) == layer_secrets_env(name)
    # The agent reads the Secret's keys from the directory the variable names.
    (tmp_path / "AWS_ACCESS_KEY_ID").write_text("key-id-123456\n")
    values = env_of(containers(pod({"checkpoints": {"remote": [S3_LAYER]}}))["agent"])
    environ = {built_secrets_env("s3"): str(tmp_path)}
    assert values[built_secrets_env("s3")] == "/trainguard/credentials/s3"
    assert Credentials.from_env("s3", environ).get("AWS_ACCESS_KEY_ID") == "key-id-123456"


@pytest.mark.parametrize(("seconds", "expected"), [(300, 300.0), (5, 5.0), (None, 600.0)])
def test_flush_timeout_reaches_the_agent(seconds: int | None, expected: float) -> None:
    checkpoints: dict[str, Any] = {"remote": [S3_LAYER]}
    if seconds is not None:
        checkpoints["flushTimeoutSeconds"] = seconds
    values = env_of(containers(pod({"checkpoints": checkpoints}))["agent"])
    assert flush_timeout_from_env(values) == expected


def test_an_empty_flush_timeout_is_the_default() -> None:
    assert flush_timeout_from_env({env.FLUSH_TIMEOUT_SECONDS: ""}) == 600.0


@pytest.mark.parametrize("raw", ["soon", "0", "-3"])
def test_a_bad_flush_timeout_is_refused_naming_the_variable(raw: str) -> None:
    with pytest.raises(ContractError, match=env.FLUSH_TIMEOUT_SECONDS):
        flush_timeout_from_env({env.FLUSH_TIMEOUT_SECONDS: raw})


def test_layer_path_variable_is_the_one_the_agent_reads() -> None:
    assert LAYER_PATH_ENV_PREFIX == AGENT_LAYER_PATH_PREFIX
    assert layer_path_env("off-site") == "TRAINGUARD_LAYER_PATH_OFF_SITE"


def test_excluded_nodes_are_kept_away_by_name() -> None:
    manifest = pod(excluded_nodes=("gpu-b", "gpu-a"))
    assert manifest["spec"]["affinity"] == {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchFields": [
                            {"key": "metadata.name", "operator": "NotIn", "values": ["gpu-a"]},
                            {"key": "metadata.name", "operator": "NotIn", "values": ["gpu-b"]},
                        ]
                    }
                ]
            }
        }
    }


def test_node_selector_and_tolerations_but_never_our_own_taint() -> None:
    manifest = pod(
        {
            "placement": {
                "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H200"},
                "tolerations": [
                    {
                        "key": "dedicated",
                        "operator": "Equal",
                        "value": "ml",
                        "effect": "NoSchedule",
                    },
                    {"key": "trainguard.dev/unhealthy", "operator": "Exists"},
                ],
            }
        }
    )
    assert manifest["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H200"}
    assert manifest["spec"]["tolerations"] == [
        {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}
    ]


def test_resources_cpu_memory_and_gpus() -> None:
    manifest = pod({"trainer": {"resources": {"gpus": 8, "cpu": "7500m", "memory": "64Gi"}}})
    trainer = containers(manifest)["trainer"]["resources"]
    assert trainer["limits"] == {"cpu": "7500m", "memory": "64Gi", "nvidia.com/gpu": "8"}
    assert {k: v for k, v in trainer["requests"].items() if k != "ephemeral-storage"} == {
        "cpu": "7500m",
        "memory": "64Gi",
        "nvidia.com/gpu": "8",
    }
    # The preflight step checks the GPUs, so it asks for the same ones.
    preflight = containers(manifest)["preflight"]["resources"]
    assert preflight["limits"]["nvidia.com/gpu"] == "8"


def test_cpu_only_run_requests_no_gpu() -> None:
    manifest = pod({"trainer": {"resources": {"gpus": 0}}})
    for container in containers(manifest).values():
        resources = container["resources"]
        assert "nvidia.com/gpu" not in {
            **resources.get("requests", {}),
            **resources.get("limits", {}),
        }


def test_a_run_stored_with_py_spy_false_keeps_its_pod_and_spec_hash() -> None:
    # Runs stored while pySpy existed carry its default; their pods must not look changed.
    stored = make_run({"monitor": {"pySpy": False}}).spec
    assert stored.to_object()["monitor"]["pySpy"] is False
    assert "pySpy" not in make_run().spec.to_object()["monitor"]
    for name, container in containers(pod({"monitor": {"pySpy": False}})).items():
        expected = RESTRICTED_TRAINER if name == "trainer" else RESTRICTED
        assert container["securityContext"] == expected, name


def test_args_and_working_dir_reach_the_trainer() -> None:
    trainer = containers(pod({"trainer": {"args": ["--lr", "3e-4"], "workingDir": "/work"}}))[
        "trainer"
    ]
    assert trainer["args"] == ["--lr", "3e-4"]
    assert trainer["workingDir"] == "/work"


def test_spec_hash_ignores_suspend_and_sees_everything_else() -> None:
    base = spec_hash(make_run().spec)
    assert spec_hash(make_run({"suspend": True}).spec) == base
    assert spec_hash(make_run({"trainer": {"image": "trainer:2"}}).spec) != base
    assert spec_hash(make_run({"monitor": {"hangAfterSeconds": 600}}).spec) != base


def test_l0_is_pod_memory_in_the_trainer_and_read_only_in_the_agent() -> None:
    manifest = pod({"checkpoints": {"size": "1Gi"}, "data": {"source": {"uri": "s3://shards/x"}}})
    # The two kept checkpoints and the one being written, in memory.
    assert volumes(manifest)["l0"] == {
        "name": "l0",
        "emptyDir": {"medium": "Memory", "sizeLimit": "3072Mi"},
    }
    holders = {
        name: mounts(container).get(env.DEFAULT_L0_DIR)
        for name, container in containers(manifest).items()
    }
    assert holders == {
        "agent": {"name": "l0", "mountPath": "/trainguard/l0", "readOnly": True},
        "preflight": None,
        "stage-data": None,
        "trainer": {"name": "l0", "mountPath": "/trainguard/l0"},
    }
    for container in containers(manifest).values():
        assert env_of(container)[env.L0_DIR] == env.DEFAULT_L0_DIR
