"""The Loader on a real GPU: pinned slots, copies overlapped with compute, device tensors correct.

    python benchmarks/cuda_check.py              # needs CUDA; under a minute
    python benchmarks/cuda_check.py --rows 50000
    python benchmarks/cuda_check.py --max-tokens 131072 --steps 100   # 4 MiB copies per batch
    python benchmarks/cuda_check.py --device cpu # dry run of the checks that apply without a GPU (2, 5, 6, 7)

Checks, in order (each prints one line; any failure exits 1):
  1. the ring's host slots are pinned and the Loader's tensors live on the GPU;
  2. every device batch of part of an epoch equals ``db.collate`` of the same indices on the host;
  3. overlap: a matmul "training step" on the default stream, alone and fed by the Loader, in
     interleaved rounds timed with CUDA events (target: the median slowdown within 5%), with how long
     the trainer's thread waited in ``next()``; then, under the torch profiler, the GPU's idle time, the
     host-to-device copies (time, bandwidth, share of it while a kernel ran: hidden under compute) and
     the host calls that can stall the pipeline (cudaMalloc, synchronizations);
  4. a slot is rewritten only after its copy completed: device batches kept across steps stay equal to
     their host reference;
  5. int32 output with ``pad_to_multiple_of=64`` equals the host collation;
  6. a packed sampler's device batches (``cu_seqlens``, ``seq_idx``, ...) equal ``db.collate_packed``;
  7. breaking out mid-epoch and ``close()`` leave no worker thread alive, and the GPU still works.
Exits with status 2 and a message where CUDA is not available (and ``--device cpu`` was not asked).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from collections.abc import Iterator

import dflash_batch as db
import numpy as np
from _tokens import token_store


def make_store(rows: int) -> db.TokenStore:
    return token_store(db.seed_workload(rows))


def fail(message: str) -> None:
    print(f"FAIL: {message}", flush=True)
    sys.exit(1)


def same(batch: dict, expected: dict) -> bool:
    """Device (or host) tensors equal a host reference of numpy arrays and ints, key for key."""
    import torch

    if set(batch) != set(expected):
        return False
    for key, value in expected.items():
        got = batch[key]
        if isinstance(value, np.ndarray):
            if got.dtype != torch.from_numpy(value).dtype or not torch.equal(got.cpu(), torch.from_numpy(value)):
                return False
        elif got != value:
            return False
    return True


def check_equal(name: str, loader: db.Loader, references, steps: int) -> int:
    """Compares the Loader's first ``steps`` batches with ``references`` (an iterator of host batches)."""
    done = 0
    for step, (expected, batch) in enumerate(zip(references, loader, strict=False)):
        if step == steps:
            break
        if not same(batch, expected):
            fail(f"{name}, step {step}: the device batch differs from the host collation")
        done += 1
    loader.close()
    return done


def _trace_figures(path: str) -> dict[str, float]:
    """GPU-side figures of a torch profiler trace: the default stream's idle time between kernels, and the
    host-to-device copies (count, time, bytes, time spent while a kernel ran), with the host calls that
    can stall the pipeline (cudaMalloc, synchronizations)."""
    import json

    with open(path) as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    kernels = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e.get("cat") == "kernel")
    copies = [e for e in events if e.get("cat") == "gpu_memcpy" and "HtoD" in e.get("name", "")]
    busy: list[list[float]] = []  # the union of kernel intervals
    for lo, hi in kernels:
        if busy and lo <= busy[-1][1]:
            busy[-1][1] = max(busy[-1][1], hi)
        else:
            busy.append([lo, hi])
    window = kernels[-1][1] - kernels[0][0] if kernels else 0.0
    busy_us = sum(hi - lo for lo, hi in busy)
    copy_us = sum(e["dur"] for e in copies)
    hidden_us = 0.0
    for e in copies:
        lo, hi = e["ts"], e["ts"] + e["dur"]
        hidden_us += sum(max(0.0, min(hi, b_hi) - max(lo, b_lo)) for b_lo, b_hi in busy if b_hi > lo and b_lo < hi)
    runtime = [e for e in events if e.get("cat") == "cuda_runtime"]

    def calls(*names: str) -> tuple[int, float]:
        hits = [e for e in runtime if any(n in e.get("name", "") for n in names)]
        return len(hits), sum(e["dur"] for e in hits)

    return {
        "window_ms": window / 1e3,
        "idle_ms": (window - busy_us) / 1e3,
        "copies": len(copies),
        "copy_ms": copy_us / 1e3,
        "copy_bytes": sum(e.get("args", {}).get("bytes", 0) for e in copies),
        "hidden": hidden_us / max(copy_us, 1e-9),
        "mallocs": calls("cudaMalloc")[0],
        "syncs": calls("Synchronize"),
    }


def overlap(loader: db.Loader, device, steps: int, rounds: int = 3) -> None:
    """Check 3: a training step's compute alone, then fed by the Loader, in interleaved rounds timed with
    CUDA events; then one fed round under the torch profiler for the GPU-side picture."""
    import torch

    weight = torch.randn(4096, 4096, device=device)
    x0 = torch.randn(512, 4096, device=device)

    def compute() -> torch.Tensor:
        x = x0
        for _ in range(8):
            x = x @ weight
        return x

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def alone() -> float:
        torch.cuda.synchronize()
        start.record()
        for _ in range(steps):
            compute()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end)

    def fed(waits: list[float]) -> float:
        torch.cuda.synchronize()
        iterator = iter(loader)
        start.record()
        for _ in range(steps):
            begin = time.perf_counter()
            batch = next(iterator)
            waits.append(time.perf_counter() - begin)
            compute()
            batch["input_ids"].sum()  # the step reads its batch on the default stream
        end.record()
        torch.cuda.synchronize()
        loader.close()
        return start.elapsed_time(end)

    def profiled(label: str, run) -> dict[str, float] | None:
        """One round under the torch profiler, summarized (None where the profiler does not work)."""
        try:
            from torch.profiler import ProfilerActivity, profile

            path = tempfile.mkdtemp() + "/trace.json"
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                elapsed = run()
            prof.export_chrome_trace(path)
            f = _trace_figures(path)
        except Exception as error:  # the profiler is a diagnosis; the timed rounds are the check
            print(f"   (profiler unavailable: {type(error).__name__}: {error})", flush=True)
            return None
        print(
            f"   profiled, {label}: {elapsed:.1f} ms; GPU idle {f['idle_ms']:.2f} of {f['window_ms']:.1f} ms; "
            f"{f['copies']} H2D copies, {f['copy_ms']:.2f} ms, {f['copy_bytes'] / 2**20:.1f} MiB "
            f"({f['copy_bytes'] / max(f['copy_ms'], 1e-9) / 1e6:.1f} GB/s), {f['hidden']:.0%} of copy time "
            f"under a kernel; {f['mallocs']} cudaMalloc, {f['syncs'][0]} synchronizations "
            f"({f['syncs'][1] / 1e3:.1f} ms)",
            flush=True,
        )
        return f

    for _ in range(5):  # warm-up: cuBLAS handles and kernels
        compute()
    # The first fed round meets a cold caching allocator on the side stream: shown apart, as a cost
    # paid once per process, not per epoch.
    profiled("first fed round (cold allocator)", lambda: fed([]))
    ratios, lines, waits = [], [], []
    for _ in range(rounds):
        first, second = alone(), fed(waits)
        ratios.append(second / first)
        lines.append(f"{first:.1f}/{second:.1f}")
    waits_us = np.array(waits) * 1e6
    ratio = float(np.median(ratios))
    print(
        f"3. {steps} steps of compute, alone/fed by the Loader (ms, {rounds} interleaved rounds): "
        f"{', '.join(lines)}; median slowdown {ratio:.3f}×; trainer waited in next(): median "
        f"{np.median(waits_us):.0f} µs, p99 {np.percentile(waits_us, 99):.0f} µs, max {waits_us.max() / 1e3:.1f} ms",
        flush=True,
    )
    profiled("compute alone", alone)
    figures = profiled("fed by the Loader", lambda: fed([]))
    if ratio > 1.05:
        fail("the Loader slowed the training step by more than 5% (median of the rounds)")
    if figures is not None and figures["copies"] and figures["hidden"] < 0.5:
        fail("less than half of the copy time overlapped with compute")


def diagnose(loader: db.Loader, device, steps: int) -> None:
    """Where the host time of a fed step goes: the trainer's wait in ``next()`` (which starts the copies)
    and its launch time, against the worker's phases per batch (waiting for the slot's last copy,
    collation) and its period; with Python's default GIL switch interval and a shorter one. Then a
    host-bound step, fed by the Loader and by one batch reused."""
    import torch

    weight = torch.randn(4096, 4096, device=device)
    x0 = torch.randn(512, 4096, device=device)
    transfer = loader._transfer
    phases: dict[str, list[float]] = {"reuse": [], "collate": [], "send": [], "start": []}

    def timed(name, function):
        def wrapper(*args):
            begin = time.perf_counter()
            if name == "reuse":
                phases["start"].append(begin)
            try:
                return function(*args)
            finally:
                phases[name].append(time.perf_counter() - begin)

        return wrapper

    loader._collate_into = timed("collate", loader._collate_into)
    transfer.before_reuse = timed("reuse", transfer.before_reuse)
    transfer.send = timed("send", transfer.send)
    for interval in (sys.getswitchinterval(), 1e-4):
        sys.setswitchinterval(interval)
        for values in phases.values():
            values.clear()
        waits, launches = [], []
        torch.cuda.synchronize()
        iterator = iter(loader)
        for _ in range(steps):
            begin = time.perf_counter()
            batch = next(iterator)
            middle = time.perf_counter()
            x = x0
            for _ in range(8):
                x = x @ weight
            batch["input_ids"].sum()
            waits.append(middle - begin)
            launches.append(time.perf_counter() - middle)
        torch.cuda.synchronize()
        loader.close()

        def us(values) -> str:
            return f"{np.median(np.array(values[5:])) * 1e6:.0f}"

        period = np.diff(np.array(phases["start"]))
        print(
            f"   switch interval {interval * 1e3:g} ms: trainer per step: next() {us(waits)} µs (starting a copy "
            f"{us(phases['send'])} µs), launches {us(launches)} µs; worker per batch: period {us(period)} µs = "
            f"slot's copy wait {us(phases['reuse'])} + collate {us(phases['collate'])} µs + queues (medians)",
            flush=True,
        )
    sys.setswitchinterval(0.005)

    # A host-bound trainer: a step of one small matmul (the GPU waits on the host), fed by the Loader or
    # by one batch made ahead and reused; the difference is what the Loader costs the trainer's thread.
    small = torch.randn(1024, 1024, device=device)
    kept = {k: v.to(device) for k, v in next(iter(loader)).items()}
    loader.close()

    def host_bound(batches) -> float:
        torch.cuda.synchronize()
        begin = time.perf_counter()
        for _, batch in zip(range(steps), batches, strict=False):
            (x0[:, :1024] @ small).sum()
            batch["input_ids"].sum()
        torch.cuda.synchronize()
        return (time.perf_counter() - begin) / steps * 1e6

    reused, fed = [], []
    for _ in range(3):
        reused.append(host_bound(iter(lambda: kept, None)))
        fed.append(host_bound(iter(loader)))
        loader.close()
    print(
        f"   host-bound step (one 512×1024 @ 1024×1024 matmul): {np.median(reused):.0f} µs with one batch "
        f"reused, {np.median(fed):.0f} µs fed by the Loader (medians of 3 rounds of {steps} steps)",
        flush=True,
    )


def planned(sampler: db.BucketSampler) -> Iterator[np.ndarray]:
    """The epoch's batches read off the plan: iterating the sampler itself would be a second iteration
    of the Loader's position (one supersedes the other)."""
    plan = sampler.plan()
    return (plan[step] for step in range(plan.steps))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--max-tokens", type=int, default=16384, help="tokens per batch (the seed workload's 16384)")
    parser.add_argument("--diagnose", action="store_true", help="also time the host side of check 3's steps")
    parser.add_argument("--device", default="cuda", help="cuda (default), or cpu for a dry run of checks 2, 5-7")
    args = parser.parse_args()
    import torch

    cuda = args.device != "cpu"
    if cuda and not torch.cuda.is_available():
        print("cuda_check: CUDA is not available here; run this on a machine with a GPU (or pass --device cpu)")
        sys.exit(2)
    device = torch.device(args.device)
    name = torch.cuda.get_device_name(device) if cuda else "cpu (dry run)"
    print(f"device: {name}; torch {torch.__version__}; dflash_batch {db.__version__}", flush=True)
    began = time.perf_counter()
    store = make_store(args.rows)
    sampler = db.BucketSampler(store.lengths(), max_tokens=args.max_tokens, seed=0)
    print(f"   store: {args.rows:,} rows, {int(store.lengths().sum()):,} tokens; {len(sampler)} steps", flush=True)

    def loader(**kwargs) -> db.Loader:
        return db.Loader(store, kwargs.pop("sampler", sampler), device=device, prefetch=2, **kwargs)

    if cuda:  # 1. pinned slots, device tensors
        ring = loader()
        first = next(iter(ring))
        pinned = all(slot["block"].is_pinned() for slot in ring._pipeline._slots)
        on_gpu = all(t.device.type == "cuda" for t in first.values())
        print(
            f"1. slots pinned: {pinned}; batch on {first['input_ids'].device}; "
            f"ring {ring.memory_bytes / 2**20:.1f} MiB",
            flush=True,
        )
        ring.close()
        if not (pinned and on_gpu):
            fail("slots must be pinned and batches on the GPU")

    # 2. every device batch of (part of) an epoch equals the host collation
    references = (db.collate(store, indices) for indices in planned(sampler))
    print(f"2. {check_equal('int64', loader(), references, args.steps)} device batches equal db.collate", flush=True)

    if cuda:
        overlap(loader(), device, args.steps)  # 3.
        if args.diagnose:
            diagnose(loader(), device, args.steps)

        # 4. batches kept across steps stay intact (slots are rewritten only after their copy completed)
        kept, references = [], []
        for step, (indices, batch) in enumerate(zip(planned(sampler), loader(), strict=False)):
            if step == 20:
                break
            kept.append(batch)
            references.append(db.collate(store, indices))
        torch.cuda.synchronize()
        for step, (batch, expected) in enumerate(zip(kept, references, strict=True)):
            if not same(batch, expected):
                fail(f"batch {step} changed after later batches were loaded")
        print("4. 20 device batches kept across steps are unchanged", flush=True)

    # 5. int32, padded to a multiple of 64 (the sampler's padding, which its budgets count)
    padded = db.BucketSampler(store.lengths(), max_tokens=args.max_tokens, seed=0, pad_to_multiple_of=64)
    settings = {"dtype": "int32", "pad_to_multiple_of": 64}
    references = (db.collate(store, indices, **settings) for indices in planned(padded))
    done = check_equal("int32", loader(sampler=padded, dtype=torch.int32), references, 100)
    print(f"5. {done} int32 batches padded to a multiple of 64 equal db.collate", flush=True)

    # 6. packed rows
    packed = db.BucketSampler(store.lengths(), max_tokens=args.max_tokens, mode="packed", seed=0)
    references = (db.collate_packed(store, indices, capacity=args.max_tokens) for indices in planned(packed))
    done = check_equal("packed", loader(sampler=packed), references, 100)
    print(f"6. {done} packed rows (cu_seqlens, seq_idx, max_seqlen) equal db.collate_packed", flush=True)

    # 7. shutdown mid-epoch: no worker left, and the device is usable after
    before = {t for t in threading.enumerate() if t.name == "dflash-batch-loader"}
    stopped = loader()
    for step, _ in enumerate(stopped):
        if step == 5:
            break
    stopped.close()
    with loader() as scoped:
        next(iter(scoped))
    alive = [t for t in threading.enumerate() if t.name == "dflash-batch-loader" and t not in before]
    if alive:
        fail(f"{len(alive)} worker thread(s) still alive after close()")
    if cuda:
        torch.cuda.synchronize()
    print("7. breaking out, close() and a with block leave no worker thread alive", flush=True)
    print(f"cuda_check: all checks passed in {time.perf_counter() - began:.1f} s", flush=True)


if __name__ == "__main__":
    main()
