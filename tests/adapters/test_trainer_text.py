"""TRL's SFTTrainer on data it tokenizes itself (issue 28): conversational ``messages`` with
``assistant_only_loss=True`` and prompt-completion text. BucketTrainer reads its store from the dataset
TRL prepared (``store`` left out, ``sampler`` a dict of its arguments), so every micro-batch carries
exactly the assistant's (or the completion's) tokens as labels, for the samples the plan put there."""

from __future__ import annotations

import itertools

import dflash_batch as db
import numpy as np
import pytest

pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
datasets = pytest.importorskip("datasets")
trl = pytest.importorskip("trl")

from dflash_batch.hf import BucketTrainer  # noqa: E402

COUNT = 60
EOS = 127


def prompt(i: int) -> list[int]:
    """Sample ``i``'s prompt: its number in the second token, then 0-8 filler tokens."""
    return [1, 1 + i, *[5] * (i % 9)]


def answer(i: int) -> list[int]:
    return [9 + i % 3] * (3 + i % 13) + [EOS]


def words(tokens: list[int]) -> str:
    return " ".join(f"t{t}" for t in tokens)


def tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers

    fast = Tokenizer(models.WordLevel({f"t{i}": i for i in range(128)}, unk_token=f"t{EOS}"))
    fast.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=fast, pad_token="t0", eos_token=f"t{EOS}")
    tok.chat_template = (
        "{% for m in messages %}{% if m['role'] == 'assistant' %}{% generation %}{{ m['content'] }} "
        f"t{EOS} {{% endgeneration %}}{{% else %}}{{{{ m['content'] }}}} {{% endif %}}{{% endfor %}}"
    )
    return tok


def dataset(kind: str):
    if kind == "conversational":
        rows = [
            {"messages": [{"role": "user", "content": words(prompt(i))},
                          {"role": "assistant", "content": words(answer(i)[:-1])}]}
            for i in range(COUNT)
        ]  # fmt: skip
    else:  # TRL appends the EOS text to each completion
        rows = [{"prompt": words(prompt(i)) + " ", "completion": words(answer(i)[:-1]) + " "} for i in range(COUNT)]
    return datasets.Dataset.from_list(rows)


def expected_labels(i: int) -> list[int]:
    return [-100] * len(prompt(i)) + answer(i)


class SFT(BucketTrainer, trl.SFTTrainer):
    pass


def flat(mode: str) -> dict:
    return {"max_tokens": 64, "seed": 3, "mode": mode}


def grouped(mode: str) -> dict:
    """The same settings as typed groups (a Balance passed in the dict: the trainer binds nothing else)."""
    batching = db.Packed(64) if mode == "packed" else db.Padded(max_tokens=64)
    return {"batching": batching, "seed": 3, "balance": db.Balance(accumulation=4)}


@pytest.mark.parametrize(
    ("kind", "mode", "settings"),
    [
        *((kind, mode, flat) for kind in ("conversational", "prompt-completion") for mode in ("padded", "packed")),
        ("conversational", "packed", grouped),
        ("prompt-completion", "padded", grouped),
    ],
)
def test_sft_trains_the_assistants_tokens_of_text_it_tokenizes(tmp_path, kind, mode, settings):
    seen, windows = [], []

    class Recording(SFT):
        def training_step(self, model, inputs, num_items_in_batch=None):
            ids, labels = inputs["input_ids"], inputs["labels"]
            if "cu_seq_lens_q" in inputs:
                cu = inputs["cu_seq_lens_q"].tolist()
                rows = [int(ids[0, a + 1]) - 1 for a in cu[:-1]]
                for row, (a, b) in zip(rows, itertools.pairwise(cu), strict=True):
                    assert labels[0, a:b].tolist() == [-100, *expected_labels(row)[1:]], row
                trained = int((labels != -100).sum())
            else:
                rows = [int(r[1]) - 1 for r in ids]
                for r, row in enumerate(rows):
                    n = len(expected_labels(row))
                    assert labels[r, :n].tolist() == expected_labels(row), row
                    assert (labels[r, n:] == -100).all()
                trained = int((labels[:, 1:] != -100).sum())
            seen.append(sorted(rows))
            windows.append((self.state.global_step, trained, int(num_items_in_batch)))
            return super().training_step(model, inputs, num_items_in_batch)

    args = trl.SFTConfig(
        output_dir=str(tmp_path), report_to=[], use_cpu=True, save_strategy="no", num_train_epochs=2,
        gradient_accumulation_steps=4, max_length=None, padding_free=mode == "packed",
        assistant_only_loss=kind == "conversational",
    )  # fmt: skip
    config = transformers.LlamaConfig(
        vocab_size=128, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=2, max_position_embeddings=64,
    )  # fmt: skip
    options = settings(mode)
    run = Recording(
        model=transformers.LlamaForCausalLM(config), args=args, train_dataset=dataset(kind),
        processing_class=tokenizer(), sampler=options,
    )  # fmt: skip
    # TRL turns its masks into labels (≥ 1.x releases) or keeps the mask column itself (1.0): either way
    # the store applies what TRL would, which the expected labels below check token by token.
    assert run.token_store.mask in ("labels", "completion_mask", "assistant_masks")
    run.train()

    lengths = np.array([len(expected_labels(i)) for i in range(COUNT)])
    plan = db.BucketSampler(lengths, accumulation=4, **options)
    assert run.bucket_sampler.schedule.config.settings() == plan.schedule.config.settings()
    assert seen == [sorted(plan.plan(e)[s].tolist()) for e in range(2) for s in range(plan.plan(e).steps)]
    for step in {s for s, _, _ in windows}:
        window = [(trained, items) for s, trained, items in windows if s == step]
        assert {items for _, items in window} == {sum(trained for trained, _ in window)}, f"step {step}"


def test_a_sampler_of_another_kind_is_a_type_error(tmp_path):
    args = trl.SFTConfig(output_dir=str(tmp_path), report_to=[], use_cpu=True, max_length=None)
    kinds = r"sampler must be a dflash_batch\.BucketSampler, a dict of its keyword arguments, or a dflash_batch\.Win"
    with pytest.raises(TypeError, match=kinds):
        SFT(model=None, args=args, train_dataset=dataset("conversational"), sampler=[64])
    with pytest.raises(TypeError, match=r"store must be a dflash_batch\.TokenStore, a Mixture or None"):
        SFT(model=None, args=args, train_dataset=dataset("conversational"), sampler={}, store="ds")
