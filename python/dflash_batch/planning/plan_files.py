"""What a ``plan_dir`` keeps after a run: nothing, after a normal exit of every process that used it.

Each process that plans or maps an epoch in a plan directory holds a shared ``flock`` on
``dflash-<fingerprint>.users`` beside the plans for as long as it lives. At a normal exit it lets go and
tries the lock alone, without waiting: when it gets it, no other process of that planner is alive, so it
removes that planner's plan files (the last epochs' and the one planned ahead), temporaries, lock and
users file. A process killed (``kill -9``, an OOM kill) leaves them: plans are pure functions of their
key, so a later run of the same data and settings uses them, and ``rm <plan_dir>/dflash-*`` clears them
when no run uses the directory. Plans of epochs no rank can still need are removed while the run goes
(``rust/core/src/shared``: all but the epoch before the one planned). Cleanup is best effort: a file that
cannot be removed is only space, and a directory this process cannot lock is left as it is.
``DFLASH_BATCH_KEEP_PLANS=1`` in the environment keeps them (a process that plans epochs ahead of a run
that maps them later).
"""

from __future__ import annotations

import fcntl
import glob
import os
import stat
import threading

from ..base import runtime

#: The users files this process holds a shared lock on, by path: their descriptors.
_HELD: dict[str, int] = {}
_GUARD = threading.Lock()


def use(plan_dir: str, fingerprint: str) -> None:
    """Says this process uses ``plan_dir``'s plans of the planner ``fingerprint`` (until it exits)."""
    path = os.path.join(plan_dir, f"dflash-{fingerprint}.users")
    with _GUARD:
        if path in _HELD:
            return
        try:
            os.makedirs(plan_dir, exist_ok=True)
            # Without blocking: a FIFO at the name must not hang the run (it is refused: no cleanup).
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
        except OSError:
            return
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise OSError("not a regular file")
            fcntl.flock(fd, fcntl.LOCK_SH)
        except OSError:
            os.close(fd)
            return
        _HELD[path] = fd


def _clear_at_exit() -> None:
    """Removes the plans of every planner no other live process uses (see the module docs)."""
    with _GUARD:
        held = list(_HELD.items())
        _HELD.clear()
    keep = os.environ.get("DFLASH_BATCH_KEEP_PLANS") == "1"
    for path, fd in held:
        if keep:
            os.close(fd)
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # another process of the run still uses them
            os.close(fd)
            continue
        stem = path[: -len(".users")]
        for name in glob.glob(glob.escape(stem) + "*"):
            if name != path and (name.endswith((".plan", ".lock")) or ".tmp-" in name):
                try:
                    os.remove(name)
                except OSError:
                    pass
        try:
            os.remove(path)
        except OSError:
            pass
        os.close(fd)


# Released after the plans being made in the background are finished (`base/runtime.py`).
runtime.release_at_exit(_clear_at_exit)
