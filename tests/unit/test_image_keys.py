"""The project images' cache keys follow what a build reads: the context its ignore file admits."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainguard_dev import images

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]

# The shape of the project's Dockerfile.dockerignore files: everything out but an allow-list.
ALLOW_LIST = """
# comment
*
!pyproject.toml
!operator/
!trainer-image/trainguard_harness/
**/__pycache__
"""


@pytest.mark.parametrize(
    ("path", "ignored"),
    [
        ("pyproject.toml", False),
        ("README.md", True),
        (".venv/bin/python", True),
        ("operator/Dockerfile", False),
        ("operator/trainguard/cli/main.py", False),
        ("operator/trainguard/__pycache__/x.pyc", True),
        ("trainer-image/Dockerfile", True),
        ("trainer-image/trainguard_harness/train.py", False),
        ("trainer-image/trainguard_harness_old/train.py", True),
    ],
)
def test_allow_list_ignore_file(path: str, ignored: bool) -> None:
    assert images.is_ignored(path, images.ignore_patterns(ALLOW_LIST)) is ignored


@pytest.mark.parametrize(
    ("patterns", "path", "ignored"),
    [
        ("*.md", "README.md", True),
        ("*.md", "docs/a.md", False),  # `*` stays within one path element
        ("**/*.md", "docs/a.md", True),
        ("docs", "docs/deep/a.md", True),  # a directory takes what it holds
        ("docs\n!docs/keep.md", "docs/keep.md", False),
        ("docs\n!docs/keep.md", "docs/other.md", True),
        ("!a\na", "a", True),  # the last matching pattern wins
    ],
)
def test_dockerignore_semantics(patterns: str, path: str, ignored: bool) -> None:
    assert images.is_ignored(path, images.ignore_patterns(patterns)) is ignored


def _context(root: Path) -> None:
    for rel, text in {
        "pyproject.toml": "[project]\n",
        "README.md": "readme\n",
        "operator/trainguard/cli.py": "print()\n",
        "operator/trainguard/__pycache__/cli.pyc": "bytes",
        "trainer-image/README.md": "not copied\n",
        "trainer-image/trainguard_harness/train.py": "train()\n",
        ".venv/lib/site.py": "venv\n",
    }.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def _key(root: Path, base: str = "sha256:base") -> str:
    patterns = images.ignore_patterns(ALLOW_LIST)
    files = images.context_files(root, patterns)
    return images.image_key(b"FROM x\n", ALLOW_LIST.encode(), root, files, base)


def test_context_files_are_what_the_ignore_file_admits(tmp_path: Path) -> None:
    _context(tmp_path)
    assert images.context_files(tmp_path, images.ignore_patterns(ALLOW_LIST)) == [
        "operator/trainguard/cli.py",
        "pyproject.toml",
        "trainer-image/trainguard_harness/train.py",
    ]


def test_key_changes_with_admitted_files_and_base_only(tmp_path: Path) -> None:
    _context(tmp_path)
    key = _key(tmp_path)
    assert _key(tmp_path) == key

    # Files the build never sees leave the key alone.
    (tmp_path / "README.md").write_text("edited\n")
    (tmp_path / ".venv/lib/site.py").write_text("edited\n")
    (tmp_path / "operator/trainguard/__pycache__/cli.pyc").write_text("edited")
    assert _key(tmp_path) == key

    # A copied file's content, a new file, its mode and another base each make a new key.
    keys = {key}
    (tmp_path / "operator/trainguard/cli.py").write_text("print(1)\n")
    keys.add(_key(tmp_path))
    (tmp_path / "operator/trainguard/new.py").write_text("\n")
    keys.add(_key(tmp_path))
    (tmp_path / "operator/trainguard/new.py").chmod(0o755)
    keys.add(_key(tmp_path))
    keys.add(_key(tmp_path, base="sha256:other"))
    assert len(keys) == 5


def test_bases_are_keyed_by_recipe_and_the_pinned_torch() -> None:
    python = images.python_base_key()
    assert python == images.python_base_key()
    assert images.torch_base_key(f"python-base-{python}") != images.torch_base_key("python-base-x")
