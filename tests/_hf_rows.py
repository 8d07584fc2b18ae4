"""Rows that name themselves, a tiny causal LM and a Trainer recording what it trained, for the HF Trainer tests
over a mixture (tests/data/test_mixture.py, tests/data/test_mixture_schedule.py, tests/_hf_mixture_run.py): row
``r`` starts with tokens ``1 + r // 100, 1 + r % 100``, so the rows of a micro-batch are read back from its
``input_ids``."""

from __future__ import annotations

from typing import Any


def rows(first: int, count: int, longest: int) -> Any:
    """Rows ``first … first + count - 1`` as a ``datasets.Dataset`` of ``input_ids`` (2 + up to ``longest`` tokens)."""
    import datasets

    ids = [[1 + r // 100, 1 + r % 100] + [3] * ((r * 7) % longest) for r in range(first, first + count)]
    return datasets.Dataset.from_dict({"input_ids": ids})


def rows_of(input_ids: Any) -> list[int]:
    """The rows a padded batch's ``input_ids`` hold (see :func:`rows`)."""
    return [int(input_ids[r, 0] - 1) * 100 + int(input_ids[r, 1]) - 1 for r in range(len(input_ids))]


def tiny_llama() -> Any:
    """A one-layer Llama of 16 hidden units over 128 tokens."""
    import transformers

    config = transformers.LlamaConfig(
        vocab_size=128, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=2,
    )  # fmt: skip
    return transformers.LlamaForCausalLM(config)


def train_recording(
    mix: Any, parts: list[Any], output_dir: str, epochs: int, max_tokens: int = 128, **args: Any
) -> Any:
    """A ``BucketTrainer`` over ``mix`` (whose sources are the datasets ``parts``, concatenated), GA 2, trained for
    ``epochs``; returns it and the ``(epoch, rows)`` of every micro-batch it trained."""
    import datasets
    import transformers
    from dflash_batch.hf import BucketTrainer

    seen: list[tuple[int, list[int]]] = []

    class Recording(BucketTrainer):
        def training_step(self, model, inputs, *rest, **kwargs):
            seen.append((self.bucket_sampler.epoch, rows_of(inputs["input_ids"])))
            return super().training_step(model, inputs, *rest, **kwargs)

    settings = dict(
        output_dir=output_dir, num_train_epochs=epochs, gradient_accumulation_steps=2, logging_steps=1, report_to=[],
        use_cpu=True, save_strategy="no",
    )  # fmt: skip
    trainer = Recording(
        model=tiny_llama(), args=transformers.TrainingArguments(**{**settings, **args}), store=mix,
        sampler={"max_tokens": max_tokens, "seed": 3}, train_dataset=datasets.concatenate_datasets(parts),
    )  # fmt: skip
    trainer.train()
    return trainer, seen
