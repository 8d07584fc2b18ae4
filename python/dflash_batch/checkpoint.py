"""Checkpoints of a :class:`~dflash_batch.BucketSampler`: what ``state_dict`` records, how
``load_state_dict`` checks a state and resumes it — on the same ranks, or on another number of ranks, where
the samples the checkpointed steps did not reach are planned again — and how a mismatch is put in words.

The functions take the sampler and read and set its position (``_epoch``, ``_consumed``, ``_resume``,
``_elastic``): this module is the sampler's checkpoint half, split from it to keep one concept a file.
"""

from __future__ import annotations

import operator
from typing import Any

import numpy as np

from . import _core
from ._arguments import _epoch, _int, _is_hex, _state_count
from ._core import PlanError

VERSION = 1


def state_of(sampler: Any, step: int | None) -> dict[str, Any]:
    """``sampler.state_dict(step)``."""
    if step is None:
        step = sampler._consumed
    else:
        step = _int("step", step)
        if not 0 <= step <= sampler._consumed:
            raise PlanError(
                f"step={step} is invalid: this sampler has handed out {sampler._consumed} batches of epoch "
                f"{sampler._epoch}; pass how many of them the training loop has trained on"
            )
    state = {
        "version": VERSION,
        "epoch": sampler._epoch,
        "step": step,
        "seed": sampler._config["seed"],
        "world_size": sampler.world_size,
        "num_samples": sampler.num_samples,
        "fingerprint": sampler._fingerprint(),
        "fingerprint_any_ranks": sampler._planner.fingerprint_any_ranks,
        # Plain values (lists, not tuples), so a mismatched resume can name the setting that differs.
        "settings": settings(sampler),
    }
    if sampler._elastic is not None and sampler._elastic["epoch"] == sampler._epoch:
        # This epoch's plan is the re-planned rest of an epoch begun on other ranks.
        state["elastic"] = {"world_size": sampler._elastic["world_size"], "step": sampler._elastic["step"]}
    return state


def load(sampler: Any, state: dict[str, Any]) -> None:
    """``sampler.load_state_dict(state)``."""
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
    if state.get("world_size") != sampler.world_size and elastic is None:
        if state.get("fingerprint_any_ranks") == sampler._planner.fingerprint_any_ranks:
            resume_elsewhere(sampler, _epoch(state["epoch"]), state["world_size"], operator.index(state["step"]))
            return
    if elastic is not None and state["fingerprint"] == sampler._fingerprint():
        # A checkpoint inside an epoch already resumed elastically, on these same ranks.
        epoch = _epoch(state["epoch"])
        resume_elsewhere(sampler, epoch, elastic["world_size"], operator.index(elastic["step"]))
        step = operator.index(state["step"])
        steps = sampler.plan().steps
        if not 0 <= step <= steps:
            raise PlanError(f"step {step} is outside the resumed epoch {epoch}, which has {steps} steps")
        sampler._consumed, sampler._resume = step, (epoch, step)
        return
    if elastic is not None:
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
    epoch, step = _epoch(state["epoch"]), operator.index(state["step"])
    sampler.set_epoch(epoch)
    steps = sampler.plan().steps
    if not 0 <= step <= steps:
        raise PlanError(f"step {step} is outside epoch {epoch}, which has {steps} steps")
    sampler._consumed = step
    sampler._resume = (epoch, step)


def resume_elsewhere(sampler: Any, epoch: int, old_world: int, step: int) -> None:
    """Resumes ``epoch`` after ``step`` steps on ``old_world`` ranks: the samples those steps did not
    reach are planned again across the sampler's ranks (same seed and epoch, so every rank computes the
    same plan); later epochs are planned as usual."""
    old = _core.Planner([sampler._planner.lengths()], **sampler._rust_config(world_size=old_world))
    old_plan = old.plan(epoch)
    if not 0 <= step <= old_plan.steps:
        raise PlanError(f"step {step} is outside epoch {epoch}, which had {old_plan.steps} steps")
    indices = np.asarray(old_plan.indices)
    done = int(old_plan.offsets[step * old_world])
    remaining = np.setdiff1d(indices, indices[:done]).astype(np.uint32)
    sampler.set_epoch(epoch)
    sampler._plan = None
    if len(remaining) == 0:  # the epoch was finished: nothing left to run
        sampler._elastic = None
        sampler._consumed, sampler._resume = sampler.plan().steps, (epoch, sampler.plan().steps)
        return
    plan = sampler._planner.plan_subset(epoch, remaining)
    sampler._elastic = {"epoch": epoch, "plan": plan, "world_size": old_world, "step": step}
    sampler._consumed, sampler._resume = 0, (epoch, 0)


def settings(sampler: Any) -> dict[str, Any]:
    """The configuration that shapes the plan, as plain values (a checkpoint may go through JSON)."""
    return {
        key: list(value) if isinstance(value, tuple) else value
        for key, value in sampler._config.items()
        if key not in ("threads", "world_size")
    }


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
