"""What differs between a checkpoint and these settings, in words: the settings a state records (as they resolve
on some number of ranks: a default target depends on the step shape), compared one by one, so a refused resume
names the setting, both values and the way forward."""

from __future__ import annotations

from typing import Any

from .._core import Mixture as CoreMixture
from ..base.arguments import _is_hex
from . import settings as settings_declared
from .schedule import Schedule


def settings(schedule: Schedule, world_size: int | None = None) -> dict[str, Any]:
    """The configuration that shapes the plan, as plain values (a checkpoint may go through JSON); on
    ``world_size`` ranks when given (a default target resolves with the step shape)."""
    own = schedule.settings() if world_size is None else schedule.settings_on(world_size)
    return {key: value for key, value in own.items() if key != "world_size"}


def differences(schedule: Schedule, state: dict[str, Any]) -> str:
    """What differs between a checkpoint's plan and the schedule's, in words."""
    # These settings as they resolve here, else on the state's ranks (a default target depends on the step
    # shape): the first that names a difference.
    world = state.get("world_size")
    worlds = [schedule.world_size]
    if isinstance(world, int) and not isinstance(world, bool) and world >= 1 and world != schedule.world_size:
        worlds.append(world)
    for on in worlds:
        found = _differences(schedule, state, on)
        if found:
            return found
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


def _differences(schedule: Schedule, state: dict[str, Any], on: int) -> str:
    """The settings that differ between the checkpoint's and the schedule's on ``on`` ranks, in words ("":
    none). Not ``world_size``: another alone resumes elastically."""
    mine = {"num_samples": schedule.num_samples, **settings(schedule, on)}
    theirs = {"num_samples": state.get("num_samples"), **(state.get("settings") or {})}
    theirs.pop("world_size", None)
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
    if not differing:
        return ""
    where = "" if on == schedule.world_size else f" (these settings on its world_size {on})"
    return f"checkpoint vs this sampler{where}: " + ", ".join(differing)


#: What ``target_efficiency=None`` aims at, in words (the core's ``default_target_efficiency_ppm``).
TARGET_DEFAULTS = (
    "left to its default it is 0.982 for padded batches priced with an attention term, 0.93 for other padded "
    "batches in optimizer steps of 2 to 7 micro-batches (world_size × accumulation), 0.97 for the rest, 0.98 "
    "for packed rows"
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
        # A default that moved (0.98 → 0.97 for padded batches, 0.98 → 0.982 under an attention price,
        # 0.97 → 0.93 for padded steps of 2 to 7 micro-batches) planned that run at another target.
        return (
            f"target_efficiency {theirs!r} vs {mine!r} ({TARGET_DEFAULTS}: pass target_efficiency={theirs!r} to "
            "resume that run)"
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
