"""How good is an optimizer step? Each batching strategy's step gradients against steps of random samples.

    python benchmarks/step_gradients.py --out docs/step_gradients --json docs/figures.json   # ≤ 10 min, 2 cores
    python benchmarks/step_gradients.py --quick --out /tmp/sg                                # a smoke run
    python benchmarks/step_gradients.py --strategies dflash_padded@0.98,dflash_padded@0.97   # at targets

The small Llama and the corpus of the convergence benchmark (``_corpus.py``: documents whose kind tracks
their length) are trained with shuffled batches to two checkpoints (a tenth of an epoch, one epoch); at each,
every document's gradient is computed once, and every strategy's optimizer steps — all ranks × micro-batches
of one accumulation window, at step shapes 1×4, 1×16 and 8×4 — are scored by ``‖g − G‖²``, the squared
distance of the step's token-mean gradient from the full-data gradient, exactly (``_gradients.py``). ``R``
divides a strategy's mean by that of steps of random documents holding the same real tokens: 1.0 is a
shuffle's quality; above 1, steps of alike documents (the cost of near-sorted batching); below 1, steps more
representative than chance. Intervals: 95% bootstrap over epochs. ``R (runs of 4)`` scores the union of 4
consecutive steps (the order of steps within an epoch). The figure is checked against a direct computation
of a few steps' gradients. Also reported: how well each per-step composition figure predicts a step's
error (Spearman's rank correlation with its error over a random step's), ``window_tv`` among them. A
dflash_batch strategy followed by ``@t`` plans at ``target_efficiency=t``; every row also gives the padding
efficiency (packed: the rows' fill) of its micro-batches, so quality is read beside what it costs.
"""

from __future__ import annotations

import argparse
import itertools
import json
import pathlib
import sys
import time

import _at_target
import dflash_batch as db
import numpy as np
from _corpus import build, write_store
from _gradients import centered_gram, doc_gradients, errors, ratio, step_error
from convergence import SIZES, inputs_of, length_grouped, model_for
from dflash_batch.tools import baselines

SHAPES = ((1, 4), (1, 16), (8, 4))
STRATEGIES = (
    "sorted", "shuffle", "seed_buckets", "hf_length_grouped", "hf_rebalance", "dflash_padded",
    "dflash_padded_priced", "dflash_padded_random", "dflash_packed", "dflash_packed_priced",
)  # fmt: skip
NAMES = {
    "sorted": "sorted static batches",
    "shuffle": "full shuffle",
    "seed_buckets": "seed's 6 buckets",
    "hf_length_grouped": "HF LengthGroupedSampler",
    "hf_rebalance": "HF BatchRebalanceSampler",
    "dflash_padded": "dflash_batch padded",
    "dflash_padded_priced": "dflash_batch padded, priced",
    "dflash_padded_random": "dflash_batch padded, order='random'",
    "dflash_packed": "dflash_batch packed",
    "dflash_packed_priced": "dflash_batch packed, priced",
}
RUN = 4  # consecutive steps in a run
#: The checkpoints: after a tenth of an epoch of shuffled training, and after one epoch.
CHECKPOINTS = {"tenth": "a tenth of an epoch", "epoch": "one epoch"}


def spec(strategy: str) -> tuple[str, float | None]:
    """``(name, target_efficiency)`` of a strategy as written: ``dflash_padded@0.97`` plans at that target."""
    name, target = _at_target.split(strategy)
    if name not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; choose from {', '.join(STRATEGIES)} (dflash_…@target)")
    return name, target


def title(strategy: str) -> str:
    name, target = spec(strategy)
    return NAMES[name] + _at_target.words(target)


def efficiency(batches: list[np.ndarray], lengths: np.ndarray, budget: int, packed: bool) -> float:
    """Real tokens over the tokens the micro-batches occupy: rows × their longest (padded), or the rows'
    capacity (packed)."""
    real = sum(int(lengths[b].sum()) for b in batches)
    held = len(batches) * budget if packed else sum(len(b) * int(lengths[b].max()) for b in batches if len(b))
    return real / held


def micro_batches(strategy: str, lengths: np.ndarray, budget: int, width: int, shape, epoch: int) -> list[np.ndarray]:
    """One epoch of ``strategy``'s micro-batches in training order, for ``ranks × accumulation`` steps:
    step ``k`` is micro-batches ``[k·r·a, (k+1)·r·a)`` (dflash_batch's plan layout; one stream cut in order
    for the others)."""
    strategy, target = spec(strategy)
    ranks, accumulation = shape
    rng = np.random.default_rng([7, epoch])
    if strategy == "sorted":
        order, offsets = baselines.cut(lengths, np.argsort(lengths, kind="stable"), max_tokens=budget)
    elif strategy == "shuffle":
        order, offsets = baselines.cut(lengths, rng.permutation(len(lengths)), max_tokens=budget)
    elif strategy == "seed_buckets":
        edges = tuple(int(e * int(lengths.max()) / 8192) for e in baselines.SEED_EDGES)
        edges = (0, *sorted(set(edges[1:-1])), int(lengths.max()))
        order, offsets = baselines.seed_bucketed(lengths, edges=edges, max_tokens=budget, seed=epoch)
    elif strategy == "hf_length_grouped":
        order, offsets = length_grouped(lengths, budget, epoch)
    elif strategy == "hf_rebalance":
        got = baselines.batch_rebalance(
            lengths, world_size=ranks, accumulation=accumulation, max_tokens=budget, seed=epoch
        )
        if got is None:
            raise SystemExit("hf_rebalance needs transformers ≥ 5.24 (pip install 'transformers>=5.24')")
        order, offsets, _ = got
    elif strategy.startswith("dflash"):
        options: dict = {"batching": db.Packed(budget) if "packed" in strategy else db.Padded(max_tokens=budget)}
        if strategy.endswith("priced"):
            options["cost"] = (1.0, 1.0 / (6 * width))  # a row of L tokens costs L + L²/6d: this model's price
        if strategy.endswith("random"):
            options["order"] = "random"
        if target is not None:
            options["target_efficiency"] = target
        sampler = db.BucketSampler(
            lengths, **options, balance=db.Balance(accumulation=accumulation), world=db.World(size=ranks), rank=0
        )
        plan = sampler.plan(epoch)
        order, offsets = np.asarray(plan.indices), np.asarray(plan.offsets)
    else:
        raise ValueError(f"unknown strategy {strategy!r}; choose from {', '.join(STRATEGIES)}")
    return [np.asarray(order[a:b], dtype=np.int64) for a, b in itertools.pairwise(np.asarray(offsets, np.int64))]


def steps_of(batches: list[np.ndarray], shape) -> list[np.ndarray]:
    """The documents of each complete optimizer step."""
    size = shape[0] * shape[1]
    return [np.concatenate(batches[k : k + size]) for k in range(0, len(batches) - size + 1, size)]


def composition(steps: list[np.ndarray], lengths: np.ndarray) -> dict[str, np.ndarray]:
    """Per step, the figures that might predict its error: ``window_tv`` (the total-variation distance of
    its tokens' share per length decile from the data's, as ``plan.stats()`` computes it), the same over
    documents, and how far its mean length is from the data's."""
    decile = token_deciles(lengths)
    data_tokens = np.bincount(decile, weights=lengths, minlength=10) / lengths.sum()
    data_docs = np.bincount(decile, minlength=10) / len(lengths)
    out: dict[str, list[float]] = {"window_tv": [], "document_tv": [], "length_gap": []}
    for s in steps:
        tokens = np.bincount(decile[s], weights=lengths[s], minlength=10) / lengths[s].sum()
        docs = np.bincount(decile[s], minlength=10) / len(s)
        out["window_tv"].append(0.5 * np.abs(tokens - data_tokens).sum())
        out["document_tv"].append(0.5 * np.abs(docs - data_docs).sum())
        out["length_gap"].append(abs(lengths[s].mean() / lengths.mean() - 1))
    return {k: np.asarray(v) for k, v in out.items()}


def token_deciles(lengths: np.ndarray) -> np.ndarray:
    """Each document's decile of the token mass over lengths, as ``plan.stats()``'s ``window_tv`` assigns
    it: a length belongs to the decile where the middle of its token mass falls."""
    values, counts = np.unique(lengths, return_counts=True)
    mass = values.astype(np.float64) * counts
    middle = np.cumsum(mass) - mass / 2
    of_value = np.minimum((10 * middle / mass.sum()).astype(np.int64), 9)
    return of_value[np.searchsorted(values, lengths)]


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1]) if len(a) > 2 and ra.std() and rb.std() else float("nan")


def train_to(model, store, lengths: np.ndarray, budget: int, lr: float, steps: int, done: int) -> None:
    """Continues shuffled training (4 micro-batches a step, AdamW, the token-mean loss) from step ``done`` to
    step ``steps``."""
    import torch

    if not hasattr(model, "_optimizer"):
        model._optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.1, betas=(0.9, 0.95))
    optimizer = model._optimizer
    batches = [b for e in range(8) for b in micro_batches("shuffle", lengths, budget, 1, (1, 4), 1000 + e)]
    for step in range(done, steps):
        micro = batches[4 * step : 4 * step + 4]
        labelled = sum(int(lengths[i].sum()) - len(i) for i in micro)
        for indices in micro:
            model(**inputs_of(store, indices, False, budget, "cpu"), num_items_in_batch=labelled).loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def direct_check(model, store, steps: list[np.ndarray], gram, tokens, full, batches_of) -> float:
    """The largest relative difference between ``‖g − G‖²`` computed from the Gram matrix and from the
    step's gradient computed directly (its padded micro-batches, summed token losses ÷ its tokens)."""
    import torch

    worst = 0.0
    for members, micro in zip(steps, batches_of, strict=True):
        model.zero_grad(set_to_none=True)
        for indices in micro:
            inputs = inputs_of(store, indices, False, 0, "cpu")
            labels = inputs.pop("labels")
            logits = model(**inputs, use_cache=False).logits[:, :-1].float()
            loss = torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1), ignore_index=-100, reduction="sum"
            )
            loss.backward()
        grad = torch.cat([p.grad.reshape(-1) for p in model.parameters()]).double().numpy()
        direct = float(np.sum((grad / tokens[members].sum() - full) ** 2))
        worst = max(worst, abs(step_error(gram, tokens, members) - direct) / direct)
    model.zero_grad(set_to_none=True)
    return worst


def score(strategy: str, shape, gram, tokens, lengths, budget: int, width: int, epochs: int, seed: int) -> dict:
    """R and R over runs of consecutive steps, with intervals, the micro-batches' efficiency, and the per-step
    figures of one strategy."""
    rng = np.random.default_rng([seed, STRATEGIES.index(spec(strategy)[0]), *shape])
    steps, blocks, runs, run_blocks, held = [], [], [], [], []
    for epoch in range(epochs):
        batches = micro_batches(strategy, lengths, budget, width, shape, epoch)
        held.append(efficiency(batches, lengths, budget, "packed" in strategy))
        own = steps_of(batches, shape)
        steps += own
        blocks += [epoch] * len(own)
        if shape[0] * shape[1] <= 16:  # runs of the larger steps cost more than they show
            joined = [np.concatenate(own[k : k + RUN]) for k in range(0, len(own) - RUN + 1, RUN)]
            runs += joined
            run_blocks += [epoch] * len(joined)
    own_error, iid_error = errors(gram, tokens, steps, rng)
    value, interval = ratio(own_error, iid_error, np.asarray(blocks), rng)
    mean_tokens = float(np.mean([tokens[s].sum() for s in steps]))
    out = {
        "title": title(strategy), "R": value, "interval": interval, "steps": len(steps), "tokens": mean_tokens,
        "efficiency": np.mean(held),
    }  # fmt: skip
    if runs:
        run_own, run_iid = errors(gram, tokens, runs, rng, draws=4)
        out["R_runs"], out["runs_interval"] = ratio(run_own, run_iid, np.asarray(run_blocks), rng)
    out["per_step"] = {"excess": own_error / iid_error, **composition(steps, lengths)}
    return out


def table(results: dict, shapes) -> str:
    lines = []
    for checkpoint, rows in results.items():
        lines += [
            f"**{CHECKPOINTS[checkpoint]}** — R = mean ‖g − G‖² ÷ that of random steps of the same real tokens "
            "(95% interval over epochs; 1 = a shuffle's quality, lower is better)",
            "",
            "| strategy | efficiency | " + " | ".join(f"R {r}×{a}" for r, a in shapes)
            + " | " + " | ".join(f"R runs of {RUN}, {r}×{a}" for r, a in shapes if r * a <= 16) + " |",
            "|---" * (2 + len(shapes) + sum(r * a <= 16 for r, a in shapes)) + "|",
        ]  # fmt: skip
        for by_shape in rows.values():
            first = next(iter(by_shape.values()))
            held = {shape.replace("x", "×"): f"{f['efficiency']:.3f}" for shape, f in by_shape.items()}
            # One figure where every shape plans alike (within the rank split's rounding); per shape where a
            # default follows the step shape.
            spread = [f["efficiency"] for f in by_shape.values()]
            alike = max(spread) - min(spread) < 0.002
            cells = [first["title"], first_value(held) if alike else ", ".join(f"{v} at {k}" for k, v in held.items())]
            cells += [f"{f['R']:.3f} [{f['interval'][0]:.3f}, {f['interval'][1]:.3f}]" for f in by_shape.values()]
            cells += [
                f"{f['R_runs']:.3f} [{f['runs_interval'][0]:.3f}, {f['runs_interval'][1]:.3f}]"
                for f in by_shape.values()
                if "R_runs" in f
            ]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def first_value(values: dict):
    return next(iter(values.values()))


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run: 80 source files, 2 epochs a figure")
    parser.add_argument(
        "--strategies", default=",".join(STRATEGIES),
        help="comma-separated subset; a dflash_batch one followed by @t plans at target_efficiency=t",
    )  # fmt: skip
    parser.add_argument("--steps", type=int, default=240, help="steps a figure draws on, at least (default 240)")
    parser.add_argument("--seed", type=int, default=0, help="model init and random steps (default 0)")
    parser.add_argument(
        "--shapes", default=",".join(f"{r}x{a}" for r, a in SHAPES),
        help="comma-separated step shapes, ranks x micro-batches (default 1x4,1x16,8x4)",
    )  # fmt: skip
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("step-gradients-out"))
    parser.add_argument("--cache", type=pathlib.Path, default=pathlib.Path(".convergence-cache"))
    parser.add_argument("--json", metavar="FILE", help="record the summary under --section of FILE")
    parser.add_argument("--section", default="step_gradients", help="the section of --json (default step_gradients)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    import torch

    torch.manual_seed(args.seed)
    strategies = args.strategies.split(",")
    try:
        shapes = tuple(tuple(int(n) for n in shape.split("x", 1)) for shape in args.shapes.split(","))
    except ValueError:
        print(f"--shapes {args.shapes!r}: write each step shape as RANKSxMICRO_BATCHES, e.g. 1x4,8x4", file=sys.stderr)
        return 2
    try:
        [spec(s) for s in strategies]
    except ValueError as e:
        print(e, file=sys.stderr)
        return 2
    max_len, vocab, width, *_, budget, samples, lr = SIZES["quick"]
    files = 80 if args.quick else None
    corpus = build(args.cache, max_len=max_len, vocab=vocab, samples=samples, files=files)
    lengths = corpus.lengths.astype(np.int64)
    tokens = (lengths - 1).astype(np.float64)  # a document's predicted tokens
    store = write_store(corpus.train, args.cache / f"train-{max_len}-{vocab}-{samples}-{files}.arrow")
    model = model_for(corpus, "quick", args.seed, "cpu")
    parameters = sum(p.numel() for p in model.parameters())
    per_epoch = len(micro_batches("shuffle", lengths, budget, width, (1, 4), 0)) // 4
    checkpoints = {"tenth": max(1, per_epoch // 10), "epoch": per_epoch}
    print(
        f"{len(lengths):,} documents, {int(lengths.sum()):,} tokens; a {parameters:,}-parameter Llama; "
        f"checkpoints after {', '.join(f'{v} steps' for v in checkpoints.values())} of shuffled training",
        flush=True,
    )
    results: dict = {}
    checks: dict[str, float] = {}
    correlations: dict = {}
    done, start = 0, time.perf_counter()
    for name, at in checkpoints.items():
        train_to(model, store, lengths, budget, lr, at, done)
        done = at
        gradients = doc_gradients(model, corpus.train)
        gram, full = centered_gram(gradients, tokens)
        del gradients
        micro = micro_batches("dflash_padded", lengths, budget, width, (1, 4), 0)[:12]
        checks[name] = direct_check(
            model, store, steps_of(micro, (1, 4)), gram, tokens, full, [micro[k : k + 4] for k in range(0, 12, 4)]
        )
        rows: dict = {}
        pooled: dict = {shape: {} for shape in shapes}
        for strategy in strategies:
            for shape in shapes:
                spe = max(1, len(micro_batches(strategy, lengths, budget, width, shape, 0)) // (shape[0] * shape[1]))
                epochs = 2 if args.quick else int(np.clip(np.ceil(args.steps / spe), 8, 40))
                f = score(strategy, shape, gram, tokens, lengths, budget, width, epochs, args.seed)
                for key, values in f.pop("per_step").items():
                    pooled[shape].setdefault(key, []).append(values)
                rows.setdefault(_at_target.key(strategy), {})[f"{shape[0]}x{shape[1]}"] = f
            print(f"  {CHECKPOINTS[name]}, {title(strategy)}: " + ", ".join(
                f"R {k} {v['R']:.3f}" for k, v in rows[_at_target.key(strategy)].items()
            ) + f"  ({time.perf_counter() - start:.0f} s)", flush=True)  # fmt: skip
        results[name] = rows
        correlations[name] = {
            f"{r}x{a}": {
                key: spearman(np.concatenate(values), np.concatenate(pooled[(r, a)]["excess"]))
                for key, values in pooled[(r, a)].items()
                if key != "excess"
            }
            for r, a in shapes
        }
    ratios = table(results, shapes)
    text = "\nSpearman's correlation of a step's error (over a random step's) with each composition figure:\n\n"
    text += "| checkpoint | shape | " + " | ".join(next(iter(next(iter(correlations.values())).values()))) + " |\n"
    text += "|---|---|" + "---|" * len(next(iter(next(iter(correlations.values())).values()))) + "\n"
    for name, by_shape in correlations.items():
        for shape, figures in by_shape.items():
            text += f"| {CHECKPOINTS[name]} | {shape} | " + " | ".join(f"{v:+.2f}" for v in figures.values()) + " |\n"
    text += f"\nDirect check (largest relative difference, 3 steps): {max(checks.values()):.1e}\n"
    text, correlated = ratios + text, text
    seconds = time.perf_counter() - start
    summary = {
        "documents": len(lengths), "parameters": parameters, "checkpoints": checkpoints, "results": results,
        "correlations": correlations, "direct_check": checks, "seconds": seconds,
    }  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "step_gradients.json").write_text(json.dumps(summary, indent=1, default=float))
    (args.out / "step_gradients.md").write_text(text)
    print(text)
    print(f"{seconds:.0f} s; written: {args.out}/step_gradients.json, step_gradients.md")
    if args.json:
        from _figures import command_of, write

        command = command_of("step_gradients.py", argv if argv is not None else sys.argv[1:])
        tables = {"table": "\n\n" + ratios.strip() + "\n\n", "correlation_table": "\n\n" + correlated.strip() + "\n\n"}
        write(args.json, args.section, {**summary, **tables}, command)
    return 0


if __name__ == "__main__":
    sys.exit(main())
