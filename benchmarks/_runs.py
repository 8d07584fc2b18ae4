"""The records of the convergence benchmark's runs: what each trained on (its plan's digest) and measured,
and the reuse of a former record's runs (``--reuse``), which a run's digest guards."""

from __future__ import annotations

import pathlib
from dataclasses import dataclass, field

import numpy as np


@dataclass
class Run:
    """One strategy, one seed, one view: what it trained on and what it measured."""

    strategy: str
    seed: int
    view: str
    steps: list[list[tuple[np.ndarray, bool]]] = field(default_factory=list)
    curve: list[dict] = field(default_factory=list)
    step_loss: list[float] = field(default_factory=list)
    trained: list[np.ndarray] = field(default_factory=list)
    seconds: float = 0.0
    plan: str = ""  # the digest of ``steps`` (``digest``): what a reused run must have trained on


def digest(steps) -> str:
    """A digest of what a run trains on, step by step: its micro-batches' samples in order, and how they are
    laid out. Reuse compares it, since a run is a pure function of its seed and its plan, and a plan changes
    with the library (a planner default) as well as with the setup."""
    import hashlib

    h = hashlib.sha256()
    for step in steps:
        h.update(b"step")
        for indices, packed in step:
            h.update(b"P" if packed else b"B")
            h.update(len(indices).to_bytes(8, "little"))
            h.update(np.asarray(indices, dtype="<i8").tobytes())
    return h.hexdigest()[:16]


def reused(paths: list[pathlib.Path], setup: dict) -> dict[tuple[str, int, str], Run]:
    """The runs former ``convergence.json`` files recorded for the same setup (model size, step target, steps,
    device), by ``(strategy, seed, view)``. Training is deterministic for a seed and a plan, so a run is what
    training again would give where its plan's digest is the same (``run_all`` compares them; a record without
    digests reuses nothing). A file of another setup is refused."""
    import json

    out = {}
    for path in paths:
        record = json.loads(path.read_text())
        differs = {k: (record.get(k), v) for k, v in setup.items() if record.get(k) != v}
        if differs:
            raise SystemExit(f"--reuse {path}: recorded for another setup ({differs}): rerun without it")
        out.update(runs_of(record))
    return out


def same_plan(done: dict[tuple[str, int, str], Run], run: Run) -> Run | None:
    """A former run of another strategy that trained ``run``'s plan with its seed and view: what training
    ``run`` gives, since a run is a pure function of its seed and its plan (a default that moved onto another
    strategy's setting reuses that strategy's runs)."""
    for former in done.values():
        if former.plan and former.plan == run.plan and (former.seed, former.view) == (run.seed, run.view):
            return former
    return None


def runs_of(record: dict) -> dict[tuple[str, int, str], Run]:
    """A record's runs by ``(strategy, seed, view)``."""
    out = {}
    for r in record["runs"]:
        run = Run(r["strategy"], r["seed"], r["view"], curve=r["curve"], step_loss=r["step_loss"])
        run.seconds, run.plan = r["seconds"], r.get("plan", "")
        out[(run.strategy, run.seed, run.view)] = run
    return out
