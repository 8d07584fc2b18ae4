"""Rows that name themselves and a tiny causal LM, for the HF Trainer tests over a mixture
(tests/data/test_mixture.py, tests/_hf_mixture_run.py): row ``r`` starts with tokens ``1 + r // 100, 1 + r % 100``,
so the rows of a micro-batch are read back from its ``input_ids``."""

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
