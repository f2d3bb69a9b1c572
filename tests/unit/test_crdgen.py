"""The CRD generator: checked-in files match the models, and the schema is structural."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from trainguard.api import TrainingRunSpec, TrainingRunStatus
from trainguard.api import constants as c
from trainguard.api.base import X_INT_OR_STRING, X_LIST_MAP_KEYS, X_VALIDATIONS
from trainguard_dev import crdgen

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
Schema = dict[str, Any]


def walk(schema: Schema, path: str = "") -> Iterator[tuple[str, Schema]]:
    """Every schema node below `schema`, with its path."""
    yield path, schema
    for name, prop in schema.get("properties", {}).items():
        yield from walk(prop, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        yield from walk(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from walk(schema["additionalProperties"], f"{path}{{}}")


@pytest.fixture(scope="module")
def crd() -> Schema:
    return crdgen.crd()


@pytest.fixture(scope="module")
def root(crd: Schema) -> Schema:
    schema: Schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return schema


def test_checked_in_files_match_the_models() -> None:
    assert crdgen.drift(REPO) == [], "run `python -m trainguard_dev.crdgen` and commit the result"


def test_chart_copy_is_identical() -> None:
    assert (REPO / crdgen.CRD_FILE).read_text() == (REPO / crdgen.CHART_CRD_FILE).read_text()


def test_check_mode_reports_drift(tmp_path: Path) -> None:
    (tmp_path / "charts" / "trainguard").mkdir(parents=True)
    command = [sys.executable, "-m", "trainguard_dev.crdgen", "--root", str(tmp_path)]
    stale = subprocess.run([*command, "--check"], capture_output=True, text=True, check=False)
    assert stale.returncode == 1
    assert "out of date" in stale.stdout
    subprocess.run(command, check=True, capture_output=True)
    for relative in crdgen.render():
        assert (tmp_path / relative).exists()
    fresh = subprocess.run([*command, "--check"], capture_output=True, text=True, check=False)
    assert fresh.returncode == 0, fresh.stdout
    (tmp_path / crdgen.CHART_CRD_FILE).write_text("edited by hand\n")
    edited = subprocess.run([*command, "--check"], capture_output=True, text=True, check=False)
    assert edited.returncode == 1
    assert str(crdgen.CHART_CRD_FILE) in edited.stdout


def test_refuses_a_directory_that_is_not_the_repository(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "trainguard_dev.crdgen", "--root", str(tmp_path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode != 0
    assert "not the repository root" in result.stderr


def test_names_and_subresources(crd: Schema) -> None:
    spec = crd["spec"]
    assert crd["metadata"]["name"] == c.CRD_NAME
    assert spec["group"] == c.GROUP
    assert spec["scope"] == "Namespaced"
    assert spec["names"]["shortNames"] == ["tr"]
    assert spec["names"]["categories"] == ["trainguard"]
    assert spec["names"]["plural"] == c.PLURAL
    (version,) = spec["versions"]
    assert version["name"] == c.VERSION
    assert version["served"] and version["storage"]
    assert version["subresources"] == {"status": {}}


def test_printer_columns(crd: Schema, root: Schema) -> None:
    columns = crd["spec"]["versions"][0]["additionalPrinterColumns"]
    default = [col["name"] for col in columns if not col.get("priority")]
    assert default == ["Phase", "Step", "Node", "Attempt", "Restarts", "Checkpoint", "Age"]
    status = root["properties"]["status"]["properties"]
    for column in columns:
        path = column["jsonPath"].split(".")[1:]
        if path[0] == "status":
            assert path[1] in status, column
            prop = status[path[1]]
            assert column["type"] == prop["type"] or (
                column["type"] == "string" and "enum" in prop
            ), column


def test_schema_is_structural(root: Schema) -> None:
    text = yaml.safe_dump(root)
    assert "$ref" not in text and "$defs" not in text
    for path, node in walk(root):
        assert "title" not in node, path
        assert node.get("additionalProperties") is not False, path
        assert "nullable" not in node, path
        assert "const" not in node, path
        if node.get(X_INT_OR_STRING):
            assert node["anyOf"] == [{"type": "integer"}, {"type": "string"}], path
        else:
            assert "anyOf" not in node, path
            assert node.get("type") in {
                "object",
                "array",
                "string",
                "integer",
                "number",
                "boolean",
            }, path


def test_every_field_is_described(root: Schema) -> None:
    undescribed = [
        path
        for path, node in walk(root)
        if path.count(".") > 1 and "description" not in node and not path.endswith(("[]", "{}"))
    ]
    assert undescribed == []


def test_lists_and_strings_are_bounded_for_cel_costs(root: Schema) -> None:
    for path, node in walk(root["properties"]["spec"], "spec"):
        if node.get("type") == "array":
            assert "maxItems" in node, path
        if node.get("type") == "string" and "enum" not in node:
            assert "maxLength" in node, path
        if node.get("type") == "object" and "additionalProperties" in node:
            assert "maxProperties" in node, path


def test_map_lists_key_on_required_fields(root: Schema) -> None:
    for path, node in walk(root):
        for key in node.get(X_LIST_MAP_KEYS, []):
            assert key in node["items"]["required"], path


def test_cel_field_paths_exist(root: Schema) -> None:
    for path, node in walk(root):
        for rule in node.get(X_VALIDATIONS, []):
            target = node
            for step in rule.get("fieldPath", "").split(".")[1:]:
                assert step in target["properties"], (path, rule)
                target = target["properties"][step]


def test_object_rules_are_generated(root: Schema) -> None:
    remote = root["properties"]["spec"]["properties"]["checkpoints"]["properties"]["remote"]
    messages = [rule["message"] for rule in remote["items"][X_VALIDATIONS]]
    assert any("hf:// layer holds model weights only" in m for m in messages)
    assert any("unique" in rule["message"] for rule in remote[X_VALIDATIONS])
    assert remote["x-kubernetes-list-type"] == "map"


def test_defaults_match_the_models(root: Schema) -> None:
    spec = root["properties"]["spec"]["properties"]
    model_defaults = TrainingRunSpec.from_object(
        {"trainer": {"image": "x", "command": ["x"]}}
    ).to_object()
    for name in ("checkpoints", "placement", "monitor", "recovery"):
        assert spec[name]["default"] == model_defaults[name], name
    assert spec["monitor"]["properties"]["intervalSeconds"]["default"] == 1
    assert spec["placement"]["properties"]["networkVolumes"]["default"] == "Forbid"
    assert spec["checkpoints"]["properties"]["hashAlgorithm"]["enum"] == [
        "xxh3",
        "blake3",
        "sha256",
    ]


def test_required_fields(root: Schema) -> None:
    assert root["required"] == ["spec"]
    spec = root["properties"]["spec"]
    assert spec["required"] == ["trainer"]
    assert set(spec["properties"]["trainer"]["required"]) == {"image", "command"}


def test_exclusive_bounds_use_openapi_v3_form(root: Schema) -> None:
    ratio = root["properties"]["spec"]["properties"]["monitor"]["properties"]["ghostMemory"][
        "properties"
    ]["ratio"]
    assert ratio["minimum"] == 1.0
    assert ratio["exclusiveMinimum"] is True


def test_status_schema_covers_the_model(root: Schema) -> None:
    status = root["properties"]["status"]["properties"]
    for field in TrainingRunStatus.model_fields.values():
        assert field.alias in status
    condition = status["conditions"]["items"]
    assert set(condition["required"]) == {
        "type",
        "status",
        "lastTransitionTime",
        "reason",
        "message",
    }
    assert condition["properties"]["status"]["enum"] == ["True", "False", "Unknown"]
    assert condition["properties"]["lastTransitionTime"]["format"] == "date-time"


def test_configuration_reference_lists_every_spec_field() -> None:
    text = crdgen.configuration_markdown()
    for path, _ in walk(crdgen.root_schema()["properties"]["spec"], "spec"):
        if path.count(".") and not path.endswith(("[]", "{}")):
            assert f"`{path.rsplit('.', 1)[1].removesuffix('[]')}`" in text, path
    assert "an hf:// layer holds model weights only" in text
