"""Gives the lowest-clients virtualenv (``make test-clients-lowest``) the torch this checkout's ``.venv``
already installed, as hard links, so that it is not downloaded a second time.

The lowest virtualenv pins torch to the main one's version, so both would hold the same files: a CUDA build
of several GB whose second download is where a flaky network failed CI (an interrupted wheel). Each
distribution of torch's requirement closure (extras followed) is linked file by file into the target's
site-packages with its ``.dist-info``, which is what pip reads to see it installed; pip then resolves the
rest as usual. A distribution the target already holds, in any version, is left to pip. Files outside
site-packages (console scripts) are not linked: the tests start ``python -m torch.distributed.run``.

    python tests/_lowest_venv.py SITE_PACKAGES
"""

from __future__ import annotations

import importlib.metadata as metadata
import os
import shutil
import sys
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = "torch"


def closure(root: str) -> dict[str, metadata.Distribution]:
    """Every installed distribution ``root`` needs on this platform, by canonical name."""
    found: dict[str, metadata.Distribution] = {}
    pending = [(root, frozenset[str]())]
    seen: set[tuple[str, frozenset[str]]] = set()
    while pending:
        name, extras = pending.pop()
        key = (canonicalize_name(name), extras)
        if key in seen:
            continue
        seen.add(key)
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue  # an optional requirement this venv lacks: pip resolves it in the target
        found[key[0]] = dist
        for line in dist.requires or []:
            requirement = Requirement(line)
            marker = requirement.marker
            if marker is None or any(marker.evaluate({"extra": extra}) for extra in extras or {""}):
                pending.append((requirement.name, frozenset(requirement.extras)))
    return found


def installed_names(site_packages: Path) -> set[str]:
    return {
        canonicalize_name(dist.metadata["Name"] or "") for dist in metadata.distributions(path=[str(site_packages)])
    }


def link(dist: metadata.Distribution, site_packages: Path) -> int:
    """Links ``dist``'s files under ``site_packages``; returns how many."""
    count = 0
    for entry in dist.files or []:
        if entry.parts and entry.parts[0] == "..":
            continue  # a console script in bin/, tied to the source venv's interpreter
        source = Path(dist.locate_file(entry))
        if not source.is_file():
            continue  # a RECORD line for a cache file never written
        target = site_packages / entry
        if target.exists():
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(source, target)
        except OSError:
            shutil.copy2(source, target)  # another filesystem
        count += 1
    return count


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    site_packages = Path(argv[0])
    if not site_packages.is_dir():
        print(f"_lowest_venv: {site_packages} is not a directory", file=sys.stderr)
        return 2
    here = f"python{sys.version_info.major}.{sys.version_info.minor}"
    if here not in site_packages.parts:
        print(f"_lowest_venv: {site_packages} is not a {here} virtualenv; pip installs {ROOT} there itself")
        return 0
    present = installed_names(site_packages)
    linked = files = 0
    for name, dist in sorted(closure(ROOT).items()):
        if name in present:
            continue
        files += link(dist, site_packages)
        linked += 1
    print(f"_lowest_venv: {linked} distributions of {ROOT}'s closure linked ({files} files) into {site_packages}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
