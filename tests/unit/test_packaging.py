"""What ships: the product and development wheels, the two images, and a slim trainer side.

Both wheels are built offline from a copy of the checkout (its tracked and untracked,
not ignored, files). The product wheel `trainguard` holds the programs (operator, agent,
init steps, command line), the ground packages and the trainer harness, and nothing of the
development tools; `trainguard-dev` holds only those. The base requirements are the ground's
and the harness's; the operator's clients and torch come only with their extras.

The trainer side is installed the way the trainer image installs it, without the `operator`
extra, into a fresh virtualenv: the product wheel itself, and the distributions its base
requirements (and later its `trainer` extra) need, linked from this environment. There the
operator's dependencies cannot be imported, every harness module imports (torch-free ones
without torch), `trainguard supervise` runs a command, and `trainguard operator` says which
extra it needs.
"""

from __future__ import annotations

import email.parser
import importlib.metadata
import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from trainguard.cli.main import EXTRA_OF_PACKAGE

pytestmark = [pytest.mark.unit, pytest.mark.timeout(180)]

REPO = Path(__file__).resolve().parents[2]
# Top-level package -> its source folder in the checkout.
PRODUCT_SOURCES = {
    "trainguard": "operator/trainguard",
    "trainguard_harness": "trainer-image/trainguard_harness",
}
DEV_SOURCES = {"trainguard_dev": "dev/trainguard_dev"}
PROGRAMS = ("operator", "agent", "initsteps", "cli")
GROUND = ("api", "ckpt", "contract", "layers")
# Path parts (module stems) that belong to the development tools or the tests.
DEV_PARTS = frozenset(
    [
        *("trainguard_dev", "devcluster", "cluster", "demo", "procnode", "crdgen", "testing"),
        *("tests", "conftest"),
    ]
)
# Distributions the product's base install must not pull in, and the extra that brings each.
EXTRA_OF_DISTRIBUTION = {
    "kopf": "operator",
    "kubernetes": "operator",
    "prometheus-client": "operator",
    "boto3": "operator",
    "paramiko": "operator",
    "huggingface-hub": "operator",
    "torch": "trainer",
}
# Modules the operator extra brings; they, the development tools' own and their PyYAML are
# never on the trainer side.
OPERATOR_MODULES = (
    "kopf",
    "kubernetes",
    "boto3",
    "paramiko",
    "huggingface_hub",
    "prometheus_client",
)
NEVER_ON_TRAINER_SIDE = (*OPERATOR_MODULES, "botocore", "yaml", "trainguard_dev")
# The ground the harness stands on, and the command line: each imports with the base install.
GROUND_MODULES = (
    "trainguard.api",
    "trainguard.ckpt",
    "trainguard.contract",
    "trainguard.gpu",
    "trainguard.cli.main",
)
# Harness modules that must import without torch: the supervisor and what it runs on.
TORCH_FREE_HARNESS = (
    "trainguard_harness",
    "trainguard_harness.supervisor",
    "trainguard_harness.settings",
    "trainguard_harness.heartbeat",
    "trainguard_harness.gpu_publisher",
    "trainguard_harness.stackdump",
)


@dataclass(frozen=True)
class Wheels:
    """The wheels built from one copy of the checkout, and the files copied."""

    product: Path
    dev: Path
    sources: frozenset[str]


def _checkout_files() -> list[str]:
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.decode()
    return [name for name in listed.split("\0") if name and (REPO / name).is_file()]


def _build_wheel(source: Path, out: Path) -> Path:
    before = set(out.glob("*.whl"))
    offline = ("-q", "--no-deps", "--no-build-isolation", "--no-index")
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", *offline, "-w", str(out), str(source)],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    (built,) = set(out.glob("*.whl")) - before
    return built


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Wheels:
    """Build `trainguard` and `trainguard-dev` from a copy of the checkout."""
    # The build backend, from this environment: the wheels are built offline.
    assert importlib.util.find_spec("setuptools") is not None, "pip install setuptools"
    root = tmp_path_factory.mktemp("wheels")
    source, out = root / "checkout", root / "dist"
    out.mkdir()
    files = _checkout_files()
    for name in files:
        target = source / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, target)
    product = _build_wheel(source, out)
    dev = _build_wheel(source / "dev", out)
    return Wheels(product=product, dev=dev, sources=frozenset(files))


def _names(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as archive:
        return archive.namelist()


def _dist_info(wheel: Path, name: str) -> str:
    with zipfile.ZipFile(wheel) as archive:
        (member,) = [n for n in archive.namelist() if re.fullmatch(rf"[^/]+\.dist-info/{name}", n)]
        return archive.read(member).decode()


def _source_modules(sources: Iterable[str], packages: dict[str, str]) -> set[str]:
    """The wheel paths the .py files under each package's source folder should have."""
    found = set()
    for name in sources:
        for package, folder in packages.items():
            if name.startswith(folder + "/") and name.endswith(".py"):
                found.add(package + name[len(folder) :])
    return found


def _module_names(wheel_paths: Iterable[str]) -> list[str]:
    modules = []
    for path in wheel_paths:
        pure = PurePosixPath(path)
        if pure.suffix != ".py":
            continue
        parts = pure.with_suffix("").parts
        modules.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return sorted(modules)


def _requirements(wheel: Path) -> list[Requirement]:
    metadata = email.parser.Parser().parsestr(_dist_info(wheel, "METADATA"))
    return [Requirement(line) for line in metadata.get_all("Requires-Dist") or []]


def _needed_with(requirements: Iterable[Requirement], extra: str) -> list[Requirement]:
    """The requirements in force when `extra` is asked for ("" for the base install)."""
    return [r for r in requirements if r.marker is None or r.marker.evaluate({"extra": extra})]


# --- the wheels -------------------------------------------------------------------------------


def test_product_wheel_holds_the_programs_ground_and_harness(wheels: Wheels) -> None:
    names = _names(wheels.product)
    tops = {PurePosixPath(n).parts[0] for n in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == set(PRODUCT_SOURCES)
    assert {t for t in tops if t.endswith(".dist-info")} == {"trainguard-0.1.0.dist-info"}
    for folder in (*PROGRAMS, *GROUND):
        assert f"trainguard/{folder}/__init__.py" in names, folder
    for path in ("trainguard/gpu.py", "trainguard/py.typed", "trainguard_harness/py.typed"):
        assert path in names
    for module in ("supervisor", "session", "writer", "train"):
        assert f"trainguard_harness/{module}.py" in names
    # Every product source file ships, and no other Python file does.
    shipped = {n for n in names if n.endswith(".py")}
    assert shipped == _source_modules(wheels.sources, PRODUCT_SOURCES)


def test_product_wheel_holds_no_development_tool_or_test(wheels: Wheels) -> None:
    names = _names(wheels.product)
    offending = [
        n
        for n in names
        if any(
            PurePosixPath(part).stem in DEV_PARTS or part.startswith("test_")
            for part in PurePosixPath(n).parts
        )
    ]
    assert offending == [], offending
    # The names looked for are really those of the development tools.
    dev_stems = {PurePosixPath(p).stem for n in _names(wheels.dev) for p in PurePosixPath(n).parts}
    assert {"trainguard_dev", "cluster", "demo", "procnode", "crdgen"} <= dev_stems
    # Only the development tools add subcommands; the product has its console script alone.
    entry_points = _dist_info(wheels.product, "entry_points.txt")
    assert "trainguard = trainguard.cli.main:main" in entry_points
    assert "trainguard.commands" not in entry_points


def test_dev_wheel_holds_only_the_development_tools(wheels: Wheels) -> None:
    names = _names(wheels.dev)
    tops = {PurePosixPath(n).parts[0] for n in names}
    assert tops == {"trainguard_dev", "trainguard_dev-0.1.0.dist-info"}
    shipped = {n for n in names if n.endswith(".py")}
    assert shipped == _source_modules(wheels.sources, DEV_SOURCES)
    for module in ("cluster/procnode.py", "demo/main.py", "crdgen.py"):
        assert f"trainguard_dev/{module}" in names
    entry_points = _dist_info(wheels.dev, "entry_points.txt")
    assert "[trainguard.commands]" in entry_points
    assert "trainguard_dev.demo.main" in entry_points


def test_base_requirements_bring_no_operator_client_and_no_torch(wheels: Wheels) -> None:
    requirements = _requirements(wheels.product)
    base = {canonicalize_name(r.name) for r in _needed_with(requirements, "")}
    assert base, "the ground needs pydantic, xxhash and nvidia-ml-py"
    assert {"pydantic", "xxhash", "nvidia-ml-py"} <= base
    assert base.isdisjoint(EXTRA_OF_DISTRIBUTION), base & set(EXTRA_OF_DISTRIBUTION)
    assert "trainguard-dev" not in base
    for distribution, extra in EXTRA_OF_DISTRIBUTION.items():
        with_extra = {canonicalize_name(r.name) for r in _needed_with(requirements, extra)}
        assert distribution in with_extra, f"{distribution} belongs to the {extra!r} extra"
    with_operator = {canonicalize_name(r.name) for r in _needed_with(requirements, "operator")}
    assert "torch" not in with_operator


# --- the images -------------------------------------------------------------------------------


def _instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(instruction, arguments) pairs, continuation lines joined and comments dropped."""
    text = dockerfile.read_text()
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    joined = re.sub(r"\\\n", " ", "\n".join(lines))
    found = []
    for line in joined.splitlines():
        if line.strip():
            word, _, rest = line.strip().partition(" ")
            found.append((word.upper(), " ".join(rest.split())))
    return found


def _copied_sources(dockerfile: Path) -> list[str]:
    sources = []
    for word, rest in _instructions(dockerfile):
        if word in ("COPY", "ADD"):
            args = [a for a in rest.split() if not a.startswith("--")]
            sources += [PurePosixPath(a).as_posix().removeprefix("./") for a in args[:-1]]
    return sources


def _pip_installs(dockerfile: Path) -> list[str]:
    """What each `pip install` in a RUN instruction installs (its non-option arguments)."""
    installs = []
    for word, rest in _instructions(dockerfile):
        if word != "RUN":
            continue
        for command in re.split(r"&&|;|\|\|", rest):
            argv = shlex.split(command)
            for at in range(len(argv) - 1):
                if PurePosixPath(argv[at]).name in ("pip", "pip3") and argv[at + 1] == "install":
                    installs += [a for a in argv[at + 2 :] if not a.startswith("-")]
    return installs


@pytest.mark.parametrize(
    ("dockerfile", "install"),
    [("operator/Dockerfile", ".[operator]"), ("trainer-image/Dockerfile", ".[trainer]")],
)
def test_each_image_installs_the_product_with_its_own_extra(dockerfile: str, install: str) -> None:
    assert _pip_installs(REPO / dockerfile) == [install]


@pytest.mark.parametrize("dockerfile", ["operator/Dockerfile", "trainer-image/Dockerfile"])
def test_no_image_copies_the_development_tools_or_the_tests(dockerfile: str) -> None:
    sources = _copied_sources(REPO / dockerfile)
    assert sources, "the image copies the product's sources"
    for source in sources:
        first = PurePosixPath(source).parts[0]
        assert first not in ("dev", "tests", ".", "*"), f"{dockerfile} copies {source}"


def test_operator_image_context_leaves_out_dev_and_tests() -> None:
    lines = (REPO / "operator/Dockerfile.dockerignore").read_text().splitlines()
    patterns = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    assert patterns[0] == "*", "everything is left out unless let in"
    let_in = [p.removeprefix("!").strip("/") for p in patterns if p.startswith("!")]
    assert not [p for p in let_in if p.split("/")[0] in ("dev", "tests")], let_in


# --- the trainer side, without the operator's dependencies ------------------------------------

PROBE = """
import importlib, importlib.util, json, sys
modules, absent = json.loads(sys.argv[1]), json.loads(sys.argv[2])
results = {}
for name in modules:
    try:
        importlib.import_module(name)
        results[name] = "ok"
    except ModuleNotFoundError as err:
        results[name] = "missing:" + (err.name or "").split(".")[0]
    except Exception as err:
        results[name] = "error:" + repr(err)
import trainguard, trainguard_harness
print(json.dumps({
    "modules": results,
    "present": [m for m in absent if importlib.util.find_spec(m) is not None],
    "origins": [trainguard.__file__, trainguard_harness.__file__],
}))
"""


def _closure(requirements: Iterable[Requirement]) -> dict[str, importlib.metadata.Distribution]:
    """The installed distributions these requirements need, their own requirements included."""
    found: dict[str, importlib.metadata.Distribution] = {}
    seen: set[tuple[str, str]] = set()
    todo = list(requirements)
    while todo:
        requirement = todo.pop()
        name = canonicalize_name(requirement.name)
        dist = importlib.metadata.distribution(requirement.name)
        assert requirement.specifier.contains(dist.version, prereleases=True), (requirement, dist)
        found[name] = dist
        for extra in ("", *sorted(requirement.extras)):
            if (name, extra) in seen:
                continue
            seen.add((name, extra))
            own = [Requirement(line) for line in dist.requires or []]
            todo += _needed_with(own, extra)
    return found


def _link_distributions(dists: Iterable[importlib.metadata.Distribution], into: Path) -> None:
    """Link each distribution's top-level entries (packages, modules, dist-info) into a folder."""
    into.mkdir(parents=True)
    for dist in dists:
        files = dist.files
        assert files, f"{dist.metadata['Name']} has no RECORD"
        root = Path(str(dist.locate_file("")))
        for top in {PurePosixPath(str(f)).parts[0] for f in files}:
            if top in ("..", "__pycache__") or top.endswith(".pth"):
                continue
            if (root / top).exists() and not (into / top).exists():
                (into / top).symlink_to(root / top)


def _probe(python: Path, modules: list[str], cwd: Path) -> dict[str, Any]:
    result = subprocess.run(
        [str(python), "-I", "-c", PROBE, json.dumps(modules), json.dumps(NEVER_ON_TRAINER_SIDE)],
        capture_output=True,
        text=True,
        check=False,
        cwd=cwd,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    probed: dict[str, Any] = json.loads(result.stdout)
    return probed


def _clean_env(venv: Path, **extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("PYTHON") and k not in ("VIRTUAL_ENV", "PIP_PYTHON")
    }
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return {**env, **extra}


def _pip(python: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), *args],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
    )


@dataclass(frozen=True)
class TrainerSide:
    """A virtualenv holding the product wheel and the distributions some extras need."""

    venv: Path
    python: Path
    site: Path
    distributions: frozenset[str]
    modules: list[str]

    @property
    def harness(self) -> list[str]:
        """The trainer harness's modules."""
        return [m for m in self.modules if m.split(".")[0] == "trainguard_harness"]

    def pip(self, *args: str) -> subprocess.CompletedProcess[str]:
        """Run this environment's pip against the virtualenv."""
        return _pip(self.python, *args)

    def run(self, *argv: str) -> subprocess.CompletedProcess[str]:
        """Run a command with the virtualenv first on PATH, in a scratch folder."""
        state = self.venv.parent / "state"
        return subprocess.run(
            argv,
            capture_output=True,
            text=True,
            check=False,
            env=_clean_env(self.venv, TRAINGUARD_STATE_DIR=str(state)),
            cwd=self.venv.parent,
            timeout=60,
        )


def _trainer_side(wheels: Wheels, root: Path, extras: tuple[str, ...]) -> TrainerSide:
    """Install the product wheel without dependencies, then link in what base and extras need."""
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    installed = _pip(python, "install", "-q", "--no-deps", "--no-index", str(wheels.product))
    assert installed.returncode == 0, installed.stdout + installed.stderr
    purelib = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site = Path(
        subprocess.run(
            [str(python), "-I", "-c", purelib], capture_output=True, text=True, check=True
        ).stdout.strip()
    )
    requirements = _requirements(wheels.product)
    needed = [r for extra in ("", *extras) for r in _needed_with(requirements, extra)]
    dists = _closure(needed)
    _link_distributions(dists.values(), root / "linked")
    (site / "trainguard-linked.pth").write_text(f"{root / 'linked'}\n")
    modules = _module_names(_names(wheels.product))
    return TrainerSide(venv, python, site, frozenset(dists), modules)


@pytest.fixture(scope="module")
def base_side(wheels: Wheels, tmp_path_factory: pytest.TempPathFactory) -> TrainerSide:
    """The product's base install: no extra at all."""
    return _trainer_side(wheels, tmp_path_factory.mktemp("base-side"), ())


def _extra_distributions(wheels: Wheels, extra: str) -> set[str]:
    """The distributions an extra brings: its direct requirements and those named above."""
    requirements = _requirements(wheels.product)
    named = {d for d, of in EXTRA_OF_DISTRIBUTION.items() if of == extra}
    needed: set[str] = {canonicalize_name(r.name) for r in _needed_with(requirements, extra)}
    base: set[str] = {canonicalize_name(r.name) for r in _needed_with(requirements, "")}
    return named | (needed - base)


def test_operator_dependencies_are_importable_in_the_development_environment(
    wheels: Wheels,
) -> None:
    # Their absence on the trainer side is then the product's doing, not this machine's.
    for module in (*NEVER_ON_TRAINER_SIDE, "torch"):
        assert importlib.util.find_spec(module) is not None, module
    operator_dists = _extra_distributions(wheels, "operator")
    distributions_of = importlib.metadata.packages_distributions()
    for module in OPERATOR_MODULES:
        assert {canonicalize_name(d) for d in distributions_of[module]} & operator_dists, module


def test_base_install_lacks_the_operators_dependencies_and_torch(
    wheels: Wheels, base_side: TrainerSide
) -> None:
    unwanted = _extra_distributions(wheels, "operator") | {"torch", "pyyaml", "trainguard-dev"}
    assert not base_side.distributions & unwanted, base_side.distributions & unwanted
    assert {"pydantic", "xxhash", "nvidia-ml-py"} <= base_side.distributions
    probed = _probe(base_side.python, [], base_side.venv.parent)
    assert probed["present"] == []
    assert all(o.startswith(str(base_side.site)) for o in probed["origins"]), probed["origins"]


def test_harness_imports_without_the_operators_dependencies_or_torch(
    base_side: TrainerSide,
) -> None:
    probed = _probe(base_side.python, base_side.modules, base_side.venv.parent)
    results: dict[str, str] = probed["modules"]
    # A module either imports or lacks a package that one of the extras brings.
    allowed = {f"missing:{package}" for package in EXTRA_OF_PACKAGE}
    assert {m: r for m, r in results.items() if r != "ok" and r not in allowed} == {}
    ground = [m for m in results if any(m == g or m.startswith(f"{g}.") for g in GROUND_MODULES)]
    assert "trainguard.ckpt.manifest" in ground
    assert {m: results[m] for m in (*TORCH_FREE_HARNESS, *ground) if results[m] != "ok"} == {}
    harness = base_side.harness
    assert {m: results[m] for m in harness if results[m] not in ("ok", "missing:torch")} == {}
    assert "missing:torch" in {results[m] for m in harness}, "torch is really absent here"
    assert results["trainguard.operator.main"] == "missing:kopf"


def test_supervise_runs_a_command_without_the_operators_dependencies(
    base_side: TrainerSide,
) -> None:
    supervised = base_side.run("trainguard", "supervise", "--", "python", "-c", "pass")
    assert supervised.returncode == 0, supervised.stdout + supervised.stderr
    state_file = base_side.venv.parent / "state" / "supervisor.json"
    state = json.loads(state_file.read_text())
    assert state["state"] == "completed", state
    assert state["command"] == ["python", "-c", "pass"]


def test_operator_command_names_the_extra_it_needs(base_side: TrainerSide) -> None:
    refused = base_side.run("trainguard", "operator", "--help")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "trainguard[operator]" in refused.stderr
    listing = base_side.run("trainguard", "--help")
    assert listing.returncode == 0, listing.stderr
    assert "supervise" in listing.stdout
    # The development tools' subcommands come only with their own distribution.
    assert not re.search(r"^\s+(dev|demo)\s", listing.stdout, re.MULTILINE), listing.stdout


def test_harness_imports_with_the_trainer_extra_and_still_no_operator_client(
    wheels: Wheels, tmp_path: Path
) -> None:
    side = _trainer_side(wheels, tmp_path, ("trainer",))
    assert "torch" in side.distributions
    unwanted = _extra_distributions(wheels, "operator") | {"pyyaml", "trainguard-dev"}
    assert not side.distributions & unwanted, side.distributions & unwanted
    probed = _probe(side.python, side.modules, tmp_path)
    assert probed["present"] == []
    assert all(o.startswith(str(side.site)) for o in probed["origins"]), probed["origins"]
    results: dict[str, str] = probed["modules"]
    assert {m: results[m] for m in side.harness if results[m] != "ok"} == {}
    operator_only = {f"missing:{p}" for p, extra in EXTRA_OF_PACKAGE.items() if extra == "operator"}
    assert {m: r for m, r in results.items() if r != "ok" and r not in operator_only} == {}
    # pip agrees that every installed distribution has what it requires.
    checked = side.pip("check")
    assert checked.returncode == 0, checked.stdout + checked.stderr
