"""Hugging Face ``transformers.Trainer`` with batches from a :class:`BucketSampler`.

    from dflash_batch.hf import BucketTrainer
    trainer = BucketTrainer(model=model, args=args, train_dataset=dataset, sampler=sampler, store=store)
    trainer.train()                                   # or train(resume_from_checkpoint=True)

The Trainer's own sampler and padding collator are bypassed: training batches are the sampler's plan,
collated in Rust by a :class:`Loader` (padded, or packed rows for a ``mode="packed"`` sampler), and
every rank of ``torchrun`` trains on its share of the one global plan. What the Trainer relies on holds:

* **Gradient accumulation**: the sampler's ``accumulation`` defaults to ``gradient_accumulation_steps``
  (its optimizer windows are the Trainer's steps); every micro-batch the Trainer pulls ahead stays
  intact; ``num_items_in_batch`` is the step's label tokens over all ranks and micro-batches, read from
  the plan (no all-gather), so a loss is the true token mean of the optimizer step.
* **One step count**: ``len()`` is the same for every epoch, as the Trainer and its LR schedule assume.
* **Exact resume**: every checkpoint folder gets ``dflash_batch_rank{R}.json`` (the Loader's state);
  ``train(resume_from_checkpoint=...)`` continues the interrupted epoch at the next batch — nothing
  replayed or skipped — after checking the data and settings match.
* **Evaluation** goes through the library too: the eval dataset's tokens, a deterministic
  ``shuffle=False`` plan with the training budget, padded by the Loader.
* **Packed rows** reach the model as it needs them (:func:`packed_inputs`).

Importing this module imports ``transformers``; ``dflash_batch`` itself never does.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from collections.abc import Iterator, Mapping
from typing import Any

from transformers import Trainer

from . import _trainer_checks
from ._core import PlanError
from .loader import Loader
from .reading import TokenStore
from .sampler import BucketSampler
from .sources import refuse_collections_and_streams

#: Name of the state file each rank writes into a checkpoint folder.
STATE_FILE = "dflash_batch_rank{rank}.json"


def packed_inputs(batch: dict[str, Any]) -> dict[str, Any]:
    """A packed Loader batch as a HF causal LM's ``forward`` takes it: ``input_ids``, ``labels`` and
    ``position_ids`` (restarting at 0 for every sample); ``use_cache=False``, since with a cache
    transformers does not derive the per-document attention mask from ``position_ids`` (the samples
    of a row would attend to each other); and ``cu_seq_lens_q/k`` and ``max_length_q/k`` for
    FlashAttention's varlen kernel (SDPA and eager attention ignore them). ``model(**packed_inputs(b))``
    computes each sample as if alone in its row."""
    inputs = {key: batch[key] for key in ("input_ids", "labels", "position_ids")}
    inputs["use_cache"] = False
    cu = batch["cu_seqlens"]
    inputs["cu_seq_lens_q"] = inputs["cu_seq_lens_k"] = cu
    inputs["max_length_q"] = inputs["max_length_k"] = batch["max_seqlen"]
    if "num_items_in_batch" in batch:
        inputs["num_items_in_batch"] = batch["num_items_in_batch"]
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
        store: the :class:`TokenStore` holding the token column of ``train_dataset``. ``None`` (default):
            read from ``train_dataset`` as the Trainer holds it after preparing it (TRL tokenizes text and
            turns its masks into ``labels`` first), with the loss mask the dataset and arguments say.
        loader_kwargs: passed to :class:`Loader` (``pad_id``, ``prefetch``, ``dtype``, ...). The
            device defaults to the Trainer's when it is a GPU, so batches are copied on a side stream.
        eval_store: the token store of ``eval_dataset`` (default: read from ``eval_dataset``).
        *args, **kwargs: as for ``Trainer``.
    """

    def __init__(
        self,
        *args: Any,
        sampler: BucketSampler | Mapping[str, Any],
        store: TokenStore | None = None,
        loader_kwargs: dict[str, Any] | None = None,
        eval_store: TokenStore | None = None,
        **kwargs: Any,
    ) -> None:
        if not isinstance(sampler, (BucketSampler, Mapping)):
            raise TypeError(
                "sampler must be a dflash_batch.BucketSampler or a dict of its keyword arguments, got "
                f"{type(sampler).__name__}"
            )
        if store is not None and not isinstance(store, TokenStore):
            raise TypeError(f"store must be a dflash_batch.TokenStore or None, got {type(store).__name__}")
        if eval_store is not None and not isinstance(eval_store, TokenStore):
            raise TypeError(f"eval_store must be a dflash_batch.TokenStore, got {type(eval_store).__name__}")
        user_collator = kwargs.get("data_collator", args[2] if len(args) > 2 else None)
        # Before the Trainer's own checks, which would say an iterable dataset lacks a length.
        refuse_collections_and_streams(kwargs.get("train_dataset", args[3] if len(args) > 3 else None))
        super().__init__(*args, **kwargs)
        if store is None:
            store = _trainer_checks.store_of(self.train_dataset, self.args)
        if isinstance(sampler, Mapping):
            options = {"accumulation": self.args.gradient_accumulation_steps, **sampler}
            sampler = BucketSampler(store.lengths(), **options)
        _trainer_checks.settings_overridden(self.args, {"data_collator": user_collator}, sampler)
        _trainer_checks.check_max_length(self.args, store.lengths())
        _trainer_checks.check_dataset(self.train_dataset, store, self.args)
        self.bucket_sampler, self.token_store, self.eval_store = sampler, store, eval_store
        self._loader_kwargs = dict(loader_kwargs or {})
        self._check_sampler(sampler)
        self._train_loader: Loader | None = None
        self._resume_from: str | None = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _trainer_checks.check_composition(cls, BucketTrainer)

    def _check_sampler(self, sampler: BucketSampler) -> None:
        args, accumulation = self.args, self.args.gradient_accumulation_steps
        if (sampler.world_size, sampler.rank) != (args.world_size, args.process_index):
            raise PlanError(
                f"the sampler plans for world_size={sampler.world_size}, rank={sampler.rank}, but this Trainer runs "
                f"process {args.process_index} of {args.world_size}; build the sampler after torch.distributed "
                "starts (or under torchrun, which sets WORLD_SIZE and RANK), or pass those values"
            )
        if sampler._accumulation_given and sampler.accumulation != accumulation:
            raise PlanError(
                f"the sampler was built with accumulation={sampler.accumulation} but the Trainer accumulates "
                f"gradient_accumulation_steps={accumulation} micro-batches per step; build the sampler with "
                f"accumulation={accumulation}, or leave it unset"
            )
        sampler._reconfigure(accumulation=accumulation)

    # -- training batches -----------------------------------------------------------------------------

    def get_train_dataloader(self) -> Loader:
        """The :class:`Loader` over the sampler's plan (the Trainer sets its epoch)."""
        self._train_loader = Loader(self.token_store, self.bucket_sampler, **self._loader_options(train=True))
        return self._train_loader

    def _loader_options(self, *, train: bool) -> dict[str, Any]:
        options = dict(self._loader_kwargs)
        if self.args.device.type == "cuda":
            options.setdefault("device", self.args.device)
        if train:
            options["num_items_in_batch"] = True
        return options

    def get_batch_samples(self, epoch_iterator: Iterator, num_batches: int, device: Any) -> tuple[list, Any]:
        """The Trainer's micro-batches of one optimizer step, with the step's label tokens from the plan
        (all ranks, all micro-batches) as ``num_items_in_batch``; packed rows as the model takes them."""
        import torch

        batches, planned = [], None
        for _ in range(num_batches):
            try:
                batch = next(epoch_iterator)
            except StopIteration:
                break
            planned = batch.pop("num_items_in_batch", planned)
            batches.append(packed_inputs(batch) if "cu_seqlens" in batch else batch)
        counted = batches and "labels" in batches[0] and (self.model_accepts_loss_kwargs or self.compute_loss_func)
        if not counted:
            return batches, None
        if planned is None or not self.args.average_tokens_across_devices:
            return batches, self._get_num_items_in_batch(batches, device)  # this rank's own count
        # What the Trainer's all-gather would sum, known from the plan without communication.
        replicas = self.get_tp_size() * self.get_cp_size() * self.get_sp_size()
        return batches, torch.tensor(planned, device=device) / replicas

    # -- checkpoints and resume -------------------------------------------------------------------------

    def train(self, resume_from_checkpoint: str | bool | None = None, *args: Any, **kwargs: Any) -> Any:
        """As ``Trainer.train``; resuming continues the interrupted epoch exactly (see the module docs)."""
        if resume_from_checkpoint is True:
            from transformers.trainer_utils import get_last_checkpoint

            resume_from_checkpoint = get_last_checkpoint(self.args.output_dir)
        self._resume_from = resume_from_checkpoint if isinstance(resume_from_checkpoint, str) else None
        return super().train(resume_from_checkpoint, *args, **kwargs)

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        super()._save_checkpoint(model, trial)
        if self._train_loader is None:
            return
        from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

        folder = os.path.join(self._get_output_dir(trial=trial), f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, STATE_FILE.format(rank=self.bucket_sampler.rank))
        with open(path + ".tmp", "w") as f:
            json.dump(self._train_loader.state_dict(), f)
        os.replace(path + ".tmp", path)

    def _run_epoch(self, *args: Any, **kwargs: Any) -> Any:
        # The Trainer fast-forwards a resumed epoch with accelerate's `skip_first_batches`, which
        # rebuilds a torch DataLoader from `.dataset`; a Loader resumes from the plan instead.
        module = sys.modules[Trainer.__module__]
        original = module.skip_first_batches
        module.skip_first_batches = functools.partial(self._skip_first_batches, original)
        try:
            return super()._run_epoch(*args, **kwargs)
        finally:
            module.skip_first_batches = original

    def _skip_first_batches(self, original: Any, dataloader: Any, num_batches: int = 0) -> Any:
        if not isinstance(dataloader, Loader):
            return original(dataloader, num_batches)
        return _Resumed(dataloader, num_batches, self._saved_state())

    def _saved_state(self) -> dict[str, Any] | None:
        if self._resume_from is None:
            return None
        path = os.path.join(self._resume_from, STATE_FILE.format(rank=self.bucket_sampler.rank))
        if not os.path.exists(path):
            return None
        with open(path) as f:
            try:
                return json.load(f)
            except json.JSONDecodeError as error:
                raise PlanError(
                    f"{path} is not a dflash_batch state ({error}); delete it to resume from the plan alone"
                ) from None

    # -- evaluation -------------------------------------------------------------------------------------

    def get_eval_dataloader(self, eval_dataset: Any = None) -> Loader:
        """A :class:`Loader` over the eval dataset: a ``shuffle=False`` plan (the same every time) with the
        training sampler's budget, this process's share of it, padded batches."""
        if eval_dataset is None and self.eval_dataset is None:
            raise ValueError("Trainer: evaluation requires an eval_dataset.")
        if isinstance(eval_dataset, str):
            eval_dataset = self.eval_dataset[eval_dataset]
        dataset = eval_dataset if eval_dataset is not None else self.eval_dataset
        if isinstance(dataset, dict):
            raise TypeError("BucketTrainer evaluates one eval_dataset at a time; pass its name to evaluate()")
        store = self.eval_store if (self.eval_store is not None and eval_dataset is None) else TokenStore(dataset)
        train = self.bucket_sampler
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
            oversize="skip" if train._config.oversize == "skip" else "error",
        )
        options = self._loader_options(train=False)
        return Loader(store, sampler, **options)


class _Resumed:
    """The Trainer's resumed epoch: the Loader set to its epoch, then started at ``steps`` (checked
    against the state saved in the checkpoint, when there is one)."""

    def __init__(self, loader: Loader, steps: int, state: dict[str, Any] | None) -> None:
        self.loader, self.steps, self.state = loader, steps, state

    def set_epoch(self, epoch: int) -> None:
        state = self.state
        if state is not None:
            if (state.get("epoch"), state.get("step")) != (epoch, self.steps):
                raise PlanError(
                    f"the checkpoint's dflash_batch state is at step {state.get('step')} of epoch "
                    f"{state.get('epoch')}, "
                    f"but the Trainer resumes at step {self.steps} of epoch {epoch}: the checkpoint was written with "
                    "another gradient_accumulation_steps, sampler or number of processes; resume with the settings "
                    "it was trained with"
                )
            self.loader.load_state_dict(state)  # checks the data and settings match
        else:
            self.loader.set_epoch(epoch)
            self.loader.skip(self.steps)

    def __len__(self) -> int:
        """The steps left in the resumed epoch, as accelerate's ``skip_first_batches`` counts them."""
        return self.loader.sampler.plan().steps - self.steps

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.loader)
