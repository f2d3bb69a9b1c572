"""The checkpoint manifest model and the names in a checkpoint root."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from trainguard.ckpt import FORMAT_VERSION, Contents, FileEntry, Manifest
from trainguard.ckpt.layout import parse_step_dirname, step_dirname

pytestmark = pytest.mark.unit


def _manifest(**overrides: object) -> Manifest:
    fields: dict[str, object] = {
        "format_version": FORMAT_VERSION,
        "step": 7,
        "time": 1.5,
        "contents": "full",
        "hash_algorithm": "xxh3-128",
        "files": [{"path": "a.bin", "size": 3, "hash": "ab"}],
        "metadata": {"producer": "test", "nested": {"n": [1, 2]}},
    }
    fields.update(overrides)
    return Manifest.model_validate(fields)


def test_manifest_round_trips_through_its_on_disk_form() -> None:
    manifest = _manifest()
    again = Manifest.from_json_bytes(manifest.to_json_bytes())
    assert again == manifest
    assert again.contents is Contents.FULL
    assert again.total_bytes == 3
    assert manifest.to_json_bytes().endswith(b"\n")


@pytest.mark.parametrize("path", ["", "/abs", "../up", "a/../b", "./a", "a//b", "MANIFEST.json"])
def test_file_paths_must_stay_inside_the_checkpoint(path: str) -> None:
    with pytest.raises(ValidationError):
        FileEntry(path=path, size=0, hash="")


def test_nested_relative_paths_are_allowed() -> None:
    assert FileEntry(path="sub/dir/x.bin", size=1, hash="h").path == "sub/dir/x.bin"


@pytest.mark.parametrize(
    "overrides",
    [
        {"files": [{"path": "a", "size": 1, "hash": "x"}, {"path": "a", "size": 1, "hash": "x"}]},
        {"contents": "everything"},
        {"step": -1},
        {"files": [{"path": "a", "size": -1, "hash": "x"}]},
        {"unknown_field": 1},
    ],
)
def test_malformed_manifests_are_rejected(overrides: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        _manifest(**overrides)


def test_step_directory_names_have_eight_digits() -> None:
    assert step_dirname(0) == "step-00000000"
    assert step_dirname(1234) == "step-00001234"
    assert parse_step_dirname("step-00001234") == 1234
    for name in ("step-1234", "step-000012345", ".tmp-step-00000001-1-2", "step-0000123x"):
        assert parse_step_dirname(name) is None
    with pytest.raises(ValueError):
        step_dirname(10**8)
    with pytest.raises(ValueError):
        step_dirname(-1)
