"""Checkpoints of a :class:`~dflash_batch.BucketSampler`: what ``state_dict`` records, how
``load_state_dict`` checks a state and resumes it — on the same ranks, or on another number of ranks, where
the samples the checkpointed steps did not reach are planned again — and how a mismatch is put in words.

The functions take the sampler, read its position and commit a checked state to it in one call
(:class:`~dflash_batch.position.Position`): this module is the sampler's checkpoint half (pickling too),
split from it to keep one concept a file.
"""

from __future__ import annotations

import operator
import warnings
from typing import Any

from ._arguments import _epoch, _int, _is_hex, _state_count
from ._core import PLAN_REVISION, PlanError
from .position import Position

VERSION = 1


def state_of(sampler: Any, step: int | None) -> dict[str, Any]:
    """``sampler.state_dict(step)``."""
    position = sampler.position
    epoch, trained, elastic = position.state()
    if step is None:
        step = trained
    else:
        step = _int("step", step)
        if not 0 <= step <= position.step:
            raise PlanError(
                f"step={step} is invalid: this sampler has handed out {position.step} batches of epoch "
                f"{epoch}; pass how many of them the training loop has trained on"
            )
    state = {
        "version": VERSION,
        "epoch": epoch,
        "step": step,
        "seed": sampler._config.seed,
        "world_size": sampler.world_size,
        "num_samples": sampler.num_samples,
        "fingerprint": sampler._fingerprint(),
        "fingerprint_any_ranks": sampler._planner.fingerprint_any_ranks,
        # The planning rules the epoch was planned under (see rust/core/src/plan/revision.rs).
        "revision": PLAN_REVISION,
        # Plain values (lists, not tuples), so a mismatched resume can name the setting that differs.
        "settings": settings(sampler),
    }
    if elastic is not None and elastic["epoch"] == epoch:
        # This epoch's plan is the re-planned rest of an epoch begun on other ranks.
        state["elastic"] = {"world_size": elastic["world_size"], "step": elastic["step"]}
    elif elastic is not None and elastic["epoch"] + 1 == epoch and len(elastic["carried"]):
        # This epoch's plan also holds the samples that rest carried (see replanned).
        state["elastic"] = {
            "world_size": elastic["world_size"],
            "step": elastic["step"],
            "carried_from": elastic["epoch"],
        }
    return state


def load(sampler: Any, state: dict[str, Any]) -> None:
    """``sampler.load_state_dict(state)``: everything is checked (and an elastic resume planned) before
    the position changes, so a refused state leaves the sampler where it was."""
    epoch, step, elastic = _checked(sampler, state)
    sampler.position.restore(epoch, step, elastic)


def _checked(sampler: Any, state: dict[str, Any]) -> tuple[int, int, dict[str, Any] | None]:
    """The position ``state`` resumes at: ``(epoch, step, elastic origin)``, or a :class:`PlanError`."""
    if not isinstance(state, dict):
        raise TypeError(f"state must be a dict from state_dict(), got {type(state).__name__}")
    missing = {"version", "epoch", "step", "fingerprint", "world_size"} - state.keys()
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
    _check_revision(sampler, state)
    epoch, step = _epoch(state["epoch"]), operator.index(state["step"])
    if state.get("world_size") != sampler.world_size and elastic is None:
        if state.get("fingerprint_any_ranks") == sampler._planner.fingerprint_any_ranks:
            return epoch, 0, replanned(sampler, epoch, state["world_size"], step)
    if elastic is not None and state["fingerprint"] == sampler._fingerprint():
        # A checkpoint inside an epoch already resumed elastically (or carrying its rest), on these ranks.
        origin = _epoch(elastic.get("carried_from", epoch))
        if origin not in (epoch, epoch - 1):
            raise PlanError(
                f"state elastic carried_from={origin!r} is not epoch {epoch} or the one before; pass the "
                "checkpoint's state unedited"
            )
        record = replanned(sampler, origin, elastic["world_size"], operator.index(elastic["step"]))
        if origin == epoch:
            plan = record["plan"]
        elif len(record["carried"]):
            plan = sampler._planner.plan_carrying(epoch, record["carried"])
        else:
            raise PlanError(
                f"state says epoch {epoch} carries samples of epoch {origin}, but that epoch's rest "
                "fits these ranks; pass the checkpoint's state unedited"
            )
        if not 0 <= step <= plan.steps:
            raise PlanError(f"step {step} is outside the resumed epoch {epoch}, which has {plan.steps} steps")
        return epoch, step, record
    if elastic is not None:
        if "carried_from" in elastic:
            raise PlanError(
                f"state was taken in epoch {state['epoch']}, which also trains samples epoch "
                f"{elastic['carried_from']} left when it moved from world_size {elastic['world_size']} to "
                f"{state['world_size']}; finish epoch {state['epoch']} on world_size {state['world_size']}, or "
                "resume from a checkpoint taken at another point"
            )
        raise PlanError(
            f"state was taken in epoch {state['epoch']} after it had moved from world_size "
            f"{elastic['world_size']} to {state['world_size']}; finish that epoch on world_size "
            f"{state['world_size']}, or resume from a checkpoint taken at another point"
        )
    if state["fingerprint"] != sampler._fingerprint():
        raise PlanError(
            f"state was saved for a different dataset or configuration ({differences(sampler, state)}); "
            "resume with the sampler settings and lengths of the checkpointed run"
        )
    steps = sampler._planner.plan(epoch).steps
    if not 0 <= step <= steps:
        raise PlanError(f"step {step} is outside epoch {epoch}, which has {steps} steps")
    return epoch, step, None


def replanned(sampler: Any, epoch: int, old_world: int, step: int, *, warn: bool = True) -> dict[str, Any]:
    """The record of ``epoch`` resumed after ``step`` steps on ``old_world`` ranks: the Rust core plans
    the samples those steps did not reach across the sampler's ranks (same seed and epoch, so every rank
    computes the same plan), or, when they are too few to give every rank whole steps, carries them into
    the next epoch's plan (see ``resume.rs``). Later epochs are planned as usual."""
    plan, carried = sampler._planner.plan_resumed(epoch, old_world, step)
    if len(carried) and warn:
        warnings.warn(
            f"the {len(carried)} sample(s) left in epoch {epoch} after step {step} on world_size {old_world} "
            f"cannot give each of world_size {sampler.world_size} ranks a batch in whole steps; epoch {epoch} "
            f"ends here and they are carried into epoch {epoch + 1}, which plans them with all its samples "
            f"(they are trained twice there; if the run ends with epoch {epoch}, they are not trained)",
            stacklevel=5,
        )
    return {"epoch": epoch, "plan": plan, "world_size": old_world, "step": step, "carried": carried}


def carried_plan(sampler: Any, epoch: int) -> Any:
    """Epoch ``epoch``'s plan when it carries the rest of an elastically resumed epoch before it,
    else None."""
    elastic = sampler.position.elastic
    if elastic is None or epoch != elastic["epoch"] + 1 or not len(elastic["carried"]):
        return None
    return sampler._planner.plan_carrying(epoch, elastic["carried"])


def _check_revision(sampler: Any, state: dict[str, Any]) -> None:
    """A checkpoint planned under older rules resumes only where its plans did not change since (else its
    epoch would be replayed differently from how it was trained)."""
    revision = state.get("revision", 0)  # written since revision 1
    _state_count("revision", revision, 0)
    same = state["fingerprint"] == sampler._fingerprint()
    if not same and state.get("fingerprint_any_ranks") != sampler._planner.fingerprint_any_ranks:
        return  # other data or settings: refused below, naming what differs
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
    changed = [w for w in sorted(worlds) if sampler._planner.plans_changed_since(revision, w)]
    if changed:
        raise PlanError(
            f"this checkpoint was planned under planning rules {revision}, and this dflash_batch (rules "
            f"{PLAN_REVISION}) plans its epoch differently for these settings (mode {sampler._config.mode!r}, "
            f"{changed[0]} ranks, accumulation {sampler.accumulation}): resuming mid-epoch would train some "
            "samples twice and skip others. Finish the epoch with the dflash_batch release that wrote the "
            f"checkpoint, or resume at the next epoch: {resume_next}"
        )


def settings(sampler: Any) -> dict[str, Any]:
    """The configuration that shapes the plan, as plain values (a checkpoint may go through JSON)."""
    return {key: value for key, value in sampler._config.settings().items() if key != "world_size"}


def differences(sampler: Any, state: dict[str, Any]) -> str:
    """What differs between a checkpoint's plan and the sampler's, in words."""
    mine = {"num_samples": sampler.num_samples, "world_size": sampler.world_size, **settings(sampler)}
    theirs = {"num_samples": state.get("num_samples"), "world_size": state.get("world_size")}
    theirs.update(state.get("settings") or {})
    differing = [
        f"{key} {theirs[key]!r} vs {mine[key]!r}" for key in mine if key in theirs and theirs[key] != mine[key]
    ]
    if differing:
        return "checkpoint vs this sampler: " + ", ".join(differing)
    if "settings" not in state:
        return f"num_samples {sampler.num_samples}, seed and world_size match; the rest is not recorded in this state"
    written = sampler._fingerprint()
    fingerprint = state.get("fingerprint")
    if not (isinstance(fingerprint, str) and len(fingerprint) == len(written) and _is_hex(fingerprint)):
        return f"its fingerprint {fingerprint!r} is not one this library writes: a corrupted or edited checkpoint"
    return (
        f"the same {sampler.num_samples} samples and settings, but different lengths: another dataset, "
        "or the same one tokenized differently"
    )


def pickled(sampler: Any) -> dict[str, Any]:
    """``sampler.__getstate__``: configuration, position and lengths, never Rust memory. A re-planned
    epoch travels as where it came from and is planned again on arrival."""
    state = sampler.__dict__.copy()
    del state["_planner"], state["_plan"], state["_plan_key"], state["_fingerprint_cache"]
    state["_position"] = sampler.position.snapshot()
    state["_lengths"] = sampler._planner.dataset_lengths()
    return state


def unpickled_position(sampler: Any, snapshot: dict[str, Any]) -> Position:
    """The position a pickled sampler travelled with, for ``sampler.__setstate__`` (its planner rebuilt):
    an elastic origin is planned again."""
    origin = snapshot["elastic"]
    # The original warned once about carried samples; its copies (workers) do not repeat it.
    elastic = None
    if origin is not None:
        elastic = replanned(sampler, origin["epoch"], origin["world_size"], origin["step"], warn=False)
    return Position.from_snapshot(snapshot, elastic)
