"""The plain-torch and HF-model recipes the README gives: a ``DataLoader`` with workers over a HF dataset
(``db.Collator``, spawn) whose resume is exact despite prefetching; packed rows in a HF Llama computing
each sample as if alone; one step count for every epoch."""

from __future__ import annotations

import itertools
import pickle

import numpy as np
import pytest

torch = pytest.importorskip("torch")
datasets = pytest.importorskip("datasets")

import dflash_batch as db  # noqa: E402


def rows_of(batch) -> list[int]:
    ids, mask = batch["input_ids"], batch["attention_mask"]
    return sorted(int(ids[r, 0]) * 1000 + int(ids[r, 1]) for r in range(ids.shape[0]) if mask[r].sum() > 0)


@pytest.fixture(scope="module")
def hf_path(tmp_path_factory):
    rng = np.random.default_rng(1)
    rows = [[1 + i // 100, 1 + i % 100, *rng.integers(1, 200, int(rng.integers(1, 30))).tolist()] for i in range(120)]
    path = str(tmp_path_factory.mktemp("recipes") / "ds")
    datasets.Dataset.from_dict({"input_ids": rows}).save_to_disk(path)
    return path


def test_dataloader_with_spawned_workers_resumes_exactly_despite_prefetch(hf_path):
    """torchdata's StatefulDataLoader saves the position of the last batch its loop received, whatever
    its workers fetched ahead (the sampler's iterator is a torchdata Stateful)."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    dataset = datasets.load_from_disk(hf_path)

    def loader(sampler):
        return StatefulDataLoader(
            dataset, batch_sampler=sampler, collate_fn=db.Collator(), num_workers=2, multiprocessing_context="spawn"
        )

    sampler = db.BucketSampler(hf_path, column="input_ids", max_tokens=96, seed=1)
    plan = sampler.plan(0)
    trained = []
    first = loader(sampler)
    for step, batch in enumerate(first):
        trained.append(rows_of(batch))
        if step == 4:
            assert sampler.position.step > 5, "the workers fetch ahead of the loop"
            state = first.state_dict()  # the batches this loop trained on: those ahead are not counted
            assert sampler.state_dict(step=step + 1)["step"] == 5  # or say it yourself
            break
    resumed = loader(db.BucketSampler(hf_path, column="input_ids", max_tokens=96, seed=1))
    resumed.load_state_dict(state)
    trained += [rows_of(batch) for batch in resumed]
    tokens = db.TokenStore(hf_path)
    expected = [sorted(int(tokens[i][0]) * 1000 + int(tokens[i][1]) for i in plan[s]) for s in range(plan.steps)]
    assert trained == expected


def test_collator_pads_like_collate_and_pickles(hf_path):
    store, dataset = db.TokenStore(hf_path), datasets.load_from_disk(hf_path)
    collator = pickle.loads(pickle.dumps(db.Collator(pad_to_multiple_of=8)))
    got = collator([dataset[i] for i in (3, 7, 11)])
    expected = db.collate(store, [3, 7, 11], pad_to_multiple_of=8)
    for key, array in expected.items():
        np.testing.assert_array_equal(got[key].numpy(), array, err_msg=key)
    with pytest.raises(TypeError, match="integer token ids"):
        collator([{"input_ids": [0.5, 1.5]}])


def test_every_epoch_has_the_same_steps_for_several_seeds_and_modes(hf_path):
    lengths = db.seed_workload(3_000)
    for seed in range(4):
        for kwargs in ({"max_tokens": 16384}, {"max_tokens": 16384, "mode": "packed"}, {"batch_size": 8}):
            for world in (1, 3):
                sampler = db.BucketSampler(lengths, seed=seed, world_size=world, rank=world - 1, **kwargs)
                before = len(sampler)  # known before any epoch is chosen
                for epoch in range(10):
                    sampler.set_epoch(epoch)
                    assert len(sampler) == before == sampler.plan().steps, (seed, kwargs, world, epoch)
                    assert len(list(sampler)) == before


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_packed_rows_in_a_hf_llama_compute_each_sample_alone(hf_path, attention):
    transformers = pytest.importorskip("transformers")
    from dflash_batch.hf import packed_inputs

    store = db.TokenStore(hf_path)
    sampler = db.BucketSampler(store.lengths(), max_tokens=64, mode="packed", seed=2)
    batch = next(iter(db.Loader(store, sampler)))
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=256,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=64,
        attn_implementation=attention,
    )
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():
        packed = model(**packed_inputs(batch))
        naive = model(input_ids=batch["input_ids"], labels=batch["labels"], position_ids=batch["position_ids"])
        cu = batch["cu_seqlens"].tolist()
        assert len(cu) > 2, "the row must hold several samples"
        total, count = 0.0, 0
        for start, end in itertools.pairwise(cu):
            ids = batch["input_ids"][:, start:end]
            alone = model(input_ids=ids, labels=ids)
            torch.testing.assert_close(packed.logits[:, start:end], alone.logits, atol=2e-5, rtol=1e-4)
            total, count = total + float(alone.loss) * (end - start - 1), count + end - start - 1
    assert abs(float(packed.loss) - total / count) < 1e-5
    # The same call without packed_inputs (the model's default use_cache=True) lets samples attend across.
    assert (naive.logits[:, cu[1] : cu[2]] - packed.logits[:, cu[1] : cu[2]]).abs().max() > 1e-4
