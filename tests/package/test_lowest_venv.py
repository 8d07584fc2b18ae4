"""tests/_lowest_venv.py, which gives ``make test-clients-lowest`` the main virtualenv's torch as hard links:
the closure follows extras and markers, a linked distribution is one pip and importlib see installed, and a
distribution the target already holds is left alone."""

from __future__ import annotations

import importlib.metadata as metadata
import os
import sys
from pathlib import Path

import _lowest_venv
import pytest


def site_packages(root: Path) -> Path:
    path = root / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    path.mkdir(parents=True)
    return path


def test_torchs_closure_follows_its_extras_and_platform_markers():
    pytest.importorskip("torch")
    names = set(_lowest_venv.closure("torch"))
    assert "torch" in names
    for line in metadata.distribution("torch").requires or []:
        requirement = _lowest_venv.Requirement(line)
        if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
            assert _lowest_venv.canonicalize_name(requirement.name) in names, line
    if sys.platform == "linux" and "cuda-toolkit" in names:
        # cuda-toolkit[cublas, ...]: the extra's own requirements come along
        assert any(name.startswith("nvidia-cublas") for name in names)


def test_a_linked_distribution_is_installed_there_and_shares_the_files(tmp_path):
    target = site_packages(tmp_path)
    dist = metadata.distribution("tqdm")
    assert _lowest_venv.link(dist, target) > 0
    (found,) = [d for d in metadata.distributions(path=[str(target)]) if d.metadata["Name"].lower() == "tqdm"]
    assert found.version == dist.version
    source = Path(dist.locate_file("tqdm/__init__.py"))
    assert os.stat(target / "tqdm" / "__init__.py").st_ino == os.stat(source).st_ino
    assert not (target / ".." / "bin").exists(), "console scripts stay in the source venv"
    assert _lowest_venv.link(dist, target) == 0, "a second run links nothing"


def test_main_leaves_what_the_target_holds_and_refuses_a_foreign_python(tmp_path, capsys):
    pytest.importorskip("torch")
    target = site_packages(tmp_path / "venv")
    for name in _lowest_venv.closure("torch"):
        info = target / f"{name.replace('-', '_')}-0.dist-info"  # every one "already installed"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0\n")
    assert _lowest_venv.main([str(target)]) == 0
    assert "0 distributions" in capsys.readouterr().out
    other = tmp_path / "other" / "lib" / "python2.7" / "site-packages"
    other.mkdir(parents=True)
    assert _lowest_venv.main([str(other)]) == 0
    assert "pip installs torch there itself" in capsys.readouterr().out
    assert list(other.iterdir()) == []
    assert _lowest_venv.main([str(tmp_path / "missing")]) == 2
    assert _lowest_venv.main([]) == 2
