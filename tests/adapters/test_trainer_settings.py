"""BucketTrainer honours or refuses what a Trainer (or TRL's SFTTrainer) is told — never ignores it in
silence (issue 28): one test per bypassed setting, the train_dataset checked against the store, iterable
datasets and dataset dicts refused naming the fix, and TRL's SFTTrainer composed as
``class SFT(BucketTrainer, SFTTrainer)`` training exactly the plan."""

from __future__ import annotations

import dataclasses
import itertools
import re
import warnings

import dflash_batch as db
import numpy as np
import pytest

pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")
datasets = pytest.importorskip("datasets")

from dflash_batch.hf import BucketTrainer  # noqa: E402

ROWS = [[1 + i // 90, 1 + i % 90, *[(7 * i + j) % 90 + 1 for j in range(2 + i % 30)]] for i in range(120)]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("settings") / "ds")
    datasets.Dataset.from_dict({"input_ids": ROWS}).save_to_disk(path)
    return path


def model():
    config = transformers.LlamaConfig(
        vocab_size=128, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=2, max_position_embeddings=128,
    )  # fmt: skip
    return transformers.LlamaForCausalLM(config)


def arguments(tmp_path, config=transformers.TrainingArguments, **kwargs):
    kwargs = {"output_dir": str(tmp_path / "out"), "report_to": [], "use_cpu": True, "save_strategy": "no", **kwargs}
    return config(**kwargs)


def trainer(data, tmp_path, cls=BucketTrainer, dataset=None, mode="padded", **kwargs):
    store = db.TokenStore(data)
    sampler = db.BucketSampler(store.lengths(), max_tokens=128, seed=5, mode=mode)
    kwargs.setdefault("args", arguments(tmp_path))
    dataset = datasets.load_from_disk(data) if dataset is None else dataset
    return cls(model=model(), train_dataset=dataset, sampler=sampler, store=store, **kwargs)


def quiet(data, tmp_path, **kwargs):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer(data, tmp_path, **kwargs)
    return [str(w.message) for w in caught if "is not used by BucketTrainer" in str(w.message)]


def test_default_arguments_warn_about_nothing(data, tmp_path):
    assert quiet(data, tmp_path) == []


@pytest.mark.parametrize(
    ("setting", "value", "says"),
    [
        ("per_device_train_batch_size", 16, "max_tokens=128 sets every batch"),
        ("dataloader_drop_last", True, "the same number of steps"),
        ("train_sampling_strategy", "group_by_length", "the sampler's plan decides the order"),
    ],
)
def test_each_setting_the_sampler_overrides_warns_once_naming_what_it_does(data, tmp_path, setting, value, says):
    if setting not in {f.name for f in dataclasses.fields(transformers.TrainingArguments)}:
        pytest.skip(f"this transformers {transformers.__version__} has no {setting}")
    said = quiet(data, tmp_path, args=arguments(tmp_path, **{setting: value}))
    assert len(said) == 1 and said[0].startswith(f"{setting}={value!r}") and says in said[0]


def test_a_data_collator_warns_that_the_loader_collates(data, tmp_path):
    collator = transformers.DataCollatorForLanguageModeling(tokenizer=None, mlm=False)
    said = quiet(data, tmp_path, data_collator=collator)
    assert len(said) == 1 and "collates padded rows in Rust" in said[0]


def test_a_train_dataset_of_other_rows_is_refused(data, tmp_path):
    fewer = datasets.load_from_disk(data).select(range(100))
    with pytest.raises(ValueError, match="train_dataset has 100 rows but the store has 120"):
        trainer(data, tmp_path, dataset=fewer)
    other = datasets.Dataset.from_dict({"input_ids": [row[::-1] for row in ROWS]})
    with pytest.raises(ValueError, match=r"row 0 holds .* differ from the store"):
        trainer(data, tmp_path, dataset=other)


def test_a_labels_column_that_masks_the_loss_is_refused(data, tmp_path):
    masked = [[-100, -100, *row[2:]] for row in ROWS]
    dataset = datasets.Dataset.from_dict({"input_ids": ROWS, "labels": masked})
    with pytest.raises(db.PlanError, match="'labels' column that masks the loss"):
        trainer(data, tmp_path, dataset=dataset)
    same = datasets.Dataset.from_dict({"input_ids": ROWS, "labels": ROWS})  # labels = input_ids: nothing lost
    trainer(data, tmp_path, dataset=same)


@pytest.mark.parametrize("kind", ["DatasetDict", "IterableDataset", "torch IterableDataset"])
def test_iterable_datasets_and_dataset_dicts_are_refused_naming_the_fix(data, tmp_path, kind):
    import torch

    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            yield from ROWS

    dataset = {
        "DatasetDict": datasets.DatasetDict({"train": datasets.load_from_disk(data)}),
        "IterableDataset": datasets.load_from_disk(data).to_iterable_dataset(),
        "torch IterableDataset": Stream(),
    }[kind]
    fix = re.escape("pass dataset['train']") if kind == "DatasetDict" else "materialize it"
    for build in (db.TokenStore, db.read_lengths, lambda d: db.BucketSampler(d, max_tokens=64)):
        with pytest.raises(TypeError, match=fix):
            build(dataset)
    with pytest.raises(TypeError, match=fix):
        trainer(data, tmp_path, dataset=dataset)


# -- TRL --------------------------------------------------------------------------------------------------

trl = pytest.importorskip("trl")


def tokenizer():
    from tokenizers import Tokenizer, models

    vocab = {f"t{i}": i for i in range(128)}
    fast = Tokenizer(models.WordLevel(vocab, unk_token="t127"))
    return transformers.PreTrainedTokenizerFast(tokenizer_object=fast, pad_token="t0", eos_token="t127")


class SFT(BucketTrainer, trl.SFTTrainer):
    """The recipe: BucketTrainer first, so its __init__ takes sampler= and store= before TRL's."""


def sft_arguments(tmp_path, **kwargs):
    return arguments(tmp_path, trl.SFTConfig, **{"max_length": None, **kwargs})


def test_the_other_base_order_fails_when_the_class_is_made_naming_the_fix():
    with pytest.raises(TypeError, match=r"list BucketTrainer first: class Wrong\(BucketTrainer, SFTTrainer\)"):

        class Wrong(trl.SFTTrainer, BucketTrainer):
            pass


@pytest.mark.parametrize("mode", ["padded", "packed"])
def test_sft_trains_exactly_the_plan_with_accumulation(data, tmp_path, mode):
    seen = []

    class Recording(SFT):
        def training_step(self, model, inputs, *rest, **kwargs):
            ids = inputs["input_ids"]
            if "cu_seq_lens_q" in inputs:
                cu = inputs["cu_seq_lens_q"].tolist()
                seen.append(sorted((int(ids[0, s]) - 1) * 90 + int(ids[0, s + 1]) - 1 for s in cu[:-1]))
            else:
                seen.append(sorted((int(r[0]) - 1) * 90 + int(r[1]) - 1 for r in ids))
            return super().training_step(model, inputs, *rest, **kwargs)

    args = sft_arguments(tmp_path, num_train_epochs=2, gradient_accumulation_steps=4, padding_free=mode == "packed")
    run = trainer(data, tmp_path, cls=Recording, mode=mode, args=args, processing_class=tokenizer())
    run.train()
    sampler = db.BucketSampler(db.TokenStore(data).lengths(), max_tokens=128, seed=5, mode=mode, accumulation=4)
    expected = [sorted(sampler.plan(e)[s].tolist()) for e in range(2) for s in range(sampler.plan(e).steps)]
    assert seen == expected


def test_sft_packing_is_refused_naming_the_fix(data, tmp_path):
    with pytest.raises(db.PlanError, match="packing=False and build the sampler with mode='packed'"):
        trainer(data, tmp_path, cls=SFT, args=sft_arguments(tmp_path, packing=True, max_length=128),
                processing_class=tokenizer())  # fmt: skip


def test_sft_padding_free_needs_a_packed_sampler(data, tmp_path):
    with pytest.raises(db.PlanError, match="mode='packed'"):
        trainer(data, tmp_path, cls=SFT, args=sft_arguments(tmp_path, padding_free=True), processing_class=tokenizer())
    trainer(data, tmp_path, cls=SFT, mode="packed", args=sft_arguments(tmp_path, padding_free=True),
            processing_class=tokenizer())  # fmt: skip


def test_sft_max_length_shorter_than_the_stores_rows_is_refused(data, tmp_path):
    longest = max(len(row) for row in ROWS)
    args = arguments(tmp_path, trl.SFTConfig, max_length=16)
    with pytest.raises(db.PlanError, match=f"max_length=16 truncates rows.*up to {longest} tokens"):
        trainer(data, tmp_path, cls=SFT, args=args, processing_class=tokenizer())


def test_sft_prompt_completion_masks_are_refused_not_ignored(data, tmp_path):
    prompts = [row[:3] for row in ROWS]
    completions = [row[3:] for row in ROWS]
    mask = [[0] * len(p) + [1] * len(c) for p, c in zip(prompts, completions, strict=True)]
    dataset = datasets.Dataset.from_dict({"input_ids": ROWS, "completion_mask": mask})
    with pytest.raises(db.PlanError, match="'completion_mask' column that masks the loss"):
        trainer(data, tmp_path, cls=SFT, dataset=dataset, args=sft_arguments(tmp_path), processing_class=tokenizer())
    args = sft_arguments(tmp_path, completion_only_loss=False)
    trainer(data, tmp_path, cls=SFT, dataset=dataset, args=args, processing_class=tokenizer())
    assert np.asarray(mask[0]).sum() < len(ROWS[0])


# -- the dataset's loss mask, trained --------------------------------------------------------------------

PROMPTS = [2 + i % 5 for i in range(len(ROWS))]  # the first tokens of each row are its prompt
MASKS = [[0] * p + [1] * (len(row) - p) for p, row in zip(PROMPTS, ROWS, strict=True)]


@pytest.fixture(scope="module", params=["completion_mask", "assistant_masks", "labels"])
def masked_data(tmp_path_factory, request):
    path = str(tmp_path_factory.mktemp("masked") / "ds")
    if request.param == "labels":  # -100 on the prompt, the tokens elsewhere
        masks = [expected_labels(row) for row in range(len(ROWS))]
    else:
        masks = MASKS
    datasets.Dataset.from_dict({"input_ids": ROWS, request.param: masks}).save_to_disk(path)
    return path


def expected_labels(row: int) -> list[int]:
    return [t if m else -100 for t, m in zip(ROWS[row], MASKS[row], strict=True)]


@pytest.mark.parametrize(("cls", "mode"), [("bucket", "padded"), ("sft", "padded"), ("sft", "packed")])
def test_the_datasets_mask_is_trained_and_normalizes_the_loss(masked_data, tmp_path, cls, mode):
    seen = []

    class Recording(SFT if cls == "sft" else BucketTrainer):
        def training_step(self, model, inputs, num_items_in_batch=None):
            ids, labels = inputs["input_ids"], inputs["labels"]
            if "cu_seq_lens_q" in inputs:  # packed: each sample's labels, its first token masked
                cu = inputs["cu_seq_lens_q"].tolist()
                for a, b in itertools.pairwise(cu):
                    row = (int(ids[0, a]) - 1) * 90 + int(ids[0, a + 1]) - 1
                    assert labels[0, a:b].tolist() == [-100, *expected_labels(row)[1:]]
                trained = int((labels != -100).sum())
            else:
                for r in range(ids.shape[0]):
                    row = (int(ids[r, 0]) - 1) * 90 + int(ids[r, 1]) - 1
                    n = len(ROWS[row])
                    assert labels[r, :n].tolist() == expected_labels(row) and (labels[r, n:] == -100).all()
                trained = int((labels[:, 1:] != -100).sum())
            seen.append((self.state.global_step, trained, int(num_items_in_batch)))
            return super().training_step(model, inputs, num_items_in_batch)

    store = db.TokenStore(masked_data)
    assert store.mask in ("completion_mask", "assistant_masks", "labels")
    sampler = db.BucketSampler(store.lengths(), max_tokens=128, seed=5, mode=mode)
    args = dict(num_train_epochs=2, gradient_accumulation_steps=4)
    if cls == "sft":
        extra = {
            "args": sft_arguments(tmp_path, padding_free=mode == "packed", **args),
            "processing_class": tokenizer(),
        }
    else:
        extra = {"args": arguments(tmp_path, **args)}
    run = Recording(
        model=model(), train_dataset=datasets.load_from_disk(masked_data), sampler=sampler, store=store, **extra
    )
    run.train()
    assert len(seen) == 2 * len(sampler)
    for step in {s for s, _, _ in seen}:
        window = [(trained, items) for s, trained, items in seen if s == step]
        assert {items for _, items in window} == {sum(trained for trained, _ in window)}, f"step {step}"
