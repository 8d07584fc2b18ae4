"""A BucketTrainer run as users run it, for tests/adapters/test_trainer.py: a tiny random Llama, several epochs,
gradient accumulation, checkpoints, optionally killed with SIGKILL at a step and resumed, single process
or under torchrun. Every micro-batch trained is appended to a JSON-lines record (flushed at once, so a
kill keeps what was trained): the rank, the epoch, the optimizer steps done before it, which dataset
rows it held, the ``num_items_in_batch`` the Trainer passed, and the label count of the batch itself.

    python tests/_trainer_run.py DATA OUT RECORD [--accumulation 4] [--epochs 3] [--kill-at STEP]
        [--resume] [--mode padded|packed] [--eval] [--step-timer]

With ``--step-timer`` the Trainer refits its rank price from step times (``step_timer=``), timed by
:class:`SyntheticTimer` so the fit is the same on every run; the prices are recorded at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import signal

import datasets
import dflash_batch as db
import numpy as np
import torch
import transformers
from dflash_batch.hf import BucketTrainer

ROWS = 160


def make_dataset(path: str, masked: bool = False) -> None:
    """Rows of 4–40 tokens whose first two tokens name the row (``1 + id // 90``, ``1 + id % 90``); with
    ``masked``, a ``completion_mask`` that masks each row's first ``2 + id % 5`` tokens (its prompt)."""
    rng = np.random.default_rng(0)
    rows = []
    for i in range(ROWS):
        body = rng.integers(1, 120, int(rng.integers(2, 39))).tolist()
        rows.append([1 + i // 90, 1 + i % 90, *body])
    columns = {"input_ids": rows}
    if masked:
        columns["completion_mask"] = [[0] * (2 + i % 5) + [1] * (len(row) - 2 - i % 5) for i, row in enumerate(rows)]
    datasets.Dataset.from_dict(columns).save_to_disk(path)


def row_ids(inputs: dict) -> list[int]:
    """The dataset rows of a batch, from their first two tokens (padded rows or packed documents)."""
    ids = inputs["input_ids"]
    if "attention_mask" in inputs:
        starts = [(r, 0) for r in range(ids.shape[0])]
    else:  # packed: a document starts where its position is 0 and it holds tokens
        positions = inputs["position_ids"][0]
        starts = [(0, int(j)) for j in torch.nonzero(positions == 0).flatten() if int(ids[0, j]) != 0]
    return [(int(ids[r, j]) - 1) * 90 + int(ids[r, j + 1]) - 1 for r, j in starts]


def label_count(inputs: dict) -> int:
    return int((inputs["labels"][..., 1:] != -100).sum())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("data")
    parser.add_argument("out")
    parser.add_argument("record")
    parser.add_argument("--accumulation", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--kill-at", type=int, default=None)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--mode", default="padded")
    parser.add_argument("--eval", action="store_true")
    parser.add_argument("--save-steps", type=int, default=4)
    parser.add_argument("--trim-steps", action="store_true")
    parser.add_argument("--sft", action="store_true")
    parser.add_argument("--predict", type=int, default=0, help="after training, predict this many rows")
    parser.add_argument("--step-timer", action="store_true")
    parser.add_argument("--plan-dir", default=None, help="plan once per machine through this directory")
    parser.add_argument("--collator", action="store_true", help="rows as text, made by a data_collator")
    parser.add_argument("--workers", type=int, default=0, help="the Trainer's dataloader_num_workers")
    parser.add_argument("--stream", type=int, default=0, help="train rows as a stream: STEPS")
    options = parser.parse_args()

    store = db.TokenStore(options.data)
    masks = datasets.load_from_disk(options.data)["completion_mask"] if store.mask else None
    train_dataset, lengths, collated = datasets.load_from_disk(options.data), store.lengths(), {}
    if options.collator:  # the rows as text a data_collator tokenizes: lengths measured, no store
        train_dataset, collated = text_rows(options.data), {"use_data_collator": True}
        lengths = db.measure_lengths(train_dataset, tokenizer=tokenizer(), version="words", add_special_tokens=False)
        collated["data_collator"] = Flatten() if options.mode == "packed" else Pad()
    sampler = db.BucketSampler(
        lengths, max_tokens=128, seed=5, mode=options.mode, trim_steps=options.trim_steps, plan_dir=options.plan_dir,
    )  # fmt: skip
    streamed = {}
    if options.stream:  # the text rows as a stream, planned in windows of 50; no dataset, no lengths up front
        sampler, train_dataset = stream_windows(list(train_dataset), options.accumulation), None
        streamed = {"max_steps": options.stream, "ignore_data_skip": True}
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=128,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=128,
    )
    model = transformers.LlamaForCausalLM(config)
    base, extra, arguments = BucketTrainer, {}, transformers.TrainingArguments
    if options.sft:  # TRL's SFTTrainer composed as the README says, on the pre-tokenized dataset
        import trl

        class SFT(BucketTrainer, trl.SFTTrainer):
            pass

        base, extra, arguments = SFT, {"processing_class": tokenizer()}, trl.SFTConfig
    args = arguments(
        output_dir=options.out,
        num_train_epochs=options.epochs,
        gradient_accumulation_steps=options.accumulation,
        learning_rate=1e-3,
        report_to=[],
        use_cpu=True,
        logging_steps=1,
        save_strategy="steps",
        save_steps=options.save_steps,
        eval_strategy="steps" if options.eval else "no",
        eval_steps=5,
        disable_tqdm=True,
        dataloader_num_workers=options.workers,
        remove_unused_columns=not options.collator,
        **streamed,
        **({"max_length": None, "padding_free": options.mode == "packed"} if options.sft else {}),
    )
    rank = int(os.environ.get("RANK", 0))
    record = open(f"{options.record}.{rank}", "a")

    class Recording(base):
        def training_step(self, model, inputs, num_items_in_batch=None):
            line = {
                "rank": rank,
                "epoch": self.bucket_sampler.epoch,
                "global_step": self.state.global_step,
                "rows": row_ids(inputs),
                "num_items": None if num_items_in_batch is None else int(num_items_in_batch),
                "labels": label_count(inputs),
                "intact": bool(_intact(inputs, masks)),
            }
            record.write(json.dumps(line) + "\n")
            record.flush()
            return super().training_step(model, inputs, num_items_in_batch)

        def prediction_step(self, model, inputs, *rest, **kwargs):
            record.write(json.dumps({"rank": rank, "eval": row_ids(inputs)}) + "\n")
            record.flush()
            return super().prediction_step(model, inputs, *rest, **kwargs)

    class Kill(transformers.TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if options.kill_at is not None and state.global_step == options.kill_at:
                record.flush()
                os.kill(os.getpid(), signal.SIGKILL)

    eval_dataset = datasets.load_from_disk(options.data).select(range(40)) if options.eval else None
    trainer = Recording(
        model=model,
        args=args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        sampler=sampler,
        store=None if options.collator else store,
        callbacks=[Kill()],
        step_timer=SyntheticTimer(sampler) if options.step_timer else False,
        **{**extra, **collated},
    )
    try:
        result = trainer.train(resume_from_checkpoint=True if options.resume else None)
    except db.PlanError as error:  # a refused resume, on every rank
        record.write(json.dumps({"rank": rank, "refused": str(error)}) + "\n")
        record.close()
        leave()
    steps = None if options.stream else len(sampler)
    record.write(json.dumps({"rank": rank, "final_step": result.global_step, "steps": steps}) + "\n")
    if options.step_timer:
        reports = [report.applied for report in trainer.step_timer.history]
        record.write(json.dumps({"rank": rank, "prices": sampler.position.prices, "applied": reports}) + "\n")
    if options.predict:  # ragged rows in their order: one prediction per row, in order
        rows = (
            datasets.load_from_disk(options.data)
            .select(range(options.predict))
            .remove_columns([c for c in ("completion_mask",) if store.mask])
        )
        output = trainer.predict(rows)
        labels = output.label_ids
        named = [
            row_ids({"input_ids": torch.as_tensor(labels[r : r + 1, :2]), "attention_mask": None})[0]
            for r in range(len(labels))
        ]
        record.write(json.dumps({"rank": rank, "predicted": named, "shape": list(output.predictions.shape)}) + "\n")
    record.close()
    leave()


class SyntheticTimer(db.StepTimer):
    """Times the block as ``1 ms + 1 µs·x + (1/16) µs·x²`` of what the micro-batch ran (the same on every run,
    so the Trainer's refit is reproducible): rows of ``L`` tokens cost ``L + L²/16``."""

    @contextlib.contextmanager
    def time(self, batch):
        yield
        x, x2 = self.features(batch)
        self.record(batch, 1e-3 + 1e-6 * x + 1e-6 / 16 * x2)


def tokenizer():
    """A word-level tokenizer over ids t0..t127, built here (no hub downloads): TRL needs one."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    fast = Tokenizer(models.WordLevel({f"t{i}": i for i in range(128)}, unk_token="t127"))
    fast.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=fast, pad_token="t0", eos_token="t127")


def stream_windows(rows: list, accumulation: int, **settings) -> db.Windows:
    """The text rows as a stream of windows of 50, measured by the tokenizer as they are read."""
    return db.Windows(
        rows, window=50, tokenizer=tokenizer(), text=lambda e: e["text"], add_special_tokens=False, max_tokens=128,
        seed=5, accumulation=accumulation, **settings,
    )  # fmt: skip


def text_rows(data: str) -> datasets.Dataset:
    """The dataset's rows as the words ``t<id>`` the tokenizer encodes back to the same ids."""
    rows = datasets.load_from_disk(data)["input_ids"]
    return datasets.Dataset.from_dict({"text": [" ".join(f"t{t}" for t in row) for row in rows]})


class Pad:
    """A user's collator: tokenizes the texts, pads, labels the real tokens."""

    def __call__(self, examples: list[dict]) -> dict:
        batch = tokenizer()([e["text"] for e in examples], padding=True, return_tensors="pt", add_special_tokens=False)
        labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
        return {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"], "labels": labels}


class Flatten:
    """A user's padding-free collator: tokenizes the texts and flattens them into one row (transformers'
    ``DataCollatorWithFlattening``: ``position_ids`` restart per example, its first label is -100)."""

    def __call__(self, examples: list[dict]) -> dict:
        ids = tokenizer()([e["text"] for e in examples], add_special_tokens=False)["input_ids"]
        flatten = transformers.DataCollatorWithFlattening(return_flash_attn_kwargs=True)
        return flatten([{"input_ids": row} for row in ids])


def leave() -> None:
    """Exits once every rank is done, without the interpreter's teardown: gloo's threads sometimes abort
    (SIGABRT, "terminate called without an active exception") while a process group is torn down at
    exit, after all the work and records are complete (seen under load in CI)."""
    import sys

    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _intact(inputs: dict, masks: list | None = None) -> bool:
    """Labels are the tokens where the batch holds tokens (the corruption a recycled slot caused); with
    the dataset's ``masks``, -100 exactly where its rows' masks say."""
    labels, ids = inputs["labels"], inputs["input_ids"]
    if masks is not None:
        if "attention_mask" not in inputs:  # packed: each sample's first token masked too
            cu = inputs["cu_seq_lens_q"].tolist()
            expected = [-100] * labels.shape[1]
            for a, b in itertools.pairwise(cu):
                row = row_ids({"input_ids": ids[:, a : a + 2], "attention_mask": None})[0]
                expected[a:b] = [-100] + [
                    t if m else -100 for t, m in zip(ids[0, a + 1 : b].tolist(), masks[row][1:], strict=True)
                ]
            return labels[0].tolist() == expected
        for r in range(ids.shape[0]):
            row = row_ids({"input_ids": ids[r : r + 1], "attention_mask": None})[0]
            n = len(masks[row])
            expected = [t if m else -100 for t, m in zip(ids[r, :n].tolist(), masks[row], strict=True)] + [-100] * (
                ids.shape[1] - n
            )
            if labels[r].tolist() != expected:
                return False
        return True
    if "attention_mask" in inputs:
        real = inputs["attention_mask"].bool()
        return bool((labels[real] == ids[real]).all() and (labels[~real] == -100).all())
    kept = labels != -100
    return bool((labels[kept] == ids[kept]).all())


if __name__ == "__main__":
    if os.environ.get("MAKE_DATASET"):
        make_dataset(os.environ["MAKE_DATASET"], masked=os.environ.get("MASKED") == "1")
    else:
        main()
