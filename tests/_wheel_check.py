"""The wheel installs and runs without Rust: a fresh virtualenv, a PATH with no cargo or rustc on it, the
wheel from ``dist/`` and the README's own dependencies, then the README's first example, run as written.

    python tests/_wheel_check.py dist        # after `make wheel`; `make wheel-test` runs both

Exits non-zero, saying why, when the wheel is not abi3, a toolchain is reachable, the install fails, or
the example does not print what it promises."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: What the README's first example imports besides dflash_batch (pip takes them from its cache).
EXAMPLE_NEEDS = ["datasets", "torch"]


def fail(message: str) -> None:
    print(f"wheel check FAILED: {message}", file=sys.stderr)
    raise SystemExit(1)


def without_rust(path: str) -> str:
    """``path`` less every directory that holds cargo, rustc or rustup."""
    keep = [
        d for d in path.split(os.pathsep) if d and not any((Path(d) / t).exists() for t in ("cargo", "rustc", "rustup"))
    ]
    return os.pathsep.join(keep)


def main() -> None:
    dist = Path(sys.argv[1] if len(sys.argv) > 1 else "dist")
    wheels = sorted(dist.glob("dflash_batch-*.whl"))
    if len(wheels) != 1:
        fail(f"expected one dflash_batch wheel in {dist}, found {[w.name for w in wheels]}")
    wheel = wheels[0]
    if "-abi3-" not in wheel.name:
        fail(f"{wheel.name} is not an abi3 wheel")
    if not list(dist.glob("dflash_batch-*.tar.gz")):
        fail(f"no source distribution in {dist}")
    env = {**os.environ, "PATH": without_rust(os.environ.get("PATH", ""))}
    for variable in ("CARGO_HOME", "RUSTUP_HOME", "PYO3_PYTHON", "VIRTUAL_ENV"):
        env.pop(variable, None)
    with tempfile.TemporaryDirectory() as folder:
        venv = Path(folder) / "venv"
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, env=env)
        python = str(venv / "bin" / "python")
        env["PATH"] = os.pathsep.join([str(venv / "bin"), env["PATH"]])
        reachable = [t for t in ("cargo", "rustc") if shutil.which(t, path=env["PATH"])]
        if reachable:
            fail(f"{reachable} still on PATH: the check would not prove the wheel needs no Rust")
        pip = [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
        subprocess.run([*pip, str(wheel), *EXAMPLE_NEEDS], check=True, env=env)
        blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)
        example = Path(folder) / "example.py"
        example.write_text(blocks[0])
        out = subprocess.run([python, str(example)], cwd=folder, env=env, capture_output=True, text=True, timeout=600)
        if out.returncode != 0:
            fail(f"the README example failed:\n{out.stderr[-3000:]}")
        last = out.stdout.strip().splitlines()[-1]
        if "steps an epoch;" not in last:
            fail(f"the README example printed {last!r}")
        where = subprocess.run(
            [python, "-c", "import dflash_batch, os; print(os.path.dirname(dflash_batch.__file__))"],
            cwd=folder, env=env, capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
        if not where.startswith(str(venv)):
            fail(f"dflash_batch was imported from {where}, not from the wheel installed in {venv}")
        print(f"wheel check passed: {wheel.name} installed without Rust on PATH; README example: {last}")


if __name__ == "__main__":
    main()
