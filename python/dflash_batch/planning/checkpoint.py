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
from .._core import Mixture as CoreMixture
from ..base.arguments import _epoch, _int, _is_hex, _state_count
from . import settings as settings_declared
from .plan_key import Keys, encode_prices, state_prices
from .schedule import Schedule

VERSION = 1
#: What a checkpoint holds besides the settings it names (``state_dict()``'s keys).
REQUIRED = ("version", "epoch", "step", "fingerprint", "world_size")


@dataclass(frozen=True)
class Origin:
    """Where an epoch resumed on another number of ranks came from: ``step`` steps of ``epoch`` had run on
    ``world_size`` ranks; ``plan`` is the rest planned on these ranks, ``carried`` the rows too few to fill
    whole steps there, which the next epoch plans with all its samples."""

    epoch: int
    world_size: int
    step: int
    plan: Plan
    carried: np.ndarray

    def record(self, epoch: int) -> dict[str, Any] | None:
        """What a checkpoint taken in ``epoch`` says about this origin (``None``: nothing left of it)."""
        if epoch == self.epoch:
            return {"world_size": self.world_size, "step": self.step}
        if epoch == self.epoch + 1 and len(self.carried):
            return {"world_size": self.world_size, "step": self.step, "carried_from": self.epoch}
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
        if state.get("fingerprint_any_ranks") == schedule.fingerprint_any_ranks:
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
    return Origin(epoch, old_world, step, plan, carried)


def _check_revision(schedule: Schedule, state: dict[str, Any]) -> None:
    """A checkpoint planned under older rules resumes only where its plans did not change since (else its
    epoch would be replayed differently from how it was trained)."""
    revision = state.get("revision", 0)  # written since revision 1
    _state_count("revision", revision, 0)
    same = state["fingerprint"] == schedule.fingerprint
    if not same and state.get("fingerprint_any_ranks") != schedule.fingerprint_any_ranks:
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
            f"{resume_next}"
        )


def settings(schedule: Schedule) -> dict[str, Any]:
    """The configuration that shapes the plan, as plain values (a checkpoint may go through JSON)."""
    return {key: value for key, value in schedule.settings().items() if key != "world_size"}


def differences(schedule: Schedule, state: dict[str, Any]) -> str:
    """What differs between a checkpoint's plan and the schedule's, in words."""
    mine = {"num_samples": schedule.num_samples, "world_size": schedule.world_size, **settings(schedule)}
    theirs = {"num_samples": state.get("num_samples"), "world_size": state.get("world_size")}
    theirs.update(state.get("settings") or {})
    differing = [_difference(key, theirs[key], mine[key]) for key in mine if key in theirs and theirs[key] != mine[key]]
    # Settings recorded only when not their default (context_parallel > 1), on one side only.
    for key in sorted(theirs.keys() - mine.keys() - {"mixture", *WHEN_SET}):
        differing.append(f"{key} {theirs[key]!r} vs {UNRECORDED.get(key, 'unset')!r}")
    for key in sorted(mine.keys() - theirs.keys() - {"mixture", *WHEN_SET}) if "settings" in state else ():
        differing.append(f"{key} {UNRECORDED.get(key, 'unset')!r} vs {mine[key]!r}")
    # Recorded only when set (rank_cost: a price refitted from step times by a StepTimer).
    for key in WHEN_SET if "settings" in state else ():
        if theirs.get(key) != mine.get(key):
            differing.append(f"{key} {theirs.get(key)!r} vs {mine.get(key)!r}")
    if "mixture" in mine and "mixture" not in theirs and "settings" in state:
        differing.append("a mixture of sources vs the checkpoint's single dataset")
    if "mixture" in theirs and "mixture" not in mine:
        differing.append("the checkpoint's mixture of sources vs a single dataset here")
    if differing:
        return "checkpoint vs this sampler: " + ", ".join(differing)
    if "settings" not in state:
        return f"num_samples {schedule.num_samples}, seed and world_size match; the rest is not recorded in this state"
    written = schedule.fingerprint
    fingerprint = state.get("fingerprint")
    if not (isinstance(fingerprint, str) and len(fingerprint) == len(written) and _is_hex(fingerprint)):
        return f"its fingerprint {fingerprint!r} is not one this library writes: a corrupted or edited checkpoint"
    return (
        f"the same {schedule.num_samples} samples and settings, but different lengths: another dataset, "
        "or the same one tokenized differently"
    )


#: The values of settings a checkpoint records only when they are not these (the fingerprint folds them in
#: only then, so every earlier fingerprint stands), and the settings recorded only when set: as declared.
UNRECORDED = settings_declared.recorded("unless default")
WHEN_SET = tuple(settings_declared.recorded("when set"))


def _difference(key: str, theirs: Any, mine: Any) -> str:
    """One differing setting in words; a mixture's, the source whose weight (or rows) differ."""
    if key == "mixture" and isinstance(theirs, dict) and isinstance(mine, dict):
        parts = []
        for field in ("weights", "rows"):
            if theirs.get(field) != mine.get(field):
                a, b = theirs.get(field), mine.get(field)
                if field == "weights" and isinstance(a, dict) and isinstance(b, dict) and a.keys() == b.keys():
                    parts += [f"weight of {name!r} {a[name]!r} vs {b[name]!r}" for name in a if a[name] != b[name]]
                else:
                    parts.append(f"mixture {field} {a!r} vs {b!r}")
        parts += [
            f"mixture {field} {theirs.get(field)!r} vs {mine.get(field)!r}"
            for field in ("unit", "max_repeat", "epoch_size")
            if theirs.get(field) != mine.get(field)
        ]
        if theirs.get("schedule") != mine.get("schedule"):
            parts.append(_schedule_difference(theirs, mine))
        return ", ".join(parts) or f"mixture {theirs!r} vs {mine!r}"
    if key == "target_efficiency":
        # Runs priced with attention before the default followed the price planned at 0.98.
        return (
            f"target_efficiency {theirs!r} vs {mine!r} (the default is 0.982 for padded batches priced with "
            f"an attention term, 0.98 otherwise: pass target_efficiency={theirs!r} to resume that run)"
        )
    return f"{key} {theirs!r} vs {mine!r}"


def _schedule_difference(theirs: dict[str, Any], mine: dict[str, Any]) -> str:
    """Where two mixtures' schedules part, in words: the interpolation, or the first epoch whose weights
    differ (both schedules are straight or flat between their points, so checking every point finds it)."""
    a, b = theirs.get("schedule"), mine.get("schedule")
    if b is None:
        return "the checkpoint's weight schedule vs fixed weights here"
    if a is None:
        return "fixed weights in the checkpoint vs a weight schedule here"
    try:
        interpolations = (a["interpolation"], b["interpolation"])
        epochs = sorted({0, *(point[0] for point in a["points"]), *(point[0] for point in b["points"])})
        spec_a, spec_b = _scheduled(theirs), _scheduled(mine)
    except (KeyError, TypeError, ValueError, IndexError):
        return f"weight schedule {a!r} vs {b!r}"
    if interpolations[0] != interpolations[1]:
        return f"schedule interpolation {interpolations[0]!r} vs {interpolations[1]!r}"
    for epoch in epochs:
        weights_a, weights_b = spec_a.weights_at(epoch), spec_b.weights_at(epoch)
        if weights_a != weights_b:
            named = [
                f"{name!r} {x!r} vs {y!r}"
                for name, x, y in zip(spec_a.names, weights_a, weights_b, strict=False)
                if x != y
            ]
            return f"weights at epoch {epoch}: " + ", ".join(named)
    return f"weight schedule {a!r} vs {b!r}"


def _scheduled(recorded: dict[str, Any]) -> CoreMixture:
    """A recorded mixture's sources and schedule, as the core reads them (the weights of any epoch)."""
    names = list(recorded["weights"])
    points = [
        (int(epoch), [float(weights[name]) for name in names]) for epoch, weights in recorded["schedule"]["points"]
    ]
    return CoreMixture(
        names,
        list(recorded["rows"]),
        [float(recorded["weights"][name]) for name in names],
        unit=recorded["unit"],
        max_repeat=float(recorded["max_repeat"]),
        epoch_size=recorded["epoch_size"],
        schedule=points,
        interpolation=recorded["schedule"]["interpolation"],
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
