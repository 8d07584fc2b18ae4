"""The parent side of the adversarial suite: runs cases in a child process (tests/_adversary_child.py)
under an address-space cap and a time limit, and names every case that took the child down (a signal),
hung, raised an exception type the API does not document, or broke an invariant.

The size of a run comes from ``DFLASH_FUZZ_EXAMPLES`` (hypothesis examples per test, each a batch of
cases in one child): a few in ``make test``, hundreds in ``make fuzz``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

CHILD = Path(__file__).with_name("_adversary_child.py")
CAP_BYTES = 4 << 30  # address space of a child: every case needs far less when it behaves
EXAMPLES = int(os.environ.get("DFLASH_FUZZ_EXAMPLES", "6"))


def _cap() -> None:  # runs in the child before exec
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (CAP_BYTES, CAP_BYTES))


def run_cases(cases: list[dict], paths: dict[str, str], timeout: float = 180) -> tuple[list[dict], list[str]]:
    """(outcomes, failures): one outcome per case that finished; a failure names the case and why."""
    env = {**os.environ, "RAYON_NUM_THREADS": "2", "MALLOC_ARENA_MAX": "2", "PYTHONPATH": str(CHILD.parent)}
    text = "".join(json.dumps(case) + "\n" for case in cases)
    try:
        child = subprocess.run(
            [sys.executable, str(CHILD), json.dumps(paths)],
            input=text,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=env,
            preexec_fn=_cap,
        )
        stdout, stderr, code = child.stdout, child.stderr, child.returncode
    except subprocess.TimeoutExpired as expired:
        stdout = expired.stdout.decode() if isinstance(expired.stdout, bytes) else (expired.stdout or "")
        stderr, code = "", "timeout"
    outcomes, started = [], None
    for line in stdout.splitlines():
        if not line.startswith("{"):
            continue
        record = json.loads(line)
        if "start" in record:
            started = record["start"]
        else:
            outcomes.append(record)
            started = None
    report = os.environ.get("DFLASH_FUZZ_REPORT")  # a tally for `make fuzz`
    if report:
        with open(report, "a") as f:
            for outcome in outcomes:
                kind = cases[outcome["case"]]["kind"]
                if kind != "selftest":
                    f.write(
                        json.dumps({"kind": kind, "outcome": outcome["outcome"], "type": outcome.get("type")}) + "\n"
                    )
    failures = [
        f"case {o['case']} {json.dumps(cases[o['case']])}: {o['reason']}" for o in outcomes if o["outcome"] == "failed"
    ]
    if started is not None or code != 0:
        culprit = json.dumps(cases[started]) if started is not None else "(between cases)"
        what = "hung past the time limit" if code == "timeout" else f"ended with {code} (a negative code is a signal)"
        failures.append(f"case {started} {culprit}: the child {what}; stderr: {stderr[-1500:]}")
    return outcomes, failures


def tally(report: str) -> str:
    """Outcomes per entry point in a ``DFLASH_FUZZ_REPORT`` file, and the exception types raised."""
    from collections import Counter

    with open(report) as f:
        rows = [json.loads(line) for line in f]
    outcomes = Counter((r["kind"], r["outcome"]) for r in rows)
    types = Counter(r["type"] for r in rows if r["outcome"] == "raised")
    lines = [f"{len(rows)} cases"]
    for kind in sorted({k for k, _ in outcomes}):
        counts = ", ".join(f"{o} {outcomes[(kind, o)]}" for o in ("ok", "raised", "failed") if outcomes[(kind, o)])
        lines.append(f"  {kind:11} {counts}")
    lines.append("raised: " + ", ".join(f"{t} {n}" for t, n in types.most_common()))
    return "\n".join(lines)


if __name__ == "__main__":
    print(tally(sys.argv[1]))
