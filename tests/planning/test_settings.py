"""Every planning setting is declared once (``rust/python/src/settings.rs``, as ``_core.SETTINGS``): the
sampler's signature, ``Config``'s text signature and the stubs take exactly those settings with those
defaults (written from it by ``python -m dflash_batch.tools.docs``), ``Config`` treats each declared default
as leaving the setting out, and the docs' table and the sampler's docstring are the declaration's."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import dflash_batch as db
import dflash_batch._core as _core
import pytest
from dflash_batch.planning import settings
from dflash_batch.tools import docs

ROOT = Path(__file__).resolve().parents[2]
# The sampler's own arguments and the typed groups, not planning settings.
OWN = ("lengths", "batching", "balance", "world", "rank", "column", "check_ranks", "plan_dir")


def test_every_declared_setting_is_a_sampler_keyword_with_its_default():
    parameters = inspect.signature(db.BucketSampler.__init__).parameters
    planning = [name for name in parameters if name not in ("self", *OWN)]
    assert planning == list(settings.names()), "the sampler's settings, in the declared order"
    for name in settings.names():
        assert parameters[name].default == settings.default(name), name
        assert parameters[name].kind is inspect.Parameter.KEYWORD_ONLY, name


def test_configs_text_signature_is_the_declaration():
    text = _core.Config.__text_signature__
    declared = ", ".join(f"{s['name']}={s['default']}" for s in settings.SETTINGS)
    assert re.sub(r"\s+", " ", text) == f"(*, {declared})"


def test_the_stub_is_the_declaration():
    tree = ast.parse((ROOT / "python/dflash_batch/_core.pyi").read_text())
    config = next(node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "Config")
    init = next(node for node in config.body if isinstance(node, ast.FunctionDef) and node.name == "__init__")
    names = [a.arg for a in init.args.kwonlyargs]
    assert names == list(settings.names())
    for arg, value, declared in zip(init.args.kwonlyargs, init.args.kw_defaults, settings.SETTINGS, strict=True):
        assert ast.literal_eval(value) == settings.default(declared["name"]), arg.arg
        assert ast.unparse(arg.annotation) == declared["type"], arg.arg


@pytest.mark.parametrize("name", settings.names())
def test_passing_the_declared_default_is_leaving_the_setting_out(name):
    budget = {"batch_size": 4} if name == "max_tokens" else {"max_tokens": 512}
    left_out = _core.Config(**budget)
    given = _core.Config(**budget, **{name: settings.default(name)})
    assert given.settings() == left_out.settings(), name
    assert given.get(name) == left_out.get(name), name


def test_an_unknown_setting_is_named_with_the_declared_ones():
    with pytest.raises(TypeError, match="unexpected keyword argument 'max_token'"):
        _core.Config(max_token=5)
    with pytest.raises(db.PlanError, match=", ".join(settings.names())):
        _core.Config(max_tokens=5).get("bogus")


@pytest.mark.parametrize("name", list(docs.BLOCKS))
def test_the_written_blocks_are_the_declaration(name):
    text = (ROOT / name).read_text()
    assert docs.rewritten(text, docs.BLOCKS[name](), name) == text, "run: python -m dflash_batch.tools.docs"


def test_a_file_without_its_markers_is_refused_by_the_writer():
    with pytest.raises(ValueError, match="must hold one"):
        docs.rewritten("no markers here", docs.keywords(), "x.py")


def test_the_docs_table_is_the_declaration():
    page = (ROOT / "docs/usage.md").read_text()
    assert docs.written(page) == page, "run: python benchmarks/_figures.py"
    for s in settings.SETTINGS:
        assert f"| `{s['name']}` | `{s['default']}` |" in page


def test_the_samplers_docstring_documents_every_setting_from_the_declaration():
    doc = db.BucketSampler.__doc__ or ""
    assert "{settings}" not in doc
    for s in settings.SETTINGS:
        assert f"        {s['name']}: " in doc, s["name"]
        assert f"accepts {s['range']}" in re.sub(r"\s+", " ", doc), s["name"]
