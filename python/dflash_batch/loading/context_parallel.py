"""Context parallelism: one packed row split over ``cp`` ranks (ring or Ulysses attention).

A sampler with ``mode="packed", context_parallel=cp`` pads every sample to a multiple of ``2·cp`` (and of
``pad_to_multiple_of``), so each document splits into ``2·cp`` equal chunks. Its batches carry
``cu_seqlens`` (the real lengths summed, Megatron THD's ``cu_seqlens``) and ``cu_seqlens_padded`` (where
each document starts in the row). :func:`context_parallel_shard` cuts a batch into what one CP rank feeds
its model:

* ``layout="zigzag"`` (ring-flash-attn's zigzag varlen, Megatron THD): rank ``i`` takes chunks ``i`` and
  ``2·cp − 1 − i`` of every document, so each rank does the same causal attention work. The shard's own
  ``cu_seqlens_padded`` is the row's divided by ``cp``: what the zigzag kernels take.
* ``layout="contiguous"`` (llama3-style, a plain split): rank ``i`` takes row tokens
  ``[i·C/cp, (i+1)·C/cp)``; documents keep their ``cu_seqlens_padded`` in row coordinates (the kernels of
  this layout all-gather keys and values and need the whole row's boundaries). Its attention work is
  uneven: ``plan.stats()["cp_spread_contiguous"]`` says by how much.

The row's tail past the last document (``cu_seqlens_padded[-1]`` to ``C``, a multiple of ``2·cp`` too) is
split like one more document, so every shard holds ``C / cp`` tokens; its labels are ``label_pad_id``.
Only numpy runs here; torch tensors are indexed with a tensor made from the numpy index."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..base.errors import invalid_setting

LAYOUTS = ("zigzag", "contiguous")
# The arrays of a packed batch that hold one entry per token of the row ([1, C]).
TOKEN_KEYS = ("input_ids", "labels", "position_ids", "seq_idx")


def padded_cu_seqlens(cu_seqlens: Any, multiple: int) -> Any:
    """``cu_seqlens_padded``: where each document starts in a row whose documents are padded to
    ``multiple`` — the real lengths (``diff(cu_seqlens)``) rounded up and summed. Numpy or torch in, the
    same out (int32, on the same device: no host sync)."""
    lengths = cu_seqlens[1:] - cu_seqlens[:-1]
    padded = (lengths + (multiple - 1)) // multiple * multiple
    out = cu_seqlens.clone() if hasattr(cu_seqlens, "clone") else cu_seqlens.copy()
    out[0] = 0
    if len(padded):
        out[1:] = padded.cumsum(0)
    return out


def shard_index(cu_seqlens_padded: Any, capacity: int, cp: int, rank: int, layout: str = "zigzag") -> np.ndarray:
    """The row positions CP rank ``rank`` of ``cp`` takes, in the order it feeds them (int64, ``capacity /
    cp`` of them). ``cu_seqlens_padded``: the batch's (numpy or a CPU tensor). Raises ``ValueError`` when
    the row cannot split as asked: a document or ``capacity`` not a multiple of ``2·cp``, or a rank or
    layout out of range."""
    _check(cp, rank, layout, capacity)
    if layout == "contiguous":
        share = capacity // cp
        return np.arange(rank * share, (rank + 1) * share, dtype=np.int64)
    bounds = np.asarray(cu_seqlens_padded, dtype=np.int64)
    if bounds.ndim != 1 or len(bounds) < 1 or bounds[0] != 0 or bounds[-1] > capacity or np.any(np.diff(bounds) < 0):
        raise ValueError(
            f"cu_seqlens_padded must rise from 0 to at most the row's {capacity} tokens; pass the batch's own"
        )
    # The tail past the last document splits like one more document.
    if bounds[-1] < capacity:
        bounds = np.append(bounds, capacity)
    starts, lengths = bounds[:-1], np.diff(bounds)
    halves = 2 * cp
    if np.any(lengths % halves):
        bad = int(np.flatnonzero(lengths % halves)[0])
        raise ValueError(
            f"document {bad} takes {int(lengths[bad])} tokens, not a multiple of 2·cp = {halves}: zigzag needs every "
            f"document padded to it; plan with context_parallel={cp} (or a multiple of it)"
        )
    chunk = lengths // halves
    early, late = starts + rank * chunk, starts + (halves - 1 - rank) * chunk
    # Per document: its early chunk, then its late one.
    firsts = np.stack([early, late], axis=1).reshape(-1)
    sizes = np.repeat(chunk, 2)
    return _ranges(firsts, sizes)


def context_parallel_shard(
    batch: dict[str, Any], *, cp: int, rank: int, layout: str = "zigzag", label_pad_id: int = -100
) -> dict[str, Any]:
    """What CP rank ``rank`` of ``cp`` feeds its model from the packed ``batch`` (a Loader's, or
    :func:`dflash_batch.collate_packed`'s with ``piece_multiple``): each ``[1, C]`` array cut to its
    ``[1, C / cp]`` shard (see the module docs for the layouts), ``shift_labels`` — what each token of the
    shard predicts: the row's labels shifted left by one before the cut (``label_pad_id`` at the row's
    end), since a shard's next token may lie on another rank; pass it to the loss (transformers' models
    take ``shift_labels=``) instead of shifting ``labels`` again — ``cu_seqlens_padded`` in the shard's
    coordinates for zigzag (the row's ``// cp``) and as the row's for contiguous, ``max_seqlen_padded``
    for that; other keys unchanged. Reassembling the ``cp`` shards by :func:`shard_index` gives the row
    back exactly. Raises ``KeyError`` for a batch without ``cu_seqlens_padded`` (a sampler without
    ``context_parallel``) and ``ValueError`` as :func:`shard_index`."""
    if "cu_seqlens_padded" not in batch:
        raise KeyError(
            "cu_seqlens_padded: the batch is not of a context-parallel plan; build the sampler with "
            "mode='packed', context_parallel=cp"
        )
    capacity = int(batch["input_ids"].shape[-1])
    cu_padded = batch["cu_seqlens_padded"]
    host = cu_padded.cpu().numpy() if hasattr(cu_padded, "cpu") else np.asarray(cu_padded)
    index = shard_index(host, capacity, cp, rank, layout)
    out = dict(batch)
    if "labels" in batch:
        out["shift_labels"] = _shifted(batch["labels"], label_pad_id)
    for key in (*TOKEN_KEYS, "shift_labels"):
        if key in out:
            array = out[key]
            out[key] = array[:, _like(index, array)]
    if layout == "zigzag":
        out["cu_seqlens_padded"] = cu_padded // cp
        out["max_seqlen_padded"] = int(batch.get("max_seqlen_padded", capacity)) // cp
    return out


def _shifted(labels: Any, label_pad_id: int) -> Any:
    """``labels`` moved left by one token, ``label_pad_id`` last (numpy or torch)."""
    if isinstance(labels, np.ndarray):
        return np.concatenate([labels[:, 1:], np.full((labels.shape[0], 1), label_pad_id, labels.dtype)], axis=1)
    import torch

    return torch.cat([labels[:, 1:], torch.full_like(labels[:, :1], label_pad_id)], dim=1)


def _like(index: np.ndarray, array: Any) -> Any:
    """``index`` as ``array`` indexes: numpy, or a torch tensor on ``array``'s device."""
    if isinstance(array, np.ndarray):
        return index
    import torch

    return torch.from_numpy(index).to(array.device)


def _ranges(firsts: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """``concat(arange(f, f + s) for f, s in zip(firsts, sizes))`` without a Python loop."""
    total = int(sizes.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    keep = sizes > 0
    firsts, sizes = firsts[keep], sizes[keep]
    steps = np.ones(total, dtype=np.int64)
    ends = np.cumsum(sizes)
    steps[0] = firsts[0]
    # At each range's first position, jump from the previous range's last to this range's first.
    steps[ends[:-1]] = firsts[1:] - (firsts[:-1] + sizes[:-1] - 1)
    return np.cumsum(steps)


def _check(cp: Any, rank: Any, layout: Any, capacity: int) -> None:
    if isinstance(cp, bool) or not isinstance(cp, (int, np.integer)) or cp < 1:
        raise invalid_setting("cp", f"cp={cp!r} is invalid; pass the context-parallel degree (an int ≥ 1)")
    if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or not 0 <= rank < cp:
        raise invalid_setting("rank", f"rank={rank!r} is invalid for cp={cp}; use 0 <= rank < cp (the CP rank)")
    if layout not in LAYOUTS:
        raise invalid_setting("layout", f"layout={layout!r} is invalid; use 'zigzag' or 'contiguous'")
    if capacity % (2 * cp if layout == "zigzag" else cp):
        raise ValueError(
            f"a row of {capacity} tokens does not split into {cp} equal shards ({layout}); plan with "
            f"max_tokens a multiple of 2·cp = {2 * cp}"
        )
