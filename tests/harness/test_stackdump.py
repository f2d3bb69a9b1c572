"""SIGUSR1 dumps every thread's stack into the state dir, and the process carries on."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from trainguard_dev.testing.polling import eventually
from trainguard_harness.stackdump import stacks_path

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]

HUNG_TRAINER = """
import sys, threading, time
from trainguard_harness.stackdump import install_stack_dumps
install_stack_dumps(sys.argv[1])
inside = threading.Event()

def stuck_in_a_read():
    inside.set()
    time.sleep(60)

def main_loop_waiting():
    inside.wait()
    print("ready", flush=True)  # both threads are now where the dump must find them
    time.sleep(3)

threading.Thread(target=stuck_in_a_read, daemon=True).start()
main_loop_waiting()
print("still alive", flush=True)
"""


def test_sigusr1_dumps_all_threads_without_killing(tmp_path: Path) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", HUNG_TRAINER, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "ready"
    child.send_signal(signal.SIGUSR1)
    dump = stacks_path(tmp_path, child.pid)
    eventually(
        lambda: "main_loop_waiting" in (dump.read_text() if dump.exists() else ""),
        10,
        "a stack dump",
        0.05,
    )
    text = dump.read_text()
    assert "stuck_in_a_read" in text and "main_loop_waiting" in text
    assert "Current thread 0x" in text and text.count("hread 0x") == 2  # both threads
    out, _ = child.communicate(timeout=20)
    assert child.returncode == 0 and "still alive" in out
