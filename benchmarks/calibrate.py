"""Issue 42's evidence: a rank price refitted from a real model's step times, on the CPU.

A small transformer (causal attention, so a step costs about ``c + a·L + b·L²``) trains padded batches of
the seed workload's lengths scaled down by 8, on ``--ranks`` simulated ranks (each micro-batch of the plan
timed in turn: ranks of one process would share 2 cores). Epoch 0 is planned with the default price
(tokens) and timed; ``StepTimer.end_epoch()`` refits the price. Epoch 1 is then timed three ways — balanced
by tokens, by the refitted price, and by the price ``db.measure_cost`` finds on a grid of shapes before
training ("true", from the start) — and the synchronous efficiency per micro-batch measured on each (the
ranks' time over what they spend waiting for the slowest) is printed beside what the fit predicted.

    python benchmarks/calibrate.py [--samples 3000] [--ranks 4] [--accumulation 2]
"""

from __future__ import annotations

import argparse
import json
import time

import dflash_batch as db
import numpy as np


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


def timed_epoch(torch, step, sampler, epoch, timer, ranks):
    """Trains every micro-batch of ``epoch`` (rank ``i % ranks`` for batch ``i``), timing each into ``timer``;
    returns the measured synchronous efficiency per micro-batch."""
    sampler.set_epoch(epoch)
    plan = sampler.plan(epoch)
    lengths = sampler.schedule.lengths()
    times = np.zeros(len(plan))
    for i in range(len(plan)):
        batch = plan[i]
        longest = int(lengths[batch].max())
        ids = torch.randint(0, 1000, (len(batch), longest))
        start = time.perf_counter()
        step(ids)
        times[i] = time.perf_counter() - start
        if timer is not None:
            timer.record(batch, times[i], rank=i % ranks)
    grid = times[: len(times) // ranks * ranks].reshape(-1, ranks)
    return float(grid.sum() / (ranks * grid.max(axis=1).sum()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=3000)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--accumulation", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=4096)
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
    timer = db.StepTimer(refit)
    timed_epoch(torch, step, refit, 0, timer, args.ranks)
    first = timer.end_epoch()
    results = {"true_price": true.cost, "epoch0": str(first), "fitted_price": first.price, "applied": first.applied}
    for name, sampler in (
        ("tokens", db.BucketSampler(lengths, **options)),
        ("refit", refit),
        ("true", db.BucketSampler(lengths, **options, rank_cost=true.cost)),
    ):
        recorder = db.StepTimer(sampler) if name == "refit" else None
        measured = timed_epoch(torch, step, sampler, 1, recorder, args.ranks)
        results[name] = {"measured": measured, "predicted": sampler.plan(1).stats()["sync_efficiency"]}
        if recorder is not None:
            report = recorder.end_epoch()
            results[name]["fit_predicted"] = report.predicted
            results[name]["fit_measured"] = report.measured
    results["seconds"] = time.perf_counter() - started
    print(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    main()
