"""A training pod's containers as different users sharing the pod's fsGroup, as on a real node.

The agent's image runs as 65532 and the trainer's as 10001; the pod's `fsGroup` (65532) is
their shared supplementary group and the kubelet makes shared volumes root:fsGroup, setgid,
group-writable. These tests fork processes into exactly those credentials (the suite runs as
root) and check what crosses between them: the agent cannot signal the trainer, so a hung
trainer is killed through the supervisor; the duplicate-trainer count works without reading
another user's environment and does not count a DataLoader's forked workers; the trainer can
prune a checkpoint the restore step wrote.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from trainguard.agent.signals import count_like
from trainguard.agent.stopping import _by_signal, stop_hung
from trainguard.contract import env
from trainguard.contract.env import PodEnv
from trainguard.contract.files import read_json, share_with_pod
from trainguard.operator.build.pod import POD_FS_GROUP
from trainguard.operator.build.pod import SECRET_MODE as POD_SECRET_MODE
from trainguard.operator.main import identity as operator_identity
from trainguard_dev.testing.polling import eventually
from trainguard_harness import supervisor

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]

AGENT_UID = 65532
TRAINER_UID = 10001
OUTSIDER_UID = 20002
# A Python every user may run (the project's virtualenv may live under a private home).
SYSTEM_PYTHON = "/usr/bin/python3"

if os.geteuid() != 0 or not os.access(SYSTEM_PYTHON, os.X_OK):
    pytest.fail("these tests switch users: run them as root with /usr/bin/python3 present")

# A trainer that registers the harness's SIGUSR1 stack dump and hangs in a named function;
# with FORKS set it first forks that many workers (as a DataLoader does), which sleep.
TRAINER = """
import faulthandler, os, signal, sys, time
out = open(os.environ["STACKS"] % os.getpid(), "a")
faulthandler.register(signal.SIGUSR1, file=out, all_threads=True)
for _ in range(int(os.environ.get("FORKS", "0"))):
    if os.fork() == 0:
        time.sleep(600)
        os._exit(0)
def wait_for_a_peer_that_never_answers():
    time.sleep(600)
open(os.environ["READY"] % os.getpid(), "w").close()
wait_for_a_peer_that_never_answers()
"""


def become(uid: int, groups: list[int] | None = None) -> None:
    """Drop this (forked) process to `uid` with the pod's fsGroup as supplementary group."""
    os.setgroups([POD_FS_GROUP] if groups is None else groups)
    os.setgid(uid)
    os.setuid(uid)


def as_user(uid: int, work: Callable[[], Any], groups: list[int] | None = None) -> Any:
    """Run `work` in a child forked as `uid`; return its JSON-able result (or raise its error)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        os.close(read_end)
        try:
            become(uid, groups)
            result = {"ok": work()}
        except BaseException as err:
            result = {"error": f"{type(err).__name__}: {err}"}
        os.write(write_end, json.dumps(result, default=str).encode())
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as pipe:
        result = json.loads(pipe.read() or '{"error": "no result"}')
    os.waitpid(pid, 0)
    if "error" in result:
        raise AssertionError(f"as uid {uid}: {result['error']}")
    return result["ok"]


def start_as(uid: int, work: Callable[[], int]) -> int:
    """Start `work` in a child forked as `uid` and leave it running; return its PID."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            become(uid)
            code = work()
        finally:
            os._exit(code)
    return pid


@pytest.fixture
def pod_dir() -> Iterator[Path]:
    """A directory every user may traverse (pytest's own temporary root is private to root)."""
    path = Path(tempfile.mkdtemp(prefix="trainguard-pod-users-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def volume(pod_dir: Path) -> Path:
    """A shared volume as the kubelet makes it with fsGroup: root:fsGroup, setgid, g+rwx."""
    shared = pod_dir / "state"
    shared.mkdir()
    os.chown(shared, 0, POD_FS_GROUP)
    shared.chmod(0o2775)
    return shared


@pytest.fixture
def reap() -> Iterator[list[int]]:
    """PIDs of forked processes (and their groups) to kill after the test."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        for kill in (os.killpg, os.kill):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)


def trainer_env(volume: Path, forks: int = 0) -> dict[str, str]:
    return {
        **os.environ,
        "STACKS": str(volume / "stacks-%d.txt"),
        "READY": str(volume / "ready-%d"),
        "FORKS": str(forks),
        env.L1_DIR: str(volume / "l1"),
        env.STATE_DIR: str(volume),
    }


def trainer_command(volume: Path) -> list[str]:
    """The trainer's command line: unique to the test (its volume), as a run's would be."""
    return [SYSTEM_PYTHON, "-c", TRAINER, str(volume)]


def spawn_trainer(volume: Path, reap: list[int], forks: int = 0) -> int:
    """A trainer as the trainer's user, in a session of its own; return its PID once ready."""
    environ = trainer_env(volume, forks)

    def run() -> int:
        os.setsid()
        os.execve(SYSTEM_PYTHON, trainer_command(volume), environ)
        return 1

    pid = start_as(TRAINER_UID, run)
    reap.append(pid)
    eventually(lambda: (volume / f"ready-{pid}").exists(), 20, "the trainer to start")
    return pid


def marker_of(volume: Path) -> bytes:
    return f"{env.L1_DIR}={volume / 'l1'}".encode()


def test_agent_counts_one_trainer_of_another_user_with_forked_workers(
    volume: Path, reap: list[int]
) -> None:
    # Before: the count read /proc/<pid>/environ, which another user may not read, and found
    # no trainer at all; with the same user, every forked worker counted as a duplicate.
    pid = spawn_trainer(volume, reap, forks=3)
    marker = marker_of(volume)
    assert as_user(AGENT_UID, lambda: count_like(pid, marker)) == 1
    assert count_like(pid, marker) == 1  # readable environments (one user): the same count


def test_a_second_trainer_is_still_a_duplicate(volume: Path, reap: list[int]) -> None:
    first = spawn_trainer(volume, reap, forks=2)
    spawn_trainer(volume, reap)
    assert as_user(AGENT_UID, lambda: count_like(first, marker_of(volume))) == 2


def test_agent_may_not_signal_the_trainer_and_says_so(volume: Path, reap: list[int]) -> None:
    pid = spawn_trainer(volume, reap)
    pod = PodEnv(state_dir=volume)
    result = as_user(AGENT_UID, lambda: _by_signal(pod, pid).__dict__)
    assert result["killed"] is False
    assert "may not signal it" in result["how"]
    assert Path(f"/proc/{pid}").exists()  # still running: nothing claimed that did not happen


def test_hung_trainer_of_another_user_is_dumped_and_killed_by_the_supervisor(
    volume: Path, reap: list[int]
) -> None:
    environ = trainer_env(volume)
    state_file = PodEnv(state_dir=volume).supervisor_file

    def supervise() -> int:
        os.environ.clear()
        os.environ.update(environ)
        return supervisor.main(
            ["--state-file", str(state_file), "--no-gpu", "--backoff", "0.2", "--",
             *trainer_command(volume)]
        )  # fmt: skip

    reap.append(start_as(TRAINER_UID, supervise))
    first = eventually(
        lambda: (read_json(state_file) or {}).get("child_pid"), 20, "the supervised trainer"
    )
    reap.append(first)
    eventually(lambda: (volume / f"ready-{first}").exists(), 20, "the trainer to start")
    pod = PodEnv(state_dir=volume)

    result = as_user(AGENT_UID, lambda: stop_hung(pod, first, "step frozen 60 s").__dict__)

    assert result["killed"] is True, result
    assert result["how"] == "killed by the supervisor"
    assert "wait_for_a_peer_that_never_answers" in result["dump"]
    state = read_json(state_file) or {}
    assert state["last_kill"]["pid"] == first and state["last_kill"]["dumped"] is True
    # Restarted in place: a new trainer, the old one recorded as killed by SIGKILL.
    second = eventually(
        lambda: (
            (read_json(state_file) or {}).get("child_pid") not in (None, first)
            and read_json(state_file)
        ),
        20,
        "the restart",
    )["child_pid"]
    reap.append(second)
    assert not Path(f"/proc/{first}").exists() or _is_zombie(first)
    history = (read_json(state_file) or {})["history"]
    assert history[0]["pid"] == first and history[0]["signal"] == "SIGKILL"
    assert second != first


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def _write_checkpoint(l1: Path, shared: bool) -> None:
    if shared:
        share_with_pod()
    step = l1 / "step-00000010"
    (step / "shards").mkdir(parents=True)
    (step / "shards" / "model.bin").write_bytes(b"x" * 64)
    (step / "manifest.json").write_text("{}")


def _prune(l1: Path) -> str:
    try:
        shutil.rmtree(l1 / "step-00000010")
    except PermissionError as err:
        return f"denied: {err}"
    return "pruned"


@pytest.mark.parametrize("shared", [True, False], ids=["pod-umask", "default-umask"])
def test_trainer_prunes_a_checkpoint_restore_wrote(volume: Path, shared: bool) -> None:
    l1 = volume / "l1"
    as_user(AGENT_UID, lambda: _write_checkpoint(l1, shared))
    outcome = as_user(TRAINER_UID, lambda: _prune(l1))
    if shared:
        assert outcome == "pruned"
    else:  # the control: with the default umask 022 the trainer is denied, as before the fix
        assert outcome.startswith("denied"), outcome


def test_agent_reads_a_layer_secret_through_the_group_and_others_cannot(pod_dir: Path) -> None:
    # The Secret file as the kubelet mounts it with defaultMode 0440 and the pod's fsGroup;
    # before, 0400 root-owned: the agent's user could not read its own credentials.
    secret = pod_dir / "credentials" / "AWS_SECRET_ACCESS_KEY"
    secret.parent.mkdir()
    secret.write_text("s3cr3t")
    os.chown(secret, 0, POD_FS_GROUP)
    secret.chmod(POD_SECRET_MODE)

    def read() -> str:
        try:
            return secret.read_text()
        except PermissionError:
            return "denied"

    assert as_user(AGENT_UID, read) == "s3cr3t"
    # Outside the pod's group (another pod's user): denied. The trainer is in the group, so
    # it is kept from the credentials by never mounting them (tests/unit/test_build_pod.py).
    assert as_user(OUTSIDER_UID, read, groups=[]) == "denied"


def test_operator_names_itself_as_a_user_without_a_passwd_entry() -> None:
    # The operator image runs as 65532, which has no entry in the image's password database:
    # kopf's own guess (getpass.getuser) raised KeyError and the operator crash-looped.
    environ = {
        k: os.environ.pop(k) for k in ("LOGNAME", "USER", "LNAME", "USERNAME") if k in os.environ
    }
    try:
        name = as_user(OUTSIDER_UID, operator_identity)
    finally:
        os.environ.update(environ)
    assert name.startswith(f"uid-{OUTSIDER_UID}@"), name
