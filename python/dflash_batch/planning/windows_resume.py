"""Where a pass of :class:`~dflash_batch.Windows` resumes: a state read and checked, and a resume on another
number of ranks (elastic).

A state is the pass, the window and the steps of its plan taken, with the settings. Resumed on the ranks that
wrote it, the window is planned again, bit for bit, and the iteration goes on after those steps. Resumed on
another ``world_size`` (the settings otherwise equal), the steps taken are the window's plan on the old ranks:
the window's examples those steps did not reach are planned across the new ranks by the core
(``Planner.plan_resumed``, the sampler's elastic resume), and later windows are planned on the new ranks as
usual — no example twice, none skipped. A state taken inside that re-planned window records its *origin* (the
old ranks and their steps), so it resumes on the same new ranks; on yet another number it is refused, naming
the way out (finish the window, or resume at the next one). When the rest of the window is too small to give
every new rank whole steps (a resume on more ranks within the window's last steps), the resume is refused
too, naming the state of the next window: the sampler carries such a rest into its next epoch, but a window
has no next plan of its examples.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import dflash_batch._core as _core

from .._core import PLAN_REVISION, PlanError
from ..base.arguments import _epoch

FORMAT = "dflash_batch.Windows"


class Origin(NamedTuple):
    """A window resumed on other ranks: its index, and the ranks and steps of its plan trained before."""

    window: int
    world_size: int
    step: int


class Resume(NamedTuple):
    """Where a checked state resumes: the pass, (window, steps taken, first example), and the origin."""

    epoch: int
    at: tuple[int, int, int]
    origin: Origin | None


def read(state: Any, config: Any, window_size: int) -> Resume:
    """``state`` checked against this ``Windows``' settings (``config``, a ``_core.Config``) and window size.
    Raises PlanError naming what differs (a world_size alone resumes elastically), a damaged state, or one of
    another plan revision."""
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise PlanError("this is not a dflash_batch.Windows state (state_dict() of a Windows)")
    if state.get("revision") != PLAN_REVISION:
        raise PlanError(
            f"the state was written by plan revision {state.get('revision')!r}, this is {PLAN_REVISION}: "
            "its windows would be planned differently; finish the pass on the version that wrote it"
        )
    try:
        recorded = dict(state["settings"])
        at = (int(state["window"]), int(state["step"]), int(state["start"]))
        epoch = _epoch(state["epoch"])
        elastic = state.get("elastic")
        origin = None if elastic is None else Origin(at[0], int(elastic["world_size"]), int(elastic["step"]))
    except (KeyError, TypeError, ValueError) as error:
        raise PlanError(f"this Windows state is damaged ({type(error).__name__}: {error})") from None
    if min(at) < 0 or at[2] < at[0] * window_size or (origin is not None and min(origin) < 0):
        raise PlanError(f"the state's position {at} (window, step, first example) is not one a stream has")
    settings = dict(config.settings())
    theirs = recorded.get("world_size")
    if isinstance(theirs, int) and not isinstance(theirs, bool) and theirs >= 1 and theirs != settings["world_size"]:
        # Compared as they resolve on the state's ranks (a default target depends on the step shape), with
        # this run's world_size.
        settings = {**dict(config.replace(world_size=theirs).settings()), "world_size": settings["world_size"]}
    differs = [
        f"{key}: {recorded.get(key)!r} there, {value!r} here"
        for key, value in settings.items()
        if key != "world_size" and recorded.get(key) != value
    ]
    if state.get("window_size") != window_size:
        differs.insert(0, f"window: {state.get('window_size')!r} there, {window_size!r} here")
    if differs:
        raise PlanError(
            "the state's windows were planned with other settings (" + "; ".join(differs) + "); resume "
            "with the settings that wrote it"
        )
    world, theirs = settings["world_size"], recorded.get("world_size")
    if theirs == world:
        return Resume(epoch, at, origin)
    if not isinstance(theirs, int) or theirs < 1:
        raise PlanError(f"this Windows state is damaged (world_size {theirs!r})")
    if origin is not None and at[1] == 0:  # nothing of the re-planned rest trained: plan it on these ranks
        return Resume(epoch, at, origin)
    if origin is not None:
        raise PlanError(
            f"this state was taken in window {at[0]} after it was resumed from world_size {origin.world_size} on "
            f"world_size {theirs}; resume it on world_size {theirs} to finish that window, or at the next window "
            f"on any number of ranks: load_state_dict(state) on {theirs} ranks, then checkpoint after window "
            f"{at[0]}"
        )
    if at[1] == 0:  # nothing of the window trained: it is planned on the new ranks from its start
        return Resume(epoch, at, None)
    return Resume(epoch, (at[0], 0, at[2]), Origin(at[0], theirs, at[1]))


def state(epoch: int, at: tuple[int, int, int], origin: Origin | None, window_size: int, settings: dict) -> dict:
    """The state of position ``at`` of pass ``epoch`` (with the origin while inside a re-planned window)."""
    out = {
        "format": FORMAT,
        "revision": PLAN_REVISION,
        "epoch": epoch,
        "window": at[0],
        "step": at[1],
        "start": at[2],
        "window_size": window_size,
        "settings": settings,
    }
    if origin is not None and origin.window == at[0]:
        out["elastic"] = {"world_size": origin.world_size, "step": origin.step}
    return out


def plan_rest(planner: _core.Planner, epoch: int, origin: Origin, start: int, examples: int) -> _core.Plan:
    """The window's examples the origin's steps did not reach, planned on the planner's ranks (the window
    starts at example ``start`` and holds ``examples``)."""
    plan, carried = planner.plan_resumed(epoch, origin.world_size, origin.step)
    if len(carried):
        after = {"window": origin.window + 1, "step": 0, "start": start + examples}
        raise PlanError(
            f"window {origin.window} resumed after {origin.step} steps on world_size {origin.world_size}: the "
            f"{len(carried)} of its {examples} examples left cannot give every one of the {plan.world_size} ranks "
            f"whole steps. Resume on world_size {origin.world_size} to finish the window (then checkpoint after "
            f"it), or leave those {len(carried)} examples out: load_state_dict({{**state, **{after}}}) "
            "starts at the next window on any number of ranks"
        )
    return plan
