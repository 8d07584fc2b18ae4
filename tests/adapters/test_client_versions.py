"""Each adapter checks its client's release when imported (issue 59): transformers 4.57 built a
``BucketTrainer`` and failed at the first step with ``AttributeError: ... get_cp_size``."""

from __future__ import annotations

import types

import pytest
from dflash_batch.adapters import versions


@pytest.mark.parametrize(
    ("text", "release"),
    [("5.18.0", (5, 18, 0)), ("5.18.0.dev0", (5, 18, 0)), ("2.6.0+cu130", (2, 6, 0)), ("1.0rc1", (1, 0))],
)
def test_releases_are_read_from_version_strings(text, release):
    assert versions.release(text) == release


OUTSIDE = [("transformers", "4.57.1"), ("transformers", "6.0.0"), ("lightning", "2.4.9"), ("accelerate", "1.13.0")]


@pytest.mark.parametrize(("name", "found"), [*OUTSIDE, ("trl", "0.19")])
def test_a_release_outside_the_range_is_an_import_error_naming_it_and_the_extra(name, found):
    lowest, below, extra = versions.SUPPORTED[name]
    fake = types.SimpleNamespace(__name__=name, __version__=found)
    with pytest.raises(ImportError, match=rf"supports {name}>={lowest},<{below}, but {name} {found} .*"
                       rf"pip install 'dflash_batch\[{extra}\]'"):  # fmt: skip
        versions.require(fake)


def test_the_installed_clients_are_within_range():
    for name in ("transformers", "accelerate", "lightning"):
        module = pytest.importorskip(name)
        versions.require(module)


def test_the_ranges_are_pyprojects():
    import pathlib

    import tomllib

    project = tomllib.loads((pathlib.Path(__file__).parents[2] / "pyproject.toml").read_text())
    extras = project["project"]["optional-dependencies"]
    for name, (lowest, below, extra) in versions.SUPPORTED.items():
        assert f"{name}>={lowest},<{below}" in extras[extra], (name, extras[extra])


def test_a_trl_trainer_mixed_with_bucket_trainer_checks_trls_release(monkeypatch):
    pytest.importorskip("transformers")
    from dflash_batch.hf import BucketTrainer

    monkeypatch.setitem(__import__("sys").modules, "trl", types.SimpleNamespace(__name__="trl", __version__="0.9.6"))
    base = type("SFTTrainer", (), {"__module__": "trl.trainer.sft_trainer"})
    mixed = type("Mixed", (BucketTrainer, base), {})
    with pytest.raises(ImportError, match=r"supports trl>=1\.0,<2, but trl 0\.9\.6 is installed"):
        mixed(sampler={})
