"""The one owner of the package's background threads and of what runs at interpreter exit and before a
fork. Every other module asks it: a thread for a Loader's worker (:func:`thread`), a plan made in the
background (:func:`background`), an object to stop at exit (:func:`stop_at_exit`), files to release at
exit (:func:`release_at_exit`). Its own hooks run those in one stated order, instead of in the reverse
order of whichever module happened to be imported first:

1. **stop** every registered worker owner (Loaders): a daemon thread still inside Rust must not return
   into a finalizing interpreter;
2. **finish** the work running in the background (plans of the next epoch), at most :data:`_EXIT_WAIT_S`
   seconds. A daemon thread still inside Rust returns into a finalizing interpreter, which ends it with
   ``pthread_exit``; the unwinding reaches pyo3's frames and aborts the process ("FATAL: exception not
   rethrown", seen when a script ended while the next epoch was planned ahead): a training run that
   finished would exit with a signal. Planning cannot be interrupted; an epoch's plan takes seconds at
   most, or as long as the process planning it for the machine (whose lock it waits on);
3. **release** what the run held (a plan directory's files, ``planning/plan_files.py``): after 2, so the
   plans being made are finished before their files are removed.

Before a fork (``os.register_at_fork``) the background work is finished too: a child would otherwise
inherit a plan directory's lock, held by a thread that does not exist in it, for as long as it lives.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time
import traceback
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout  # not the builtin before Python 3.11
from typing import Any, TypeVar

T = TypeVar("T")

#: Guards :data:`_RUNNING` and :data:`_EXITING`.
_LOCK = threading.Lock()
#: Work running in the background, started by :func:`background`.
_RUNNING: set[Future[Any]] = set()
#: Set once the interpreter exits: no background work starts after that.
_EXITING = False
#: The longest the interpreter's exit waits for background work, in seconds.
_EXIT_WAIT_S = 600.0
#: Objects whose ``close()`` stops their threads (step 1 at exit).
_STOPPABLE: weakref.WeakSet[Any] = weakref.WeakSet()
#: Functions releasing what the process held (step 3 at exit), in the order given.
_RELEASES: list[Callable[[], None]] = []


def thread(target: Callable[[], None], name: str) -> threading.Thread:
    """A started daemon thread running ``target`` (its owner stops it: see :func:`stop_at_exit`)."""
    worker = threading.Thread(target=target, name=name, daemon=True)
    worker.start()
    return worker


def background(work: Callable[[], T], name: str) -> Future[T] | None:
    """``work()`` started on a thread of its own; its result or error lands in the future returned.
    ``None`` once the interpreter exits (nothing starts then), or when the OS gives no thread: the caller
    does the work itself when it needs the result."""
    with _LOCK:
        if _EXITING:
            return None
        future: Future[T] = Future()
        _RUNNING.add(future)

    def run() -> None:
        try:
            future.set_result(work())
        except BaseException as error:  # handed to whoever asks for the result
            future.set_exception(error)
        finally:
            with _LOCK:
                _RUNNING.discard(future)

    try:
        thread(run, name)
    except RuntimeError:  # no thread to be had ("can't start new thread"): the caller works without one
        with _LOCK:
            _RUNNING.discard(future)
        return None
    return future


def stop_at_exit(owner: Any) -> None:
    """Calls ``owner.close()`` at interpreter exit while ``owner`` lives (held weakly)."""
    _STOPPABLE.add(owner)


def release_at_exit(release: Callable[[], None]) -> None:
    """Calls ``release()`` at interpreter exit, after the background work is finished (once)."""
    if release not in _RELEASES:
        _RELEASES.append(release)


def finish_background(timeout: float | None = None) -> bool:
    """Waits for the background work, at most ``timeout`` seconds (``None``: until it is done); ``False``
    when the time ran out first."""
    with _LOCK:
        running = list(_RUNNING)
    deadline = None if timeout is None else time.monotonic() + timeout
    for future in running:
        left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
        try:
            future.exception(left)  # waits; the error, if any, is for whoever asks for the result
        except FutureTimeout:
            return False
    return True


def _guarded(step: Callable[[], object]) -> None:
    """One step at exit; an error in it is printed and the other steps still run."""
    try:
        step()
    except Exception:
        traceback.print_exc()


def _at_exit() -> None:
    """Stop, finish, release (see the module docs)."""
    global _EXITING
    for owner in list(_STOPPABLE):
        _guarded(owner.close)
    with _LOCK:
        _EXITING = True  # nothing starts after this, so the wait below sees all of it
    if not finish_background(_EXIT_WAIT_S):
        print(
            f"dflash_batch: the next epoch's plan is still being made after {_EXIT_WAIT_S:.0f} s at exit "
            "(another process of this machine may hold the plan directory's lock); exiting without it",
            file=sys.stderr,
        )
    for release in list(_RELEASES):
        _guarded(release)


atexit.register(_at_exit)
if hasattr(os, "register_at_fork"):  # POSIX only; elsewhere there is no fork to inherit a lock through
    os.register_at_fork(before=finish_background)
