"""The adversarial pass, kept in the suite: hypothesis draws arguments for every public entry point (the
sampler's keywords and their combinations, Plan indexing, state dicts, sources, collate, the Loader, the
CLI) and runs them in a capped child process (see tests/_adversary.py). A case fails on a signal, a hang,
an exception type outside the documented ones, or a broken invariant (no sample twice, budgets, equal
steps, thread-count determinism, resume = the rest of the epoch, batches = collate of the plan).

``make test`` runs a few examples per entry point; ``make fuzz`` hundreds (DFLASH_FUZZ_EXAMPLES).
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from _adversary import EXAMPLES, run_cases
from _arrow import token_rows, token_table, write_ipc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytestmark = [pytest.mark.fuzz, pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="POSIX: FIFOs and RLIMIT_AS")]

CASES = 20  # cases per child
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, derandomize=False, suppress_health_check=list(HealthCheck))
HUGE = [0, -1, 2**31, 2**32, 2**63, 2**64, -(2**63) - 1]


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    root = tmp_path_factory.mktemp("adversary")
    store = write_ipc(root / "store.arrow", token_table(token_rows(120, longest=40)))
    (root / "empty_dir").mkdir()
    (root / "empty_file").write_bytes(b"")
    (root / "text_file").write_text("not arrow\n")
    os.mkfifo(root / "fifo")
    os.mkfifo(root / "fifo_lengths.txt")  # a lengths file the CLI would have opened and waited on forever
    (root / "zero_lengths.txt").symlink_to("/dev/zero")  # ... or read until memory ran out
    np.save(root / "lengths.npy", np.random.default_rng(0).integers(1, 500, 300))
    (root / "one.txt").write_text("100\n")
    return {
        "store": str(store),
        "missing": str(root / "missing.arrow"),
        "empty_dir": str(root / "empty_dir"),
        "empty_file": str(root / "empty_file"),
        "text_file": str(root / "text_file"),
        "devnull": "/dev/null",
        "fifo": str(root / "fifo"),
        "npy": str(root / "lengths.npy"),
        "fifo_txt": str(root / "fifo_lengths.txt"),
        "zero_txt": str(root / "zero_lengths.txt"),
        "one_txt": str(root / "one.txt"),
        "png": str(root / "plot.png"),
        "unwritable_png": "/proc/no/such/dir/plot.png",
    }


def check(cases, paths):
    outcomes, failures = run_cases(cases, paths)
    assert not failures, "\n\n".join(failures)
    assert len(outcomes) == len(cases)


@pytest.mark.slow  # a child for each kind of failure, a hang among them
def test_the_harness_names_each_kind_of_failure(paths):
    """A suite that cannot fail proves nothing: a signal, a hang, an undocumented exception type and a
    broken invariant and an error of a kind the core does not declare are each reported against their
    case, and a documented error is not."""
    for what, expected in [
        ("abort", "ended with -6"),
        ("hang", "hung past the time limit"),
        ("undocumented", "KeyError"),
        ("broken", "invariant: a deliberately broken invariant"),
        ("undeclared_kind", "kind 'bogus' is not declared"),
    ]:
        cases = [{"kind": "selftest", "what": "documented"}, {"kind": "selftest", "what": what}]
        outcomes, failures = run_cases(cases, paths, timeout=10)
        assert len(failures) == 1 and failures[0].startswith("case 1 ") and expected in failures[0], failures
        assert outcomes[0]["outcome"] == "raised" and outcomes[0]["type"] == "PlanError"


# -- strategies ------------------------------------------------------------------------------------------

wide_ints = st.one_of(st.integers(-5, 70_000), st.sampled_from(HUGE))
json_scalars = st.one_of(wide_ints, st.none(), st.booleans(), st.floats(allow_nan=True), st.text(max_size=4))
json_values = st.one_of(
    json_scalars, st.lists(json_scalars, max_size=3), st.dictionaries(st.text(max_size=3), json_scalars, max_size=3)
)

DTYPE_LIMITS = {
    "int8": 127,
    "uint8": 255,
    "int16": 32767,
    "uint16": 65535,
    "int32": 2**31 - 1,
    "uint32": 2**32 - 1,
    "int64": 2**62,
    "uint64": 2**63,
}


@st.composite
def lengths_specs(draw, valid_only=False):
    dtype = draw(st.sampled_from(sorted(DTYPE_LIMITS)))
    low = 1 if valid_only else draw(st.sampled_from([1, 1, 1, 0, -3]))
    high = draw(st.sampled_from([60, 600, 5000, 100_000] + ([] if valid_only else [2**32 + 5])))
    values = draw(st.lists(st.integers(low, high), min_size=1, max_size=250))
    limit = DTYPE_LIMITS[dtype]
    lowest = 0 if dtype.startswith("u") else -limit - 1
    values = [min(max(v, lowest), limit) for v in values]
    if valid_only:
        return {"kind": "array", "values": values, "dtype": dtype}
    kind = draw(st.sampled_from(["array"] * 6 + ["list", "arrow", "generator", "none", "float"]))
    if kind == "arrow":
        dtype = "int64"
        values = [min(max(v, -(2**63)), 2**63 - 1) for v in values]
    return {"kind": kind, "values": values, "dtype": dtype}


VALID = {  # values every keyword accepts: most cases use only these, so plans get made and checked
    "boundaries": st.one_of(
        st.just("auto"), st.integers(1, 40), st.lists(st.integers(0, 6000), min_size=1, max_size=6).map(sorted)
    ),
    "seed": st.integers(0, 2**64 - 1),
    "shuffle": st.booleans(),
    "drop_last": st.booleans(),
    "oversize": st.sampled_from(["error", "skip", "truncate"]),
    "pad_to_multiple_of": st.sampled_from([1, 2, 8, 64]),
    "accumulation": st.integers(1, 6),
    "target_efficiency": st.sampled_from([None, 0.5, 0.9, 0.98, 1.0]),
    "order": st.sampled_from(["stratified", "random"]),
    "cost": st.one_of(
        st.sampled_from([None, "tokens"]), st.tuples(st.sampled_from([1.0, 2.5]), st.sampled_from([0.0, 1e-4]))
    ),
    "balance_tolerance": st.sampled_from([None, 0.05, 0.1, 1.0]),
    "mode": st.sampled_from(["padded", "padded", "packed"]),
    "bucketed": st.booleans(),
    "threads": st.sampled_from([None, 1, 2]),
    "trim_steps": st.booleans(),
    "context_parallel": st.sampled_from([1, 2, 4]),
}
INVALID = {
    "boundaries": st.sampled_from([0, 65536, "bogus", [5, 3, 1]]),
    "seed": st.sampled_from([-1, 2**64, 1.5]),
    "oversize": st.just("bogus"),
    "pad_to_multiple_of": st.sampled_from([0, 2**32]),
    "accumulation": st.sampled_from([0, 2**32]),
    "target_efficiency": st.sampled_from([0.0, 1.5, float("nan")]),
    "order": st.just("sideways"),
    "cost": st.one_of(st.just("flops"), st.tuples(st.sampled_from([-1.0, 1e30]), st.sampled_from([float("inf"), 0.0]))),
    "balance_tolerance": st.sampled_from([0.0, 1e9]),
    "mode": st.just("rolled"),
    "threads": st.sampled_from([0, -1, 2**70]),
    "trim_steps": st.sampled_from(["yes", 2]),
    "context_parallel": st.sampled_from([0, 2**32, "4"]),
}


@st.composite
def sampler_kwargs(draw, valid: bool):
    kwargs = {}
    if draw(st.booleans()):
        bad = st.sampled_from([0, -5, 2**40, True])
        kwargs["max_tokens"] = draw(st.integers(1, 20_000) if valid else st.one_of(st.integers(1, 20_000), bad))
    else:
        bad = st.sampled_from([0, -1, 2**33])
        kwargs["batch_size"] = draw(st.integers(1, 64) if valid else st.one_of(st.integers(1, 64), bad))
    for name in draw(st.lists(st.sampled_from(sorted(VALID)), max_size=5, unique=True)):
        wrong = not valid and name in INVALID and draw(st.booleans())
        kwargs[name] = draw(INVALID[name] if wrong else VALID[name])
    if kwargs.get("mode") != "packed":
        kwargs.pop("bucketed", None)  # padded batches are always bucketed: refusing it is tested elsewhere
    return kwargs


@st.composite
def sampler_cases(draw):
    valid = draw(st.sampled_from([True, True, False]))
    return {
        "kind": "sampler",
        "lengths": draw(lengths_specs(valid_only=valid)),
        "kwargs": draw(sampler_kwargs(valid)),
        "world": draw(st.integers(1, 9)),
    }


def batch_of(strategy):
    return st.lists(strategy, min_size=CASES, max_size=CASES)


# -- the entry points -------------------------------------------------------------------------------------


@SETTINGS
@given(cases=batch_of(sampler_cases()))
def test_sampler_keywords_and_their_combinations(paths, cases):
    check(cases, paths)


@SETTINGS
@given(
    cases=batch_of(
        st.builds(
            lambda spec, m, i: {"kind": "plan_index", "lengths": spec, "max_tokens": m, "index": i},
            lengths_specs(valid_only=True),
            st.integers(100_000, 10**6),
            st.one_of(
                st.integers(-300, 300),
                st.sampled_from([*HUGE, 2**70, -(2**70)]),
                st.floats(),
                st.none(),
                st.text(max_size=2),
            ),
        )
    )
)
def test_plan_indexing(paths, cases):
    check(cases, paths)


STATE_KEYS = [
    "version",
    "epoch",
    "step",
    "seed",
    "world_size",
    "num_samples",
    "fingerprint",
    "fingerprint_any_ranks",
    "settings",
    "elastic",
    "extra",
]


@SETTINGS
@given(
    cases=batch_of(
        st.builds(
            lambda spec, w, edits: {
                "kind": "state",
                "lengths": spec,
                "kwargs": {"max_tokens": 100_000, "world_size": w, "rank": 0},
                "edits": edits,
            },
            lengths_specs(valid_only=True),
            st.integers(1, 4),
            st.dictionaries(st.sampled_from(STATE_KEYS), st.one_of(json_values, st.just("__delete__")), max_size=3),
        )
    )
)
def test_state_dicts_edited_any_way(paths, cases):
    check(cases, paths)


@SETTINGS
@given(
    cases=batch_of(
        st.one_of(
            st.builds(
                lambda i, k: {"kind": "collate", "indices": i, "kwargs": k},
                st.one_of(
                    st.lists(st.one_of(st.integers(-3, 125), st.sampled_from(HUGE)), min_size=1, max_size=12),
                    st.lists(st.integers(0, 119), max_size=0),
                ),
                st.fixed_dictionaries(
                    {},
                    optional={
                        "pad_id": wide_ints,
                        "label_pad_id": wide_ints,
                        "pad_to_multiple_of": st.sampled_from([1, 8, 0, -2, 2**31, 2**40, 1.5]),
                        "dtype": st.sampled_from(["int64", "int32", "int16", "float32", "bogus"]),
                    },
                ),
            ),
            st.builds(
                lambda i, k: {"kind": "collate", "packed": True, "indices": i, "kwargs": k},
                st.lists(st.one_of(st.integers(-3, 125), st.sampled_from(HUGE)), min_size=1, max_size=8),
                st.fixed_dictionaries(
                    {"capacity": st.sampled_from([1, 40, 200, 0, -1, 2**40])},
                    optional={"pad_id": wide_ints, "dtype": st.sampled_from(["int64", "int32", "int8"])},
                ),
            ),
        )
    )
)
def test_collate_arguments(paths, cases):
    check(cases, paths)


@SETTINGS
@given(
    cases=batch_of(
        st.builds(
            lambda s, k, n: {"kind": "loader", "sampler": s, "kwargs": k, "steps": n},
            st.fixed_dictionaries(
                {"max_tokens": st.sampled_from([64, 128, 512]), "seed": st.integers(0, 9)},
                optional={"mode": st.sampled_from(["padded", "packed"]), "world_size": st.just(2)},
            ).map(lambda s: {**s, "rank": s.get("world_size", 1) - 1}),
            st.fixed_dictionaries(
                {},
                optional={
                    "prefetch": st.sampled_from([1, 2, 4, 0, -1, True]),
                    "dtype": st.sampled_from([None, "int32", "int64", "float16", "bogus"]),
                    "pad_id": wide_ints,
                    "pad_to_multiple_of": st.sampled_from([1, 8, 0, 2**20]),
                    "reuse_buffers": st.sampled_from([False, True, "yes"]),
                    "device": st.sampled_from([None, "cpu", "cuda", "meta", "cpu:0", 5]),
                    "num_items_in_batch": st.sampled_from([False, True, "x"]),
                    "pin_memory": st.sampled_from([None, False, True]),
                },
            ),
            st.integers(1, 6),
        )
    )
)
def test_loader_arguments(paths, cases):
    check(cases, paths)


@SETTINGS
@given(
    cases=batch_of(
        st.builds(
            lambda p, e, c: {"kind": "source", "path": p, "entry": e, "column": c},
            st.sampled_from(["store", "missing", "empty_dir", "empty_file", "text_file", "devnull", "fifo", "npy"]),
            st.sampled_from(["TokenStore", "read_lengths", "BucketSampler"]),
            st.sampled_from(["seq_len", "input_ids", "nope"]),
        )
    )
)
def test_sources(paths, cases):
    check(cases, paths)


OPTIONS = {
    "--samples": ["1", "50", "3000", "0", "-1", "1000000000000", "x"],
    "--max-tokens": ["1", "4096", "0", "-5", "abc"],
    "--world-size": ["1", "8", "0", "-1"],
    "--epochs": ["1", "2", "0"],
    "--seed": ["0", "-1", "18446744073709551616"],
    "--accumulation": ["1", "0", "-3"],
    "--loader-rows": ["0", "100", "-1"],
    "--batch-size": ["0", "1", "32"],
    "--boundaries": ["auto", "4", "0", "1,2,3", "3,2", "x"],
    "--target-efficiency": ["0.9", "0", "2", "nan"],
    "--column": ["seq_len", "input_ids", "nope"],
    "--oversize": ["error", "skip", "zzz"],
    "--plot": ["@png", "@unwritable_png"],
}


@st.composite
def cli_argv(draw):
    command = draw(st.sampled_from(["demo", "analyze", "analyze", "bogus"]))
    argv = [command]
    if command == "analyze":
        argv += draw(
            st.sampled_from(
                [["--demo"], ["@store"], ["@npy"], ["@missing"], ["@text_file"], ["@fifo_txt"], ["@zero_txt"],
                 ["@one_txt"], []]
            )
        )  # fmt: skip
    names = draw(st.lists(st.sampled_from(sorted(OPTIONS)), max_size=4, unique=True))
    for name in names:
        argv += [name, draw(st.sampled_from(OPTIONS[name]))]
    if draw(st.booleans()):
        argv.append("--json")
    # The seed workload's default size takes seconds: keep runs short unless a size is drawn.
    if "--samples" not in names:
        argv += ["--samples", "2000"]
    if command == "demo" and "--loader-rows" not in names:
        argv += ["--loader-rows", "0"]
    if command == "demo" and "--epochs" not in names:
        argv += ["--epochs", "1"]
    return argv


@settings(max_examples=max(1, EXAMPLES // 2), deadline=None, suppress_health_check=list(HealthCheck))
@given(cases=st.lists(cli_argv().map(lambda argv: {"kind": "cli", "argv": argv}), min_size=8, max_size=8))
def test_cli_arguments(paths, cases):
    check(cases, paths)
