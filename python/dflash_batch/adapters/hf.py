"""Hugging Face ``transformers.Trainer`` (and TRL's ``SFTTrainer``) with batches from a :class:`BucketSampler`.

    from dflash_batch.hf import BucketTrainer
    trainer = BucketTrainer(model=model, args=args, train_dataset=dataset, sampler=sampler, store=store)
    trainer.train()                                   # or train(resume_from_checkpoint=True)

The Trainer's own sampler and padding collator are bypassed: training batches are the sampler's plan,
collated in Rust by a :class:`Loader` (padded, or packed rows for a ``mode="packed"`` sampler), and
every rank of ``torchrun`` trains on its share of the one global plan. (For rows a collator tokenizes
itself, ``use_data_collator=True`` has your dataset and ``data_collator`` make the plan's batches instead:
:mod:`dflash_batch.adapters.hf_collated`.) What the Trainer relies on holds:

* **Gradient accumulation**: the sampler's ``accumulation`` is bound to ``gradient_accumulation_steps``
  (its optimizer windows are the Trainer's steps); every micro-batch the Trainer pulls ahead stays
  intact; ``num_items_in_batch`` is the step's label tokens over all ranks and micro-batches, read from
  the plan (no all-gather), so a loss is the true token mean of the optimizer step.
* **One step count**: ``len()`` is the same for every epoch, as the Trainer and its LR schedule assume.
* **Exact resume**: every checkpoint folder gets one ``dflash_batch.json`` (the position, written by the
  first process; every rank's position is the same). ``train(resume_from_checkpoint=...)`` checks it
  against the data, the settings and the step the Trainer counted, then the Trainer's own
  fast-forward (``skip_first_batches``, over the sampler's index batches: nothing is collated to be
  thrown away) continues the interrupted epoch at the next batch — nothing replayed or skipped. A
  checkpoint written on another number of processes, or with another ``gradient_accumulation_steps``,
  is refused, naming the way forward: the Trainer counts its epochs in optimizer steps of the processes
  it runs on, so it cannot continue such an epoch exactly (a torch loop, accelerate or Lightning over a
  :class:`Loader` resume on any number of ranks).
* **Evaluation and prediction** go through the library too: ``evaluate`` over a deterministic
  ``shuffle=False`` plan padded by the Loader; ``predict`` over the rows in order (one prediction per
  row), padded by :class:`~dflash_batch.Collator` unless a ``data_collator`` was given.
* **Packed rows** reach the model as it needs them (:func:`packed_inputs`).

Only the Trainer's public API is used: its overridable ``get_*_dataloader``, ``get_batch_samples`` and
``train``, a ``TrainerCallback`` for the checkpoint file, and a genuine ``torch.utils.data.DataLoader``
(whose iteration is the Loader's) so the Trainer's resume machinery works as it documents it.

Importing this module imports ``transformers``; ``dflash_batch`` itself never does.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Iterator, Mapping
from typing import Any

import accelerate
import numpy as np
import torch
import transformers
from transformers import Trainer
from transformers.trainer_utils import get_last_checkpoint

from .._core import PlanError
from ..data.mixture import Mixture
from ..data.reading import TokenStore
from ..data.sources import refuse_collections_and_streams
from ..loading.collate import Collator
from ..loading.loader import Loader
from ..planning.sampler import BucketSampler
from ..planning.windows import Windows
from ..pricing.calibration import StepTimer
from ..pricing.per_source import SourceLosses
from . import hf_checks, hf_collated, hf_stream
from .hf_calibration import Calibrate, timer_of
from .hf_checkpoints import Checkpoints, check_resume
from .torch import Rows
from .versions import require

require(transformers)
require(accelerate)


def packed_inputs(batch: dict[str, Any]) -> dict[str, Any]:
    """A packed Loader batch as a HF causal LM's ``forward`` takes it: ``input_ids``, ``labels`` and
    ``position_ids`` (restarting at 0 for every sample); ``use_cache=False``, since with a cache
    transformers does not derive the per-document attention mask from ``position_ids`` (the samples
    of a row would attend to each other); and ``cu_seq_lens_q/k`` and ``max_length_q/k`` for
    FlashAttention's varlen kernel (SDPA and eager attention ignore them). ``model(**packed_inputs(b))``
    computes each sample as if alone in its row."""
    inputs = {key: batch[key] for key in ("input_ids", "labels", "position_ids")}
    inputs["use_cache"] = False
    # Samples padded for context parallelism span their padding too (labelled -100, positions counting on).
    cu = batch.get("cu_seqlens_padded", batch["cu_seqlens"])
    inputs["cu_seq_lens_q"] = inputs["cu_seq_lens_k"] = cu
    inputs["max_length_q"] = inputs["max_length_k"] = batch.get("max_seqlen_padded", batch["max_seqlen"])
    for key in ("num_items_in_batch", "source"):
        if key in batch:
            inputs[key] = batch[key]
    return inputs


class BucketTrainer(Trainer):
    """A ``transformers.Trainer`` whose training (and evaluation) batches come from dflash_batch.

    Args:
        sampler: the :class:`BucketSampler` of ``train_dataset``, built with this process's rank (the
            default under ``torchrun``). Its ``accumulation`` must be left unset or equal
            ``gradient_accumulation_steps``. Or a dict of its keyword arguments (``max_tokens``, ``seed``,
            ``mode``, ...): the sampler is then built from the store's lengths once the Trainer holds its
            dataset — the way for data a trainer tokenizes itself (TRL's conversational or
            prompt-completion text).
        store: the :class:`TokenStore` holding the token column of ``train_dataset`` (or the :class:`Mixture`
            whose sources it concatenates: a sampler given as a dict is then built from the mixture, and
            each source's mean token loss is logged as ``loss/<source>``). ``None`` (default):
            read from ``train_dataset`` as the Trainer holds it after preparing it (TRL tokenizes text and
            turns its masks into ``labels`` first), with the loss mask the dataset and arguments say.
        loader_kwargs: passed to :class:`Loader` (``pad_id``, ``prefetch``, ``dtype``, ...). The
            device defaults to the Trainer's when it is a GPU, so batches are copied on a side stream.
        eval_store: the token store of ``eval_dataset`` (default: read from ``eval_dataset``).
        step_timer: ``True`` (or a :class:`~dflash_batch.StepTimer` of ``sampler``) times every training
            micro-batch's forward pass and refits the price ranks are balanced by at every epoch's end
            (``docs/calibration.md``; :mod:`dflash_batch.adapters.hf_calibration`). Default ``False``.
        use_data_collator: ``True``: no store — the batches are rows of ``train_dataset`` made by the
            ``data_collator``, each checked against its planned length; ``sampler`` from the lengths it makes
            (``db.measure_lengths``; :mod:`~dflash_batch.adapters.hf_collated`), or a :class:`~dflash_batch.Windows`
            of a stream (:mod:`~dflash_batch.adapters.hf_stream`). Default ``False``: the Loader collates.
        *args, **kwargs: as for ``Trainer``.
    """

    def __init__(
        self,
        *args: Any,
        sampler: BucketSampler | Windows | Mapping[str, Any],
        store: TokenStore | Mixture | None = None,
        loader_kwargs: dict[str, Any] | None = None,
        eval_store: TokenStore | None = None,
        step_timer: bool | StepTimer = False,
        use_data_collator: bool = False,
        **kwargs: Any,
    ) -> None:
        trl = sys.modules.get("trl")
        with_trl = trl is not None and any(c.__module__.startswith("trl.") for c in type(self).__mro__)
        if with_trl:
            require(trl)  # a TRL trainer this one is mixed into: its release is checked too
        hf_collated.check_sampler_kind(sampler, use_data_collator, with_trl)
        mixture: Mixture | None = None
        if isinstance(store, Mixture):
            mixture, store = store, store.store
        if store is not None and not isinstance(store, TokenStore):
            raise TypeError(f"store must be a dflash_batch.TokenStore, a Mixture or None, got {type(store).__name__}")
        if eval_store is not None and not isinstance(eval_store, TokenStore):
            raise TypeError(f"eval_store must be a dflash_batch.TokenStore, got {type(eval_store).__name__}")
        if use_data_collator:
            hf_collated.refuse_settings(sampler, store if mixture is None else mixture, eval_store, loader_kwargs)
        user_collator = kwargs.get("data_collator", args[2] if len(args) > 2 else None)
        # Before the Trainer's own checks, which would say an iterable dataset lacks a length.
        refuse_collections_and_streams(kwargs.get("train_dataset", args[3] if len(args) > 3 else None))
        super().__init__(*args, **kwargs)
        self.use_data_collator = use_data_collator
        if use_data_collator:
            self._init_collated(sampler, step_timer)  # type: ignore[arg-type]
            return
        tokens: TokenStore = (
            store
            if isinstance(store, TokenStore)
            else hf_checks.store_of(self.train_dataset, self.args, collator=user_collator)
        )
        if isinstance(sampler, Mapping):
            options = dict(sampler)
            if "accumulation" not in options and "balance" not in options:  # a Balance's is bound below
                options["accumulation"] = self.args.gradient_accumulation_steps
            sampler = BucketSampler(mixture if mixture is not None else tokens.lengths(), **options)
        hf_checks.settings_overridden(self.args, {"data_collator": user_collator}, sampler)
        hf_checks.check_max_length(self.args, tokens.lengths())
        hf_checks.check_dataset(self.train_dataset, tokens, self.args)
        self.token_store: TokenStore | None = tokens
        self.user_collator = user_collator
        self.loader_kwargs = dict(loader_kwargs or {})
        # A mixture's per-source token losses, logged as loss/<source> with the Trainer's loss, where the
        # loss it extends hands back the logits it computed (a fused LM head, as TRL's, builds none).
        logits = self._extends_the_trainers_loss()
        mixed = isinstance(sampler, BucketSampler) and sampler.mixture is not None
        self._attach(sampler, eval_store, step_timer, sources=mixed and logits)

    def _init_collated(self, sampler: BucketSampler | Windows, step_timer: bool | StepTimer) -> None:
        """``use_data_collator=True``: the Trainer's dataset (or the Windows' stream) and its collator make the
        batches, no store."""
        hf_checks.settings_overridden(self.args, {}, sampler)
        if isinstance(sampler, Windows):
            hf_stream.check_windows(sampler, self.args, self.train_dataset, step_timer)
        else:
            hf_collated.check_dataset(self.train_dataset, sampler)
        hf_collated.warn_pruned_evaluation(self.args, self.eval_dataset)
        self.token_store, self.user_collator, self.loader_kwargs = None, self.data_collator, {}
        self._attach(sampler, None, step_timer, sources=False)

    def _attach(self, sampler: Any, eval_store: Any, step_timer: bool | StepTimer, sources: bool) -> None:
        self.bucket_sampler, self.eval_store, self._stream_resumed = sampler, eval_store, False
        hf_checks.check_ranks(sampler, self.args)
        if isinstance(sampler, BucketSampler):
            self._check_sampler(sampler)
        self.train_loader: _TrainBatches | hf_collated.CollatedBatches | hf_stream.StreamBatches | None = None
        self._planned: tuple[int, np.ndarray] | None = None  # (epoch, label tokens of its steps)
        self.source_losses = SourceLosses(sampler.mixture.names) if sources else None
        self.add_callback(Checkpoints(self))
        self.step_timer = timer_of(step_timer, sampler)
        if self.step_timer is not None:
            self.add_callback(Calibrate(self))

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        hf_checks.check_composition(cls, BucketTrainer)

    def _check_sampler(self, sampler: BucketSampler) -> None:
        args = self.args
        accumulation = args.gradient_accumulation_steps
        if sampler.accumulation_given and sampler.accumulation != accumulation:
            raise PlanError(
                f"the sampler was built with accumulation={sampler.accumulation} but the Trainer accumulates "
                f"gradient_accumulation_steps={accumulation} micro-batches per step; build the sampler with "
                f"accumulation={accumulation}, or leave it unset"
            )
        sampler.bind_accumulation(accumulation)

    # -- training batches -----------------------------------------------------------------------------

    def get_train_dataloader(self) -> _TrainBatches | hf_collated.CollatedBatches | hf_stream.StreamBatches:
        """The Loader over the sampler's plan, as the ``DataLoader`` the Trainer expects (it sets the epoch);
        with ``use_data_collator=True``, the dataset's rows of the plan (or the Windows' batches of the stream)
        through the ``data_collator``."""
        batches: _TrainBatches | hf_collated.CollatedBatches | hf_stream.StreamBatches
        if isinstance(self.bucket_sampler, Windows):
            resumed, self._stream_resumed = self._stream_resumed, False  # a later train() starts at pass 0
            batches = hf_stream.StreamBatches(self.bucket_sampler, self.data_collator, self.args, resumed)
        elif self.use_data_collator:
            dataset, collator = self.train_dataset, self.data_collator
            batches = hf_collated.CollatedBatches(dataset, collator, self.bucket_sampler, self.args)
        else:
            assert self.token_store is not None  # the Loader path always has its store
            batches = _TrainBatches(Loader(self.token_store, self.bucket_sampler, **self._loader_options()))
        self.train_loader = batches
        return batches

    def _loader_options(self) -> dict[str, Any]:
        options = dict(self.loader_kwargs)
        if self.args.device.type == "cuda":
            options.setdefault("device", self.args.device)
        return options

    def get_batch_samples(self, epoch_iterator: Iterator, num_batches: int, device: Any) -> tuple[list, Any]:
        """The Trainer's micro-batches of one optimizer step, with the step's label tokens from the plan
        (all ranks, all micro-batches) as ``num_items_in_batch``; packed rows as the model takes them. With
        ``use_data_collator=True``, the Trainer's own: it counts the collated labels."""
        if self.use_data_collator:
            return super().get_batch_samples(epoch_iterator, num_batches, device)
        batches = []
        for _ in range(num_batches):
            try:
                batch = next(epoch_iterator)
            except StopIteration:
                break
            batch.pop("num_items_in_batch", None)
            batches.append(packed_inputs(batch) if "cu_seqlens" in batch else batch)
        counted = bool(batches) and "labels" in batches[0]
        counted = counted and (self.model_accepts_loss_kwargs or self.compute_loss_func is not None)
        if not (counted and self.args.average_tokens_across_devices):
            return super().get_batch_samples(iter(batches), len(batches), device)
        # What the Trainer's all-gather would sum, known from the plan without communication: the
        # position counts the micro-batches handed to the Trainer, so the last one names the step.
        position = self.bucket_sampler.position
        planned = self._planned_steps(position.epoch)[(position.step - 1) // self.bucket_sampler.accumulation]
        replicas = self.get_tp_size() * self.get_cp_size() * self.get_sp_size()
        return batches, torch.tensor(int(planned), device=device) / replicas

    def _planned_steps(self, epoch: int) -> np.ndarray:
        if self._planned is None or self._planned[0] != epoch:
            self._planned = (epoch, self.bucket_sampler.label_tokens(epoch, store=self.token_store))
        return self._planned[1]

    @classmethod
    def _extends_the_trainers_loss(cls) -> bool:
        """Whether the ``compute_loss`` after this class's is ``transformers.Trainer``'s own (TRL's builds
        no logits, and returning outputs makes it run the model a second time)."""
        after = cls.__mro__[cls.__mro__.index(BucketTrainer) + 1 :]
        return next(klass for klass in after if "compute_loss" in vars(klass)) is Trainer

    def compute_loss(self, model: Any, inputs: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        """The Trainer's loss; a mixture's ``source`` ids stay out of the model, and each source's token
        losses are taken from the logits it computed (logged as ``loss/<source>``). With ``step_timer``,
        a training micro-batch's forward pass is timed."""
        if self.step_timer is not None and model.training:
            with self.step_timer.time(inputs):
                return self._bucket_loss(model, inputs, *args, **kwargs)
        return self._bucket_loss(model, inputs, *args, **kwargs)

    def _bucket_loss(self, model: Any, inputs: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        source = inputs.pop("source", None)
        inputs.pop("num_items_per_source", None)
        if source is None or self.source_losses is None or not model.training:
            return super().compute_loss(model, inputs, *args, **kwargs)
        wanted = kwargs.pop("return_outputs", args[0] if args else False)
        loss, outputs = super().compute_loss(model, inputs, True, *args[1:], **kwargs)
        logits = outputs.get("logits") if isinstance(outputs, Mapping) else getattr(outputs, "logits", None)
        if logits is not None and "labels" in inputs:
            self.source_losses.add(logits.detach(), {**inputs, "source": source})
        return (loss, outputs) if wanted else loss

    def log(self, logs: dict[str, float], *args: Any, **kwargs: Any) -> None:
        """The Trainer's logs, with each source's mean token loss since the last log beside ``loss`` (a source
        none of whose tokens trained since is left out of that line)."""
        if self.source_losses is not None and "loss" in logs:
            # Every rank's tokens (the Trainer logs on every process, and reduces `loss` over them too).
            means = self.source_losses.means(all_ranks=True).items()
            logs = {**logs, **{f"loss/{name}": value for name, value in means if not math.isnan(value)}}
        super().log(logs, *args, **kwargs)

    # -- resume -----------------------------------------------------------------------------------------

    def train(self, resume_from_checkpoint: str | bool | None = None, *args: Any, **kwargs: Any) -> Any:
        """As ``Trainer.train``; a resume is checked against the checkpoint's dflash_batch state first, then
        continues the interrupted epoch exactly (see the module docs)."""
        if resume_from_checkpoint is True:
            resume_from_checkpoint = get_last_checkpoint(self.args.output_dir)  # the Trainer raises if none
        if isinstance(resume_from_checkpoint, (str, os.PathLike)) and isinstance(self.bucket_sampler, Windows):
            self._stream_resumed = hf_stream.resume(self.bucket_sampler, self.args, os.fspath(resume_from_checkpoint))
        elif isinstance(resume_from_checkpoint, (str, os.PathLike)):
            check_resume(os.fspath(resume_from_checkpoint), self.bucket_sampler, self.args.gradient_accumulation_steps)
        return super().train(resume_from_checkpoint, *args, **kwargs)

    # -- evaluation and prediction ----------------------------------------------------------------------

    def get_eval_dataloader(self, eval_dataset: Any = None) -> Loader | torch.utils.data.DataLoader:  # type: ignore[override]
        """A :class:`Loader` over the eval dataset: a ``shuffle=False`` plan (the same every time) with the
        training sampler's budget, this process's share of it, padded batches."""
        if self.use_data_collator:  # the Trainer's own, with its data_collator
            return super().get_eval_dataloader(eval_dataset)
        if eval_dataset is None and self.eval_dataset is None:
            raise ValueError("Trainer: evaluation requires an eval_dataset.")
        if isinstance(eval_dataset, str):
            eval_dataset = self.eval_dataset[eval_dataset]  # type: ignore[index]
        dataset = eval_dataset if eval_dataset is not None else self.eval_dataset
        if isinstance(dataset, dict):
            raise TypeError("BucketTrainer evaluates one eval_dataset at a time; pass its name to evaluate()")
        store = self.eval_store if (self.eval_store is not None and eval_dataset is None) else TokenStore(dataset)
        train = self.bucket_sampler
        budget: dict[str, Any]
        if train.max_tokens:
            budget = {"max_tokens": train.max_tokens}
        else:
            budget = {"batch_size": self.args.per_device_eval_batch_size}
        sampler = BucketSampler(
            store.lengths(),
            **budget,
            shuffle=False,
            world_size=train.world_size,
            rank=train.rank,
            oversize="skip" if train.schedule.config.oversize == "skip" else "error",
        )
        return Loader(store, sampler, **self._loader_options())

    def get_test_dataloader(self, test_dataset: Any) -> Any:
        """``predict``'s batches: the rows in order, ``per_device_eval_batch_size`` at a time, padded by
        :class:`~dflash_batch.Collator` (or the ``data_collator`` given), prepared by accelerate like the
        Trainer's own, so it returns one prediction per row, in the rows' order."""
        from torch.utils.data import DataLoader

        refuse_collections_and_streams(test_dataset)
        loader = DataLoader(
            test_dataset,
            batch_size=self.args.eval_batch_size,
            collate_fn=self.user_collator if self.user_collator is not None else Collator(),
            num_workers=self.args.dataloader_num_workers,
            pin_memory=self.args.dataloader_pin_memory,
            shuffle=False,
            drop_last=False,
        )
        return self.accelerator.prepare(loader)


class _TrainBatches(torch.utils.data.DataLoader):
    """The Loader as the ``DataLoader`` the Trainer takes: iterating it is iterating the Loader; its
    dataset, batch sampler and collate function are real, so the Trainer's ``skip_first_batches``
    builds a working loader over the sampler's index batches for a resumed epoch (that epoch is collated
    in the training thread; the next ones go through the Loader again)."""

    def __init__(self, loader: Loader) -> None:
        super().__init__(Rows(len(loader.store)), batch_sampler=loader.sampler, collate_fn=loader.collate)
        self.loader = loader

    def __iter__(self) -> Iterator[dict[str, Any]]:  # type: ignore[override]
        return iter(self.loader)

    def __len__(self) -> int:
        return len(self.loader)

    def set_epoch(self, epoch: int) -> None:
        self.loader.set_epoch(epoch)

    def state_dict(self) -> dict[str, Any]:
        return self.loader.state_dict()

    def position_at(self, global_step: int) -> dict[str, Any]:
        """The position a checkpoint records: the Loader's count excludes what it prefetched."""
        return self.loader.state_dict()
