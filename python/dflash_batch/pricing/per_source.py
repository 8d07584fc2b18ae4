"""``SourceLosses``: each source's mean token loss over the micro-batches trained since it was last read,
from the logits the model computed anyway — the per-source loss curves of a :class:`Mixture`, without an
extra pass. :class:`~dflash_batch.hf.BucketTrainer` logs them as ``loss/<source>``; a torch loop adds
each micro-batch and reads the means when it logs::

    losses = db.SourceLosses(sampler.mixture.names)
    for batch in loader:
        logits = model(batch["input_ids"]).logits
        ...
        losses.add(logits, batch)           # batch["labels"] and batch["source"] (a Loader batch)
        if step % 100 == 0:
            print(losses.means())           # {"chat": 2.31, "code": 1.87, ...}; then starts over

A token's loss is the cross-entropy of predicting it from the ones before (labels shifted by one, as a
causal LM's loss is), counted where its label is not ``-100``; a token belongs to the source of its row
(padded batches) or of its packed sample (``cu_seqlens``). Under several processes ``means()`` reads what
this process trained; ``means(all_ranks=True)`` sums every rank's losses and tokens first (a collective:
every rank calls it at the same point, as the HF Trainer's logging does), so each source's mean is over
every token of it that all ranks trained — what :class:`~dflash_batch.hf.BucketTrainer` logs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


class SourceLosses:
    """Summed token losses and label counts per source (see the module docs).

    Args:
        names: the sources, in the mixture's order (``sampler.mixture.names``).
    """

    def __init__(self, names: Sequence[str]) -> None:
        import torch

        self.names = [str(name) for name in names]
        self._sums = torch.zeros(len(self.names), dtype=torch.float64)
        self._tokens = torch.zeros(len(self.names), dtype=torch.int64)

    def add(self, logits: Any, batch: Mapping[str, Any]) -> None:
        """Adds one micro-batch: ``logits`` (``[rows, L, vocab]``) computed from ``batch``, which holds
        ``labels`` and ``source`` (and ``cu_seqlens`` or ``cu_seq_lens_q`` when packed)."""
        import torch

        with torch.no_grad():
            labels = batch["labels"]
            if logits.shape[:2] != labels.shape:
                raise ValueError(
                    f"logits of shape {tuple(logits.shape)} do not match labels of shape {tuple(labels.shape)}"
                )
            target = labels[:, 1:]
            losses = torch.nn.functional.cross_entropy(
                logits[:, :-1].flatten(0, 1).float(), target.flatten(), ignore_index=-100, reduction="none"
            ).view(target.shape)
            counted = target != -100
            source = batch["source"].to(labels.device)
            # Where each sample lies in the row: padded for context parallelism, else its real span.
            cu = batch.get("cu_seqlens_padded", batch.get("cu_seqlens", batch.get("cu_seq_lens_q")))
            if cu is not None:  # packed: token t + 1 belongs to the sample whose span holds it
                positions = torch.arange(1, labels.shape[1], device=labels.device)
                sample = torch.searchsorted(cu.to(labels.device).long(), positions, right=True) - 1
                owner = source[sample.clamp(0, len(source) - 1)].expand_as(target)
            else:
                owner = source.view(-1, 1).expand_as(target)
            owner = owner[counted].cpu()
            self._sums.index_add_(0, owner, losses[counted].double().cpu())
            self._tokens.index_add_(0, owner, torch.ones_like(owner))

    def means(self, reset: bool = True, *, all_ranks: bool = False) -> dict[str, float]:
        """Each source's mean token loss since the last reset (``nan`` for a source with no token), then
        starts over unless ``reset=False``. ``all_ranks``: over every rank's tokens, summed across the
        ``torch.distributed`` group (a collective; this process's alone without a group)."""
        import torch

        sums, tokens = self._sums, self._tokens
        if all_ranks:
            sums, tokens = _summed_over_ranks(sums, tokens)
        means = (sums / tokens.clamp(min=1)).tolist()
        out = {name: (m if t else float("nan")) for name, m, t in zip(self.names, means, tokens, strict=True)}
        if reset:
            self._sums, self._tokens = torch.zeros_like(self._sums), torch.zeros_like(self._tokens)
        return out

    def __repr__(self) -> str:
        return f"SourceLosses({self.names})"


def _summed_over_ranks(sums: Any, tokens: Any) -> tuple[Any, Any]:
    """``sums`` and ``tokens`` summed over the default process group (unchanged without one): one
    ``all_reduce`` of both, on the device the backend reduces on (NCCL: the current CUDA device)."""
    from ..base.ranks import process_group_size

    if not process_group_size():
        return sums, tokens
    import torch
    import torch.distributed as dist

    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else sums.device
    both = torch.cat([sums, tokens.double()]).to(device)
    dist.all_reduce(both)
    both = both.cpu()
    n = len(sums)
    return both[:n], both[n:].round().long()
