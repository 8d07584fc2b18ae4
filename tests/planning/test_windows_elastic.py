"""Elastic resume of a stream (issue 62): a `Windows` state taken on W ranks resumes on W' ranks — the rest of
its window planned across the new ranks, later windows as the new ranks plan them — with every example of the
pass trained once; a state taken inside that re-planned window resumes on the same new ranks, and is refused
on yet another number, naming the way out."""

from __future__ import annotations

import dflash_batch as db
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

EXAMPLES = [{"id": i, "seq_len": int(n)} for i, n in enumerate(db.seed_workload(5000, seed=4))]


def ranks(world: int, **kwargs) -> list[db.Windows]:
    return [
        db.Windows(EXAMPLES, column="seq_len", window=1200, max_tokens=16384, world_size=world, rank=r, **kwargs)
        for r in range(world)
    ]


def take(windows: db.Windows, steps: int | None = None) -> list[int]:
    """The example ids of this rank's next ``steps`` batches (the rest of the pass when None)."""
    out: list[int] = []
    if steps == 0:
        return out
    for k, batch in enumerate(windows):
        out += [example["id"] for example in batch]
        if steps is not None and k + 1 == steps:
            break
    return out


@settings(max_examples=25, deadline=None)
@given(before=st.integers(1, 3), after=st.integers(1, 5), steps=st.integers(0, 260), epoch=st.integers(0, 1))
def test_a_stream_resumes_on_another_number_of_ranks_with_every_example_once(before, after, steps, epoch):
    old = ranks(before)
    for w in old:
        w.set_epoch(epoch)
    trained = [i for w in old for i in take(w, steps)]
    states = [w.state_dict() for w in old]
    assert all(s == states[0] for s in states), "every rank is at the same place"
    new = ranks(after)
    for w in new:
        w.load_state_dict(states[0])
    try:
        rest = [take(w) for w in new]
    except db.PlanError as refused:  # the window's rest cannot give every new rank whole steps: named
        event("rest too small for the new ranks")
        assert "starts at the next window on any number of ranks" in str(refused)
        return
    assert len({len(r) > 0 for r in rest}) <= 2
    everything = sorted(trained + [i for r in rest for i in r])
    assert everything == list(range(len(EXAMPLES))), "an example lost or trained twice"


def test_later_windows_are_the_new_ranks_own_and_a_state_inside_the_rest_resumes_there():
    old = ranks(3)
    trained = [i for w in old for i in take(w, 7)]
    before = list(trained)
    state = old[0].state_dict()
    assert state["window"] == 0 and state["step"] == 7 and "elastic" not in state
    new = ranks(2)
    for w in new:
        w.load_state_dict(state)
    its = [iter(w) for w in new]
    trained += [e["id"] for it in its for _ in range(3) for e in next(it)]
    inside = new[0].state_dict()
    assert inside["elastic"] == {"world_size": 3, "step": 7} and inside["step"] == 3 and inside["window"] == 0
    # Resumed on the same new ranks: the rest of the re-planned window, then every later window.
    again = ranks(2)
    for w in again:
        w.load_state_dict(inside)
    rest = [take(w) for w in again]
    assert sorted(trained + [i for r in rest for i in r]) == list(range(len(EXAMPLES)))
    # After the re-planned window, each rank's batches are those of an uninterrupted run on 2 ranks.
    fresh = [e["id"] for b in ranks(2)[0] for e in b]
    later = [i for i in fresh if i >= 1200]
    assert [i for i in rest[0] if i >= 1200] == later
    # On yet another number of ranks, refused, naming the way out; at the window's start, any number resumes.
    with pytest.raises(db.PlanError, match="resume it on world_size 2 to finish that window"):
        ranks(4)[0].load_state_dict(inside)
    start = {**inside, "step": 0}
    four = ranks(4)
    for w in four:
        w.load_state_dict(start)
    resumed = [i for w in four for i in take(w)]
    # Step 0 of the re-planned rest: the rest after the 3-rank steps, planned on 4 ranks.
    assert sorted(before + resumed) == list(range(len(EXAMPLES)))


def test_other_settings_than_the_ranks_are_still_refused():
    old = ranks(2)
    take(old[0], 3)
    state = old[0].state_dict()
    with pytest.raises(db.PlanError, match="max_tokens: 16384 there, 8192 here"):
        db.Windows(EXAMPLES, column="seq_len", window=1200, max_tokens=8192, world_size=3, rank=0).load_state_dict(
            state
        )


def test_a_rest_too_small_for_the_new_ranks_is_refused_naming_the_next_windows_state():
    """One rank took all but one of window 0's 199 steps; its last batch cannot give 4 ranks a batch each."""
    old = ranks(1)[0]
    trained = take(old, 198)
    state = old.state_dict()
    resumed = ranks(4)[0]
    resumed.load_state_dict(state)
    with pytest.raises(
        db.PlanError, match=r"load_state_dict\(\{\*\*state, \*\*\{'window': 1, 'step': 0, 'start': 1200\}\}\)"
    ):
        take(resumed)
    # The state it names: the next window on 4 ranks; only the named examples of window 0 are left out.
    four = ranks(4)
    for w in four:
        w.load_state_dict({**state, "window": 1, "step": 0, "start": 1200})
    rest = [i for w in four for i in take(w)]
    left_out = set(range(len(EXAMPLES))) - set(trained) - set(rest)
    assert left_out and all(i < 1200 for i in left_out) and len(trained) + len(rest) + len(left_out) == len(EXAMPLES)
