"""The project's own images, built on a machine without a container engine or a registry.

`operator/Dockerfile` and `trainer-image/Dockerfile` are built as users build them, by BuildKit
(buildkitd and buildctl from hack/tools/buildkit, steps run by the cached runc), with only the
base image swapped through the Dockerfile's own build argument and a BuildKit named context:

- the Python base, for `PYTHON_IMAGE`: Debian bookworm's essential set with python3,
  python3-venv, ca-certificates, passwd and libstdc++6 (mmdebstrap, from Debian's mirror), a
  virtualenv at /opt/venv first on PATH (`python` and `pip` as in the python images; Debian's
  own pip refuses installs, PEP 668), packed as an OCI layout by umoci;
- the torch base, for `BASE_IMAGE`: the Python base plus torch at the version pinned in
  hack/constraints.txt (hack/images/torch-base.Dockerfile), several gigabytes, built once.

The base trusts the CAs this machine's administrator added (/usr/local/share/ca-certificates),
as a base built on this network must for its `RUN pip install` to reach PyPI.

Everything is cached by content under $TRAINGUARD_CACHE/images (default:
~/.cache/trainguard/images, shared by checkouts): a base by its recipe and package list (the
versions Debian served are recorded in its packages.lock), a project image by its Dockerfile,
its ignore file, the build context files that file admits and its base's digest. A project
image is an OCI archive, ready for `ctr images import`, named `trainguard.local/<name>:<key>`.
buildkitd runs only while something is built.

    python -m trainguard_dev.images build      # prints each image's ref and archive
"""

from __future__ import annotations

import argparse
import fcntl
import fnmatch
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("TRAINGUARD_CACHE", REPO / ".cache"))
BIN = CACHE / "bin"


def _images_dir() -> Path:
    """$TRAINGUARD_CACHE/images, else the user's cache, shared by every checkout.

    Images are keyed by content, so checkouts of different revisions share the bases (the
    torch base alone is gigabytes) and each keeps its own project images.
    """
    if os.environ.get("TRAINGUARD_CACHE"):
        return CACHE / "images"
    user_cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(user_cache) / "trainguard" / "images"


IMAGES = _images_dir()

REGISTRY = "trainguard.local"
BUILDKIT_VERSION = "v0.34.2"  # hack/build-buildkit.sh builds it and checks its module's pin
BUILDKIT_KEEP_MB = 10_000
DEBIAN_SUITE = "bookworm"
DEBIAN_SOURCES = (
    "deb http://deb.debian.org/debian bookworm main",
    "deb http://deb.debian.org/debian bookworm-updates main",
    "deb http://deb.debian.org/debian-security bookworm-security main",
)
# On top of Debian's essential set (coreutils, dash, ...): the interpreter, its venv module
# (with the pip wheel), TLS roots, useradd (the trainer's Dockerfile calls it) and the C++
# runtime, which Debian's images have through apt and torch's extensions load.
DEBIAN_PACKAGES = ("python3", "python3-venv", "ca-certificates", "passwd", "libstdc++6")
# As Debian's slim images do: no manuals, translations or docs but the copyrights.
DPKG_OPTIONS = (
    "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/locale/*",
    "path-include=/usr/share/locale/locale.alias",
    "path-exclude=/usr/share/doc/*",
    "path-include=/usr/share/doc/*/copyright",
)
VENV = "/opt/venv"
BASE_ENV = (
    f"PATH={VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LANG=C.UTF-8",
)
BASE_CMD = "python3"
# Run in the new root filesystem ($1) once Debian's packages are in, the added CAs with them.
CUSTOMIZE_HOOKS = (
    'chroot "$1" update-ca-certificates >/dev/null 2>&1',
    f'chroot "$1" python3 -m venv {VENV}',
)
LOCAL_CAS = Path("/usr/local/share/ca-certificates")
TORCH_DOCKERFILE = REPO / "hack" / "images" / "torch-base.Dockerfile"
CONSTRAINTS = REPO / "hack" / "constraints.txt"


@dataclass(frozen=True)
class ProjectImage:
    """A Dockerfile of the project and the build argument that names its base."""

    name: str
    dockerfile: str  # relative to the repository root, which is the build context
    base_arg: str
    base: str  # "python" or "torch"


OPERATOR = ProjectImage("trainguard", "operator/Dockerfile", "PYTHON_IMAGE", "python")
TRAINER = ProjectImage("trainguard-trainer", "trainer-image/Dockerfile", "BASE_IMAGE", "torch")
PROJECT_IMAGES = (OPERATOR, TRAINER)


@dataclass(frozen=True)
class Image:
    """A built image: its reference, OCI archive, manifest digest and the user it declares."""

    name: str
    ref: str
    tar: Path
    digest: str
    user: str


@dataclass(frozen=True)
class Layout:
    """A base image in an OCI layout directory, as BuildKit's named contexts read it."""

    name: str
    path: Path
    digest: str


def log(message: str) -> None:
    """Progress of the build, on stderr."""
    print(f"[images] {message}", file=sys.stderr, flush=True)


def _sha(parts: Iterable[bytes]) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(hashlib.sha256(part).digest())
    return digest.hexdigest()


# --- what a build depends on ------------------------------------------------------------------


def ignore_patterns(text: str) -> list[tuple[bool, str]]:
    """A .dockerignore's patterns, in order, as (is_exception, cleaned pattern)."""
    patterns = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        exception = line.startswith("!")
        pattern = os.path.normpath(line[1:].strip() if exception else line).lstrip("/")
        patterns.append((exception, pattern))
    return patterns


def _pattern_regex(pattern: str) -> re.Pattern[str]:
    # Go's filepath.Match per path element, and `**` for any number of elements, as in
    # moby/patternmatcher, which BuildKit applies to the build context.
    parts = []
    for element in pattern.split("/"):
        if element == "**":
            parts.append("(?:.*)")
        else:
            parts.append(fnmatch.translate(element).removesuffix(r"\Z").replace(".*", "[^/]*"))
    regex = "/".join(parts).replace("(?:.*)/", "(?:.*/)?")
    return re.compile(f"(?s:{regex})\\Z")


def is_ignored(path: str, patterns: Sequence[tuple[bool, str]]) -> bool:
    """Whether the context leaves `path` out: the last pattern matching it or a parent wins."""
    prefixes = []
    parts = path.split("/")
    for i in range(1, len(parts) + 1):
        prefixes.append("/".join(parts[:i]))
    ignored = False
    for exception, pattern in patterns:
        regex = _pattern_regex(pattern)
        if any(regex.match(prefix) for prefix in prefixes):
            ignored = not exception
    return ignored


def _may_hold_exceptions(directory: str, patterns: Sequence[tuple[bool, str]]) -> bool:
    return any(
        exception and (pattern.startswith(directory + "/") or "*" in pattern.split("/")[0])
        for exception, pattern in patterns
    )


def context_files(root: Path, patterns: Sequence[tuple[bool, str]]) -> list[str]:
    """The files of the build context at `root`, sorted, after the ignore file's patterns."""
    found = []
    for current, dirs, files in os.walk(root):
        rel_dir = os.path.relpath(current, root)
        rel_dir = "" if rel_dir == "." else rel_dir + "/"
        dirs[:] = sorted(
            d
            for d in dirs
            if not is_ignored(rel_dir + d, patterns) or _may_hold_exceptions(rel_dir + d, patterns)
        )
        found += [rel_dir + f for f in files if not is_ignored(rel_dir + f, patterns)]
    return sorted(found)


def image_key(
    dockerfile: bytes, ignore: bytes, context: Path, files: Sequence[str], base: str
) -> str:
    """The cache key of a project image: what its build reads, and its base's digest."""
    parts = [BUILDKIT_VERSION.encode(), dockerfile, ignore, base.encode()]
    for rel in files:
        path = context / rel
        executable = b"x" if os.access(path, os.X_OK) else b"-"
        parts += [rel.encode(), executable, path.read_bytes()]
    return _sha(parts)[:16]


def torch_version() -> str:
    """The torch version the harness is tested with (hack/constraints.txt)."""
    for line in CONSTRAINTS.read_text().splitlines():
        if line.startswith("torch=="):
            return line.removeprefix("torch==").strip()
    raise RuntimeError(f"{CONSTRAINTS} pins no torch version")


def _local_cas() -> list[Path]:
    return sorted(LOCAL_CAS.glob("*.crt")) if LOCAL_CAS.is_dir() else []


def python_base_key() -> str:
    """The Python base's key: its recipe (the constants above) and the CAs it trusts."""
    recipe = [DEBIAN_SUITE, *DEBIAN_SOURCES, *DEBIAN_PACKAGES, *DPKG_OPTIONS, *CUSTOMIZE_HOOKS]
    recipe += [*BASE_ENV, BASE_CMD]
    cas = [p.read_bytes() for p in _local_cas()]
    return _sha([*(r.encode() for r in recipe), *cas])[:16]


def torch_base_key(python_base: str) -> str:
    """The torch base's key: the Python base's name (its key), Dockerfile, pinned torch."""
    return _sha([python_base.encode(), TORCH_DOCKERFILE.read_bytes(), torch_version().encode()])[
        :16
    ]


# --- the tools ----------------------------------------------------------------------------------


def _run(argv: Sequence[str | Path], **kwargs: object) -> None:
    subprocess.run([str(a) for a in argv], check=True, **kwargs)  # type: ignore[call-overload]


def _ensure_tools() -> None:
    missing = [p for p in ("mmdebstrap", "umoci") if shutil.which(p) is None]
    if missing:
        log(f"installing from Debian's packages: {' '.join(missing)}")
        _run(
            ["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing],
            env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
            stdout=subprocess.DEVNULL,
        )
    # runc, which runs BuildKit's steps, is the real nodes' (hack/build-node.sh).
    if not (BIN / "runc").exists():
        _run(["bash", REPO / "hack" / "build-node.sh"], stdout=subprocess.DEVNULL)
    if not (BIN / f"buildkitd-{BUILDKIT_VERSION}").exists():
        _run(["bash", REPO / "hack" / "build-buildkit.sh"], stdout=subprocess.DEVNULL)


class BuildKit:
    """A buildkitd of its own (OCI worker, runc, host network), for the duration of a build."""

    def __init__(self, state: Path) -> None:
        self.state = state
        self.root = state / "root"
        # A Unix socket path is limited to 108 bytes: keep it short, outside the cache.
        self.sockdir = Path(tempfile.mkdtemp(prefix="tg-buildkit-"))
        self.addr = f"unix://{self.sockdir}/buildkitd.sock"
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> BuildKit:
        return self

    def _start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        logfile = (self.state / "buildkitd.log").open("ab")
        # No containerd worker; `--oci-worker-net=host` lets RUN pip reach PyPI. The OCI
        # worker leaves oom_score_adj unset, which root without CAP_SYS_RESOURCE needs.
        log(f"starting buildkitd {BUILDKIT_VERSION} (state: {self.state})")
        self.process = subprocess.Popen(
            [
                str(BIN / "buildkitd"),
                "--root", str(self.root),
                "--addr", self.addr,
                "--containerd-worker=false",
                "--oci-worker=true",
                "--oci-worker-binary", str(BIN / "runc"),
                "--oci-worker-net=host",
                "--oci-worker-snapshotter=overlayfs",
                # Room for the torch base's layers, so that a trainer image rebuilt after a
                # change to the project reuses them instead of unpacking gigabytes again.
                f"--oci-worker-gc-keepstorage={BUILDKIT_KEEP_MB}",
            ],
            stdout=logfile,
            stderr=logfile,
        )  # fmt: skip
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and self.process.poll() is None:
            ready = subprocess.run(
                [BIN / "buildctl", "--addr", self.addr, "debug", "workers"],
                capture_output=True,
                check=False,
            )
            if ready.returncode == 0:
                return
            time.sleep(0.2)
        raise RuntimeError(f"buildkitd did not start: see {self.state / 'buildkitd.log'}")

    def __exit__(self, *_: object) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.sockdir, ignore_errors=True)

    def build(
        self,
        what: str,
        dockerfile: Path,
        context: Path,
        build_args: dict[str, str],
        bases: Sequence[tuple[str, Layout]],
        output: str,
    ) -> None:
        """Build `dockerfile` with `context`; each (ref, layout) of `bases` replaces ref."""
        if self.process is None:
            self._start()
        argv: list[str | Path] = [
            BIN / "buildctl", "--addr", self.addr, "build", "--progress=plain",
            "--frontend", "dockerfile.v0",
            "--local", f"context={context}",
            "--local", f"dockerfile={dockerfile.parent}",
            "--opt", f"filename={dockerfile.name}",
            "--output", output,
        ]  # fmt: skip
        for arg, value in build_args.items():
            argv += ["--opt", f"build-arg:{arg}={value}"]
        for ref, layout in bases:
            argv += ["--oci-layout", f"{layout.name}={layout.path}"]
            argv += ["--opt", f"context:{ref}=oci-layout://{layout.name}@{layout.digest}"]
        logpath = IMAGES / "logs" / f"{what}.log"
        logpath.parent.mkdir(parents=True, exist_ok=True)
        start = time.monotonic()
        with logpath.open("w") as logfile:
            process = subprocess.Popen(
                [str(a) for a in argv], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
            assert process.stdout is not None
            for line in process.stdout:
                logfile.write(line)
                # Step headers and errors only; the full output is in the log.
                if re.match(r"#\d+ \[", line) or "ERROR" in line:
                    log(f"{what}: {line.rstrip()[:160]}")
            returncode = process.wait()
        if returncode != 0:
            tail = logpath.read_text().splitlines()[-40:]
            raise RuntimeError(f"building {what} failed (log: {logpath}):\n" + "\n".join(tail))
        log(f"{what}: built in {time.monotonic() - start:.0f} s")


# --- bases ------------------------------------------------------------------------------------


def _layout_digest(path: Path, tag: str) -> str:
    index = json.loads((path / "index.json").read_text())
    for manifest in index["manifests"]:
        if manifest.get("annotations", {}).get("org.opencontainers.image.ref.name") == tag:
            return str(manifest["digest"])
    raise RuntimeError(f"{path} has no image tagged {tag}")


def build_python_base() -> Layout:
    """The Python base's OCI layout, from Debian's packages (about a minute cold)."""
    key = python_base_key()
    name = f"python-base-{key}"
    path = IMAGES / "bases" / name
    if (path / "index.json").exists():
        return Layout(name, path, _layout_digest(path, "latest"))
    log(f"python base {key}: building from Debian {DEBIAN_SUITE} ({', '.join(DEBIAN_PACKAGES)})")
    start = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="python-base-", dir=IMAGES))
    try:
        sources = work / "sources.list"
        sources.write_text("\n".join(DEBIAN_SOURCES) + "\n")
        rootfs = work / "rootfs.tar"
        argv: list[str | Path] = [
            "mmdebstrap", "--quiet", "--variant=essential",
            f"--include={','.join(DEBIAN_PACKAGES)}", "--skip=output/dev",
        ]  # fmt: skip
        argv += [f"--dpkgopt={option}" for option in DPKG_OPTIONS]
        cas = _local_cas()
        if cas:
            argv += [f"--customize-hook=copy-in {' '.join(map(str, cas))} {LOCAL_CAS}"]
        argv += [f"--customize-hook={hook}" for hook in CUSTOMIZE_HOOKS]
        argv += [
            '--customize-hook=chroot "$1" dpkg-query -W -f="\\${Package}=\\${Version}\\n"'
            f' > {work / "packages.lock"}',
            DEBIAN_SUITE, rootfs, sources,
        ]  # fmt: skip
        _run(argv)
        layout = work / "layout"
        _run(["umoci", "init", "--layout", layout])
        _run(["umoci", "new", "--image", f"{layout}:latest"])
        _run(["umoci", "raw", "add-layer", "--image", f"{layout}:latest",
              "--history.created_by", f"mmdebstrap {DEBIAN_SUITE} {' '.join(DEBIAN_PACKAGES)}",
              rootfs])  # fmt: skip
        rootfs.unlink()
        config = ["umoci", "config", "--image", f"{layout}:latest", "--no-history"]
        for env in BASE_ENV:
            config += ["--config.env", env]
        _run([*config, "--config.cmd", BASE_CMD])
        _run(["umoci", "gc", "--layout", layout])
        shutil.move(work / "packages.lock", layout / "packages.lock")
        path.parent.mkdir(parents=True, exist_ok=True)
        _prune_bases("python-base-")
        layout.rename(path)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    log(f"python base {key}: built in {time.monotonic() - start:.0f} s ({_size(path)})")
    return Layout(name, path, _layout_digest(path, "latest"))


def build_torch_base(buildkit: BuildKit, python: Layout) -> Layout:
    """The torch base's OCI layout: the Python base plus PyPI's torch (minutes, gigabytes)."""
    key = torch_base_key(python.name)
    name = f"torch-base-{key}"
    path = IMAGES / "bases" / name
    if (path / "index.json").exists():
        return Layout(name, path, _layout_digest(path, "latest"))
    log(f"torch base {key}: installing torch {torch_version()} from PyPI (gigabytes, minutes)")
    start = time.monotonic()
    _prune_bases("torch-base-")  # before, so that the disk holds one torch base at a time
    partial = path.with_name(path.name + ".partial")
    ref = f"{REGISTRY}/python-base"
    buildkit.build(
        "torch-base",
        TORCH_DOCKERFILE,
        TORCH_DOCKERFILE.parent,
        {"PYTHON_IMAGE": ref, "TORCH_VERSION": torch_version()},
        [(ref, python)],
        f"type=oci,tar=false,dest={partial},name=latest",
    )
    partial.rename(path)
    log(f"torch base {key}: built in {time.monotonic() - start:.0f} s ({_size(path)})")
    return Layout(name, path, _layout_digest(path, "latest"))


def _prune_bases(prefix: str) -> None:
    # A base whose recipe changed is never used again; the torch base alone is gigabytes.
    for old in (IMAGES / "bases").glob(prefix + "*"):
        log(f"removing the superseded base {old.name}")
        shutil.rmtree(old)


def _size(path: Path) -> str:
    total = sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return f"{total / 1e6:.0f} MB"


# --- project images ---------------------------------------------------------------------------


def _read_config(tar: Path) -> tuple[str, dict[str, object]]:
    """An OCI archive's manifest digest and image config."""
    with tarfile.open(tar) as archive:

        def blob(digest: str) -> dict[str, object]:
            member = archive.extractfile("blobs/" + digest.replace(":", "/"))
            assert member is not None
            return json.loads(member.read())  # type: ignore[no-any-return]

        index_file = archive.extractfile("index.json")
        assert index_file is not None
        digest = str(json.loads(index_file.read())["manifests"][0]["digest"])
        manifest = blob(digest)
        config = blob(str(manifest["config"]["digest"]))  # type: ignore[index]
    return digest, config


def _project_key(image: ProjectImage, base: Layout) -> str:
    dockerfile = REPO / image.dockerfile
    ignore = dockerfile.with_name(dockerfile.name + ".dockerignore")
    ignore_text = ignore.read_bytes() if ignore.exists() else b""
    files = context_files(REPO, ignore_patterns(ignore_text.decode()))
    return image_key(dockerfile.read_bytes(), ignore_text, REPO, files, base.digest)


def _cached(name: str, key: str) -> Image | None:
    meta = IMAGES / f"{name}-{key}.json"
    if not meta.exists():
        return None
    data = json.loads(meta.read_text())
    return Image(data["name"], data["ref"], Path(data["tar"]), data["digest"], data["user"])


def _build_project_image(buildkit: BuildKit, image: ProjectImage, base: Layout, key: str) -> Image:
    ref = f"{REGISTRY}/{image.name}:{key}"
    tar = IMAGES / f"{image.name}-{key}.tar"
    log(f"{image.name}: building {image.dockerfile} as {ref}")
    base_ref = f"{REGISTRY}/{image.base}-base"
    partial = tar.with_suffix(".tar.partial")
    buildkit.build(
        image.name,
        REPO / image.dockerfile,
        REPO,
        {image.base_arg: base_ref},
        [(base_ref, base)],
        f"type=oci,dest={partial},name={ref}",
    )
    partial.rename(tar)
    digest, config = _read_config(tar)
    user = str(config.get("config", {}).get("User", ""))  # type: ignore[attr-defined]
    built = Image(image.name, ref, tar, digest, user)
    meta = {"name": built.name, "ref": ref, "tar": str(tar), "digest": digest, "user": user}
    (IMAGES / f"{image.name}-{key}.json").write_text(json.dumps(meta, indent=2) + "\n")
    # An image's older builds are never used again.
    for old in IMAGES.iterdir():
        ours = re.fullmatch(rf"{re.escape(image.name)}-[0-9a-f]{{16}}\.(tar|json)", old.name)
        if ours and key not in old.name:
            old.unlink()
    return built


def build_images(names: Sequence[str] | None = None) -> dict[str, Image]:
    """Build (or find in the cache) the project's images; keyed by image name."""
    wanted = [i for i in PROJECT_IMAGES if names is None or i.name in names]
    IMAGES.mkdir(parents=True, exist_ok=True)
    built: dict[str, Image] = {}
    # One build at a time per cache: a second waits, then finds what the first built.
    with (IMAGES / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _ensure_tools()
        with BuildKit(IMAGES / "buildkit") as buildkit:
            built = _build_all(buildkit, wanted)
    return built


def _build_all(buildkit: BuildKit, wanted: Sequence[ProjectImage]) -> dict[str, Image]:
    built: dict[str, Image] = {}
    python = build_python_base()
    for image in wanted:
        base = build_torch_base(buildkit, python) if image.base == "torch" else python
        key = _project_key(image, base)
        found = _cached(image.name, key)
        if found is not None and found.tar.exists():
            log(f"{image.name}: cached ({found.ref})")
            built[image.name] = found
        else:
            built[image.name] = _build_project_image(buildkit, image, base, key)
    return built


def run_in_image(image: Image, argv: Sequence[str], timeout: float = 600) -> str:
    """Run `argv` once in `image` as the user it declares, with runc, and return its output.

    The archive is unpacked by umoci into a bundle whose runtime config comes from the image's
    own (user, environment, working directory); no engine or containerd takes part.
    """
    work = Path(tempfile.mkdtemp(prefix=f"run-{image.name}-", dir=IMAGES))
    try:
        layout = work / "layout"
        with tarfile.open(image.tar) as archive:
            archive.extractall(layout, filter="tar")
        index = json.loads((layout / "index.json").read_text())
        tag = "run"
        index["manifests"][0].setdefault("annotations", {})["org.opencontainers.image.ref.name"] = (
            tag
        )
        (layout / "index.json").write_text(json.dumps(index))
        bundle = work / "bundle"
        _run(["umoci", "unpack", "--image", f"{layout}:{tag}", bundle], stdout=subprocess.DEVNULL)
        shutil.rmtree(layout)
        config_path = bundle / "config.json"
        config = json.loads(config_path.read_text())
        config["process"]["args"] = list(argv)
        config["process"]["terminal"] = False
        config_path.write_text(json.dumps(config))
        result = subprocess.run(
            [str(BIN / "runc"), "--root", str(work / "runc"), "run", "--bundle", str(bundle),
             f"{image.name}-{work.name[-8:]}"],
            capture_output=True, text=True, timeout=timeout, check=False, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        if result.returncode != 0:
            raise RuntimeError(
                f"{argv} in {image.ref} exited {result.returncode}:\n{result.stdout}{result.stderr}"
            )
        return result.stdout
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m trainguard_dev.images build [NAME...]`: print each image's ref and archive."""
    parser = argparse.ArgumentParser(prog="python -m trainguard_dev.images", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    build = commands.add_parser("build", help="build the project's images (cached by content)")
    known = [i.name for i in PROJECT_IMAGES]
    build.add_argument("names", nargs="*", metavar="NAME", help=f"some of: {', '.join(known)}")
    args = parser.parse_args(argv)
    unknown = set(args.names) - set(known)
    if unknown:
        parser.error(f"unknown images: {', '.join(sorted(unknown))}")
    start = time.monotonic()
    images = build_images(args.names or None)
    for image in images.values():
        print(f"{image.ref}\t{image.tar}\t{image.digest}\tuser={image.user}")
    log(f"done in {time.monotonic() - start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
