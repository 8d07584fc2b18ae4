"""StepTimer and rank prices (issue 42): the fit recovers a known price through noise and outliers, a worse
fit is not applied, an applied one changes only the rank balance of the epochs after it, checkpoints carry
the prices (a resume mid-epoch after a refit plans the same batches), and 2 processes under gloo get the
same price."""

from __future__ import annotations

import json
from pathlib import Path

import dflash_batch as db
import numpy as np
import pytest
from dflash_batch.pricing import price_fit
from dflash_batch.pricing.price_fit import MIN_RECORDS, robust_fit
from hypothesis import example, given, settings
from hypothesis import strategies as st

RANKS, ACCUMULATION = 4, 4


def _sampler(**kwargs) -> db.BucketSampler:
    lengths = np.random.default_rng(0).integers(16, 4000, 12_000)
    options = {"max_tokens": 16384, "world_size": RANKS, "rank": 0, "accumulation": ACCUMULATION, **kwargs}
    return db.BucketSampler(lengths, **options)


def _train(timer: db.StepTimer, sampler: db.BucketSampler, price, rng, outliers=0.0) -> None:
    """One epoch of simulated ranks: every micro-batch of the plan timed as ``c + a·x + b·x²`` with noise."""
    a, b, c = price
    plan = sampler.plan()
    for i in range(len(plan)):
        batch = plan[i]
        x, x2 = timer.features(batch)
        seconds = (c + a * x + b * x2) * rng.lognormal(0.0, 0.02)
        if rng.random() < outliers:
            seconds *= 6.0
        timer.record(batch, seconds, rank=i % RANKS)


PRICES = {
    "a": st.floats(1e-7, 1e-5),
    "ratio": st.floats(1e-5, 1e-2),
    "c": st.floats(0.0, 0.01),
    "noise": st.floats(0.0, 0.03),
    "outliers": st.floats(0.0, 0.1),
    "seed": st.integers(0, 2**32 - 1),
}


def _timings(rng, length, rows, price, noise, outliers):
    a, b, c = price
    x, x2 = rows * length, rows * length**2
    clean = c + a * x + b * x2
    seconds = clean * rng.lognormal(0.0, noise, len(x))
    bad = rng.random(len(x)) < outliers
    seconds[bad] *= rng.uniform(3.0, 10.0, int(bad.sum()))
    return x, x2, clean, seconds, bad


@settings(max_examples=60, deadline=None)
@given(**PRICES)
# A 66-token row costs 7e-6 s beside a 0.0078 s step with 2.3% noise (1.8e-4 s): no fit can price it to 10%
# (found by hypothesis in a clean clone: 10.8% off there, 0.085 of the bound below).
@example(a=1e-07, ratio=0.0078125, c=0.0078125, noise=0.0234375, outliers=0.0625, seed=13248)
def test_the_fit_recovers_a_known_price_through_noise_and_outliers(a, ratio, c, noise, outliers, seed):
    """Rows and lengths that vary apart (``batch_size`` batches, say): the row price itself is recovered,
    each batch's rows priced within 10% or within three standard deviations of that batch's timing noise
    (rows far cheaper than the noise of a step cannot be priced closer by any fit)."""
    rng = np.random.default_rng(seed)
    length = rng.integers(64, 4096, 400).astype(np.float64)
    rows = rng.integers(1, 16, 400).astype(np.float64)
    x, x2, clean, seconds, bad = _timings(rng, length, rows, (a, a * ratio, c), noise, outliers)
    (fa, fb, fc), kept = robust_fit(x, x2, seconds)
    truth = a * length + a * ratio * length**2
    fitted = fa * length + fb * length**2
    error = rows * np.abs(fitted - truth)
    assert np.all(error <= 0.1 * rows * truth + 3 * noise * clean), (fa, fb, fc)
    if bad.sum() >= 4:
        assert kept[bad].mean() < 0.5


@settings(max_examples=60, deadline=None)
@given(**PRICES)
def test_under_a_token_budget_the_fit_predicts_every_batch(a, ratio, c, noise, outliers, seed):
    """Under a token budget ``rows·L`` is nearly the same for every batch, so the linear price and the
    per-step constant trade places; what balance needs, each batch's time, is still predicted."""
    rng = np.random.default_rng(seed)
    length = rng.integers(64, 4096, 400).astype(np.float64)
    rows = np.maximum(1, 16384 // length).astype(np.float64)
    x, x2, clean, seconds, _ = _timings(rng, length, rows, (a, a * ratio, c), noise, outliers)
    (fa, fb, fc), _ = robust_fit(x, x2, seconds)
    assert np.all(np.abs((fc + fa * x + fb * x2) / clean - 1) < 0.05), (fa, fb, fc)


def test_a_fit_no_better_than_the_price_in_use_is_not_applied():
    sampler = _sampler(rank_cost=(1.0, 1 / 2048))
    timer = db.StepTimer(sampler, all_ranks_here=True)
    _train(timer, sampler, (1e-6, 1e-6 / 2048, 1e-3), np.random.default_rng(1))
    report = timer.end_epoch()
    assert report.fitted is not None and not report.applied
    assert sampler.rank_price(1) == (1.0, 1 / 2048)
    assert sampler.position.prices == ()
    assert timer.history == [report]


def test_an_applied_fit_rebalances_the_next_epochs_only():
    sampler = _sampler()
    plain = _sampler()
    steps, current = len(sampler), sampler.plan(0)
    timer = db.StepTimer(sampler, all_ranks_here=True)
    _train(timer, sampler, (1e-6, 1e-6 / 2048, 1e-3), np.random.default_rng(2), outliers=0.03)
    report = timer.end_epoch()
    assert report.applied and report.from_epoch == 1, report
    assert report.price[1] == pytest.approx(1 / 2048, rel=0.1)
    low, high = report.ratio_range
    assert low <= report.price[1] * 1.05 and high >= report.price[1] * 0.95 and high / low < 1.5
    assert "leaving a quarter out" in str(report) and "applied from epoch 1" in str(report)
    assert report.dropped > 0  # the outliers
    # The epoch trained is planned as it was; the next one balanced by the fit, with the same batches.
    assert np.array_equal(sampler.plan(0).indices, current.indices)
    assert sampler.rank_price(0) == (1.0, 0.0) and sampler.rank_price(5) == report.price
    assert sampler.plan(0).stats()["rank_price"] == (1.0, 0.0)
    assert sampler.plan(1).stats()["rank_price"] == report.price
    assert len(sampler) == steps
    fitted, before = sampler.plan(1), plain.plan(1)
    assert np.array_equal(np.sort(fitted.indices), np.sort(before.indices))
    assert not np.array_equal(fitted.indices, before.indices)
    # Predicted balance at the fitted price: better planned for it than for tokens.
    scored = _sampler(rank_cost=report.price)
    assert fitted.stats()["sync_efficiency"] == pytest.approx(scored.plan(1).stats()["sync_efficiency"])
    assert report.predicted is not None and report.measured is not None


def test_a_resume_mid_epoch_after_a_refit_plans_the_same_batches():
    sampler = _sampler()
    timer = db.StepTimer(sampler, all_ranks_here=True)
    _train(timer, sampler, (1e-6, 1e-6 / 1024, 0.0), np.random.default_rng(3))
    assert timer.end_epoch().applied
    sampler.set_epoch(1)
    batches = iter(sampler)
    taken = [next(batches) for _ in range(5)]
    state = json.loads(json.dumps(sampler.state_dict()))
    rest = list(batches)
    assert state["rank_costs"] == [[1, *sampler.rank_price(1)]]
    resumed = _sampler()
    resumed.load_state_dict(state)
    assert resumed.rank_price(1) == sampler.rank_price(1)
    again = list(resumed)
    assert len(again) == len(rest) and all(np.array_equal(x, y) for x, y in zip(again, rest, strict=True))
    assert len(taken) + len(rest) == len(sampler)
    # Without the prices the checkpoint's plan is another one: refused, naming the setting.
    del state["rank_costs"]
    with pytest.raises(db.PlanError, match="rank_cost"):
        _sampler().load_state_dict(state)


def test_prices_survive_pickling_into_workers():
    import pickle

    sampler = _sampler()
    sampler.position.price_from(2, (1.0, 1e-3))
    copy = pickle.loads(pickle.dumps(sampler))
    assert copy.position.prices == ((2, (1.0, 1e-3)),)
    assert np.array_equal(copy.plan(2).indices, sampler.plan(2).indices)


def test_a_price_for_an_epoch_begun_or_refused_by_the_planner_changes_nothing():
    sampler = _sampler()
    batches = iter(sampler)
    next(batches)
    with pytest.raises(db.PlanError, match="has begun"):
        sampler.position.price_from(0, (1.0, 1e-3))
    with pytest.raises(db.PlanError) as bad:
        sampler.position.price_from(1, (0.0, 0.0))
    assert bad.value.setting == "rank_cost"
    assert sampler.position.prices == ()
    next(batches)  # the running iteration goes on
    with pytest.raises(db.PlanError, match="trim_steps"):
        _sampler(rank_cost=(1.0, 1e-3), trim_steps=True)


@pytest.mark.parametrize(
    "rank_costs", [[[1, 1.0]], [[1, 1.0, "x"]], [[2, 1.0, 0.1], [1, 1.0, 0.2]], [[-1, 1.0, 0.0]], "1,1,0"]
)
def test_bad_prices_in_a_state_are_refused(rank_costs):
    sampler = _sampler()
    state = {**sampler.state_dict(), "rank_costs": rank_costs}
    with pytest.raises(db.PlanError, match="rank_costs"):
        _sampler().load_state_dict(state)


def test_too_few_records_fit_nothing():
    sampler = _sampler()
    timer = db.StepTimer(sampler, all_ranks_here=True)
    plan = sampler.plan()
    for i in range(MIN_RECORDS - 1):
        timer.record(plan[i], 0.01 + i * 1e-4, rank=i % RANKS)
    report = timer.end_epoch()
    assert report.fitted is None and not report.applied and "fewer" in report.reason
    assert sampler.position.prices == ()


def test_bad_records_are_refused_naming_the_value():
    sampler = _sampler()
    timer = db.StepTimer(sampler, all_ranks_here=True)
    batch = sampler.plan()[0]
    for seconds in (0.0, -1.0, float("nan"), float("inf"), True):
        with pytest.raises(ValueError, match="seconds"):
            timer.record(batch, seconds)
    with pytest.raises(ValueError, match="rank"):
        timer.record(batch, 0.1, rank=RANKS)
    with pytest.raises(TypeError, match="index array"):
        timer.record(np.array([0.5]), 0.1)
    with pytest.raises(TypeError, match="attention_mask"):
        timer.record({"input_ids": np.zeros((1, 4))}, 0.1)
    with pytest.raises(IndexError, match="below"):
        timer.record(np.array([10**9]), 0.1)
    with pytest.raises(ValueError, match="margin"):
        db.StepTimer(sampler, margin=1.0, all_ranks_here=True)
    timer.record(batch, 0.1)
    sampler.set_epoch(1)
    with pytest.raises(db.PlanError, match="end_epoch"):
        timer.record(batch, 0.1)


def test_loader_batches_are_timed_by_their_masks_and_cu_seqlens():
    sampler = _sampler()
    timer = db.StepTimer(sampler, all_ranks_here=True)
    mask = np.zeros((3, 8), dtype=np.int64)
    mask[0, :8], mask[1, :5], mask[2, :2] = 1, 1, 1
    assert timer.features({"attention_mask": mask}) == (3 * 8, 3 * 64)
    packed = db.StepTimer(_sampler(mode="packed"), all_ranks_here=True)
    assert packed.features({"cu_seqlens": np.array([0, 3, 7, 7], dtype=np.int32)}) == (7, 9 + 16)
    ticks = iter([1.0, 1.25])
    clocked = db.StepTimer(sampler, clock=lambda: next(ticks), all_ranks_here=True)
    with clocked.time({"attention_mask": mask}):
        pass
    assert clocked._records[0][4] == 0.25


def _worker(rank: int, world: int, init_file: str, out_dir: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        lengths = np.random.default_rng(0).integers(16, 4000, 6_000)
        sampler = db.BucketSampler(lengths, max_tokens=16384, accumulation=2)
        timer = db.StepTimer(sampler)
        rng = np.random.default_rng(100 + rank)  # each rank its own noise: the fit must still agree
        plan = sampler.plan(0)
        for step in range(len(sampler)):
            batch = plan[step * world + rank]
            x, x2 = timer.features(batch)
            timer.record(batch, (1e-3 + 1e-6 * x + 1e-6 / 1500 * x2) * rng.lognormal(0, 0.05))
        report = timer.end_epoch()
        result = {"price": report.price, "applied": report.applied, "from": report.from_epoch}
        result["plan"] = sampler.plan(1).indices[:50].tolist()
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))
    finally:
        dist.barrier()
    import os

    os._exit(0)


@pytest.mark.multiprocess  # 2 processes
def test_every_rank_gets_the_same_price(tmp_path):
    torch = pytest.importorskip("torch")
    mp = pytest.importorskip("torch.multiprocessing")
    if not torch.distributed.is_available():
        pytest.skip("torch.distributed is not built in")
    mp.spawn(_worker, args=(2, str(tmp_path / "init"), str(tmp_path)), nprocs=2, join=True)
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert results[0]["applied"] and results[0] == results[1]
    assert results[0]["price"][1] == pytest.approx(1 / 1500, rel=0.15)


def test_lightning_step_timing_times_every_batch_of_the_plan_and_reprices_the_next_epoch(tmp_path):
    """Lightning with a Loader as its train dataloader and StepTiming (a synthetic clock: each step takes
    c + a·x + b·x² of what it ran): one record per training batch, in plan order; epoch 1 trains the plan
    re-priced by the fit (checked against the sampler re-priced the same way)."""
    L = pytest.importorskip("lightning")
    torch = pytest.importorskip("torch")
    pa = pytest.importorskip("pyarrow")
    from dflash_batch.adapters.lightning import StepTiming

    rng = np.random.default_rng(0)
    rows = [rng.integers(1, 60, int(n)).tolist() for n in rng.integers(2, 60, 300)]
    store = db.TokenStore(pa.table({"input_ids": rows}))
    sampler = db.BucketSampler(store.lengths(), max_tokens=256, accumulation=2, seed=1)
    now = [0.0]

    class Synthetic(db.StepTimer):
        def begin(self, batch):
            super().begin(batch)
            x, x2 = self.features(batch)
            now[0] += 1e-3 + 1e-6 * x + 1e-6 / 32 * x2  # the step's time, passed before it ends

    timer = Synthetic(sampler, clock=lambda: now[0])
    seen = []

    class Model(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(64, 4)

        def training_step(self, batch, index):
            lengths = batch["attention_mask"].sum(1)
            seen.append((self.current_epoch, sorted(lengths.tolist())))
            return self.embed(batch["input_ids"]).square().mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

        def train_dataloader(self):
            return db.Loader(store, sampler)

    trainer = L.Trainer(
        max_epochs=2, accumulate_grad_batches=2, accelerator="cpu", logger=False, enable_progress_bar=False,
        enable_model_summary=False, enable_checkpointing=False, default_root_dir=str(tmp_path),
        callbacks=[StepTiming(timer)],
    )  # fmt: skip
    trainer.fit(Model())
    reports = timer.history
    assert [r.epoch for r in reports] == [0, 1] and reports[0].applied, reports
    assert sampler.position.prices == ((1, reports[0].price),)
    assert reports[0].price[1] == pytest.approx(1 / 32, rel=0.05)
    assert all(r.records + r.dropped == len(sampler) for r in reports)
    lengths = store.lengths()
    oracle = db.BucketSampler(store.lengths(), max_tokens=256, accumulation=2, seed=1)
    oracle.position.price_from(1, reports[0].price)
    expected = [(e, sorted(lengths[b].tolist())) for e in range(2) for b in oracle.plan(e)]
    assert seen == expected


def test_a_checkpoints_prices_are_taken_without_its_position_but_not_while_iterating():
    sampler = _sampler()
    sampler.position.price_from(1, (1.0, 1e-3))
    state = sampler.state_dict()
    fresh = _sampler()
    fresh.position.load_prices(state)
    assert fresh.position.prices == sampler.position.prices and fresh.position.step == 0
    batches = iter(fresh)
    next(batches)
    with pytest.raises(db.PlanError, match="while an iteration runs"):
        fresh.position.load_prices({"rank_costs": []})
    assert fresh.position.prices == sampler.position.prices
    with pytest.raises(db.PlanError, match="rank_costs"):
        _sampler().position.load_prices({"rank_costs": [[0, "a", 1]]})


def test_a_timer_of_several_ranks_without_a_process_group_is_refused():
    """Regression (issue 59): ranks as separate processes with world_size/rank passed and no process group,
    each with a StepTimer, fitted each its own price and trained batches of different plans (66 samples
    twice and 4 never in one epoch), with no refusal and no warning."""
    sampler = _sampler()  # world_size=4, rank=0, no torch.distributed
    with pytest.raises(db.PlanError, match=r"world_size=4 ranks, but torch.distributed is not initialized.*"
                       r"init_process_group\(\).*rank_cost=\(a, b\).*all_ranks_here=True"):  # fmt: skip
        db.StepTimer(sampler)
    db.StepTimer(sampler, all_ranks_here=True)  # one process recording every rank: no one to disagree
    db.StepTimer(db.BucketSampler(np.full(100, 50), max_tokens=1000))  # one rank: nothing to share
    with pytest.raises(TypeError, match="all_ranks_here must be a bool"):
        db.StepTimer(sampler, all_ranks_here="yes")


def test_a_trim_steps_sampler_is_refused_when_the_timer_is_built():
    """Regression (issue 59): refused only at the first applied fit, an epoch into the run."""
    with pytest.raises(db.PlanError, match="cannot re-price a trim_steps=True sampler"):
        db.StepTimer(_sampler(trim_steps=True), all_ranks_here=True)


@pytest.mark.parametrize("seconds", [5e-324, 1e-12, 2e5, np.float64(1e-10)])
def test_seconds_outside_a_nanosecond_to_a_day_are_refused_at_record(seconds):
    """Regression (issue 59): denormal seconds were accepted and failed the fit with numpy's LinAlgError."""
    sampler = _sampler()
    timer = db.StepTimer(sampler, all_ranks_here=True)
    with pytest.raises(ValueError, match=r"between 1e-09 \(a nanosecond\) and 86400 \(a day\)"):
        timer.record(sampler.plan()[0], seconds)
    timer.record(sampler.plan()[0], np.float32(0.5))  # numpy numbers are numbers


def test_attention_dominated_timings_fit_a_quadratic_price_the_planner_takes():
    """Regression (issue 59): timings with no linear part fitted (1, 5e13), which the planner refused as a
    rank_cost the user never set; the logs wrote it as inf (non-standard JSON in trainer_state.json)."""
    for noise in (0.0, 0.01):  # exact timings fit a ≈ 5e-22; with 1% noise the fit finds a small linear part
        sampler = _sampler()
        timer = db.StepTimer(sampler, all_ranks_here=True)
        plan, rng = sampler.plan(), np.random.default_rng(1)
        for i in range(len(plan)):
            _, x2 = timer.features(plan[i])
            timer.record(plan[i], 1e-9 * x2 * (1 + noise * rng.standard_normal()), rank=i % RANKS)
        report = timer.end_epoch()
        assert report.applied and sampler.rank_price(1) == report.price, report
        logs = report.logs()
        json.dumps(logs, allow_nan=False)
        assert all(np.isfinite(v) for v in logs.values())
        linear, quadratic = report.price
        if noise == 0.0:
            assert report.price == (0.0, 1.0), report
            assert logs["rank_price/linear"] == 0.0 and logs["rank_price/quadratic"] == 1.0
        else:  # the linear part the noise leaves is within it: under 5% of the cost even at the shortest length
            shortest = 16
            assert linear * shortest < 0.05 * quadratic * shortest**2, report


@pytest.mark.parametrize(("a", "b", "price"), [(0.0, 1.0, (0.0, 1.0)), (1e-20, 1.0, (0.0, 1.0)),
                                               (1.0, 1e-14, (1.0, 0.0)), (2.0, 1.0, (1.0, 0.5))])  # fmt: skip
def test_a_fit_becomes_a_price_within_the_planners_bounds(a, b, price):
    assert price_fit.rank_price(a, b) == price
    db.BucketSampler(np.full(100, 50), max_tokens=1000, rank_cost=price)  # taken


@pytest.mark.multiprocess  # 2 processes
def test_ranks_as_separate_processes_without_a_group_are_refused_a_timer_each(tmp_path):
    """Regression (issue 59), as users ran it: two processes with world_size/rank passed and no
    torch.distributed group, each with a StepTimer, trained batches of different plans. Each is refused."""
    import subprocess
    import sys

    code = (
        "import sys, numpy as np, dflash_batch as db\n"
        "sampler = db.BucketSampler(np.random.default_rng(0).integers(16, 4000, 2000), max_tokens=16384, "
        "world_size=2, rank=int(sys.argv[1]))\n"
        "try:\n    db.StepTimer(sampler)\nexcept db.PlanError as error:\n    print('refused', error)\n"
    )
    children = [
        subprocess.Popen([sys.executable, "-c", code, str(r)], stdout=subprocess.PIPE, text=True) for r in range(2)
    ]
    outputs = [child.communicate(timeout=300)[0] for child in children]
    assert all(o.startswith("refused") and "init_process_group()" in o for o in outputs), outputs
