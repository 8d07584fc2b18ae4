"""The child side of the adversarial suite (tests/_adversary.py starts it): runs each case read from stdin
(JSON lines) against the public API and prints one JSON line per case — before it starts, and after, with
the outcome: ``ok``, ``raised`` (a documented exception type) or ``failed`` (an undocumented exception type
or a broken invariant, with the reason). A signal or a hang shows as a case started and never finished.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import traceback
import warnings

import dflash_batch as db
import numpy as np

# What the API documents it raises on bad input: ValueError and TypeError subclasses (PlanError,
# DataError), IndexError for indexing, MemoryError, and OSError subclasses for files.
DOCUMENTED = (ValueError, TypeError, IndexError, MemoryError, OSError)


class Broken(AssertionError):
    """An invariant that does not hold."""


def check(condition: bool, what: str) -> None:
    if not condition:
        raise Broken(what)


def make_lengths(spec):
    """Lengths from a case's spec: {"values": [...], "dtype": ...}, or a special input."""
    kind = spec.get("kind", "array")
    if kind == "array":
        return np.array(spec["values"], dtype=spec["dtype"])
    if kind == "list":
        return list(spec["values"])
    if kind == "arrow":
        import pyarrow as pa

        return pa.array(spec["values"], type=getattr(pa, spec["dtype"])())
    if kind == "generator":
        return (v for v in spec["values"])
    if kind == "none":
        return None
    if kind == "float":
        return np.array(spec["values"], dtype=np.float64)
    raise ValueError(f"unknown lengths kind {kind}")


def padded(length: int, multiple: int) -> int:
    return -(-length // multiple) * multiple


def sampler_invariants(lengths, kwargs, world) -> None:
    """Every rank's plan: no sample twice, budgets kept, equal steps, thread-count determinism, resume."""
    plans = []
    for rank in range(min(world, 3)):
        sampler = db.BucketSampler(lengths, world_size=world, rank=rank, **kwargs)
        plan = sampler.plan(0)
        plans.append(plan)
        check(len(sampler) == plan.steps and len(plan) == plan.steps * world, "steps and len disagree")
        if rank == 0:
            indices = np.asarray(plan.indices)
            check(len(np.unique(indices)) == len(indices), "a sample appears twice in one epoch")
            stats = plan.stats()
            if kwargs.get("oversize") != "truncate":
                expected = sampler.num_samples - stats["skipped"] - stats["dropped"]
                check(len(indices) == expected, f"{len(indices)} samples planned, {expected} expected")
            values = np.asarray(sampler.schedule.lengths(), dtype=np.int64)
            check_budgets(plan, values, kwargs)
            one = db.BucketSampler(lengths, world_size=world, rank=rank, **{**kwargs, "threads": 1})
            p1 = one.plan(0)
            check(
                np.array_equal(p1.indices, plan.indices) and np.array_equal(p1.offsets, plan.offsets),
                "threads=1 plans another epoch",
            )
        if plan.steps >= 2:
            step = plan.steps // 2
            state = sampler.state_dict(step=0)
            state["step"] = step
            again = db.BucketSampler(lengths, world_size=world, rank=rank, **kwargs)
            again.load_state_dict(state)
            rest = [b.tolist() for b in again]
            want = [plan[s * world + rank].tolist() for s in range(step, plan.steps)]
            if kwargs.get("oversize") != "truncate":
                check(rest == want, "a resume does not yield the rest of the epoch")
    check(len({p.steps for p in plans}) == 1, "ranks disagree on the steps")


def check_budgets(plan, lengths, kwargs) -> None:
    if kwargs.get("oversize") == "truncate":
        return
    if kwargs.get("mode") == "packed":  # every sample padded to the piece multiple, rows within max_tokens
        cp = kwargs.get("context_parallel", 1)
        multiple = int(np.lcm(kwargs.get("pad_to_multiple_of", 1), 2 * cp if cp > 1 else 1))
        for b in range(len(plan)):
            used = sum(padded(int(lengths[m]), multiple) for m in np.asarray(plan[b], dtype=np.int64))
            check(used <= kwargs["max_tokens"], f"packed row {b} takes {used} padded tokens > max_tokens")
        return
    multiple = kwargs.get("pad_to_multiple_of", 1)
    for b in range(len(plan)):
        members = np.asarray(plan[b], dtype=np.int64)
        check(len(members) >= 1, f"batch {b} is empty")
        if "batch_size" in kwargs:
            check(len(members) <= kwargs["batch_size"], f"batch {b} has {len(members)} rows")
        elif kwargs.get("cost") in (None, "tokens"):
            cost = len(members) * padded(int(lengths[members].max()), multiple)
            check(cost <= kwargs["max_tokens"], f"batch {b} costs {cost} > max_tokens")


def run_sampler(case, _):
    lengths = make_lengths(case["lengths"])
    sampler_invariants(lengths, case["kwargs"], case["world"])


def run_plan_index(case, _):
    plan = db.BucketSampler(make_lengths(case["lengths"]), max_tokens=case["max_tokens"]).plan(0)
    batch = plan[case["index"]]
    check(batch.ndim == 1, "a batch is not 1-D")


def run_state(case, _):
    lengths = make_lengths(case["lengths"])
    sampler = db.BucketSampler(lengths, **case["kwargs"])
    state = sampler.state_dict()
    for key, value in case["edits"].items():
        if value == "__delete__":
            state.pop(key, None)
        else:
            state[key] = value
    fresh = db.BucketSampler(lengths, **case["kwargs"])
    fresh.load_state_dict(state)
    yielded = sum(1 for _ in fresh)
    check(yielded <= fresh.plan().steps, "a resume yields more steps than the epoch has")


def run_collate(case, paths):
    store = db.TokenStore(paths["store"])
    indices = case["indices"]
    kwargs = {k: v for k, v in case["kwargs"].items()}
    if case.get("packed"):
        out = db.collate_packed(store, indices, **kwargs)
        check(out["input_ids"].ndim == 2, "packed input_ids is not 2-D")
        return
    out = db.collate(store, indices, **kwargs)
    rows = len(np.asarray(indices).reshape(-1))
    check(out["input_ids"].shape[0] == rows, "collate returned another number of rows")
    for r, i in enumerate(np.asarray(indices).reshape(-1)):
        tokens = store[int(i)]
        check(np.array_equal(out["input_ids"][r, : len(tokens)], tokens), f"row {r} differs from store[{i}]")


def run_loader(case, paths):
    store = db.TokenStore(paths["store"])
    sampler = db.BucketSampler(store.lengths(), **case["sampler"])
    loader = db.Loader(store, sampler, **case["kwargs"])
    plan = sampler.plan()
    try:
        for step, batch in enumerate(loader):
            if step >= case["steps"]:
                break
            if sampler.mode == "padded":
                kwargs = {
                    k: case["kwargs"][k]
                    for k in ("pad_id", "label_pad_id", "pad_to_multiple_of")
                    if k in case["kwargs"]
                }
                want = db.collate(store, plan[step * sampler.world_size + sampler.rank], **kwargs)
                check(np.array_equal(batch["input_ids"].numpy(), want["input_ids"]), f"step {step} differs")
    finally:
        loader.close()


def run_source(case, paths):
    path = paths[case["path"]]
    entry = case["entry"]
    if entry == "TokenStore":
        db.TokenStore(path)
    elif entry == "read_lengths":
        db.read_lengths(path, case.get("column", "seq_len"))
    else:
        db.BucketSampler(path, max_tokens=1024)


def run_cli(case, paths):
    from dflash_batch.tools import cli

    argv = [paths.get(a[1:], a) if a.startswith("@") else a for a in case["argv"]]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main(argv)
        except SystemExit as exit_:
            code = exit_.code
    check(code in (0, 1, 2, None), f"exit code {code!r}")
    check("Traceback" not in err.getvalue(), "a traceback was printed")


def tokens_digest(tokens) -> str:
    import hashlib

    return hashlib.sha256(np.asarray(tokens, dtype=np.int64).tobytes()).hexdigest()[:16]


def pyarrow_verdict(path):
    """(rows, digest of input_ids' tokens) as pyarrow reads and fully validates the file; None if it refuses."""
    import pyarrow as pa

    try:
        with pa.memory_map(path) as source:
            try:
                table = pa.ipc.open_file(source).read_all()
            except pa.ArrowInvalid:
                source.seek(0)
                table = pa.ipc.open_stream(source).read_all()
        table.validate(full=True)
        column = table.column("input_ids").combine_chunks()
        return table.num_rows, tokens_digest(column.flatten().to_numpy(zero_copy_only=False))
    except Exception:  # any refusal is pyarrow's verdict
        return None


def run_arrow(case, _):
    """A mutated Arrow file: dflash_batch raises a clear error, or reads what pyarrow reads (rows and
    tokens) or the original, or, where pyarrow refuses the file, the original's rows."""
    path = case["path"]
    reference = pyarrow_verdict(path)
    try:
        rows = len(db.read_lengths(path, "input_ids"))
        store = db.TokenStore(path)
        tokens, offsets = store.gather(np.arange(len(store)))
    except DOCUMENTED:
        raise
    ours = (len(store), tokens_digest(tokens))
    check(rows == len(store) and offsets[-1] == len(tokens), "lengths and the token store disagree")
    original = (case["rows"], case["digest"])
    if reference is not None:
        check(ours == tuple(reference) or ours == original, f"read {ours}, pyarrow {reference}, original {original}")
    else:  # damage pyarrow saw elsewhere (a text column, the footer): a flipped token is undetectable
        # by any reader (Arrow has no checksums), a lost or invented row is not
        check(
            ours[0] == original[0],
            f"read {ours[0]} rows where pyarrow refuses the file; the original has {original[0]}",
        )


def run_megatron(case, _):
    """A Megatron pair whose ``.idx`` was damaged: dflash_batch raises a documented error, or reads the
    original lengths and exactly the ``.bin``'s tokens in the dtype the damaged header names (a dtype
    code changed to another of the same width is undetectable: the format has no checksums); document
    boundaries, when read, rise from 0 to the sequence count. No row lost or invented."""
    from _megatron import DTYPES

    prefix = case["prefix"]
    lengths = db.read_lengths(prefix)
    store = db.TokenStore(prefix)
    tokens, offsets = store.gather(np.arange(len(store)))
    check(lengths.tolist() == case["lengths"], f"read lengths {lengths.tolist()}, the original has {case['lengths']}")
    check(np.array_equal(np.diff(offsets), lengths), "lengths and the token store disagree")
    with open(prefix + ".idx", "rb") as f:
        code = f.read(18)[17]
    with open(prefix + ".bin", "rb") as f:
        reference = np.frombuffer(f.read(), dtype=DTYPES[code])
    check(store.dtype == reference.dtype, f"dtype {store.dtype}, the header says {reference.dtype}")
    check(np.array_equal(tokens, reference, equal_nan=tokens.dtype.kind == "f"), "tokens differ from the .bin")
    try:
        documents = db.read_documents(prefix)
    except DOCUMENTED:
        return
    check(documents[0] == 0 and documents[-1] == len(lengths), f"documents span {documents[0]}..{documents[-1]}")
    check(bool((np.diff(documents.astype(np.int64)) >= 0).all()), "documents fall")


def run_selftest(case, _):
    """What the harness must catch, on demand (tests/base/test_adversarial.py checks it does)."""
    what = case["what"]
    if what == "abort":
        os.abort()
    if what == "hang":
        import threading

        threading.Event().wait()
    if what == "undocumented":
        raise KeyError("not a documented type")
    if what == "broken":
        check(False, "a deliberately broken invariant")
    if what == "documented":
        raise db.PlanError("a documented type")
    if what == "undeclared_kind":
        error = db.PlanError("a documented type of an undeclared kind")
        error.kind = "bogus"
        raise error


RUNNERS = {
    "selftest": run_selftest,
    "sampler": run_sampler,
    "plan_index": run_plan_index,
    "state": run_state,
    "collate": run_collate,
    "loader": run_loader,
    "source": run_source,
    "cli": run_cli,
    "arrow": run_arrow,
    "megatron": run_megatron,
}


def undeclared(error: BaseException) -> str | None:
    """What is wrong with a library error's fields against the core's declared kinds (None: nothing): its
    kind is declared (or invalid_setting, which names its setting), its reason a declared kind."""
    import dflash_batch as db
    from dflash_batch import _core

    if not isinstance(error, db.Error):
        return None
    names = {k["name"] for k in _core.ERROR_KINDS}
    kind, reason, setting = getattr(error, "kind", None), getattr(error, "reason", None), getattr(error, "setting", 0)
    if kind is None:  # raised from Python without the core's fields: no kind to check
        return None
    if kind not in names:
        return f"kind {kind!r} is not declared"
    if reason is not None and reason not in names:
        return f"reason {reason!r} is not declared"
    if kind == "invalid_setting" and not setting:
        return "an invalid_setting that names no setting"
    return None


def main() -> None:
    paths = json.loads(sys.argv[1])
    warnings.simplefilter("ignore")
    for number, line in enumerate(sys.stdin):
        case = json.loads(line)
        print(json.dumps({"start": number}), flush=True)
        try:
            RUNNERS[case["kind"]](case, paths)
            outcome = {"case": number, "outcome": "ok"}
        except Broken as broken:
            outcome = {"case": number, "outcome": "failed", "reason": f"invariant: {broken}"}
        except DOCUMENTED as error:
            outcome = {"case": number, "outcome": "raised", "type": type(error).__name__, "message": str(error)[:300]}
            wrong = undeclared(error)
            if wrong:
                outcome = {"case": number, "outcome": "failed", "reason": f"{wrong}: {error}"[:500]}
        except BaseException as error:  # any other type is what this suite looks for
            reason = f"{type(error).__name__}: {error}"[:500] + "\n" + traceback.format_exc()[-1500:]
            outcome = {"case": number, "outcome": "failed", "reason": reason}
        print(json.dumps(outcome), flush=True)
    os._exit(0)  # no teardown of worker threads' pools: the cases are done


if __name__ == "__main__":
    main()
