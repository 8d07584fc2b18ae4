"""Exact resume after a real crash: a training process is SIGKILLed mid-epoch after a checkpoint; a new
process resumes from the checkpoint; the samples trained before the checkpoint plus those trained after the
resume are the epoch, each exactly once."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import dflash_batch as db
import pytest

pytestmark = pytest.mark.multiprocess  # several processes: `make test-all`, not the fast lane

TRAIN = r"""
import json, os, sys
import dflash_batch as db

log, ckpt, mode = sys.argv[1], sys.argv[2], sys.argv[3]
sampler = db.BucketSampler(db.seed_workload(4000, seed=2), max_tokens=16384, world_size=2, rank=1, seed=9)
sampler.set_epoch(3)
if mode == "resume":
    with open(ckpt) as f:
        sampler.load_state_dict(json.load(f))
with open(log, "a") as out:
    for batch in sampler:
        step = sampler.state_dict()["step"]
        out.write(json.dumps({"mode": mode, "step": step, "samples": batch.tolist()}) + "\n")
        out.flush()
        os.fsync(out.fileno())
        if mode == "first" and step == 5:  # checkpoint after 5 steps, atomically
            with open(ckpt + ".tmp", "w") as f:
                json.dump(sampler.state_dict(), f)
            os.replace(ckpt + ".tmp", ckpt)
        if mode == "first" and step == 8:  # three more steps trained, then wait to be killed
            print("ready", flush=True)
            sys.stdin.readline()
"""


@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL is POSIX")
def test_sigkill_mid_epoch_then_resume_is_exact(tmp_path: Path):
    log, ckpt = tmp_path / "log.jsonl", tmp_path / "ckpt.json"
    first = subprocess.Popen(
        [sys.executable, "-c", TRAIN, str(log), str(ckpt), "first"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert first.stdout is not None
    assert first.stdout.readline().strip() == "ready"  # the child blocks here until killed
    first.send_signal(signal.SIGKILL)
    assert first.wait(timeout=60) == -signal.SIGKILL
    resumed = subprocess.run([sys.executable, "-c", TRAIN, str(log), str(ckpt), "resume"], timeout=120)
    assert resumed.returncode == 0

    records = [json.loads(line) for line in log.read_text().splitlines()]
    checkpoint = json.loads(ckpt.read_text())["step"]
    assert checkpoint == 5
    before = [s for r in records if r["mode"] == "first" and r["step"] <= checkpoint for s in r["samples"]]
    after = [s for r in records if r["mode"] == "resume" for s in r["samples"]]
    assert next(r["step"] for r in records if r["mode"] == "resume") == checkpoint + 1

    sampler = db.BucketSampler(db.seed_workload(4000, seed=2), max_tokens=16384, world_size=2, rank=1, seed=9)
    sampler.set_epoch(3)
    epoch = [s for batch in sampler for s in batch.tolist()]
    assert sorted(before + after) == sorted(epoch), "a sample was lost or trained twice past the checkpoint"
    assert len(set(before + after)) == len(before + after)
