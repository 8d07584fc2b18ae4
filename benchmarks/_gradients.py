"""The step-gradient estimator of ``step_gradients.py``: how far an optimizer step's gradient lies from the
full-data gradient, against steps of independent samples holding the same real tokens.

A document's summed-token gradient ``s_i`` (the gradient of the sum of its tokens' losses) is computed once
per checkpoint; every step's gradient is then a weighted sum of them. With ``n_i`` the document's predicted
tokens, ``G = Σ s_i / Σ n_i`` the full-data gradient and ``c_i = s_i − n_i·G`` (so ``Σ c_i = 0``), a step of
documents ``S`` holding ``T = Σ_S n_i`` tokens has

    g_S − G = Σ_S c_i / T,        ‖g_S − G‖² = 1_Sᵀ C 1_S / T²,        C = c cᵀ (documents × documents),

so the Gram matrix ``C`` answers every step of every strategy exactly, without the large cancellation of
``‖g‖² − 2g·G + ‖G‖²``. ``R`` is the mean of that error over a strategy's steps divided by its mean over
steps of documents drawn at random holding the same tokens (each step matched by its own ``T``): 1 is a
shuffle's quality, above 1 a step whose documents are alike (sorted, or one length bucket), below 1 a step
whose composition is more representative than chance (stratified sampling)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np


def doc_gradients(model, docs: Sequence[np.ndarray], progress: Callable[[int], None] | None = None) -> np.ndarray:
    """``s_i`` of every document as the rows of a (documents × parameters) float32 matrix: one forward and
    backward per document, its loss the sum over its predicted tokens."""
    import torch

    params = [p for p in model.parameters() if p.requires_grad]
    width = sum(p.numel() for p in params)
    out = np.empty((len(docs), width), dtype=np.float32)
    model.eval()  # no dropout; the gradient is the training loss's
    for i, doc in enumerate(docs):
        ids = torch.as_tensor(np.asarray(doc, dtype=np.int64))[None]
        logits = model(input_ids=ids, use_cache=False).logits[0, :-1]
        loss = torch.nn.functional.cross_entropy(logits.float(), ids[0, 1:], reduction="sum")
        grads = torch.autograd.grad(loss, params)
        out[i] = torch.cat([g.reshape(-1) for g in grads]).to(torch.float32).numpy()
        if progress is not None:
            progress(i)
    model.train()
    return out


def centered_gram(gradients: np.ndarray, tokens: np.ndarray, chunk: int = 512) -> tuple[np.ndarray, np.ndarray]:
    """``(C, G)``: the Gram matrix of the centered gradients ``c_i = s_i − n_i·G`` (float64, accumulated from
    float32 products in blocks) and the full-data gradient ``G``. ``gradients`` is centered in place."""
    tokens = np.asarray(tokens, dtype=np.float64)
    full = gradients.sum(axis=0, dtype=np.float64) / tokens.sum()
    for a in range(0, len(gradients), chunk):
        gradients[a : a + chunk] -= (tokens[a : a + chunk, None] * full[None]).astype(np.float32)
    n = len(gradients)
    gram = np.empty((n, n), dtype=np.float64)
    for a in range(0, n, chunk):
        for b in range(a, n, chunk):
            block = gradients[a : a + chunk] @ gradients[b : b + chunk].T
            gram[a : a + chunk, b : b + chunk] = block
            gram[b : b + chunk, a : a + chunk] = block.T
    return gram, full


def step_error(gram: np.ndarray, tokens: np.ndarray, members: np.ndarray) -> float:
    """``‖g_S − G‖²`` of the step of documents ``members`` (see the module docs)."""
    members = np.asarray(members, dtype=np.int64)
    total = float(tokens[members].sum())
    return float(gram[np.ix_(members, members)].sum()) / (total * total)


def iid_step(tokens: np.ndarray, target: float, rng: np.random.Generator) -> np.ndarray:
    """Documents drawn at random without replacement until their tokens are nearest ``target``."""
    order = rng.permutation(len(tokens))
    cumulative = np.cumsum(tokens[order])
    k = int(np.searchsorted(cumulative, target))
    if k < len(order) and (k == 0 or abs(cumulative[k] - target) < abs(cumulative[k - 1] - target)):
        k += 1
    return order[: max(1, k)]


def errors(
    gram: np.ndarray, tokens: np.ndarray, steps: Sequence[np.ndarray], rng: np.random.Generator, draws: int = 8
) -> tuple[np.ndarray, np.ndarray]:
    """Each step's error, and the mean error of ``draws`` random steps holding the same tokens."""
    own = np.array([step_error(gram, tokens, s) for s in steps])
    iid = np.array(
        [
            np.mean([step_error(gram, tokens, iid_step(tokens, float(tokens[s].sum()), rng)) for _ in range(draws)])
            for s in steps
        ]
    )
    return own, iid


def ratio(own: np.ndarray, iid: np.ndarray, blocks: np.ndarray, rng: np.random.Generator, resamples: int = 2000):
    """``R = mean(own) / mean(iid)`` and its 95% bootstrap interval, resampling whole ``blocks`` (the epoch
    each step belongs to: the steps of an epoch partition it, so they are not independent)."""
    value = float(own.mean() / iid.mean())
    labels = np.unique(blocks)
    if len(labels) < 2:
        return value, (value, value)
    members = [np.flatnonzero(blocks == b) for b in labels]
    sums = np.array([[own[m].sum(), iid[m].sum()] for m in members])
    picks = rng.integers(0, len(labels), size=(resamples, len(labels)))
    chosen = sums[picks].sum(axis=1)
    values = chosen[:, 0] / chosen[:, 1]
    low, high = np.percentile(values, [2.5, 97.5])
    return value, (float(low), float(high))
