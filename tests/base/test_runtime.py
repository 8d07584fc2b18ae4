"""The one owner of background threads and exit/fork hooks (``base/runtime.py``, issue 60): background work
hands back its result or error, a thread the OS refuses means no background work (never a future that
never ends), and at exit workers are stopped, background work finished, then held files released, in
that order, each step running even when one before it raised."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest
from dflash_batch.base import runtime


def test_background_work_hands_back_its_result_and_its_error():
    done = runtime.background(lambda: 41 + 1, "test-result")
    assert done is not None and done.result(timeout=60) == 42

    def fails() -> None:
        raise ValueError("planned badly")

    failed = runtime.background(fails, "test-error")
    assert failed is not None
    with pytest.raises(ValueError, match="planned badly"):
        failed.result(timeout=60)
    assert runtime.finish_background(60)


def test_no_thread_to_be_had_is_no_background_work(monkeypatch):
    def refused(*_args):
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(runtime, "thread", refused)
    assert runtime.background(lambda: 1, "test-refused") is None
    assert runtime.finish_background(0), "nothing left waiting for a thread that never started"


def test_finish_background_says_when_its_time_ran_out():
    release = threading.Event()
    slow = runtime.background(lambda: release.wait(60), "test-slow")
    assert slow is not None
    assert not runtime.finish_background(0.01)
    release.set()
    assert runtime.finish_background(60) and slow.result() is True


EXIT_ORDER = """
import threading
from dflash_batch.base import runtime

runtime._EXIT_WAIT_S = 30.0  # finished before the workers stopped, the wait would run out: a failure
gate = threading.Event()

class Owner:
    def close(self):
        print("stop", flush=True)
        gate.set()  # the background work can end only once workers are stopped
        raise OSError("a worker that fails to stop")  # printed; the next steps still run

owner = Owner()
runtime.stop_at_exit(owner)
def work():
    gate.wait(60)
    print("finish", flush=True)
runtime.background(work, "test-exit")
runtime.release_at_exit(lambda: print("release", flush=True))
"""


def test_exit_stops_workers_then_finishes_background_work_then_releases():
    done = subprocess.run([sys.executable, "-c", EXIT_ORDER], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["stop", "finish", "release"]
    assert "a worker that fails to stop" in done.stderr
