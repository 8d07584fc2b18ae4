"""Does mixing pay? Held-out loss of a small Llama trained on the same data batched six ways.

    python benchmarks/convergence.py --quick --out docs/convergence     # ≤ 10 min on 2 CPU cores
    python benchmarks/convergence.py --device cuda --out results        # the full run, sized for one GPU

The data is this Python's own standard library, split into documents whose kind tracks their length —
docstrings (short prose), functions and classes (medium code), whole modules (long) — tokenized with a
byte-level BPE trained here, drawn to the seed workload's length histogram scaled to ``max_len``
(``_corpus.py``); whole files are held out for evaluation, scored per length band. Strategies, all under
the same padded-token budget per micro-batch, through the same loop and dflash_batch's collation: sorted
static batches (the seed's first version, short to long), a full shuffle, the seed's 6 buckets,
dflash_batch padded, dflash_batch packed rows, HF transformers' ``BatchRebalanceSampler``.

**Equal real tokens per optimizer step** (the main view). A full shuffle's padded batches hold far fewer
real tokens than sorted ones, so at equal micro-batches per step it takes more, smaller steps, and real
tokens per step, not batch order, would drive the loss. Here consecutive micro-batches form a step until
its real tokens are nearest a common target (``group_steps``), and the loss is summed over the step's
tokens and divided by their count (a token-normalised loss), so every strategy trains the same number of
steps on about the same tokens each. The second view, **equal steps**, takes 4 micro-batches a step.

Printed and written to ``--out``: held-out loss (overall and per length band) against real tokens seen
and against projected time (padding included: a padded micro-batch of ``k`` rows of ``L`` tokens costs
``k·(L + L²/6d)``, a packed row ``C + Σl²/6d``, for the model's width ``d``), the step loss's noise, every
figure over ``--seeds`` seeds (model init and sampler draws) with its spread: ``convergence.json``,
``convergence.md``, ``convergence.png``.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import pathlib
import sys
import time

import _at_target
import dflash_batch as db
import numpy as np
from _corpus import Corpus, build, write_store
from _runs import Run, digest, reused, same_plan
from dflash_batch.tools import baselines

STRATEGIES = (
    "sorted", "shuffle", "seed_buckets", "dflash_padded", "dflash_packed", "hf_rebalance", "hf_length_grouped",
)  # fmt: skip
#: The equivalence margin in held-out loss (nats), stated before any run: twice the seed-to-seed standard
#: deviation of a full shuffle's held-out loss in the recorded quick run (0.015 over its seeds), so a
#: difference inside it is smaller than what a new seed alone moves the loss by.
MARGIN = 0.03
ACCUMULATION = 4
#: Sizes: (max_len, vocab, hidden, layers, heads, budget, samples, lr).
SIZES = {
    "quick": (512, 2048, 64, 2, 4, 2048, 3000, 3e-3),
    "full": (2048, 8192, 384, 6, 6, 16384, None, 1e-3),
}


def micro_batches(strategy: str, lengths: np.ndarray, budget: int, max_len: int, seed: int, epoch: int):
    """One epoch of ``strategy``'s micro-batches: ``(indices, packed)`` in training order (a dflash_batch
    strategy written ``name@t`` plans at ``target_efficiency=t``)."""
    strategy, target = _at_target.split(strategy)
    rng = np.random.default_rng([seed, epoch])
    if strategy == "sorted":
        order, offsets = baselines.cut(lengths, np.argsort(lengths, kind="stable"), max_tokens=budget)
    elif strategy == "shuffle":
        order, offsets = baselines.cut(lengths, rng.permutation(len(lengths)), max_tokens=budget)
    elif strategy == "seed_buckets":
        edges = tuple(int(e * max_len / 8192) for e in baselines.SEED_EDGES)
        order, offsets = baselines.seed_bucketed(lengths, edges=edges, max_tokens=budget, seed=seed * 1000 + epoch)
    elif strategy in ("dflash_padded", "dflash_packed"):
        mode = "packed" if strategy == "dflash_packed" else "padded"
        options = {} if target is None else {"target_efficiency": target}
        sampler = db.BucketSampler(
            lengths, max_tokens=budget, seed=seed, accumulation=ACCUMULATION, mode=mode, **options
        )
        plan = sampler.plan(epoch)
        order, offsets = np.asarray(plan.indices), np.asarray(plan.offsets)
    elif strategy == "hf_length_grouped":
        order, offsets = length_grouped(lengths, budget, seed * 1000 + epoch)
    elif strategy == "hf_rebalance":
        got = baselines.batch_rebalance(
            lengths, world_size=1, accumulation=ACCUMULATION, max_tokens=budget, seed=seed * 1000 + epoch
        )
        if got is None:
            raise SystemExit("hf_rebalance needs transformers ≥ 5.24 (pip install 'transformers>=5.24')")
        order, offsets, _ = got
    else:
        raise ValueError(f"unknown strategy {strategy!r}; choose from {', '.join(STRATEGIES)}")
    offsets = np.asarray(offsets, dtype=np.int64)
    packed = strategy == "dflash_packed"
    return [(np.asarray(order[a:b], dtype=np.int64), packed) for a, b in itertools.pairwise(offsets)]


def length_grouped(lengths: np.ndarray, budget: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """HF transformers' ``LengthGroupedSampler`` order (its batch size: the budget's rows on average), cut
    into batches under the padded-token ``budget``."""
    import torch
    from transformers.trainer_pt_utils import LengthGroupedSampler

    rows = max(1, round(budget / float(lengths.mean())))
    peer = LengthGroupedSampler(rows, lengths=lengths.tolist(), generator=torch.Generator().manual_seed(seed))
    return baselines.cut(lengths, np.fromiter(iter(peer), dtype=np.int64), max_tokens=budget)


def group_steps(tokens, target: float) -> list[int]:
    """Ends of the optimizer steps that consecutive micro-batches of ``tokens`` real tokens form, holding
    every step near ``target`` real tokens and the running total near ``steps × target``: a micro-batch
    joins the step unless the running total is nearer the step's goal (``k × target`` for step ``k``)
    without it. So after every step the total is within half a micro-batch of its goal, and a step is
    within one micro-batch of ``target`` (what one step is short the next makes up, as error diffusion
    does); a micro-batch larger than the goal is a step of its own."""
    if not target > 0:
        raise ValueError(f"target must be positive, got {target}")
    ends, total, goal, open_step = [], 0.0, target, False
    for i, t in enumerate(tokens):
        if open_step and abs(total + t - goal) > abs(total - goal):
            ends.append(i)
            goal += target
            while goal < total:  # a step far over its goal: the next goal still lies ahead
                goal += target
        total += t
        open_step = True
    if open_step:
        ends.append(len(tokens))
    return ends


def step_tokens(lengths: np.ndarray, budget: int) -> float:
    """The real tokens of every strategy's optimizer step: what dflash_batch's padded micro-batches held on
    average at ``target_efficiency=0.98`` (the planner's default when the benchmark was set up), × the
    accumulation. Pinned to that setting so that a change of the planner's default changes dflash_batch's
    runs only, not every strategy's step size (and with it every recorded run)."""
    sampler = db.BucketSampler(
        lengths, max_tokens=budget, seed=0, accumulation=ACCUMULATION, mode="padded", target_efficiency=0.98
    )
    plan = sampler.plan(0)
    order, offsets = np.asarray(plan.indices), np.asarray(plan.offsets, dtype=np.int64)
    return ACCUMULATION * float(np.mean([lengths[order[a:b]].sum() for a, b in itertools.pairwise(offsets)]))


def plan_steps(strategy, view, lengths, budget, max_len, seed, target, steps):
    """``steps`` optimizer steps of ``strategy`` (epochs drawn as needed), grouped as ``view`` says."""
    out, epoch, pending = [], 0, []
    while len(out) < steps:
        pending += micro_batches(strategy, lengths, budget, max_len, seed, epoch)
        epoch += 1
        if view == "tokens":
            ends = group_steps([int(lengths[i].sum()) for i, _ in pending], target)
        else:
            ends = list(range(ACCUMULATION, len(pending) + 1, ACCUMULATION))
        starts = [0, *ends[:-1]]
        whole = [pending[a:b] for a, b in zip(starts, ends, strict=True)]
        # The last step of a pass may be short: it waits for the next epoch's micro-batches.
        keep = len(whole) - 1 if view == "tokens" else len(whole)
        out += whole[:keep]
        pending = [mb for step in whole[keep:] for mb in step] + pending[ends[-1] if ends else 0 :]
    return out[:steps]


def model_for(corpus: Corpus, size: str, seed: int, device):
    import torch
    import transformers

    max_len, _, hidden, layers, heads, *_ = SIZES[size]
    config = transformers.LlamaConfig(
        vocab_size=corpus.vocab, hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=heads, max_position_embeddings=max_len,
        attn_implementation="sdpa", tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(seed)  # the same init for every strategy of a seed
    return transformers.LlamaForCausalLM(config).to(device)


def inputs_of(store, indices, packed: bool, budget: int, device) -> dict:
    import torch

    if packed:
        batch = db.collate_packed(store, indices, capacity=budget)
        keys = ("input_ids", "labels", "position_ids")
        got = {k: torch.from_numpy(batch[k]).to(device) for k in keys}
        return {**got, "use_cache": False}
    batch = db.collate(store, indices)
    return {k: torch.from_numpy(batch[k]).to(device) for k in ("input_ids", "labels", "attention_mask")}


def projected(lengths: np.ndarray, indices: np.ndarray, packed: bool, budget: int, width: int) -> float:
    """The micro-batch's time in units of ``budget`` tokens of linear work (see the module docs)."""
    own = lengths[indices].astype(np.float64)
    if packed:
        return (budget + (own**2).sum() / (6 * width)) / budget
    longest = own.max()
    return len(own) * (longest + longest**2 / (6 * width)) / budget


def evaluate(model, held: dict, device) -> dict:
    """Held-out loss per band (token-weighted) and overall."""
    import torch

    model.eval()
    sums, counts = {}, {}
    with torch.no_grad():
        for band, (store, batches) in held.items():
            for indices in batches:
                inputs = inputs_of(store, indices, False, 0, device)
                labels = inputs.pop("labels")
                logits = model(**inputs, use_cache=False).logits[:, :-1].float()
                target = labels[:, 1:]
                loss = torch.nn.functional.cross_entropy(
                    logits.reshape(-1, logits.shape[-1]), target.reshape(-1), ignore_index=-100, reduction="sum"
                )
                sums[band] = sums.get(band, 0.0) + float(loss)
                counts[band] = counts.get(band, 0) + int((target != -100).sum())
    model.train()
    out = {band: sums[band] / counts[band] for band in sums}
    out["all"] = sum(sums.values()) / sum(counts.values())
    return out


def train(run: Run, corpus: Corpus, store, held, size: str, device, evals: int) -> Run:
    """Trains a fresh model on ``run.steps``, evaluating ``evals`` times along the way."""
    import torch

    lengths = corpus.lengths.astype(np.int64)
    *_, budget, _, lr = SIZES[size]
    width = SIZES[size][2]
    model = model_for(corpus, size, run.seed, device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.1, betas=(0.9, 0.95))
    total = len(run.steps)
    warmup = max(1, total // 20)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / warmup) * (0.1 + 0.9 * 0.5 * (1 + np.cos(np.pi * s / total)))
    )
    at = set(np.linspace(0, total, evals + 1).round().astype(int).tolist())
    seen, clock, start = 0, 0.0, time.perf_counter()
    for step, micro in enumerate([*run.steps, None]):
        if step in at:
            run.curve.append({"step": step, "tokens": seen, "time": clock, **evaluate(model, held, device)})
        if micro is None:
            break
        labelled = sum(int(lengths[i].sum()) - len(i) for i, _ in micro)
        step_loss = 0.0
        for indices, packed in micro:
            inputs = inputs_of(store, indices, packed, budget, device)
            loss = model(**inputs, num_items_in_batch=labelled).loss
            loss.backward()
            step_loss += float(loss.detach())
            run.trained.append(indices)
            seen += int(lengths[indices].sum())
            clock += projected(lengths, indices, packed, budget, width)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        run.step_loss.append(step_loss)
    run.seconds = time.perf_counter() - start
    return run


def held_out_batches(corpus: Corpus, budget: int, per_band: int, directory: pathlib.Path) -> dict:
    """Per band, a store of at most ``per_band`` held-out documents and their padded batches."""
    held = {}
    lengths = np.array([len(d) for d in corpus.held_out])
    for k, (lo, hi) in enumerate(corpus.bands):
        members = np.flatnonzero((lengths >= lo) & (lengths < hi + (k == len(corpus.bands) - 1)))[:per_band]
        if not len(members):
            continue
        store = write_store([corpus.held_out[i] for i in members], directory / f"held_{k}.arrow")
        own = lengths[members]
        order, offsets = baselines.cut(own, np.argsort(own, kind="stable"), max_tokens=budget)
        batches = [order[a:b] for a, b in itertools.pairwise(offsets)]
        held[f"{lo}-{hi}"] = (store, batches)
    return held


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a tiny model on a 3,000-document subset (CPU)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    parser.add_argument("--steps", type=int, help="optimizer steps a run (default: --epochs epochs)")
    parser.add_argument("--epochs", type=float, help="epochs a run (default: 1 quick, 3 full)")
    parser.add_argument("--margin", type=float, default=MARGIN, help=f"TOST margin, nats (default {MARGIN})")
    parser.add_argument("--seeds", type=int, default=2, help="seeds per strategy (default 2)")
    parser.add_argument("--strategies", default=",".join(STRATEGIES), help="comma-separated subset")
    parser.add_argument("--views", default="tokens,steps", help="'tokens' (equal real tokens a step), 'steps'")
    parser.add_argument("--files", type=int, help="use the first N standard-library files (tests)")
    parser.add_argument("--evals", type=int, default=8, help="held-out evaluations a run (default 8)")
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("convergence-out"), help="output folder")
    parser.add_argument("--cache", type=pathlib.Path, default=pathlib.Path(".convergence-cache"))
    parser.add_argument("--json", metavar="FILE", help="record the summary under --section of FILE")
    parser.add_argument(
        "--reuse", type=pathlib.Path, nargs="+", default=[], metavar="FILE",
        help="convergence.json files whose runs of the same setup and plan to keep",
    )  # fmt: skip
    parser.add_argument("--section", default="convergence", help="the section of --json (default convergence)")
    return parser.parse_args(argv)


def run_all(args: argparse.Namespace) -> tuple[list[Run], dict, str]:
    """Every run the arguments ask for, their summary, and the table written to ``args.out``."""
    import torch
    from _convergence_report import report

    size = "quick" if args.quick else "full"
    max_len, vocab, *_, budget, samples, _ = SIZES[size]
    device = torch.device(args.device)
    corpus = build(args.cache, max_len=max_len, vocab=vocab, samples=samples, files=args.files)
    lengths = corpus.lengths
    args.out.mkdir(parents=True, exist_ok=True)
    key = f"{max_len}-{vocab}-{samples}-{args.files}"
    store = write_store(corpus.train, args.cache / f"train-{key}.arrow")
    held = held_out_batches(corpus, budget, 48 if args.quick else 256, args.cache / f"held-{key}")
    target = step_tokens(lengths, budget)
    epochs = args.epochs or (1 if args.quick else 3)
    steps = args.steps or int(np.ceil(epochs * lengths.sum() / target))
    print(
        f"{len(lengths):,} training documents ({corpus.kinds}), {int(lengths.sum()):,} tokens, "
        f"{len(corpus.held_out):,} held out; {steps} steps of ~{target:,.0f} real tokens; device {device}"
    )
    runs = []
    done = reused(args.reuse, {"size": size, "target": target, "steps": steps, "device": str(device)})
    for view in args.views.split(","):
        for strategy in args.strategies.split(","):
            for seed in range(args.seeds):
                run = Run(_at_target.key(strategy), seed, view)
                run.steps = plan_steps(strategy, view, lengths, budget, max_len, seed, target, steps)
                run.plan = digest(run.steps)
                former = done.get((run.strategy, seed, view))
                same = same_plan(done, run)
                if former is not None and former.plan == run.plan:
                    run, how = former, " (reused)"
                elif same is not None:  # another strategy's run of this plan (a default moved onto it)
                    run, how = same, f" (reused: the same plan as {same.strategy})"
                    run = dataclasses.replace(run, strategy=_at_target.key(strategy))
                else:
                    train(run, corpus, store, held, size, device, args.evals)
                    how = "" if former is None else " (trained again: its plan changed)"
                runs.append(run)
                last = run.curve[-1]
                print(
                    f"  {view:<6} {run.strategy:<14} seed {seed}: held-out {last['all']:.4f} after "
                    f"{last['tokens']:,} tokens, {run.seconds:.0f} s{how}",
                    flush=True,
                )
    meta = {
        "size": size, "target": target, "steps": steps, "device": str(device), "seeds": args.seeds,
        "margin": args.margin,
    }  # fmt: skip
    summary, text = report(runs, corpus, args.out, meta)
    return runs, {**meta, "documents": len(lengths), "tokens": int(lengths.sum()), "summary": summary}, text


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("--device cuda: no CUDA device here (run on a GPU machine, or --device cpu)", file=sys.stderr)
        return 2
    try:
        names = {_at_target.split(s)[0] for s in args.strategies.split(",")}
    except ValueError as e:
        print(e, file=sys.stderr)
        return 2
    unknown = names - set(STRATEGIES) or set(args.views.split(",")) - {"tokens", "steps"}
    if unknown:
        print(f"unknown strategy or view {sorted(unknown)}: see --help", file=sys.stderr)
        return 2
    _, summary, text = run_all(args)
    print(text)
    if args.json:
        from _figures import command_of, write

        command = command_of("convergence.py", argv if argv is not None else sys.argv[1:])
        write(args.json, args.section, {**summary, "table": "\n\n" + text.strip() + "\n\n"}, command)
    print(f"written: {args.out}/convergence.json, convergence.md, convergence.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
