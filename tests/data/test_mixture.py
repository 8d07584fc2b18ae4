"""Mixtures (issue 41): every epoch each source contributes exactly its share, every optimizer step carries
each source near its weight, batches say each row's source, and resumes stay exact. Shares are checked
against the plan's rows (which row of which source trained how often), not just a summary figure."""

from __future__ import annotations

import os
import pickle
import warnings

import dflash_batch as db
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

# Four sources of different length profiles (chat and safety shorter, code longer), 40/30/20/10.
PARTS = db.seed_mixture(20_000, seed=4)
WEIGHTS = {"chat": 0.4, "code": 0.3, "math": 0.2, "safety": 0.1}


def mixture(unit: str = "tokens", weights: dict | None = None, **kwargs) -> db.Mixture:
    weights = weights or WEIGHTS
    return db.Mixture({n: (PARTS[n], weights[n]) for n in weights}, unit=unit, **kwargs)


def largest_remainder(size: int, weights: list[float]) -> list[int]:
    """The reference apportionment: floors, then one each to the largest remainders (earlier on ties)."""
    exact = [size * w / sum(weights) for w in weights]
    shares = [int(np.floor(e)) for e in exact]
    order = sorted((i for i in range(len(weights)) if weights[i] > 0), key=lambda i: (-(exact[i] - shares[i]), i))
    for i in order[: size - sum(shares)]:
        shares[i] += 1
    return shares


def per_source(mix: db.Mixture, rows: np.ndarray, lengths: np.ndarray | None = None) -> np.ndarray:
    weights = None if lengths is None else lengths[rows].astype(np.float64)
    return np.bincount(mix.source_of(rows), weights=weights, minlength=len(mix.names))


def source_tv(mix: db.Mixture, plan: db.Plan, window: int, unit: str, indices: np.ndarray | None = None) -> float:
    """The reference per-window source TV: ½ Σ |window share − weight|, averaged over whole windows."""
    rows = plan.indices if indices is None else indices
    offsets = plan.offsets.astype(np.int64)
    weights = np.array([mix.weights[n] for n in mix.names])
    distances = []
    for w in range((len(offsets) - 1) // window):
        part = rows[offsets[w * window] : offsets[(w + 1) * window]]
        mass = per_source(mix, part, mix.lengths() if unit == "tokens" else None)
        distances.append(0.5 * np.abs(mass / mass.sum() - weights).sum())
    return float(np.mean(distances))


def shuffled_within_lengths(mix: db.Mixture, rows: np.ndarray, seed: int) -> np.ndarray:
    """`rows` with each length's samples shuffled among that length's slots: the same batches' lengths,
    with sources left to chance."""
    lengths = mix.lengths()[rows]
    slots = np.argsort(lengths, kind="stable")
    drawn = np.lexsort((np.random.default_rng(seed).random(len(rows)), lengths))
    out = rows.copy()
    out[slots] = rows[drawn]
    return out


def test_every_epochs_sample_shares_are_exact():
    mix = mixture("samples")
    sampler = db.BucketSampler(mix, max_tokens=16384, world_size=4, rank=0, accumulation=2, seed=1)
    want = largest_remainder(len(mix), list(WEIGHTS.values()))
    steps = len(sampler)
    for epoch in range(3):
        plan = sampler.plan(epoch)
        assert plan.steps == steps, "every epoch has the same steps"
        assert per_source(mix, plan.indices).tolist() == want
        stats = plan.stats()
        assert [stats["sources"][n]["samples"] for n in mix.names] == want
        assert [stats["sources"][n]["weight"] for n in mix.names] == list(WEIGHTS.values())


@pytest.mark.parametrize("unit", ["samples", "tokens"])
@pytest.mark.parametrize("mode", ["padded", "packed"])
def test_every_optimizer_step_carries_the_sources_nearer_their_weights_than_chance(unit, mode):
    parts = db.seed_mixture(50_000, seed=6)
    mix = db.Mixture({n: (parts[n], WEIGHTS[n]) for n in WEIGHTS}, unit=unit)
    sampler = db.BucketSampler(mix, max_tokens=16384, world_size=8, rank=0, accumulation=4, mode=mode)
    plan = sampler.plan(2)
    ours = source_tv(mix, plan, 32, unit)
    assert plan.stats()["source_tv"] == pytest.approx(ours, abs=1e-12)
    chance = source_tv(mix, plan, 32, unit, shuffled_within_lengths(mix, plan.indices, 0))
    assert ours < 0.8 * chance, (ours, chance)  # measured: 0.015-0.029 against 0.041-0.053


def test_token_shares_are_within_one_sample_of_the_weights():
    mix = mixture("tokens")
    lengths = mix.lengths()
    sampler = db.BucketSampler(mix, max_tokens=16384, world_size=2, rank=0, seed=3)
    want = largest_remainder(int(lengths.sum()), list(WEIGHTS.values()))
    for epoch in range(3):
        got = per_source(mix, sampler.plan(epoch).indices, lengths)
        assert np.all(np.abs(got - want) <= lengths.max()), (got, want)


def test_a_down_sampled_source_repeats_no_row_in_an_epoch_and_cycles_through_its_rows():
    # chat holds ~8000 of 20000 rows; at 0.1 of an epoch of 20000 samples it gives 2000 an epoch.
    weights = {"chat": 0.1, "code": 0.4, "math": 0.3, "safety": 0.2}
    mix = mixture("samples", weights)
    sampler = db.BucketSampler(mix, max_tokens=16384, seed=2)
    lo, hi = mix.bounds[:2]
    cycle = (hi - lo) // 2000  # epochs a cycle of chat's rows holds
    seen: list[np.ndarray] = []
    for epoch in range(cycle):
        plan = sampler.plan(epoch)
        # Formed again (if at all) over its own selection — by other forming draws, or, where its rows form
        # more batches under every draw (epoch 2 here), by merging its own batches (`reformed` 17) — so
        # every epoch has the same batches and the cycle holds.
        assert plan.stats()["batches"] == sampler.plan(0).stats()["batches"]
        rows = plan.indices
        mine = rows[(rows >= lo) & (rows < hi)]
        assert len(mine) == 2000 and len(np.unique(mine)) == 2000, "once per epoch"
        seen.append(mine)
    assert len(np.unique(np.concatenate(seen))) == cycle * 2000, "a cycle repeats no row"


def test_up_sampled_rows_repeat_within_the_cap_and_as_evenly_as_can_be():
    weights = {"chat": 0.1, "code": 0.1, "math": 0.2, "safety": 0.6}  # safety: ~2000 rows asked for 12000
    rows = len(PARTS["safety"])
    mix = mixture("samples", weights, max_repeat=7)
    plan = db.BucketSampler(mix, batch_size=8).plan(0).indices
    safety = np.bincount(plan, minlength=len(mix))[mix.bounds[3] : mix.bounds[4]]
    assert safety.sum() == 12000 and set(np.unique(safety)) <= {12000 // rows, 12000 // rows + 1}
    with pytest.raises(db.PlanError, match=rf"source 'safety' holds {rows} samples.*max_repeat=4\.0") as raised:
        db.BucketSampler(mixture("samples", weights), batch_size=8)
    assert raised.value.kind == "source_too_small"


@pytest.mark.parametrize("mode", ["padded", "packed"])
def test_the_plan_is_the_same_for_any_thread_count_and_after_pickling(mode):
    kwargs = {"max_tokens": 16384, "world_size": 2, "rank": 1, "seed": 9, "mode": mode, "accumulation": 2}
    one = db.BucketSampler(mixture(), threads=1, **kwargs)
    two = db.BucketSampler(mixture(), threads=2, **kwargs)
    copy = pickle.loads(pickle.dumps(two))
    for epoch in (0, 5):
        assert np.array_equal(one.plan(epoch).indices, two.plan(epoch).indices)
        assert np.array_equal(one.plan(epoch).offsets, two.plan(epoch).offsets)
        assert np.array_equal(copy.plan(epoch).indices, two.plan(epoch).indices)
    assert copy.schedule.fingerprint == two.schedule.fingerprint


def test_efficiency_and_balance_are_those_of_the_same_lengths_without_sources():
    """Choosing moves whole batches: the plan's padding is that of its batches' own lengths."""
    mix = mixture()
    sampler = db.BucketSampler(mix, max_tokens=16384, world_size=4, rank=0, accumulation=2)
    plan = sampler.plan(1)
    lengths = mix.lengths()
    stats = plan.stats()
    offsets = plan.offsets.astype(np.int64)
    longest = np.maximum.reduceat(lengths[plan.indices], offsets[:-1])
    padded = int((np.diff(offsets) * longest).sum())
    assert stats["padded_tokens"] == padded and stats["real_tokens"] == int(lengths[plan.indices].sum())
    assert stats["efficiency"] > 0.95


@given(
    sizes=st.lists(st.integers(1, 60), min_size=1, max_size=4),
    raw=st.lists(st.floats(0.05, 1.0), min_size=4, max_size=4),
    unit=st.sampled_from(["samples", "tokens"]),
    cap=st.floats(1.0, 5.0),
    threads=st.integers(1, 2),
    epoch=st.integers(0, 30),
)
@settings(max_examples=int(os.environ.get("DFLASH_MIXTURE_EXAMPLES", 60)), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])  # fmt: skip
# Found in a clean-clone run: a tokens-weighted epoch of 4 samples under a shared count of 5 batches.
@pytest.mark.fuzz
@example(sizes=[2, 3], raw=[1.0, 0.125, 1.0, 1.0], unit="tokens", cap=2.0, threads=1, epoch=4)
@example(sizes=[1, 3], raw=[1.0, 1.0, 1.0, 1.0], unit="tokens", cap=2.0, threads=1, epoch=1)
def test_shares_repeats_and_threads_for_any_weights_sizes_and_caps(sizes, raw, unit, cap, threads, epoch):
    rng = np.random.default_rng(sum(sizes) + epoch)
    weights = [w / sum(raw[: len(sizes)]) for w in raw[: len(sizes)]]
    data = {f"s{i}": (rng.integers(1, 50, size=n), w) for i, (n, w) in enumerate(zip(sizes, weights, strict=True))}
    try:
        mix = db.Mixture(data, unit=unit, max_repeat=cap)
        samplers = [db.BucketSampler(mix, max_tokens=64, threads=t, seed=epoch) for t in (threads, 3 - threads)]
    except db.PlanError as error:
        assert error.kind in ("source_too_small", "too_few_samples_for_ranks"), error
        return
    try:
        plan = samplers[0].plan(epoch)
    except db.PlanError as error:
        # The documented refusal (docs/mixtures.md) of an epoch whose selection no forming draw or merge fits
        # into the shared count — hypothesis found one: 4 samples in tokens, sizes [1, 3], cap 2, epoch 1. The
        # fix it names must work.
        assert "pass drop_last=True" in str(error), error
        db.BucketSampler(mix, max_tokens=64, threads=threads, seed=epoch, drop_last=True).plan(epoch)
        return
    assert np.array_equal(plan.indices, samplers[1].plan(epoch).indices), "thread-count independent"
    lengths = mix.lengths()
    counts = np.bincount(plan.indices, minlength=len(mix))
    for s in range(len(sizes)):
        mine = counts[mix.bounds[s] : mix.bounds[s + 1]]
        assert mine.max() <= np.ceil(cap), "within the cap"
        assert mine.max() - mine.min() <= 1, "repeats as even as can be"
    if unit == "samples":
        assert per_source(mix, plan.indices).tolist() == largest_remainder(len(mix), weights)
    else:
        want = largest_remainder(int(lengths.sum()), weights)
        assert np.all(np.abs(per_source(mix, plan.indices, lengths) - want) <= lengths.max())


def test_per_source_label_tokens_equal_a_numpy_reference():
    mix = mixture()
    sampler = db.BucketSampler(mix, max_tokens=16384, world_size=2, rank=0, accumulation=3)
    plan = sampler.plan(0)
    got = sampler.label_tokens(0, by_source=True)
    lengths = mix.lengths()
    window = 2 * 3
    offsets = plan.offsets.astype(np.int64)
    want = np.zeros((-(-len(plan) // window), 4), dtype=np.int64)
    for b in range(len(plan)):
        for row in plan.indices[offsets[b] : offsets[b + 1]]:
            want[b // window, mix.source_of([row])[0]] += lengths[row] - 1
    assert np.array_equal(got, want)
    assert np.array_equal(got.sum(axis=1), sampler.label_tokens(0))


def tokenized(n: int, lengths: np.ndarray, start: int, masked: bool | None = None) -> pa.Table:
    """A table of `n` rows whose tokens name their row (`start + row`, repeated) and an optional mask."""
    ids = [[start + r] * int(lengths[r]) for r in range(n)]
    columns = {"input_ids": ids}
    if masked is not None:
        columns["completion_mask" if masked else "labels"] = [
            [0] + [1] * (len(i) - 1) if masked else [-100, *i[1:]] for i in ids
        ]
    return pa.table(columns)


def stores(masks=(None, None)) -> tuple[db.TokenStore, db.TokenStore]:
    a = tokenized(120, np.arange(120) % 23 + 3, 0, masks[0])
    b = tokenized(80, np.arange(80) % 41 + 5, 1000, masks[1])
    return db.TokenStore(a), db.TokenStore(b)


@pytest.mark.parametrize("mode", ["padded", "packed"])
def test_the_loader_gives_each_row_its_source_and_the_steps_per_source_counts(mode):
    torch = pytest.importorskip("torch")
    a, b = stores()
    mix = db.Mixture({"a": (a, 0.3), "b": (b, 0.7)}, unit="samples")
    sampler = db.BucketSampler(mix, max_tokens=128, world_size=2, rank=1, accumulation=2, mode=mode)
    plan = sampler.plan(0)
    by_source = sampler.label_tokens(0, by_source=True)
    with db.Loader(mix, sampler, num_items_in_batch=True) as loader:
        for step, batch in enumerate(loader):
            rows = plan[step * 2 + 1]
            assert batch["source"].tolist() == mix.source_of(rows).tolist()
            # The tokens name their row: each row's source is the one its tokens came from.
            if mode == "padded":
                firsts = batch["input_ids"][:, 0].tolist()
            else:
                firsts = batch["input_ids"][0, batch["cu_seqlens"][:-1].long()].tolist()
            assert [int(t >= 1000) for t in firsts] == batch["source"].tolist()
            assert torch.equal(batch["num_items_per_source"], torch.from_numpy(by_source[step // 2]))
            assert int(batch["num_items_in_batch"]) == int(by_source[step // 2].sum())


def test_stores_are_read_as_one_and_pickle_as_their_parts():
    a, b = stores((True, True))
    mix = db.Mixture({"a": (a, 0.5), "b": (b, 0.5)})
    joined = mix.store
    assert len(joined) == 200 and joined.mask == "completion_mask"
    assert joined[119][0] == 119 and joined[120][0] == 1000
    labels = db.collate(joined, [0, 120])["labels"]
    assert labels[0, 0] == -100 and labels[1, 0] == -100, "each part's mask applies"
    copy = pickle.loads(pickle.dumps(joined))
    assert np.array_equal(copy.lengths(), joined.lengths())


@pytest.mark.parametrize(
    ("masks", "message"),
    [((True, None), "applies no loss mask"), ((None, True), "applies a loss mask"), ((True, False), "a labels mask")],
)
def test_stores_with_different_mask_columns_are_refused(masks, message):
    a, b = stores(masks)
    mix = db.Mixture({"a": (a, 0.5), "b": (b, 0.5)})
    with pytest.raises(db.DataError, match=message) as raised:
        mix.store  # noqa: B018
    assert raised.value.kind == "sources_differ"


def test_stores_of_another_token_type_are_refused():
    a = db.TokenStore(pa.table({"input_ids": pa.array([[1, 2]], pa.list_(pa.int32()))}))
    b = db.TokenStore(pa.table({"input_ids": pa.array([[1, 2]], pa.list_(pa.int64()))}))
    with pytest.raises(db.DataError, match="source 'b' int64 tokens, where source 'a' has int32"):
        db.Mixture({"a": (a, 0.5), "b": (b, 0.5)}).store  # noqa: B018


@pytest.mark.parametrize(
    ("sources", "kwargs", "error", "kind", "message"),
    [
        ({"a": ([5, 6], 0.5), "b": ([7], 0.4)}, {}, db.PlanError, "invalid_setting", r"sum to 0\.5 \+ 0\.4 = 0\.9"),
        ({"a": ([5, 6], 1.5), "b": ([7], -0.5)}, {}, db.PlanError, "invalid_setting", "source 'b' has weight -0.5"),
        ({"a": ([5, 6], float("nan")), "b": ([7], 1.0)}, {}, db.PlanError, "invalid_setting", "'a' has weight NaN"),
        ({"a": ([], 0.5), "b": ([7], 0.5)}, {}, db.PlanError, "empty_source", "source 'a' of the mixture has no rows"),
        ({}, {}, db.PlanError, "invalid_setting", "a mixture has 0 source"),
        ({"a": ([5], 1.0)}, {"max_repeat": 0.5}, db.PlanError, "invalid_setting", r"max_repeat=0\.5 is invalid"),
        ({"a": ([5], 1.0)}, {"unit": "rows"}, db.PlanError, "invalid_setting", "unit='rows' is invalid"),
        ({"a": ([5], 1.0)}, {"epoch_size": 0}, db.PlanError, "invalid_setting", "epoch_size=0 is invalid"),
        ({"a": ([5], "1")}, {}, TypeError, None, "source 'a' has weight '1'"),
        ({"a": [5]}, {}, TypeError, None, r"source 'a' must be a \(data, weight\) pair"),
        ({"a": ([5], 1.0)}, {"epoch_size": 2.5}, TypeError, None, "epoch_size must be a positive int"),
        ({"a": ("lengths", 1.0)}, {}, Exception, None, ""),
    ],
)
def test_each_bad_mixture_is_refused_with_its_kind(sources, kwargs, error, kind, message):
    with pytest.raises(error, match=message or None) as raised:
        db.Mixture(sources, **kwargs)
    if kind is not None:
        assert raised.value.kind == kind
    if raised.type not in (TypeError, db.PlanError):
        assert isinstance(raised.value, (TypeError, ValueError, OSError)), raised.value


def test_a_list_of_sources_is_not_a_mixture():
    with pytest.raises(TypeError, match="sources must be a dict of name -> \\(data, weight\\)"):
        db.Mixture([("a", [5], 1.0)])  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "setting"),
    [({"shuffle": False}, "shuffle"), ({"oversize": "truncate", "mode": "packed"}, "oversize")],
)
def test_settings_a_mixture_does_not_take_are_refused(kwargs, setting):
    with pytest.raises(db.PlanError, match=setting) as raised:
        db.BucketSampler(mixture(), max_tokens=16384, **kwargs)
    assert (raised.value.kind, raised.value.setting) == ("invalid_setting", setting)


def test_a_loader_over_lengths_only_says_what_is_missing():
    pytest.importorskip("torch")
    mix = mixture()
    sampler = db.BucketSampler(mix, max_tokens=16384)
    with pytest.raises(TypeError, match="source 'chat' was given as lengths"):
        db.Loader(mix, sampler)


def test_resume_mid_epoch_is_exact_and_other_weights_are_refused_by_name():
    mix = mixture()
    sampler = db.BucketSampler(mix, max_tokens=16384, world_size=1, seed=4)
    sampler.set_epoch(1)
    it = iter(sampler)
    trained = [next(it) for _ in range(7)]
    state = sampler.state_dict()
    resumed = db.BucketSampler(mixture(), max_tokens=16384, world_size=1, seed=4)
    resumed.load_state_dict(state)
    rest = list(resumed)
    everything = np.concatenate(trained + rest)
    assert np.array_equal(np.sort(everything), np.sort(sampler.plan(1).indices)), "the epoch's rows, as often"
    other = db.BucketSampler(mixture(weights={**WEIGHTS, "chat": 0.3, "safety": 0.2}), max_tokens=16384, seed=4)
    with pytest.raises(db.PlanError, match=r"weight of 'chat' 0\.4 vs 0\.3, weight of 'safety' 0\.1 vs 0\.2"):
        other.load_state_dict(state)
    plain = db.BucketSampler(mix.lengths(), max_tokens=16384, seed=4)
    with pytest.raises(db.PlanError, match="the checkpoint's mixture of sources vs a single dataset"):
        plain.load_state_dict(state)


@pytest.mark.parametrize(("before", "after", "steps"), [(4, 2, 5), (2, 3, 3), (1, 2, 4)])
def test_an_elastic_resume_trains_the_rest_of_the_epochs_selection_once(before, after, steps):
    # A target given: the default's follows the step shape, and a mixture whose target would move is refused
    # (tests/planning/test_elastic_target.py).
    kwargs = {"max_tokens": 16384, "seed": 6, "accumulation": 2, "target_efficiency": 0.97}
    old = [db.BucketSampler(mixture(), world_size=before, rank=r, **kwargs) for r in range(before)]
    trained = []
    for s in old:
        it = iter(s)
        trained += [next(it) for _ in range(steps)]
    state = old[0].state_dict()
    new = [db.BucketSampler(mixture(), world_size=after, rank=r, **kwargs) for r in range(after)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a rest too small for the ranks is carried, and says so
        for s in new:
            s.load_state_dict(state)
    rest = [b for s in new for b in s]
    carried = new[0].position.origin.carried if new[0].position.origin is not None else np.zeros(0)
    everything = np.concatenate(trained + rest + [carried])
    assert np.array_equal(np.sort(everything), np.sort(old[0].plan(0).indices)), "nothing lost or repeated"
    stats = new[0].plan().stats()
    assert abs(sum(v["share"] for v in stats["sources"].values()) - 1) < 1e-9


@pytest.mark.parametrize("packed", [False, True])
def test_source_losses_equal_a_reference(packed):
    torch = pytest.importorskip("torch")
    generator = torch.Generator().manual_seed(0)
    vocab, names = 11, ["a", "b", "c"]
    if packed:  # one row of three samples: [0, 4), [4, 9), [9, 12), then padding
        cu = torch.tensor([0, 4, 9, 12], dtype=torch.int32)
        labels = torch.randint(0, vocab, (1, 14), generator=generator)
        labels[0, [0, 4, 9, 12, 13]] = -100  # each sample's first token, and the padding
        batch = {"labels": labels, "source": torch.tensor([2, 0, 2]), "cu_seqlens": cu}
        owner = [[None, 2, 2, 2, 0, 0, 0, 0, 0, 2, 2, 2, None, None]]
    else:
        labels = torch.randint(0, vocab, (3, 6), generator=generator)
        labels[1, 4:] = -100
        batch = {"labels": labels, "source": torch.tensor([1, 0, 1])}
        owner = [[1] * 6, [0] * 6, [1] * 6]
    logits = torch.randn((*labels.shape, vocab), generator=generator)
    losses = db.SourceLosses(names)
    losses.add(logits, batch)
    sums, counts = np.zeros(3), np.zeros(3)
    log_probs = torch.log_softmax(logits, dim=-1).numpy()
    for r in range(labels.shape[0]):
        for t in range(labels.shape[1] - 1):
            target = int(labels[r, t + 1])
            if target != -100:
                sums[owner[r][t + 1]] -= log_probs[r, t, target]
                counts[owner[r][t + 1]] += 1
    means = losses.means()
    for s, name in enumerate(names):
        if counts[s]:
            assert means[name] == pytest.approx(sums[s] / counts[s], rel=1e-5)
        else:
            assert np.isnan(means[name])
    assert all(np.isnan(v) for v in losses.means().values()), "reading the means starts over"
    with pytest.raises(ValueError, match="do not match labels"):
        losses.add(logits[:, :-1], batch)


def test_the_hf_trainer_trains_the_mixtures_plan_and_logs_each_sources_loss(tmp_path):
    """The real Trainer, GA 2, two epochs: the rows of every micro-batch are the plan's, and each source's
    token loss is logged beside the loss."""
    pytest.importorskip("transformers")
    from _hf_rows import rows, train_recording

    chat, code = rows(0, 90, 20), rows(90, 60, 40)
    mix = db.Mixture({"chat": (db.TokenStore(chat), 0.3), "code": (db.TokenStore(code), 0.7)}, unit="samples")
    trainer, seen = train_recording(mix, [chat, code], str(tmp_path), epochs=2)
    sampler = trainer.bucket_sampler
    for epoch in range(2):
        plan = sampler.plan(epoch)
        trained = [sorted(r) for e, r in seen if e == epoch]
        assert trained == [sorted(plan[s].tolist()) for s in range(plan.steps)], f"epoch {epoch}"
        assert per_source(mix, plan.indices).tolist() == [45, 105], "0.3 and 0.7 of 150 samples"
    logged = [line for line in trainer.state.log_history if "loss" in line and "grad_norm" in line]
    assert sum("loss/chat" in line for line in logged) > len(logged) // 2
    assert all(line.get(f"loss/{n}", 1) > 0 for line in logged for n in mix.names), "a finite loss, or none"


def test_rows_that_fit_no_batch_are_skipped_and_never_selected():
    """With ``oversize="skip"`` a source's too-long rows are left out of every epoch, counted as skipped,
    and the shares are taken over the rows that fit."""
    long = np.array([50, 900, 60, 700, 40] * 20)  # 40 of these 100 rows exceed max_tokens=512
    short = np.arange(1, 101) % 30 + 5
    mix = db.Mixture({"long": (long, 0.5), "short": (short, 0.5)}, unit="samples")
    sampler = db.BucketSampler(mix, max_tokens=512, oversize="skip", seed=2)
    fits = np.flatnonzero(mix.lengths() <= 512)
    for epoch in range(3):
        plan = sampler.plan(epoch)
        assert np.isin(plan.indices, fits).all(), "a row that fits no batch was selected"
        stats = plan.stats()
        assert stats["skipped"] == 40
        assert per_source(mix, plan.indices).tolist() == [80, 80], "half of the 160 rows that fit each"
        counts = np.bincount(plan.indices, minlength=len(mix))[:100]
        assert set(np.unique(counts[long <= 512])) <= {1, 2} and counts[long > 512].sum() == 0
