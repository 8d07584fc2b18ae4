"""One base for the library's errors, with fields a program can branch on (issue 30): ``db.Error`` (a
``ValueError``) under ``PlanError`` and ``DataError``; ``kind`` names what went wrong, ``row``,
``setting`` and ``path`` say where; a bad setting is a ``PlanError`` of kind ``invalid_setting`` wherever
it is checked, in Rust or in Python."""

from __future__ import annotations

import dflash_batch as db
import numpy as np
import pyarrow as pa
import pytest


def store() -> db.TokenStore:
    return db.TokenStore(pa.table({"input_ids": pa.array([[1, 2], [3, 4, 5]])}))


def test_plan_and_data_errors_share_one_value_error_base():
    assert issubclass(db.PlanError, db.Error) and issubclass(db.DataError, db.Error)
    assert issubclass(db.Error, ValueError)
    assert (db.Error.kind, db.PlanError.kind, db.DataError.kind) == ("error", "plan", "data")
    assert (db.Error.row, db.Error.setting, db.Error.path) == (None, None, None)


def test_a_core_error_names_its_kind_and_row():
    with pytest.raises(db.PlanError) as caught:
        db.BucketSampler([5, 9, -4], max_tokens=64)
    assert (caught.value.kind, caught.value.row, caught.value.setting) == ("non_positive_length", 2, None)


def test_a_read_error_names_its_file(tmp_path):
    path = tmp_path / "lengths.arrow"
    path.write_bytes(b"not arrow at all")
    with pytest.raises(db.DataError) as caught:
        db.read_lengths(str(path))
    assert (caught.value.kind, caught.value.path) == ("read", str(path))


def test_a_mask_row_of_another_length_names_the_row():
    table = pa.table({"input_ids": pa.array([[1, 2], [3, 4, 5]]), "loss_mask": pa.array([[1, 1], [0, 1]])})
    with pytest.raises(db.DataError) as caught:
        db.TokenStore(table)
    assert (caught.value.kind, caught.value.row) == ("mask_length", 1)


@pytest.mark.parametrize(
    ("make", "setting"),
    [
        (lambda: db.BucketSampler([3, 4], max_tokens=8, seed=-1), "seed"),
        (lambda: db.BucketSampler([3, 4], max_tokens=8, world_size=2, rank=5), "rank"),
        (lambda: db.BucketSampler([3, 4], max_tokens=8, oversize="clip"), "oversize"),
        (lambda: db.BucketSampler([3, 4], max_tokens=8, boundaries="many"), "boundaries"),
        (lambda: db.BucketSampler([3, 4], max_tokens=8, pad_to_multiple_of=0), "pad_to_multiple_of"),
        (lambda: db.seed_workload(-1), "n"),
        (lambda: db.collate(store(), np.arange(1), dtype="float16"), "dtype"),
        (lambda: db.collate_packed(store(), np.arange(1), capacity=0), "capacity"),
        (lambda: db.Loader(store(), db.BucketSampler([2, 3], max_tokens=8), prefetch=0), "prefetch"),
        (lambda: db.Loader(store(), db.BucketSampler([2, 3], max_tokens=8), device="meta"), "device"),
        (
            lambda: db.Loader(store(), db.BucketSampler([2, 3], max_tokens=8, mode="packed"), pad_to_multiple_of=8),
            "pad_to_multiple_of",
        ),
    ],
)
def test_a_bad_setting_is_a_plan_error_of_kind_invalid_setting_wherever_it_is_checked(make, setting):
    with pytest.raises(db.PlanError) as caught:
        make()
    assert caught.value.kind in ("invalid_setting", "invalid_ratio"), caught.value.kind
    assert caught.value.setting == setting, str(caught.value)
    assert f"{setting}=" in str(caught.value)
