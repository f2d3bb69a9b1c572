"""The operator's docs name everything the code defines: env contract, network list, flags."""

from __future__ import annotations

from pathlib import Path

import pytest
from run_factory import make_run

from trainguard.contract import env
from trainguard.operator.build.constants import OperatorReason
from trainguard.operator.build.pod import PodInputs, training_pod
from trainguard.operator.main import _parser
from trainguard.operator.policies.placement import (
    DEFAULT_NETWORK_CSI_DRIVERS,
    NETWORK_NAME_MARKERS,
    NETWORK_PV_SOURCES,
)

pytestmark = pytest.mark.unit

DOCS = Path(__file__).resolve().parents[2] / "docs"
ENV_CONTRACT = (DOCS / "env-contract.md").read_text()
OPERATOR = (DOCS / "operator.md").read_text()


def test_env_contract_documents_every_variable() -> None:
    variables = {
        value
        for key, value in vars(env).items()
        if key.isupper()
        and isinstance(value, str)
        and value.startswith("TRAINGUARD_")
        and not value.endswith("_")
    }
    missing = {v for v in variables if f"`{v}`" not in ENV_CONTRACT}
    assert not missing
    assert f"`{env.LAYER_PATH_PREFIX}<NAME>`" in ENV_CONTRACT
    assert f"`{env.LAYER_SECRETS_PREFIX}<NAME>`" in ENV_CONTRACT


@pytest.mark.parametrize(
    "name", sorted([*DEFAULT_NETWORK_CSI_DRIVERS, *NETWORK_PV_SOURCES, *NETWORK_NAME_MARKERS])
)
def test_network_list_is_documented(name: str) -> None:
    assert f"`{name}`" in OPERATOR


@pytest.mark.parametrize("reason", [r.value for r in OperatorReason])
def test_operator_reasons_are_documented(reason: str) -> None:
    assert f"`{reason}`" in OPERATOR


def test_every_flag_is_documented() -> None:
    flags = [
        option
        for action in _parser()._actions
        for option in action.option_strings
        if option.startswith("--") and option != "--help"
    ]
    missing = [f for f in flags if f"`{f}" not in OPERATOR]
    assert not missing


def test_env_contract_documents_every_volume_of_the_pod() -> None:
    layer = {
        "name": "backup",
        "uri": "s3://bucket/run",
        "credentialsSecret": {"name": "creds"},
    }
    sources = [
        {"pvc": {"claimName": "shards"}},
        {"uri": "s3://bucket/shards", "credentialsSecret": {"name": "shards-creds"}},
    ]
    for source in sources:
        spec = {
            "data": {"source": source, "size": "1Gi"},
            "checkpoints": {"remote": [layer]},
        }
        manifest = training_pod(make_run(spec), PodInputs(attempt=1, agent_image="tg:1"))
        for volume in manifest["spec"]["volumes"]:
            name = volume["name"].replace("-backup", "-<layer>")
            assert f"| `{name}` |" in ENV_CONTRACT, name
