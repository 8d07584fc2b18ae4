"""Error kinds are declared once, in the core (``rust/core/src/error/fields.rs``, ``_core.ERROR_KINDS``):
each raised as its declared class; every bad setting as kind ``invalid_setting`` naming the setting, its
finer kind kept as ``reason``; every kind documented in docs/usage.md (issue 47)."""

from __future__ import annotations

import re
from pathlib import Path

import dflash_batch as db
import dflash_batch._core as _core
import numpy as np
import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs" / "usage.md"


def documented() -> dict[str, str]:
    table = DOCS.read_text().split("<!--kinds")[1].split("<!--/kinds-->")[0]
    rows = re.findall(r"^\| `([a-z_]+)` \| ([^|]+) \| ([^|]+) \|$", table, re.M)
    return {name: raised for name, raised, meaning in rows if meaning.strip()}


def test_every_declared_kind_is_documented_with_its_class():
    declared = {k["name"]: k for k in _core.ERROR_KINDS}
    docs = documented()
    assert set(docs) == set(declared), "the docs' kinds and the core's differ"
    for name, kind in declared.items():
        assert kind["exception"] in docs[name], name
        assert ("invalid_setting" in docs[name]) == kind["invalid_setting"], name


@pytest.mark.parametrize(
    ("kwargs", "setting", "reason"),
    [
        ({"max_tokens": 64, "batch_size": 2}, "max_tokens", "batch_spec"),
        ({}, "max_tokens", "batch_spec"),
        ({"max_tokens": 64, "target_efficiency": 1.5}, "target_efficiency", "invalid_ratio"),
        ({"max_tokens": 64, "balance_tolerance": 0.0}, "balance_tolerance", "invalid_ratio"),
        ({"max_tokens": 64, "cost": (0.0, 0.0)}, "cost", "invalid_cost"),
        ({"max_tokens": 64, "cost": (5e-324, 0.0)}, "cost", "invalid_cost"),
        ({"max_tokens": 64, "boundaries": [5]}, "boundaries", "too_few_edges"),
        ({"max_tokens": 64, "boundaries": [0, 9, 4]}, "boundaries", "edges_not_increasing"),
        ({"max_tokens": 64, "oversize": "truncate"}, "oversize", "truncate_setting"),
        ({"batch_size": 4, "mode": "packed"}, "mode", "packed_setting"),
        ({"max_tokens": 64, "context_parallel": 2}, "context_parallel", "context_parallel_setting"),
        ({"max_tokens": 60, "mode": "packed", "context_parallel": 4}, "max_tokens", "piece_multiple"),
        ({"batch_size": 4, "trim_steps": True}, "trim_steps", "trim_setting"),
        ({"max_tokens": 0}, "max_tokens", "invalid_setting"),
    ],
)
def test_every_bad_setting_is_invalid_setting_naming_it(kwargs, setting, reason):
    """Issue 47 row 1: these were kinds invalid_ratio, invalid_cost, too_few_edges, ..., several with
    setting=None, where the docs promise invalid_setting naming the setting."""
    with pytest.raises(db.PlanError) as error:
        db.BucketSampler(np.arange(1, 30), **kwargs)
    assert (error.value.kind, error.value.setting, error.value.reason) == ("invalid_setting", setting, reason)


def test_an_error_that_is_not_a_setting_keeps_its_kind_as_its_reason():
    with pytest.raises(db.PlanError) as error:
        db.BucketSampler(np.array([3, 0, 4]), max_tokens=64)
    assert (error.value.kind, error.value.reason, error.value.row) == ("non_positive_length", "non_positive_length", 1)


# -- issue 47: each row of its table -----------------------------------------------------------------------


@pytest.mark.parametrize("suffix", [".txt", ".npy"])
def test_row2_analyze_refuses_a_fifo_or_a_device_lengths_file_without_reading_it(tmp_path, suffix, capsys):
    """It hung forever on a FIFO, and read /dev/zero until memory ran out."""
    import os

    from dflash_batch.tools.cli import main

    fifo = tmp_path / f"lengths{suffix}"
    os.mkfifo(fifo)
    zero = tmp_path / f"zero{suffix}"
    zero.symlink_to("/dev/zero")
    for path in (fifo, zero):
        assert main(["analyze", str(path), "--no-peers"]) == 2
        assert "not a regular file" in capsys.readouterr().err


def test_row4_a_collator_batch_whose_later_row_lacks_the_mask_names_the_row():
    """It raised a bare KeyError('loss_mask')."""
    pytest.importorskip("torch")
    rows = [{"input_ids": [1, 2, 3], "loss_mask": [0, 1, 1]}, {"input_ids": [4, 5]}]
    with pytest.raises(ValueError, match=r"row 1 of this batch has no 'loss_mask' column, which row 0 has"):
        db.Collator()(rows)


def test_row5_a_null_inside_a_mask_list_says_so():
    """It spoke of a missing length and of null rows."""
    import pyarrow as pa

    table = pa.table({"input_ids": [[1, 2, 3], [4, 5]], "loss_mask": [[0, None, 1], [1, 1]]})
    with pytest.raises(db.DataError, match=r'has a null loss-mask value in column "loss_mask" at row 0') as error:
        db.TokenStore(table)
    assert "length" not in str(error.value).split(";")[0]
    tokens = pa.table({"input_ids": [[1, None, 3]]})
    with pytest.raises(db.DataError, match=r'has a null token in column "input_ids" at row 0'):
        db.TokenStore(tokens)


def test_row7_len_after_an_elastic_resume_is_the_epochs_steps_on_the_new_world():
    """It was 50 (the re-planned rest) where every other epoch on 5 ranks has 54."""
    lengths = db.seed_workload(3000, seed=1)
    old = db.BucketSampler(lengths, max_tokens=16384, world_size=2, rank=0, seed=1)
    for _, _ in zip(range(3), old, strict=False):
        pass
    new = db.BucketSampler(lengths, max_tokens=16384, world_size=5, rank=0, seed=1)
    epoch_steps = len(new)
    new.load_state_dict(old.state_dict())
    assert len(new) == epoch_steps == new.plan(1).steps, "len() is every epoch's steps on the new world"
    assert new.plan().steps < epoch_steps, "the rest of the resumed epoch, through the position"
    assert sum(1 for _ in new) == new.plan().steps


@pytest.mark.parametrize("lengths", [{3, 4, 5}, {"a": 3}, frozenset({2})])
def test_row8_a_set_or_dict_as_lengths_is_a_type_error_naming_it(lengths):
    with pytest.raises(TypeError, match=f"got a {type(lengths).__name__}"):
        db.BucketSampler(lengths, max_tokens=64)


def test_row8_a_bool_among_lengths_is_not_a_length():
    """[1, True] was accepted as [1, 1]."""
    with pytest.raises(TypeError, match="row 1 is the bool True"):
        db.BucketSampler([1, True], max_tokens=64)
    with pytest.raises(TypeError, match="lengths must be integers, got dtype bool"):
        db.BucketSampler(np.array([True, False]), max_tokens=64)


def test_row8_an_empty_selection_of_a_dataset_says_so():
    """Dataset.select([]) said the list of files held no rows."""
    datasets = pytest.importorskip("datasets")
    empty = datasets.Dataset.from_dict({"input_ids": [[1, 2], [3]]}).select([])
    with pytest.raises(db.DataError, match=r"the datasets.Dataset holds no rows \(an empty select or filter"):
        db.TokenStore(empty)


def test_row9_a_megatron_labels_pair_is_found_by_auto_as_arrow_finds_labels(tmp_path):
    """mask="auto" looked only for PREFIX_loss_mask, where Arrow tries labels first."""
    from _megatron import write_pair

    rows = [[1, 2, 3], [4, 5]]
    prefix = write_pair(tmp_path / "d", rows)
    write_pair(tmp_path / "d_labels", [[1, -100, 3], [-100, 5]], dtype=np.int32)
    store = db.TokenStore(prefix)
    assert store.mask == "labels"
    assert db.collate(store, [0, 1])["labels"].tolist() == [[1, -100, 3], [-100, 5, -100]]
    write_pair(tmp_path / "d_loss_mask", [[0, 1, 1], [1, 1]], dtype=np.uint8)
    assert db.TokenStore(prefix).mask == "labels", "labels first, as for Arrow"
    assert db.TokenStore(prefix, mask="loss_mask").mask == "loss_mask"
