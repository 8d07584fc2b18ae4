"""Odd files where a dataset is expected (issue 29): each half of a Megatron pair as a FIFO, a directory, a
dangling or looping symlink, a device or an unreadable file, named by its prefix, either half or a
directory; sidecar JSON of the wrong shape; length inputs numpy cannot hold as integers. Every case runs
in a child under a timeout: a hang or a signal fails, and the error must be a documented type whose
message names the file that is wrong (or the row that is)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import dflash_batch as db
import numpy as np
import pytest
from _megatron import write_pair

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="FIFOs, /dev/zero and /proc")

#: Seconds a child may take: opening a FIFO without a writer blocks forever.
TIMEOUT = 60

CHILD = textwrap.dedent(
    """
    import sys
    import dflash_batch as db
    for source in sys.argv[1:]:
        for reader in (db.read_lengths, db.TokenStore, db.read_documents):
            try:
                reader(source)
                print("READ", reader.__name__, source)
            except (db.DataError, OSError) as error:
                print("ERROR", type(error).__name__, str(error).replace("\\n", " "))
    """
)


def odd(path: Path, kind: str) -> None:
    """Makes ``path`` the odd kind of file."""
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    elif kind == "dangling symlink":
        path.symlink_to(path.parent / "nowhere")
    elif kind == "looping symlink":
        path.symlink_to(path)
    elif kind == "device":
        path.symlink_to("/dev/zero")
    elif kind == "unreadable" and os.geteuid() == 0:  # root reads any file whose mode forbids it, not this one
        path.symlink_to("/proc/sys/vm/compact_memory")
    elif kind == "unreadable":
        path.write_bytes(b"\0" * 64)
        path.chmod(0)


KINDS = ["fifo", "directory", "dangling symlink", "looping symlink", "device", "unreadable"]


@pytest.mark.parametrize("half", [".bin", ".idx"])
@pytest.mark.parametrize("kind", KINDS)
def test_each_half_of_a_pair_as_an_odd_file_is_an_error_naming_that_half(tmp_path, half, kind):
    prefix = tmp_path / "data"
    write_pair(prefix, [[1, 2, 3], [4, 5]])
    bad = Path(str(prefix) + half)
    bad.unlink()
    odd(bad, kind)
    namings = [str(prefix), str(prefix) + ".idx", str(prefix) + ".bin", str(tmp_path)]
    child = subprocess.run(
        [sys.executable, "-c", CHILD, *namings], capture_output=True, text=True, timeout=TIMEOUT
    )  # a hang raises TimeoutExpired: the test fails
    assert child.returncode == 0, f"rc {child.returncode} (negative: a signal): {child.stderr[-2000:]}"
    lines = child.stdout.splitlines()
    assert len(lines) == 3 * len(namings), child.stdout + child.stderr[-2000:]
    for line in lines:
        assert line.startswith("ERROR"), f"{kind} {half} was read: {line}"
        if "does not exist" in line or "no Arrow files" in line or "is missing" in line:
            continue  # a dangling half is a missing one; a directory whose pairs are incomplete has none
        assert str(bad) in line, f"the message does not name {bad}: {line}"
        if kind in ("fifo", "directory", "device"):
            what = {"fifo": "a FIFO", "directory": "a directory", "device": "a device"}[kind]
            assert f"{bad} is {what}, not a regular file" in line, line


@pytest.mark.parametrize(
    ("name", "content", "expected"),
    [
        ("dataset_dict.json", b"[1, 2]", "holds a list, not the object DatasetDict.save_to_disk writes"),
        ("dataset_dict.json", b'{"splits": "train"}', "splits is 'train', not a list of split names"),
        ("dataset_dict.json", b"\xff\xfe{}", "is not JSON in UTF-8"),
        ("dataset_dict.json", b"{", "is not JSON in UTF-8"),
        ("state.json", b"\xff\xfe{}", "is not JSON in UTF-8"),
        ("state.json", b'"a string"', "holds a str, not the object save_to_disk writes"),
        ("state.json", b'{"_data_files": {"filename": "x"}}', "_data_files is a dict, not a list of shards"),
    ],
)
def test_a_malformed_sidecar_is_a_data_error_naming_the_file(tmp_path, name, content, expected):
    (tmp_path / name).write_bytes(content)
    for reader in (db.read_lengths, db.TokenStore):
        with pytest.raises(db.DataError, match=str(tmp_path / name)) as caught:
            reader(str(tmp_path))
        assert expected in str(caught.value)


def test_a_sidecar_that_is_a_fifo_is_refused_instead_of_blocking(tmp_path):
    os.mkfifo(tmp_path / "state.json")
    code = f"import dflash_batch as db\ntry:\n db.read_lengths({str(tmp_path)!r})\nexcept db.DataError as e:\n print(e)"
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=TIMEOUT)
    assert "state.json is a FIFO, not a regular file" in child.stdout, child.stdout + child.stderr


@pytest.mark.parametrize(
    ("lengths", "error", "expected"),
    [
        ([1, 2**63], db.PlanError, "length 9223372036854775808 at row 1 exceeds the largest supported length"),
        ([1, 2**64], db.PlanError, "length 18446744073709551616 at row 1 exceeds"),
        ([np.uint64(5), -1], db.PlanError, "length -1 at row 1 is not positive"),
        ([3, None, 4], db.PlanError, "lengths row 1 is missing"),
        ([3.0, float("nan")], db.PlanError, "lengths row 1 is missing"),
        (np.array([3.0, np.nan]), db.PlanError, "lengths row 1 is missing"),
        ([1.5, 2], TypeError, "lengths must be integers, got dtype float64"),
    ],
)
def test_length_inputs_name_the_real_problem_and_the_row(lengths, error, expected):
    with pytest.raises(error, match=expected):
        db.BucketSampler(lengths, max_tokens=64)


def test_pandas_nullable_lengths_with_na_name_the_row():
    pd = pytest.importorskip("pandas")
    for lengths in (pd.array([4, None, 2], dtype="Int64"), pd.Series([4, 5, None], dtype="Int64")):
        with pytest.raises(db.PlanError, match=r"lengths row \d is missing"):
            db.BucketSampler(lengths, max_tokens=64)


def test_the_checks_refuse_only_what_is_odd(tmp_path):
    """A plain pair by every naming, and a well-formed dataset_dict.json, read (or point to a split) as before."""
    prefix = write_pair(tmp_path / "ok", [[1, 2, 3], [4, 5]])
    for source in (prefix, prefix + ".idx", prefix + ".bin", str(tmp_path)):
        assert db.read_lengths(source).tolist() == [3, 2]
    splits = tmp_path / "dict"
    splits.mkdir()
    (splits / "dataset_dict.json").write_text(json.dumps({"splits": ["train"]}))
    with pytest.raises(FileNotFoundError, match="splits \\['train'\\]; pass one split's directory"):
        db.read_lengths(str(splits))


def test_a_path_longer_than_the_system_takes_says_so(tmp_path):
    """An existing file whose absolute path passes PATH_MAX: made by walking down relative paths."""
    here = os.getcwd()
    try:
        os.chdir(tmp_path)
        for _ in range(25):
            os.mkdir("d" * 200)
            os.chdir("d" * 200)
        write_pair("data", [[1, 2]])
        deep = os.getcwd()
    finally:
        os.chdir(here)
    assert len(deep) > 4096
    with pytest.raises(OSError, match=r"is longer than the system accepts in a path") as caught:
        db.read_lengths(deep + "/data.idx")
    assert "does not exist" not in str(caught.value)


def test_a_glob_in_a_directory_that_cannot_be_listed_says_so(tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root lists directories whatever their mode")
    folder = tmp_path / "locked"
    folder.mkdir()
    write_pair(folder / "data", [[1, 2]])
    folder.chmod(0)
    try:
        with pytest.raises(PermissionError, match="cannot be listed"):
            db.read_lengths(str(folder / "*.idx"))
    finally:
        folder.chmod(0o700)
