"""The cost of lengths after your own preprocessing: ``db.measure_lengths`` on chat data with a chat template,
against tokenizing the same data alone and against ``datasets.map(..., batched=True)``, on the same cores.

    python benchmarks/lengths_pass.py                     # 1,000,000 chat samples (a few minutes on 2 cores)
    python benchmarks/lengths_pass.py --samples 100000    # a quick look
    python benchmarks/lengths_pass.py --json docs/figures.json

The data: conversations of 1 to 3 turns whose messages are words drawn from this Python's standard library
(the lengths spread like chat SFT data's: a long tail), a byte-level BPE trained on the spot (``tokenizers``;
nothing downloaded) and a ChatML-style template, through a ``transformers`` fast tokenizer. Three ways to the
same lengths, each timed once on a ``datasets.Dataset`` in memory:

* **tokenizing alone** — what a user runs to tokenize the data, nothing kept: ``apply_chat_template(chunk,
  tokenize=True)`` a chunk of 1,024 conversations at a time (renders each, then the tokenizer's batch
  encoding, which is parallel in Rust);
* **measure_lengths** — ``db.measure_lengths(data, tokenizer=tok, text=render, cache=...)``: the template
  rendered in worker processes, the tokens counted by the tokenizer's batch encoding, the lengths cached;
* **datasets.map** — ``data.map(lengths, batched=True, num_proc=cores)``, the column written to its cache.

Target (issue 62): measure_lengths ≤ 1.2× tokenizing alone. Then the plan: padding efficiency of
``BucketSampler(lengths, max_tokens=16384)`` on the measured lengths, and what a length function that leaves
out the template (content tokens only) does to the budget: the share of batches whose real rows would
overflow it, and by how much.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import tempfile
import time

import dflash_batch as db
import numpy as np

TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
BUDGET = 16384


def conversations(n: int, seed: int = 0) -> list[dict]:
    """``n`` chats: 1–3 turns, each message a lognormal number of standard-library words."""
    import keyword

    words = sorted(set(keyword.kwlist) | set(dir(__builtins__)) | set(sys.stdlib_module_names))
    rng = np.random.default_rng(seed)
    vocab = np.asarray(words)
    turns = rng.integers(1, 4, size=n)
    sizes = np.minimum(rng.lognormal(2.8, 1.0, size=2 * int(turns.sum())).astype(np.int64) + 1, 2000)
    picks = vocab[rng.integers(0, len(vocab), size=int(sizes.sum()))]
    texts = np.split(picks, np.cumsum(sizes)[:-1])
    out, k = [], 0
    for t in turns:
        messages = []
        for _ in range(t):
            messages.append({"role": "user", "content": " ".join(texts[k])})
            messages.append({"role": "assistant", "content": " ".join(texts[k + 1])})
            k += 2
        out.append({"messages": messages})
    return out


def tokenizer_for(sample: list[dict]):
    """A byte-level BPE trained on ``sample``'s messages, as a transformers fast tokenizer with the template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE(unk_token=None))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    special = ["<|im_start|>", "<|im_end|>", "<|endoftext|>"]
    trainer = trainers.BpeTrainer(vocab_size=8192, special_tokens=special, show_progress=False)
    bpe.train_from_iterator((m["content"] for c in sample for m in c["messages"]), trainer=trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    tok.chat_template = TEMPLATE
    return tok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=1_000_000)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--json", metavar="FILE", help="record the figures under 'lengths_pass' of FILE")
    args = parser.parse_args(argv)
    import datasets

    datasets.disable_progress_bars()
    rows = conversations(args.samples)
    tok = tokenizer_for(rows[:20_000])
    data = datasets.Dataset.from_list(rows)
    # The data as a user holds it: a Dataset (Arrow memory, as load_from_disk gives), not also a million
    # Python dicts beside it, which every forked worker would copy page by page as it touches them.
    del rows
    print(f"{len(data):,} conversations, {args.workers} workers, on {os.cpu_count()} cores", flush=True)

    def render(example: dict) -> str:
        return tok.apply_chat_template(example["messages"], tokenize=False)

    def lengths_of(batch: dict) -> dict:
        ids = tok.apply_chat_template(batch["messages"], tokenize=True, return_dict=True)["input_ids"]
        return {"length": [len(i) for i in ids]}

    seconds: dict[str, float] = {}
    start = time.perf_counter()
    alone = np.concatenate(
        [lengths_of(data[a : a + 1024])["length"] for a in range(0, len(data), 1024)]
    )  # fmt: skip
    seconds["tokenizing alone"] = time.perf_counter() - start
    with tempfile.TemporaryDirectory() as scratch:
        start = time.perf_counter()
        measured = db.measure_lengths(
            data, tokenizer=tok, text=render, version="chatml", workers=args.workers,
            cache=os.path.join(scratch, "lengths.npy"), progress=False,
        )  # fmt: skip
        seconds["measure_lengths"] = time.perf_counter() - start
        start = time.perf_counter()
        again = db.measure_lengths(
            data, tokenizer=tok, text=render, version="chatml", cache=os.path.join(scratch, "lengths.npy")
        )
        seconds["measure_lengths, cached"] = time.perf_counter() - start
        start = time.perf_counter()
        written = os.path.join(scratch, "m.arrow")
        mapped = data.map(lengths_of, batched=True, num_proc=args.workers, cache_file_name=written)
        seconds["datasets.map"] = time.perf_counter() - start
        from_map = np.asarray(mapped["length"])
        measured = np.array(measured)  # a copy: the cache file goes with the scratch folder
    if not (np.array_equal(alone, measured) and np.array_equal(alone, again) and np.array_equal(alone, from_map)):
        raise SystemExit("the three ways gave different lengths")
    print(f"\n{'way':<26} {'seconds':>9} {'samples/s':>11} {'× alone':>8}")
    for name, s in seconds.items():
        print(f"{name:<26} {s:>9.1f} {len(data) / s:>11,.0f} {s / seconds['tokenizing alone']:>8.2f}")
    ratio = seconds["measure_lengths"] / seconds["tokenizing alone"]
    print(f"target: measure_lengths ≤ 1.2× tokenizing alone: {ratio:.2f}  {'MET' if ratio <= 1.2 else 'MISSED'}")

    figures = {"samples": len(data), "workers": args.workers, "seconds": seconds, "ratio": ratio,
               "tokens": int(alone.sum()), "map_ratio": seconds["datasets.map"] / seconds["tokenizing alone"],
               "cached_ratio": seconds["measure_lengths, cached"] / seconds["tokenizing alone"]}  # fmt: skip
    figures["plan"] = plan_figures(measured, data, tok)
    if args.json:
        from _figures import command_of, write

        write(args.json, "lengths_pass", figures, command_of("lengths_pass.py", argv or sys.argv[1:]))
    return 0


def plan_figures(lengths: np.ndarray, data, tok) -> dict:
    """The plan on the measured lengths, and a plan on lengths that leave the template out, checked against
    the real (measured) lengths of its rows."""
    plan = db.BucketSampler(lengths, max_tokens=BUDGET, seed=0).plan(0)
    content = db.measure_lengths(
        data, tokenizer=tok, text=lambda ex: "".join(m["content"] for m in ex["messages"]), progress=False
    )
    short = db.BucketSampler(content, max_tokens=BUDGET, seed=0).plan(0)
    offsets, indices = np.asarray(short.offsets, np.int64), np.asarray(short.indices)
    over = []
    for a, b in itertools.pairwise(offsets):
        real = (b - a) * int(lengths[indices[a:b]].max())
        over.append(real / BUDGET)
    over = np.asarray(over)
    out = {
        "efficiency": plan.stats()["efficiency"],
        "template_tokens": float(lengths.sum() / content.sum() - 1),
        "overflowing": float((over > 1).mean()),
        "worst": float(over.max()),
    }
    print(
        f"\nplan on the measured lengths (max_tokens={BUDGET:,}): efficiency {out['efficiency']:.4f}\n"
        f"a length function that leaves the template out ({out['template_tokens']:.1%} fewer tokens): "
        f"{out['overflowing']:.1%} of its batches hold more real tokens than the budget, the worst "
        f"{out['worst']:.2f}× (a collator that pads to the longest row would overflow memory)"
    )
    return out


if __name__ == "__main__":
    sys.exit(main())
