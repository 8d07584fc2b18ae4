"""Command line: ``dflash-batch demo`` and ``dflash-batch analyze SOURCE`` (an Arrow dataset, or a
lengths file: ``.npy`` or one integer per line)."""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import time

import numpy as np

from ..data.reading import read_lengths
from ..data.sources import regular_file
from ..data.workload import SEED_SAMPLES, seed_workload
from ..planning.sampler import BucketSampler
from . import analyze as report
from . import baselines


def _plan_ms(sampler: BucketSampler, epochs: int) -> float:
    times = []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        start = time.perf_counter()
        sampler.plan()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def demo(args: argparse.Namespace) -> int:
    """Plans epochs of the seed workload and compares them with today's strategies (or, with ``--json``,
    prints the figures as one JSON object)."""
    # ~40 bytes a sample at the peak (the generator's float64 draws, the lengths, the baselines' plans).
    need, memory = args.samples * 40, os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if need > memory:
        print(
            f"dflash-batch: --samples {args.samples:,} needs about {need / 2**30:,.0f} GiB, more than this machine's "
            f"{memory / 2**30:,.0f} GiB; pass at most {memory // 40:,}",
            file=sys.stderr,
        )
        return 2
    lengths = seed_workload(args.samples, seed=args.seed)
    sampler = BucketSampler(
        lengths, max_tokens=args.max_tokens, world_size=args.world_size, seed=args.seed, accumulation=args.accumulation
    )
    figures = _demo_figures(lengths, sampler, _plan_ms(sampler, args.epochs), args)
    if args.json:
        print(report.to_json(figures))
        return 0
    stats, ms = figures["stats"], figures["plan_ms"]
    print(
        f"seed workload: {len(lengths):,} samples, mean {lengths.mean():.0f} tokens, "
        f"median {np.median(lengths):.0f}, longest {lengths.max()}"
    )
    print(
        f"\ndflash_batch: max_tokens={args.max_tokens}, world_size={args.world_size}, "
        f"{stats['buckets']} buckets {sampler.edges}"
    )
    print(
        f"  {stats['batches']:,} batches, {stats['steps']:,} steps per rank, "
        f"{stats['min_rows']}–{stats['max_rows']} rows per batch"
    )
    print(f"  padding efficiency {stats['efficiency']:.3f}, planned in {ms:.1f} ms per epoch (median of {args.epochs})")
    print(
        f"  mixing over windows of {stats['window']} batches: length_gap {stats['length_gap']:.3f} (the last "
        f"tenth {stats['length_gap_tail']:.3f}), window_tv {stats['window_tv']:.3f} ({stats['window_tv_tail']:.3f}); "
        f"churn {figures['churn']:.5f}; rank imbalance p99 {stats['rank_imbalance_p99']:.2f}"
    )
    if stats["sync_efficiency"] is not None:
        print(
            f"  ranks in sync: {stats['sync_efficiency']:.3f} of the GPUs' time works when they meet every "
            f"micro-batch, {stats['sync_efficiency_step']:.3f} every optimizer step; end to end (padding "
            f"included) {stats['end_to_end_efficiency']:.3f} / {stats['end_to_end_efficiency_step']:.3f} trains "
            "real tokens"
        )
    first = sampler.plan(0)[0]
    print(f"  epoch 0, step 0, rank 0: {len(first)} samples of lengths {sorted(lengths[first].tolist())}")

    print(f"\n{'strategy (same data)':<34} {'efficiency':>10}   reshuffled each epoch?")
    rows = [(name, eff, "no" if name.startswith("sorted") else "yes") for name, eff in figures["baselines"].items()]
    for name, eff, mixed in [*rows, ("dflash_batch", stats["efficiency"], "yes")]:
        print(f"{name:<34} {eff:>10.3f}   {mixed}")
    if args.loader_rows:
        _loader_demo(lengths[: args.loader_rows], args)
    return 0


def _demo_figures(lengths: np.ndarray, sampler: BucketSampler, ms: float, args: argparse.Namespace) -> dict:
    """What the demo reports, as plain values: the plan's figures beside today's strategies."""
    baseline = {
        "sorted static batches of 8": baselines.efficiency(lengths, *baselines.sorted_static(lengths, 8)),
        "random shuffle, batches of 8": baselines.efficiency(lengths, *baselines.random_shuffle(lengths, 8)),
        "seed's 6 buckets, token budget": baselines.efficiency(
            lengths, *baselines.seed_bucketed(lengths, max_tokens=args.max_tokens)
        ),
    }
    stats = sampler.plan(0).stats()
    return {
        "samples": len(lengths),
        "mean_length": float(lengths.mean()),
        "max_tokens": args.max_tokens,
        "world_size": args.world_size,
        "accumulation": args.accumulation,
        "edges": sampler.edges,
        "plan_ms": ms,
        "churn": sampler.plan(0).churn(sampler.plan(1)),
        "stats": {k: v for k, v in stats.items() if isinstance(v, (int, float, str, type(None)))},
        "baselines": {name: value for name, value in baseline.items() if value is not None},
    }


def _loader_demo(lengths: np.ndarray, args: argparse.Namespace) -> None:
    """Writes a tokenized Arrow file of ``lengths`` and runs one epoch of the Loader over it."""
    try:
        import pyarrow as pa
        import torch  # noqa: F401
    except ImportError:
        print("\n(Loader demo skipped: install the torch and arrow extras)")
        return
    import tempfile

    from ..data.reading import TokenStore
    from ..loading.loader import Loader

    offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    tokens = (np.arange(offsets[-1], dtype=np.int64) % 32_000).astype(np.int32)
    with tempfile.TemporaryDirectory() as directory:
        path = f"{directory}/tokens.arrow"
        table = pa.table({"input_ids": pa.ListArray.from_arrays(pa.array(offsets), pa.array(tokens))})
        with pa.OSFile(path, "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
            for batch in table.to_batches(max_chunksize=1000):
                writer.write_batch(batch)
        store = TokenStore(path)
        sampler = BucketSampler(store.lengths(), max_tokens=args.max_tokens, seed=args.seed)
        start = time.perf_counter()
        with Loader(store, sampler, prefetch=2) as loader:
            steps = sum(1 for _ in loader)
            ring = loader.memory_bytes
        seconds = time.perf_counter() - start
    print(
        f"\nLoader (CPU, int64 tensors) over a {len(lengths):,}-row Arrow file: {steps:,} batches in "
        f"{seconds * 1e3:.0f} ms, {lengths.sum() / seconds / 1e6:.0f} M real tokens/s; "
        f"prefetch ring {ring / 2**20:.1f} MiB"
    )


def _lengths(source: str, column: str | None) -> np.ndarray:
    if source.endswith(".npy"):
        lengths = np.load(_checked_file(source), allow_pickle=False)
        if lengths.dtype.kind not in "iu":  # floats would be truncated to integers without a word
            raise ValueError(f"{source} holds {lengths.dtype} values; lengths are integers (save an integer array)")
        return lengths
    if source.endswith((".txt", ".csv")):
        return np.atleast_1d(np.loadtxt(_checked_file(source), dtype=np.int64))  # one line is one sample
    return read_lengths(source, column)


def _as_flags(message: str) -> str:
    """A library message as the command line's: ``column="x"`` is ``--column x`` here."""
    message = re.sub(r'pass column="([^"]*)"', r"pass --column \1", message)
    return message.replace("pass one of them as column=", "pass one of them with --column")


def _checked_file(source: str) -> str:
    """A lengths file this process opens itself, through the library's opener of such files: a regular
    file (a FIFO would block the open forever, a device read forever) of at most 1 GiB."""
    regular_file(source, "pass a lengths file (.npy, or .txt/.csv with one integer per line) of at most 1 GiB; "
                 "save larger ones as .npy with np.save", limit=2**30)  # fmt: skip
    return source


def analyze(args: argparse.Namespace) -> int:
    """Prints a dataset's histogram, the chosen buckets and the strategies table (or JSON, or a PNG)."""
    if (args.source is None) == (not args.demo):
        print("dflash-batch: pass a SOURCE or --demo (the generated seed workload), not both", file=sys.stderr)
        return 2
    if args.batch_size and args.max_tokens:
        print(
            "dflash-batch: pass --max-tokens or --batch-size, not both (a batch is sized by one rule)",
            file=sys.stderr,
        )
        return 2
    if args.plot and not _writable(args.plot):
        print(
            f"dflash-batch: --plot {args.plot} cannot be written; pass a path in a writable directory", file=sys.stderr
        )
        return 2
    try:
        lengths = seed_workload(args.samples) if args.demo else _lengths(args.source, args.column)
    except (OSError, ValueError) as err:
        print(f"dflash-batch: cannot read lengths from {args.source}: {_as_flags(str(err))}", file=sys.stderr)
        return 2
    lengths = np.asarray(lengths, dtype=np.int64)
    rule = {"batch_size": args.batch_size} if args.batch_size else {"max_tokens": args.max_tokens or 16384}
    sampler = BucketSampler(
        lengths,
        **rule,
        boundaries=args.boundaries,
        world_size=args.world_size,
        rank=0,
        oversize=args.oversize,
        accumulation=args.accumulation,
        target_efficiency=args.target_efficiency,
    )
    skipped = None
    if args.oversize == "skip":  # baselines must see what the plan sees
        limit = rule.get("max_tokens", np.iinfo(np.int64).max)
        kept = lengths <= limit
        total = int(lengths.sum())
        gone = int(lengths[~kept].sum())
        skipped = {"samples": int((~kept).sum()), "tokens": gone, "token_share": gone / total if total else 0.0}
        lengths = lengths[kept]
    result = report.report(lengths, sampler=sampler, rule=rule, accumulation=args.accumulation, peers=not args.no_peers)
    if skipped is not None:
        result["skipped"] = skipped
    result["plan_ms"] = _plan_ms(sampler, 5)
    if args.json:
        print(report.to_json(result))  # strict JSON: figures a plan cannot have are null
    else:
        report.print_report(result)
        print(f"\nplanned in {result['plan_ms']:.1f} ms per epoch")
    if args.plot:
        report.plot(result, args.plot)
        if not args.json:
            print(f"plot written to {args.plot}")
    return 0


def _boundaries(text: str):
    if text == "auto":
        return text
    if "," in text:
        return [int(x) for x in text.split(",")]
    return int(text)


def _writable(path: str) -> bool:
    """Whether a file can be created or replaced at ``path`` (checked before any work is done)."""
    directory = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path) or not os.path.isdir(directory):
        return False
    return os.access(path if os.path.exists(path) else directory, os.W_OK)


def _samples(text: str) -> int:
    """A sample count the planner can hold (at most 2**32 - 1)."""
    value = _count(text)
    if value > 2**32 - 1:
        raise argparse.ArgumentTypeError(f"{value} is invalid; a plan holds at most 4,294,967,295 samples")
    return value


def _natural(text: str) -> int:
    """An integer ≥ 0, or argparse's error naming the option."""
    return _at_least(text, 0)


def _count(text: str) -> int:
    """A positive integer argument, or argparse's error naming the option."""
    return _at_least(text, 1)


def _at_least(text: str, low: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer; pass an integer ≥ {low}") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"{value} is invalid; pass an integer ≥ {low}")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dflash-batch", description="Length-bucketed batch planning.")
    sub = parser.add_subparsers(dest="command", required=True)
    d = sub.add_parser("demo", help="plan the seed workload and compare with today's strategies")
    d.add_argument("--samples", type=_samples, default=SEED_SAMPLES)
    d.add_argument("--max-tokens", type=int, default=16384)
    d.add_argument("--world-size", type=int, default=8)
    d.add_argument("--epochs", type=_count, default=9)
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--accumulation", type=int, default=4, help="micro-batches per optimizer step (mixing windows)")
    d.add_argument("--loader-rows", type=_natural, default=50_000, help="rows of the Loader demo (0 skips it)")
    d.add_argument("--json", action="store_true", help="print the planning figures as JSON (no Loader demo)")
    d.set_defaults(run=demo)
    a = sub.add_parser(
        "analyze",
        help="histogram, chosen buckets and a strategies table for a dataset: an Arrow file, save_to_disk "
        "directory or glob, a lengths file (.npy, or .txt/.csv with one integer per line), or --demo",
    )
    a.add_argument("source", nargs="?")
    a.add_argument("--demo", action="store_true", help="analyze the generated seed workload instead")
    a.add_argument("--samples", type=_samples, default=SEED_SAMPLES, help="samples of --demo")
    a.add_argument(
        "--column",
        default=None,
        help="lengths column, or a list column such as input_ids (default: seq_len when "
        "the data has it, else input_ids)",
    )
    a.add_argument("--max-tokens", type=_count, help="padded-token budget per batch (default 16384)")
    a.add_argument("--batch-size", type=_count, help="rows per batch instead of a token budget")
    a.add_argument("--boundaries", type=_boundaries, default="auto", help="'auto', a count, or e0,e1,...")
    a.add_argument("--target-efficiency", type=float, default=None)
    a.add_argument("--world-size", type=int, default=8)
    a.add_argument("--accumulation", type=int, default=4)
    a.add_argument("--oversize", choices=["error", "skip"], default="error")
    a.add_argument(
        "--no-peers", action="store_true", help="leave out HF's BatchRebalanceSampler (seconds per million samples)"
    )
    a.add_argument("--json", action="store_true", help="print the report as JSON")
    a.add_argument("--plot", metavar="FILE.png", help="draw the histogram, edges and strategies (matplotlib)")
    a.set_defaults(run=analyze)
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except BrokenPipeError:
        # The reader closed the pipe (`... --json | head -c 100`): nothing more to say, and nothing to flush
        # at exit either (a second BrokenPipeError would print a traceback).
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
    except (ValueError, TypeError, ImportError) as err:
        print(f"dflash-batch: {_as_flags(str(err))}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
