"""accelerate and Lightning as users run them, for tests/adapters/test_clients_resume.py: a tiny model, gradient
accumulation 4, two epochs, a checkpoint through the client's own mechanism, optionally SIGKILL a few
optimizer steps later and a resume from that checkpoint. Every micro-batch trained is appended to a
JSON-lines record per rank (flushed at once, so a kill keeps what was trained): its epoch, the optimizer
steps done before it and its dataset rows.

Scenarios (``--scenario``):

* ``accelerate-stateful``: ``prepare(DataLoader(ds, batch_sampler=batch_sampler(sampler)))`` with
  ``use_stateful_dataloader=True``: ``save_state``/``load_state`` save and restore the loader's position;
* ``accelerate-epoch``: the same, the loop continuing from ``sampler.epoch`` after ``load_state`` (the
  sampler's epoch registered with ``epoch_state(sampler)``), not from a counter of its own;
* ``accelerate-skip``: the same loader, stateless: the resume skips the micro-batches the checkpoint had
  trained with ``accelerator.skip_first_batches``;
* ``accelerate-loader``: ``dflash_batch.adapters.accelerate.loader(db.Loader(...))`` under
  ``accelerator.accumulate``, ``register_for_checkpointing(loader)``;
* ``lightning-loader``: a ``db.Loader`` as the train dataloader (Lightning saves it as a stateful loader);
* ``lightning-sampler``: ``DataLoader(ds, batch_sampler=sampler)`` with the ``SamplerCheckpoint`` callback;
* ``torch-loader``: plain DDP (``no_sync`` between optimizer steps) over a ``db.Loader``, its state in a
  ``torch.save`` checkpoint;
* ``torch-workers``: plain DDP over torchdata's ``StatefulDataLoader(ds, batch_sampler=sampler,
  num_workers=2)``, whose workers fetch ahead, the loader's ``state_dict()`` in the checkpoint;
* ``torch-workers-epoch``: the same, the loop continuing from ``sampler.epoch`` once set from the loaded
  state (``resume_epoch``), not from a counter of its own;
* ``torch-workers-step``: the same over a plain torch ``DataLoader``: ``sampler.state_dict(step=...)`` with
  the micro-batches the loop counted;
* ``torch-mixture``: plain DDP over a ``db.Loader`` of a two-source :class:`db.Mixture` of the dataset's
  rows (:func:`mixture_of`: the first three fifths down-sampled to 0.3 of every epoch, the rest
  up-sampled to 0.7), each micro-batch's ``source`` ids recorded.

    python -m torch.distributed.run --standalone --nproc_per_node=2 tests/_clients_run.py DATA OUT RECORD \
        --scenario S [--save-at N] [--kill-at N] [--resume]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import signal

import datasets
import dflash_batch as db
import torch
from _trainer_run import _intact, leave, row_ids

ACCUMULATION, EPOCHS, MAX_TOKENS, SEED = 4, 2, 128, 5


class Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed, self.head = torch.nn.Embedding(128, 8), torch.nn.Linear(8, 128)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        logits = self.head(self.embed(input_ids))
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)


class Record:
    def __init__(self, path: str, rank: int) -> None:
        self.rank, self.file = rank, open(f"{path}.{rank}", "a")

    def write(self, **line) -> None:
        self.file.write(json.dumps({"rank": self.rank, **line}) + "\n")
        self.file.flush()


class Progress:
    """The training loop's own counters, checkpointed beside the model (as users keep them)."""

    def __init__(self) -> None:
        self.epoch, self.micro, self.optimizer_steps = 0, 0, 0

    def state_dict(self) -> dict:
        return dict(vars(self))

    def load_state_dict(self, state: dict) -> None:
        self.__dict__.update(state)


def sampler_of(store: db.TokenStore, **ranks) -> db.BucketSampler:
    return db.BucketSampler(store.lengths(), max_tokens=MAX_TOKENS, seed=SEED, accumulation=ACCUMULATION, **ranks)


#: The mixture's weights from epoch 1 on (issue 63: the kill and the resume fall in the epoch after the change).
SCHEDULE = {1: {"a": 0.2, "b": 0.8}}


def mixture_of(data: str) -> db.Mixture:
    """The dataset's rows as two sources: the first three fifths at 0.3 of epoch 0 and 0.2 of every later
    epoch (:data:`SCHEDULE`), the rest at 0.7 and 0.8."""
    rows = datasets.load_from_disk(data)
    split = len(rows) * 3 // 5
    parts = {"a": (rows.select(range(split)), 0.3), "b": (rows.select(range(split, len(rows))), 0.7)}
    sources = {name: (db.TokenStore(part), weight) for name, (part, weight) in parts.items()}
    return db.Mixture(sources, unit="samples", schedule=SCHEDULE)


def kill() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def run_accelerate(options: argparse.Namespace) -> None:
    from accelerate import Accelerator
    from accelerate.utils import DataLoaderConfiguration
    from dflash_batch.adapters.accelerate import batch_sampler, epoch_state
    from dflash_batch.adapters.accelerate import loader as accelerated
    from torch.utils.data import DataLoader

    stateful = options.scenario in ("accelerate-stateful", "accelerate-epoch")
    config = DataLoaderConfiguration(use_stateful_dataloader=stateful)
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=ACCUMULATION, dataloader_config=config)
    record = Record(options.record, accelerator.process_index)
    store = db.TokenStore(options.data)
    sampler = sampler_of(store)
    torch.manual_seed(0)
    model = Tiny()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    if options.scenario == "accelerate-loader":
        loader = accelerated(db.Loader(store, sampler))
    else:
        hf = datasets.load_from_disk(options.data)
        loader = DataLoader(hf, batch_sampler=batch_sampler(sampler), collate_fn=db.Collator())
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    progress = Progress()
    accelerator.register_for_checkpointing(progress)
    if options.scenario == "accelerate-loader":
        accelerator.register_for_checkpointing(loader)
    if options.scenario == "accelerate-epoch":
        accelerator.register_for_checkpointing(epoch_state(sampler))
    if options.resume:
        accelerator.load_state(options.out)
    start = sampler.epoch if options.scenario == "accelerate-epoch" else progress.epoch
    for epoch in range(start, EPOCHS):
        loader.set_epoch(epoch)
        batches = loader
        if options.scenario == "accelerate-skip" and epoch == start and progress.micro:
            batches = accelerator.skip_first_batches(loader, progress.micro)
        for batch in batches:
            with accelerator.accumulate(model):
                loss = model(batch["input_ids"], batch["labels"])
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
            record.write(epoch=epoch, optimizer_steps=progress.optimizer_steps, rows=row_ids(batch))
            progress.micro += 1
            if accelerator.sync_gradients:
                progress.optimizer_steps += 1
                if progress.optimizer_steps == options.save_at:
                    accelerator.save_state(options.out)
                if progress.optimizer_steps == options.kill_at:
                    accelerator.wait_for_everyone()
                    kill()
        progress.epoch, progress.micro = epoch + 1, 0
    record.write(final_steps=progress.optimizer_steps, steps=len(sampler))
    leave()


def run_lightning(options: argparse.Namespace) -> None:
    import lightning as L
    from lightning.pytorch.callbacks import Callback, ModelCheckpoint
    from torch.utils.data import DataLoader

    world, rank = int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("RANK", 0))
    record = Record(options.record, rank)
    store = db.TokenStore(options.data)
    # Lightning starts torch.distributed inside fit(): the ranks are passed, not found.
    sampler = sampler_of(store, world_size=world, rank=rank)
    callbacks = []
    if options.scenario == "lightning-loader":
        dataloader = db.Loader(store, sampler)
    else:
        from dflash_batch.adapters.lightning import SamplerCheckpoint

        hf = datasets.load_from_disk(options.data)
        dataloader = DataLoader(hf, batch_sampler=sampler, collate_fn=db.Collator())
        callbacks.append(SamplerCheckpoint(sampler))

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.net = Tiny()

        def train_dataloader(self):
            return dataloader

        def training_step(self, batch, index):
            record.write(epoch=self.current_epoch, optimizer_steps=self.global_step, rows=row_ids(batch))
            return self.net(batch["input_ids"], batch["labels"])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    class Kill(Callback):
        def on_train_batch_start(self, trainer, *args):
            if trainer.global_step == options.kill_at:
                trainer.strategy.barrier()  # the checkpoint is on disk on every rank's side
                kill()

    saving = ModelCheckpoint(dirpath=options.out, every_n_train_steps=options.save_at or 10**9, save_top_k=-1)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=world,
        strategy="ddp" if world > 1 else "auto",
        max_epochs=EPOCHS,
        accumulate_grad_batches=ACCUMULATION,
        callbacks=[saving, Kill(), *callbacks],
        use_distributed_sampler=False,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    path = None
    if options.resume:
        (path,) = glob.glob(os.path.join(options.out, f"*step={options.save_at}.ckpt"))
    trainer.fit(Module(), ckpt_path=path)
    record.write(final_steps=trainer.global_step, steps=len(sampler))
    leave()


def run_torch(options: argparse.Namespace) -> None:
    import contextlib

    import torch.distributed as dist
    from torch.utils.data import DataLoader

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    record = Record(options.record, rank)
    store = db.TokenStore(options.data)
    sampler = sampler_of(store)
    mixture = None
    if options.scenario == "torch-mixture":
        mixture = mixture_of(options.data)
        sampler = db.BucketSampler(mixture, max_tokens=MAX_TOKENS, seed=SEED, accumulation=ACCUMULATION)
    # The dataset's own mask column (read apart from the store), to check every micro-batch's labels.
    masks = datasets.load_from_disk(options.data)[store.mask] if store.mask else None
    hf = datasets.load_from_disk(options.data)
    if options.scenario == "torch-loader":
        loader = saved = db.Loader(store, sampler)
    elif options.scenario == "torch-mixture":
        loader = saved = db.Loader(mixture, sampler)
    elif options.scenario in ("torch-workers", "torch-workers-epoch"):
        from torchdata.stateful_dataloader import StatefulDataLoader

        loader = saved = StatefulDataLoader(hf, batch_sampler=sampler, collate_fn=db.Collator(), num_workers=2)
    else:  # a plain DataLoader: the loop says how many micro-batches it trained
        loader = DataLoader(hf, batch_sampler=sampler, collate_fn=db.Collator(), num_workers=2)
        saved = None
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(Tiny())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    progress = Progress()
    path = os.path.join(options.out, "checkpoint.pt")
    if options.resume:
        checkpoint = torch.load(path, weights_only=False)
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        progress.load_state_dict(checkpoint["progress"])
        (saved or sampler).load_state_dict(checkpoint["data"])
        if options.scenario == "torch-workers-epoch":
            from dflash_batch.adapters.torch import resume_epoch

            sampler.set_epoch(resume_epoch(checkpoint["data"]))  # torchdata applies the state lazily
    # The loop's own count, or the sampler's epoch once set from the state (torch-workers-epoch).
    start = sampler.epoch if options.scenario == "torch-workers-epoch" else progress.epoch
    for epoch in range(start, EPOCHS):
        progress.epoch = epoch
        sampler.set_epoch(epoch)
        steps = len(sampler)
        for batch in loader:
            progress.micro += 1
            last = progress.micro % ACCUMULATION == 0 or progress.micro == steps
            with contextlib.nullcontext() if last else model.no_sync():
                model(batch["input_ids"], batch["labels"]).backward()
            intact = _intact(batch, masks)
            sources = {"sources": batch["source"].tolist()} if "source" in batch else {}
            record.write(
                epoch=epoch, optimizer_steps=progress.optimizer_steps, rows=row_ids(batch), intact=intact, **sources
            )
            if last:
                optimizer.step()
                optimizer.zero_grad()
                progress.optimizer_steps += 1
                if progress.optimizer_steps == options.save_at and rank == 0:
                    os.makedirs(options.out, exist_ok=True)
                    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
                    data = saved.state_dict() if saved is not None else sampler.state_dict(step=progress.micro)
                    torch.save({**state, "progress": progress.state_dict(), "data": data}, path)
                if progress.optimizer_steps == options.kill_at:
                    dist.barrier()
                    kill()
        progress.micro = 0
    record.write(final_steps=progress.optimizer_steps, steps=len(sampler))
    leave()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("data")
    parser.add_argument("out")
    parser.add_argument("record")
    parser.add_argument("--scenario", required=True)
    parser.add_argument("--save-at", type=int, default=None)
    parser.add_argument("--kill-at", type=int, default=None)
    parser.add_argument("--resume", action="store_true")
    options = parser.parse_args()
    if options.scenario.startswith("accelerate"):
        run_accelerate(options)
    elif options.scenario.startswith("lightning"):
        run_lightning(options)
    else:
        run_torch(options)


if __name__ == "__main__":
    main()
