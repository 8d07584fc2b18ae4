"""The step-gradient benchmark (``benchmarks/step_gradients.py``, issue 61): its estimator on planted data —
random steps score 1, steps of alike documents above 1, the Gram matrix's figure is the direct one — the TOST
verdicts of the convergence benchmark on planted differences, and a smoke run of the benchmark."""

from __future__ import annotations

import json

import _at_target
import _equivalence
import _gradients
import dflash_batch as db
import numpy as np
import pytest


def planted(n: int = 600, width: int = 40, bias: float = 0.0, seed: int = 0):
    """Summed-token gradients of ``n`` documents: each token's gradient is a shared mean, a length-tracking
    direction scaled by ``bias`` (documents of one length pull one way), and noise."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(5, 400, n)
    tokens = (lengths - 1).astype(np.float64)
    mean, direction = rng.normal(size=width), rng.normal(size=width)
    pull = bias * (np.log(lengths) - np.log(lengths).mean())
    rows = tokens[:, None] * (mean + pull[:, None] * direction) + np.sqrt(tokens)[:, None] * rng.normal(size=(n, width))
    return rows.astype(np.float32), tokens, lengths


def random_steps(tokens: np.ndarray, count: int, target: float, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [_gradients.iid_step(tokens, target, rng) for _ in range(count)]


def test_random_steps_score_one_within_their_interval():
    rows, tokens, _ = planted()
    gram, _ = _gradients.centered_gram(rows, tokens)
    steps = random_steps(tokens, 400, 3000.0, seed=1)
    rng = np.random.default_rng(2)
    own, iid = _gradients.errors(gram, tokens, steps, rng)
    value, (low, high) = _gradients.ratio(own, iid, np.arange(len(steps)) // 20, rng)
    assert low <= 1.0 <= high and 0.9 < value < 1.1, (value, low, high)


def test_steps_of_alike_lengths_score_above_one():
    rows, tokens, lengths = planted(bias=3.0)
    gram, _ = _gradients.centered_gram(rows, tokens)
    order = np.argsort(lengths, kind="stable")
    steps = [order[a : a + 15] for a in range(0, len(order) - 14, 15)]  # sorted: alike documents together
    rng = np.random.default_rng(3)
    own, iid = _gradients.errors(gram, tokens, steps, rng)
    value, (low, _) = _gradients.ratio(own, iid, np.arange(len(steps)) // 4, rng)
    assert low > 1.5, value


def test_the_gram_figure_is_the_direct_one_on_small_cases():
    rows, tokens, _ = planted(n=50, width=7, bias=1.0, seed=4)
    direct_rows = rows.astype(np.float64)
    full = direct_rows.sum(axis=0) / tokens.sum()
    gram, got_full = _gradients.centered_gram(rows.copy(), tokens)
    assert np.allclose(got_full, full, rtol=1e-6)
    for members in (np.array([0]), np.array([3, 9, 27]), np.arange(50)[::3], np.arange(49)):
        g = direct_rows[members].sum(axis=0) / tokens[members].sum()
        direct = float(((g - full) ** 2).sum())
        assert _gradients.step_error(gram, tokens, members) == pytest.approx(direct, rel=1e-5, abs=1e-12)
    # the whole data's step is the full gradient itself
    assert _gradients.step_error(gram, tokens, np.arange(50)) == pytest.approx(0.0, abs=1e-9)


def test_summed_document_gradients_are_the_batch_gradient_of_a_real_model():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=2, max_position_embeddings=32, attn_implementation="eager",
    )  # fmt: skip
    model = transformers.LlamaForCausalLM(config).double()
    rng = np.random.default_rng(5)
    docs = [rng.integers(0, 64, n) for n in (5, 12, 9, 20, 3)]
    rows = _gradients.doc_gradients(model, docs).astype(np.float64)
    # The same documents' summed token losses, right-padded into one batch: one backward.
    width = max(len(d) for d in docs)
    ids = torch.zeros((len(docs), width), dtype=torch.long)
    labels = torch.full((len(docs), width), -100)
    mask = torch.zeros((len(docs), width), dtype=torch.long)
    for r, d in enumerate(docs):
        ids[r, : len(d)] = labels[r, : len(d)] = mask[r, : len(d)] = torch.as_tensor(d)
        mask[r, : len(d)] = 1
    logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1]
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 64), labels[:, 1:].reshape(-1), reduction="sum")
    batch = torch.autograd.grad(loss, list(model.parameters()))
    direct = torch.cat([g.reshape(-1) for g in batch]).numpy()
    assert np.allclose(rows.sum(axis=0), direct, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("differences", "words"),
    [
        ([0.004, -0.003, 0.001, 0.0, -0.002], "equivalent within ±0.030"),
        ([0.11, 0.09, 0.10, 0.12, 0.10], "worse by at least 0.0"),
        ([-0.11, -0.09, -0.10, -0.12, -0.10], "better by at least 0.0"),
        ([0.2, -0.2, 0.15, -0.1, 0.05], "inconclusive"),
    ],
)
def test_tost_verdicts_on_planted_differences(differences, words):
    got = _equivalence.verdict(differences, 0.03)
    assert got["verdict"].startswith(words) and got["n"] == 5
    assert got["low"] < got["mean"] < got["high"]


def test_tost_says_beyond_the_margin_and_refuses_what_it_cannot_judge():
    assert _equivalence.verdict([0.11, 0.09, 0.10, 0.12, 0.10], 0.03)["verdict"].endswith("(beyond the margin)")
    # The mean ± t(4)·sd/√5 of a known sample: mean 0.1, sd 0.0122, t 2.132.
    mean, low, high = _equivalence.interval([0.11, 0.09, 0.10, 0.12, 0.08])
    assert mean - low == pytest.approx(high - mean)
    assert mean == pytest.approx(0.1) and high - mean == pytest.approx(
        2.132 * np.std([0.11, 0.09, 0.10, 0.12, 0.08], ddof=1) / np.sqrt(5)
    )
    with pytest.raises(ValueError, match="at least 2 paired differences"):
        _equivalence.interval([0.1])
    with pytest.raises(ValueError, match="margin must be positive"):
        _equivalence.verdict([0.1, 0.2], 0.0)


@pytest.mark.slow  # trains a small model to two checkpoints and scores 3 strategies (~2 min)
def test_a_quick_run_scores_sorted_batches_worse_than_a_shuffle(tmp_path):
    import step_gradients

    out = tmp_path / "out"
    code = step_gradients.main(
        ["--quick", "--strategies", "sorted,shuffle,dflash_padded", "--out", str(out), "--cache", str(tmp_path / "c")]
    )
    assert code == 0
    record = json.loads((out / "step_gradients.json").read_text())
    assert max(record["direct_check"].values()) < 1e-4
    for rows in record["results"].values():
        for shape in ("1x4", "1x16", "8x4"):
            assert rows["sorted"][shape]["R"] > 1.1 > rows["shuffle"][shape]["R"] - 0.1, shape
            low, high = rows["shuffle"][shape]["interval"]
            assert low <= rows["shuffle"][shape]["R"] <= high
    table = (out / "step_gradients.md").read_text()
    assert "| sorted static batches |" in table and "Spearman" in table


def test_unknown_strategies_exit_2(tmp_path):
    import step_gradients

    assert step_gradients.main(["--strategies", "shuffle,bogus", "--out", str(tmp_path)]) == 2


def test_a_strategy_at_a_target_plans_at_it_and_bad_specs_are_refused(tmp_path):
    import step_gradients

    assert step_gradients.spec("dflash_padded@0.97") == ("dflash_padded", 0.97)
    assert step_gradients.spec("shuffle") == ("shuffle", None)
    assert step_gradients.title("dflash_padded@0.98") == "dflash_batch padded, target_efficiency=0.98"
    lengths = np.array([5, 9, 30, 31, 33, 60, 64, 64, 120, 7] * 30)
    at = step_gradients.micro_batches("dflash_padded@0.9", lengths, 256, 64, (1, 4), 0)
    sampler = db.BucketSampler(lengths, batching=db.Padded(max_tokens=256), target_efficiency=0.9, accumulation=4)
    assert [b.tolist() for b in at] == [b.tolist() for b in sampler.plan(0)]
    for bad in ("shuffle@0.97", "dflash_padded@high", "dflash_padded@1.5", "dflash_padded@", "bogus@0.9", "bogus"):
        with pytest.raises(ValueError, match=r"target|unknown strategy"):
            step_gradients.spec(bad)
        assert step_gradients.main(["--strategies", bad, "--out", str(tmp_path)]) == 2


def test_efficiency_is_real_tokens_over_what_the_batches_hold():
    import step_gradients

    lengths = np.array([10, 6, 4, 8])
    batches = [np.array([0, 1]), np.array([2, 3])]
    assert step_gradients.efficiency(batches, lengths, 32, packed=False) == 28 / (2 * 10 + 2 * 8)
    assert step_gradients.efficiency(batches, lengths, 32, packed=True) == 28 / 64
    assert _at_target.key("dflash_padded@0.98") == "dflash_padded_at_098"
    assert _at_target.key("dflash_packed") == "dflash_packed"
