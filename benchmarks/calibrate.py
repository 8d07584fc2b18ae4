"""Issue 42's evidence: a rank price refitted from a real model's step times, on the CPU.

A small transformer (causal attention, so a step costs about ``c + a·L + b·L²``) trains padded batches of
the seed workload's lengths scaled down by 8, on ``--ranks`` simulated ranks (each micro-batch of the plan
timed in turn: ranks of one process would share 2 cores). Epoch 0 is planned with the default price
(tokens) and timed; ``StepTimer.end_epoch()`` refits the price. Epoch 1 is then timed three ways — balanced
by tokens, by the refitted price, and by the price ``db.measure_cost`` finds on a grid of shapes before
training ("true", from the start) — and the synchronous efficiency per micro-batch measured on each (the
ranks' time over what they spend waiting for the slowest) is printed beside what the fit predicted.

The timer's own cost is measured too: a record (the batch's features and an append) and the epoch's fit,
as a share of the micro-batches' time (the issue asks ≤ 1%).

    python benchmarks/calibrate.py [--samples 2000] [--ranks 4] [--accumulation 2] [--json docs/figures.json]
"""

from __future__ import annotations

import argparse
import json
import time

import dflash_batch as db
import numpy as np
from _figures import write


def model_step(torch, width: int = 64):
    """A 2-layer causal transformer's forward and backward on a padded ``[rows, L]`` batch."""
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(width, 4, 2 * width, dropout=0.0, batch_first=True)
    net = torch.nn.ModuleDict(
        {
            "embed": torch.nn.Embedding(1000, width),
            "body": torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False),
            "head": torch.nn.Linear(width, 1000),
        }
    )

    def step(input_ids):
        length = input_ids.shape[1]
        mask = torch.nn.Transformer.generate_square_subsequent_mask(length)
        hidden = net["body"](net["embed"](input_ids), mask=mask, is_causal=True)
        loss = torch.nn.functional.cross_entropy(net["head"](hidden).flatten(0, 1), input_ids.flatten())
        loss.backward()
        net.zero_grad(set_to_none=True)

    return step


def timed_epoch(torch, step, sampler, epoch, timer, ranks, spent=None, repeats=1):
    """Trains every micro-batch of ``epoch`` (rank ``i % ranks`` for batch ``i``), timing each into ``timer``
    (the seconds its records took added to ``spent[0]``, the micro-batches' to ``spent[1]``); returns the
    measured synchronous efficiency per micro-batch. Each micro-batch runs ``repeats`` times and keeps its
    fastest: what the device takes, without the spikes of other work on a shared machine."""
    sampler.set_epoch(epoch)
    plan = sampler.plan(epoch)
    lengths = sampler.schedule.lengths()
    times = np.zeros(len(plan))
    for i in range(len(plan)):
        batch = plan[i]
        longest = int(lengths[batch].max())
        ids = torch.randint(0, 1000, (len(batch), longest))
        runs = []
        for _ in range(repeats):
            start = time.perf_counter()
            step(ids)
            runs.append(time.perf_counter() - start)
        times[i] = min(runs)
        if timer is not None:
            start = time.perf_counter()
            timer.record(batch, times[i], rank=i % ranks)
            if spent is not None:
                spent[0] += time.perf_counter() - start
                spent[1] += times[i]
    grid = times[: len(times) // ranks * ranks].reshape(-1, ranks)
    return float(grid.sum() / (ranks * grid.max(axis=1).sum()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=2000)
    parser.add_argument("--json", metavar="FILE", help="record the figures under 'calibrate' of FILE")
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--accumulation", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=4096)
    parser.add_argument(
        "--repeats", type=int, default=2, help="runs of each micro-batch, the fastest kept (a shared CPU's noise)"
    )
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)  # one core per simulated rank's step: steadier times
    lengths = np.clip(db.seed_workload(args.samples, seed=0) // 8, 8, args.max_tokens)
    step = model_step(torch)
    options = {"max_tokens": args.max_tokens, "world_size": args.ranks, "rank": 0, "accumulation": args.accumulation}

    started = time.perf_counter()
    true = db.measure_cost(
        lambda batch: step(batch["input_ids"]), lengths=(64, 128, 256, 512, 1024), rows=(1, 2, 4), device="cpu"
    )
    refit = db.BucketSampler(lengths, **options)
    timer = db.StepTimer(refit, all_ranks_here=True)  # one process times every rank
    spent = [0.0, 0.0]
    timed_epoch(torch, step, refit, 0, timer, args.ranks, spent, args.repeats)
    start = time.perf_counter()
    first = timer.end_epoch()
    spent[0] += time.perf_counter() - start
    results = {
        "true_price": true.cost,
        "epoch0": str(first),
        "fitted_price": first.price,
        "applied": first.applied,
        "overhead": spent[0] / spent[1],
    }
    for name, sampler in (
        ("tokens", db.BucketSampler(lengths, **options)),
        ("refit", refit),
        ("true", db.BucketSampler(lengths, **options, rank_cost=true.cost)),
    ):
        recorder = db.StepTimer(sampler, all_ranks_here=True) if name == "refit" else None
        measured = timed_epoch(torch, step, sampler, 1, recorder, args.ranks, repeats=args.repeats)
        results[name] = {"measured": measured, "predicted": sampler.plan(1).stats()["sync_efficiency"]}
        if recorder is not None:
            report = recorder.end_epoch()
            results[name]["fit_predicted"] = report.predicted
            results[name]["fit_measured"] = report.measured
    results["seconds"] = time.perf_counter() - started
    print(json.dumps(results, indent=1, default=str))
    figures = {
        "true_ratio": true.cost[1] / true.cost[0],
        "fitted_ratio": first.price[1] / first.price[0] if first.price else None,
        "applied": first.applied,
        "overhead": results["overhead"],
        "epoch0": {"measured": first.measured, "predicted": first.predicted},
        **{name: results[name] for name in ("tokens", "refit", "true")},
        "samples": args.samples,
        "ranks": args.ranks,
        "accumulation": args.accumulation,
        "repeats": args.repeats,
    }
    write(args.json, "calibrate", figures, "python benchmarks/calibrate.py")


if __name__ == "__main__":
    main()
