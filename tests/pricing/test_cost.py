"""``measure_cost`` and ``fit_cost``: the fit recovers known coefficients from synthetic timings (with and
without noise), every bad argument is a clear error, and end to end it times a tiny HF Llama on the CPU
and returns a cost the sampler takes."""

from __future__ import annotations

import dflash_batch as db
import numpy as np
import pytest
from dflash_batch.pricing.cost import fit_cost
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")


class FakeClock:
    """A clock that a fake step advances by the modelled time of its batch: timings with known truth."""

    def __init__(self, a, b, c, noise=0.0, seed=0):
        self.now, self.a, self.b, self.c, self.noise = 0.0, a, b, c, noise
        self.rng = np.random.default_rng(seed)
        self.shapes = []

    def __call__(self):
        return self.now

    def step(self, batch):
        rows, length = batch["input_ids"].shape
        self.shapes.append((rows, length))
        seconds = self.c + rows * (self.a * length + self.b * length * length)
        self.now += seconds * (1 + self.noise * self.rng.standard_normal())


def test_exact_timings_give_back_the_coefficients():
    clock = FakeClock(a=2e-6, b=3e-10, c=1e-3)
    fit = db.measure_cost(clock.step, clock=clock, device="cpu", repeats=2, warmup=1, progress=False)
    assert fit.a == pytest.approx(2e-6, rel=1e-6) and fit.b == pytest.approx(3e-10, rel=1e-6)
    assert fit.c == pytest.approx(1e-3, rel=1e-6) and fit.error < 1e-9
    assert fit.cost == pytest.approx((1.0, 1.5e-4))
    assert len(fit.timings) == 15 and len(clock.shapes) == 15 * 3  # warmup 1 + repeats 2 per shape
    assert fit.seconds(4, 4096) == pytest.approx(1e-3 + 4 * (2e-6 * 4096 + 3e-10 * 4096**2))
    budget = fit.budget(16384, 8192)
    assert budget == int(np.ceil(2 * (8192 + 1.5e-4 * 8192**2)))
    sampler = db.BucketSampler(db.seed_workload(2000), max_tokens=budget, cost=fit.cost)
    assert len(sampler) > 0 and max(len(b) for b in sampler) >= 2
    with pytest.raises(ValueError, match="needs ints with 0 < length <= tokens"):
        fit.budget(100, 200)


@settings(max_examples=25, deadline=None)
@given(
    a=st.floats(1e-8, 1e-4),
    ratio=st.floats(0, 1e-3),
    c=st.floats(0, 1e-2),
    noise=st.sampled_from([0.0, 0.01, 0.03]),
    seed=st.integers(0, 100),
)
def test_noisy_timings_fit_within_the_noise(a, ratio, c, noise, seed):
    clock = FakeClock(a=a, b=a * ratio, c=c, noise=noise, seed=seed)
    fit = db.measure_cost(clock.step, clock=clock, device="cpu", repeats=3, progress=False)
    assert fit.a >= 0 and fit.b >= 0 and fit.c >= 0
    # The fitted time of every shape is within a few noise widths of the truth.
    for rows, length, _ in fit.timings:
        truth = c + rows * (a * length + a * ratio * length**2)
        assert fit.seconds(rows, length) == pytest.approx(truth, rel=6 * noise + 1e-6)
    assert fit.median_error <= 3 * noise + 1e-6


def test_no_attention_term_is_fit_as_zero_not_negative():
    clock = FakeClock(a=1e-6, b=0.0, c=0.0, noise=0.02, seed=3)
    fit = db.measure_cost(clock.step, clock=clock, device="cpu", progress=False)
    assert fit.b >= 0 and fit.cost[1] < 1e-5


def test_max_tokens_bounds_the_grid_and_too_few_shapes_is_an_error():
    clock = FakeClock(a=1e-6, b=1e-10, c=0.0)
    fit = db.measure_cost(clock.step, clock=clock, device="cpu", max_tokens=2048, progress=False)
    assert max(r * n for r, n, _ in fit.timings) <= 2048
    with pytest.raises(ValueError, match="at least 3 shapes over 2 lengths"):
        db.measure_cost(clock.step, clock=clock, device="cpu", lengths=[512], progress=False)
    with pytest.raises(ValueError, match="at least 3 shapes"):
        fit_cost([(1, 256, 0.1), (1, 512, 0.2)])
    with pytest.raises(ValueError, match="positive number of seconds"):
        fit_cost([(1, 256, 0.1), (1, 512, 0.0), (2, 512, 0.3)])


def test_an_exact_fit_warns_about_nothing(recwarn):
    clock = FakeClock(a=2e-6, b=3e-10, c=1e-3, noise=0.01)
    db.measure_cost(clock.step, clock=clock, device="cpu", progress=False)
    assert not [w for w in recwarn if "measure_cost" in str(w.message)]


def test_a_fit_off_on_a_noisy_machine_warns_naming_the_noise():
    clock = FakeClock(a=2e-6, b=3e-10, c=1e-3, noise=0.5, seed=1)
    with pytest.warns(UserWarning, match=r"the fit is off by up to \d+\.\d% .*timings of one shape differ") as caught:
        fit = db.measure_cost(clock.step, clock=clock, device="cpu", progress=False)
    assert fit.error > 0.2 and len(caught) == 1


def test_a_fit_off_on_too_few_shapes_warns_naming_them():
    clock = FakeClock(a=2e-6, b=3e-10, c=1e-3)
    slow = {(2, 512)}  # one shape twice as slow as the model, timed the same every repeat

    def step(batch):
        clock.step(batch)
        if tuple(batch["input_ids"].shape) in slow:
            clock.now += clock.c + 2 * (clock.a * 512 + clock.b * 512**2)

    with pytest.warns(UserWarning, match="only 4 shapes over 2 lengths were timed"):
        db.measure_cost(step, clock=clock, device="cpu", lengths=[256, 512], rows=[1, 2], progress=False)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"lengths": [0, 256]}, ValueError, "lengths must be positive ints"),
        ({"rows": []}, ValueError, "rows must be positive ints"),
        ({"rows": [1.5]}, ValueError, "rows must be positive ints"),
        ({"repeats": 0}, ValueError, "repeats=0 is invalid"),
        ({"warmup": -1}, ValueError, "warmup=-1 is invalid"),
        ({"max_tokens": 0}, ValueError, "max_tokens=0 is invalid"),
    ],
)
def test_bad_arguments(kwargs, error, message):
    clock = FakeClock(a=1e-6, b=0, c=0)
    with pytest.raises(error, match=message):
        db.measure_cost(clock.step, clock=clock, device="cpu", progress=False, **kwargs)


def test_a_step_that_fails_names_the_shape_and_a_non_callable_is_a_type_error():
    def broken(batch):
        raise RuntimeError("shape mismatch in the model")

    with pytest.raises(RuntimeError, match="shape mismatch") as caught:
        db.measure_cost(broken, device="cpu", progress=False)
    assert any("1 rows × 256 tokens" in note for note in caught.value.__notes__)
    with pytest.raises(TypeError, match="step must be a callable"):
        db.measure_cost("model", device="cpu")


def test_a_tiny_llama_on_the_cpu_end_to_end():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=128,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=512,
        attn_implementation="sdpa",
    )
    model = transformers.LlamaForCausalLM(config)

    def step(batch):
        model(**batch).loss.backward()

    fit = db.measure_cost(step, lengths=(32, 64, 128, 256), rows=(1, 2), vocab_size=128, device="cpu", progress=False)
    assert len(fit.timings) == 8 and not fit.skipped
    assert all(np.isfinite(v) and v >= 0 for v in (fit.a, fit.b, fit.c)) and fit.a + fit.b > 0
    assert np.isfinite(fit.error)
    assert "CostFit(cost=(" in repr(fit)
    lengths = db.seed_workload(3000) // 32 + 1
    a, b = fit.cost
    longest = int(lengths.max())
    # The budget is in the fitted units: room for 4 rows of the longest sample.
    budget = int(np.ceil(4 * (a * longest + b * longest**2)))
    sampler = db.BucketSampler(lengths, max_tokens=budget, cost=fit.cost)
    assert len(sampler) > 0
