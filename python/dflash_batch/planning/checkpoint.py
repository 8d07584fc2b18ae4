"""What a checkpoint of the training position says, and how a state is checked against a schedule.

Two pure functions over a :class:`~dflash_batch.planning.schedule.Schedule`: :func:`encode` writes a position as the
plain dict ``state_dict()`` returns (JSON-ready), :func:`decode` checks a dict and returns the position it
resumes at — on the same ranks, or on another number of ranks, where the samples the checkpointed steps
did not reach are planned again (an :class:`Origin`). Neither changes anything: the
:class:`~dflash_batch.planning.cursor.Cursor` commits a decoded position in one step, so a refused state leaves
everything as it was.
"""

from __future__ import annotations

import operator
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._core import PLAN_REVISION, Plan, PlanError
from ..base.arguments import _epoch, _int, _state_count
from .plan_key import Keys, encode_prices, state_prices
from .schedule import Schedule
from .state_differences import TARGET_DEFAULTS, differences, settings

VERSION = 1
#: What a checkpoint holds besides the settings it names (``state_dict()``'s keys).
REQUIRED = ("version", "epoch", "step", "fingerprint", "world_size")


@dataclass(frozen=True)
class Origin:
    """Where an epoch resumed on another number of ranks came from: ``step`` steps of ``epoch`` had run on
    ``world_size`` ranks; ``plan`` is the rest planned on these ranks, ``carried`` the rows too few to fill
    whole steps there, which the next epoch plans with all its samples; ``fingerprint``: the settings'
    on the old ranks, which a later resume re-making that epoch there checks."""

    epoch: int
    world_size: int
    step: int
    plan: Plan
    carried: np.ndarray
    fingerprint: str

    def record(self, epoch: int) -> dict[str, Any] | None:
        """What a checkpoint taken in ``epoch`` says about this origin (``None``: nothing left of it)."""
        own = {"world_size": self.world_size, "step": self.step, "fingerprint": self.fingerprint}
        if epoch == self.epoch:
            return own
        if epoch == self.epoch + 1 and len(self.carried):
            return {**own, "carried_from": self.epoch}
        return None


@dataclass(frozen=True)
class Resume:
    """A checked position: the next iteration starts at ``step`` of ``epoch`` (planned from ``origin`` when
    that epoch was resumed on another number of ranks, or carries its rest)."""

    epoch: int
    step: int
    origin: Origin | None


def encode(keys: Keys, epoch: int, step: int, origin: Origin | None) -> dict[str, Any]:
    """The state of a position: ``step`` steps of ``epoch`` trained, plus what identifies the plan and the
    rank prices, from which every epoch's key is derived again (:mod:`dflash_batch.planning.plan_key`)."""
    schedule = keys.at(epoch)
    state: dict[str, Any] = {
        "version": VERSION,
        "epoch": epoch,
        "step": step,
        "seed": schedule.config.seed,
        "world_size": schedule.world_size,
        "num_samples": schedule.num_samples,
        "fingerprint": schedule.fingerprint,
        "fingerprint_any_ranks": schedule.fingerprint_any_ranks,
        # The planning rules the epoch was planned under (see rust/core/src/plan/revision.rs).
        "revision": PLAN_REVISION,
        # Plain values (lists, not tuples), so a mismatched resume can name the setting that differs.
        "settings": settings(schedule),
    }
    elastic = origin.record(epoch) if origin is not None else None
    if elastic is not None:
        state["elastic"] = elastic
    if keys.prices:
        state["rank_costs"] = encode_prices(keys.prices)
    return state


def decode(keys: Keys, state: Any, *, warn: bool = True) -> tuple[Resume, Keys]:
    """The position ``state`` resumes at, and the keys it plans with (``keys`` with the prices the state
    records), or a :class:`PlanError` naming what is wrong. Every epoch is checked and re-planned by its
    own key: an elastic origin by its epoch's price, the epoch carrying its rest by that epoch's."""
    _check_shape(state)
    keys = keys.with_prices(state_prices(state))
    epoch = _epoch(state["epoch"])
    schedule = keys.at(epoch)
    _check_revision(schedule, state)
    step, elastic = operator.index(state["step"]), state.get("elastic")
    world = operator.index(state["world_size"])
    if elastic is not None and operator.index(elastic["world_size"]) == world:
        raise PlanError(
            f"state elastic world_size={elastic['world_size']} equals its own world_size={world}: an epoch "
            "resumed elastically moved to another number of ranks; pass the checkpoint's state unedited"
        )
    if world != schedule.world_size and elastic is None:
        # These settings on the state's ranks: a default that depends on the step shape resolves as it
        # did there, so the plan re-made there is the one trained.
        if schedule.fingerprint_on(world) == state["fingerprint"]:
            _check_cycles(schedule, state)
            return Resume(epoch, 0, replanned(schedule, epoch, world, step, warn=warn)), keys
    if elastic is not None and state["fingerprint"] == schedule.fingerprint:
        return _inside_elastic(keys, epoch, step, elastic), keys
    if elastic is not None:
        if "carried_from" in elastic:
            raise PlanError(
                f"state was taken in epoch {state['epoch']}, which also trains samples epoch "
                f"{elastic['carried_from']} left when it moved from world_size {elastic['world_size']} to "
                f"{world}; finish epoch {state['epoch']} on world_size {world}, or resume from a checkpoint "
                "taken at another point"
            )
        raise PlanError(
            f"state was taken in epoch {state['epoch']} after it had moved from world_size "
            f"{elastic['world_size']} to {world}; finish that epoch on world_size {world}, or resume from a "
            "checkpoint taken at another point"
        )
    if state["fingerprint"] != schedule.fingerprint:
        raise PlanError(
            f"state was saved for a different dataset or configuration ({differences(schedule, state)}); "
            "resume with the sampler settings and lengths of the checkpointed run"
        )
    steps = schedule.plan(epoch).steps
    if not 0 <= step <= steps:
        raise PlanError(f"step {step} is outside epoch {epoch}, which has {steps} steps")
    return Resume(epoch, step, None), keys


def _check_cycles(schedule: Schedule, state: dict[str, Any]) -> None:
    """A mixture's cycles walk its sources bucket by bucket, so later epochs continue the cycle only under
    the buckets it began with: refused where the default target resolves differently on these ranks."""
    theirs = settings(schedule, state["world_size"]).get("target_efficiency")
    mine = settings(schedule).get("target_efficiency")
    if schedule.mixture is None or theirs == mine:
        return
    raise PlanError(
        f"a mixture resumed on world_size {schedule.world_size} would aim at target_efficiency {mine!r}, and it "
        f"ran at {theirs!r} on world_size {state['world_size']} ({TARGET_DEFAULTS}): its sources' cycles follow "
        f"the buckets, and would repeat and skip rows from here; pass target_efficiency={theirs!r}"
    )


def _check_shape(state: Any) -> None:
    """The keys and types ``state_dict()`` writes, before any of them is believed."""
    if not isinstance(state, dict):
        raise TypeError(f"state must be a dict from state_dict(), got {type(state).__name__}")
    missing = set(REQUIRED) - state.keys()
    if missing:
        raise PlanError(f"state is missing {sorted(missing)}; pass a dict from BucketSampler.state_dict()")
    if state["version"] != VERSION:
        raise PlanError(f"state version {state['version']!r} is not supported (expected {VERSION!r})")
    _state_count("world_size", state["world_size"], 1)
    _state_count("step", state["step"], 0)
    elastic = state.get("elastic")
    if elastic is not None:
        if not isinstance(elastic, dict) or not {"world_size", "step"} <= elastic.keys():
            raise PlanError(
                f"state elastic={elastic!r} is not what state_dict() writes (a dict with world_size and "
                "step); pass the checkpoint's state unedited"
            )
        _state_count("elastic world_size", elastic["world_size"], 1)
        _state_count("elastic step", elastic["step"], 0)
        if not isinstance(elastic.get("fingerprint", ""), str):
            raise PlanError(
                f"state elastic fingerprint={elastic['fingerprint']!r} is not what state_dict() writes (16 hex "
                "digits); pass the checkpoint's state unedited"
            )


def _inside_elastic(keys: Keys, epoch: int, step: int, elastic: dict[str, Any]) -> Resume:
    """A checkpoint inside an epoch already resumed elastically (or carrying its rest), on these ranks: the
    origin re-planned by its own epoch's key, the carrying epoch by its own."""
    origin_epoch = _epoch(elastic.get("carried_from", epoch))
    if origin_epoch not in (epoch, epoch - 1):
        raise PlanError(
            f"state elastic carried_from={origin_epoch!r} is not epoch {epoch} or the one before; pass the "
            "checkpoint's state unedited"
        )
    # The core refuses an origin step past that epoch's steps on its ranks.
    world, origin_step = operator.index(elastic["world_size"]), operator.index(elastic["step"])
    planned = elastic.get("fingerprint")  # recorded since a default target depends on the step shape
    if planned is not None and keys.at(origin_epoch).fingerprint_on(world) != planned:
        target = keys.at(origin_epoch).settings_on(world).get("target_efficiency")
        raise PlanError(
            f"state's epoch {origin_epoch} began on world_size {world}, where these settings plan it differently "
            f"from how it was trained there (they aim at target_efficiency {target!r} there; {TARGET_DEFAULTS}); "
            "resume with the settings of the checkpointed run"
        )
    origin = replanned(keys.at(origin_epoch), origin_epoch, world, origin_step)
    if origin_epoch == epoch:
        plan = origin.plan
    elif len(origin.carried):
        plan = keys.at(epoch).plan_carrying(epoch, origin.carried)
    else:
        raise PlanError(
            f"state says epoch {epoch} carries samples of epoch {origin_epoch}, but that epoch's rest fits "
            "these ranks; pass the checkpoint's state unedited"
        )
    if not 0 <= step <= plan.steps:
        raise PlanError(f"step {step} is outside the resumed epoch {epoch}, which has {plan.steps} steps")
    return Resume(epoch, step, origin)


def replanned(schedule: Schedule, epoch: int, old_world: int, step: int, *, warn: bool = True) -> Origin:
    """``epoch`` resumed after ``step`` steps on ``old_world`` ranks: the Rust core plans the samples those
    steps did not reach across the schedule's ranks (same seed and epoch, so every rank computes the same
    plan), or, when they are too few to give every rank whole steps, carries them into the next epoch's plan
    (see ``resume.rs``). Later epochs are planned as usual."""
    plan, carried = schedule.plan_resumed(epoch, old_world, step)
    if len(carried) and warn:
        warnings.warn(
            f"the {len(carried)} sample(s) left in epoch {epoch} after step {step} on world_size {old_world} "
            f"cannot give each of world_size {schedule.world_size} ranks a batch in whole steps; epoch {epoch} "
            f"ends here and they are carried into epoch {epoch + 1}, which plans them with all its samples "
            f"(they are trained twice there; if the run ends with epoch {epoch}, they are not trained)",
            stacklevel=5,
        )
    return Origin(epoch, old_world, step, plan, carried, schedule.fingerprint_on(old_world))


def _check_revision(schedule: Schedule, state: dict[str, Any]) -> None:
    """A checkpoint planned under older rules resumes only where its plans did not change since (else its
    epoch would be replayed differently from how it was trained)."""
    revision = state.get("revision", 0)  # written since revision 1
    _state_count("revision", revision, 0)
    same = state["fingerprint"] == schedule.fingerprint
    if not same and schedule.fingerprint_on(state["world_size"]) != state["fingerprint"]:
        return  # other data or settings: refused later, naming what differs
    if state["step"] == 0 and not state.get("elastic"):
        return  # nothing of the epoch was trained: any plan of it is the rest
    resume_next = f"load_state_dict({{**state, 'epoch': {state['epoch']} + 1, 'step': 0}})"
    if revision > PLAN_REVISION:
        raise PlanError(
            f"this checkpoint was planned under planning rules {revision}, newer than this dflash_batch's "
            f"({PLAN_REVISION}), which may plan its epoch differently: resuming mid-epoch could train some "
            "samples twice and skip others. Upgrade dflash_batch to the release that wrote the checkpoint, or "
            f"resume at the next epoch: {resume_next}"
        )
    worlds = {state["world_size"], *([state["elastic"]["world_size"]] if state.get("elastic") else [])}
    changed = [w for w in sorted(worlds) if schedule.plans_changed_since(revision, w)]
    if changed:
        raise PlanError(
            f"this checkpoint was planned under planning rules {revision}, and this dflash_batch (rules "
            f"{PLAN_REVISION}) plans its epoch differently for these settings (mode {schedule.mode!r}, "
            f"{changed[0]} ranks, accumulation {schedule.accumulation}): resuming mid-epoch would train some "
            "samples twice and skip others. Finish the epoch with the dflash_batch release that wrote the "
            f"checkpoint (one whose dflash_batch._core.PLAN_REVISION is {revision}), or resume at the next epoch: "
            f"{resume_next}{_target_hint(schedule, state, changed)}"
        )


def _target_hint(schedule: Schedule, state: dict[str, Any], changed: list[int]) -> str:
    """Where the epoch's plan changed only because a default target moved (revision 5): the target that
    replays it here."""
    theirs = (state.get("settings") or {}).get("target_efficiency")
    if theirs is None or schedule.config.get("target_efficiency") is not None:
        return ""
    given = schedule.replace(target_efficiency=theirs)
    if any(given.plans_changed_since(state.get("revision", 0), world) for world in changed):
        return ""
    return (
        f"; or pass target_efficiency={theirs!r}, the target it was planned at, to finish it here ({TARGET_DEFAULTS})"
    )


def trained_step(value: Any, handed_out: int, epoch: int) -> int:
    """A user's ``state_dict(step=...)``: how many of the ``handed_out`` batches of ``epoch`` were trained."""
    step = _int("step", value)
    if not 0 <= step <= handed_out:
        raise PlanError(
            f"step={step} is invalid: this sampler has handed out {handed_out} batches of epoch "
            f"{epoch}; pass how many of them the training loop has trained on"
        )
    return step
