//! How well a plan mixes lengths, and how evenly it loads ranks: the figures that tell whether the
//! optimizer sees the whole dataset in every accumulation window and whether any rank waits.
//!
//! * **`window_tv`**: the epoch's batches, in training order across all ranks, are cut into windows of
//!   `G = accumulation × world_size` consecutive batches (an incomplete last window is left out). The
//!   length axis is cut into 10 token-weighted deciles. For each window, the total-variation distance
//!   `½ Σ_d |p_d − q_d|` between the window's share of tokens per decile `p` and the whole epoch's `q`
//!   (≈ 0.1 each); `window_tv` is the mean over windows. 0: every window looks like the dataset; sorted
//!   batches: ≈ 0.9. A length value is never split between deciles: it belongs to the decile where the
//!   middle of its token mass falls, and `q` is measured with the same assignment, so ties at a decile
//!   edge cannot bias the distance.
//!   `window_tv_tail` is the same over the last tenth of the windows; `length_gap` (and its tail) the
//!   mean over windows of how far their mean sample length is from the epoch's, relatively: the
//!   figure that best predicts a step's gradient error (`benchmarks/step_gradients.py`).
//! * **churn** (between two plans): the share of sample pairs sharing a batch in the first plan that
//!   share one again in the second.
//! * **synchronous efficiency**: useful cost over the time ranks take when every step (or every
//!   optimizer step) waits for its slowest rank: `Σ cost / (world_size × Σ_steps max_rank cost)`.
//!   Padding efficiency says how full the batches are; this says how much of the GPUs' time the
//!   ranks spend waiting on each other, which on many GPUs costs more.
//! * **rank imbalance**: per step, the most over the least cost among the step's `world_size`
//!   batches (padded tokens, or the configuration's cost model `a·L + b·L²` per row; a packed row
//!   costs `Σ a·l + b·l²` over its samples); reported as its median, 99th percentile and maximum.

use crate::lengths::{with_lengths, Length};

/// Deciles of the token mass over lengths. Decile boundaries rise with length, so nine thresholds
/// describe them whatever the longest length: a table with an entry per length up to the longest
/// took 9 bytes per possible length, 36 GB (an abort) for a length near u32::MAX.
#[derive(Debug, Clone)]
pub struct Deciles {
    /// `first[d - 1]`: the shortest length in decile `d` or above, for `d` in 1..=9 (`u64::MAX`
    /// when no length is).
    first: [u64; 9],
    /// The whole epoch's share of tokens per decile (the `q` of the module docs).
    pub share: [f64; 10],
}

/// Longest length up to which the token mass is always counted in a table (8 bytes a length, 32 MB
/// here); past it only while the table is no larger than a sorted copy of the lengths (4 bytes a
/// sample), which counts it otherwise.
const TABLE_MAX: usize = 1 << 22;

impl Deciles {
    /// Deciles of `lengths` (every sample counted; samples of length 0 carry no tokens).
    pub fn new<L: Length>(lengths: &[L]) -> Self {
        let longest = lengths.iter().map(|&l| l.into()).max().unwrap_or(0) as usize;
        // The token mass of every length present, shortest first.
        let masses: Vec<(u32, u64)> = if longest <= TABLE_MAX.max(lengths.len() / 2) {
            let mut tokens_at = vec![0u64; longest + 1];
            for &l in lengths {
                let l: u32 = l.into();
                tokens_at[l as usize] += u64::from(l);
            }
            // Lengths index a table of at most `longest + 1` ≤ u32::MAX + 1 entries.
            #[allow(clippy::cast_possible_truncation)]
            tokens_at
                .iter()
                .enumerate()
                .filter(|&(_, &t)| t > 0)
                .map(|(l, &t)| (l as u32, t))
                .collect()
        } else {
            let mut sorted: Vec<u32> = lengths.iter().map(|&l| l.into()).collect();
            sorted.sort_unstable();
            let mut masses: Vec<(u32, u64)> = Vec::new();
            for l in sorted.into_iter().filter(|&l| l > 0) {
                match masses.last_mut() {
                    Some((last, tokens)) if *last == l => *tokens += u64::from(l),
                    _ => masses.push((l, u64::from(l))),
                }
            }
            masses
        };
        let total: u64 = masses.iter().map(|&(_, t)| t).sum();
        let (mut below, mut mass, mut first) = (0u64, [0u64; 10], [u64::MAX; 9]);
        for (l, tokens) in masses {
            // The middle of this length's token mass, as a fraction of all tokens, picks its decile.
            let middle = 2 * u128::from(below) + u128::from(tokens);
            let decile = (10 * middle / (2 * u128::from(total))).min(9);
            // decile ≤ 9 by the `min`.
            #[allow(clippy::cast_possible_truncation)]
            let decile = decile as usize;
            for threshold in &mut first[..decile] {
                *threshold = (*threshold).min(u64::from(l));
            }
            mass[decile] += tokens;
            below += tokens;
        }
        Self {
            first,
            share: mass.map(|m| fraction(m, total)),
        }
    }

    /// Deciles of a planner's stored lengths.
    pub fn of_lengths(lengths: &crate::lengths::Lengths) -> Self {
        with_lengths!(lengths, v => Self::new(v))
    }

    /// Bytes [`Deciles::new`] allocates at its peak for `lengths`: the table or the sorted copy,
    /// and a mass for each distinct length (16 bytes, in a vector that grows by doubling).
    pub fn bytes(lengths: &crate::lengths::Lengths) -> u64 {
        fn longest<L: Length>(v: &[L]) -> u64 {
            v.iter()
                .map(|&l| u64::from(Into::<u32>::into(l)))
                .max()
                .unwrap_or(0)
        }
        let n = lengths.len() as u64;
        let longest = with_lengths!(lengths, v => longest(v));
        let table = longest <= (TABLE_MAX as u64).max(n / 2);
        let distinct = n.min(longest + 1);
        if table {
            (longest + 1) * 8 + distinct * 48
        } else {
            n * 4 + distinct * 48
        }
    }

    /// The decile of a length: that of the longest length seen at or below it (lengths past the
    /// longest seen count in its decile). Counting the thresholds passed has no branch to mispredict.
    #[inline]
    pub fn of(&self, length: u32) -> usize {
        let length = u64::from(length);
        self.first.iter().filter(|&&t| t <= length).count()
    }
}

/// The rows of batches `first..last` of a CSR plan.
fn rows<'a>(offsets: &[u32], indices: &'a [u32], first: usize, last: usize) -> &'a [u32] {
    // Offsets index `indices`, which lives in memory: they fit in usize.
    #[allow(clippy::cast_possible_truncation)]
    let range = offsets[first] as usize..offsets[last] as usize;
    &indices[range]
}

fn fraction(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        return 0.0;
    }
    // Token counts stay far below 2^53; these are reports, not exact values.
    #[allow(clippy::cast_precision_loss)]
    let ratio = part as f64 / whole as f64;
    ratio
}

/// The mean total-variation distance of windows of `window` consecutive batches from `deciles.share`
/// (see the module docs), or `None` when the plan has no complete window.
pub fn window_tv<L: Length>(
    offsets: &[u32],
    indices: &[u32],
    lengths: &[L],
    deciles: &Deciles,
    window: usize,
) -> Option<f64> {
    mixing(offsets, indices, lengths, deciles, window).map(|m| m.window_tv)
}

/// How well every optimizer window of a plan mirrors the epoch (see the module docs): over all its
/// complete windows, and over the last tenth of them on their own (the tail of an epoch, where a
/// planner that runs out of some lengths would show it).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Mixing {
    /// Mean over windows of the total-variation distance of their token share per decile.
    pub window_tv: f64,
    /// The same over the last tenth of the windows (at least one).
    pub window_tv_tail: f64,
    /// Mean over windows of `|mean length of the window's samples / the epoch's − 1|`: of the
    /// per-step figures measured against step gradients (`benchmarks/step_gradients.py`), the one
    /// that best predicts how far a step's gradient lies from the full-data one.
    pub length_gap: f64,
    /// The same over the last tenth of the windows.
    pub length_gap_tail: f64,
}

/// [`Mixing`] of a plan over windows of `window` batches; `None` without a complete window.
pub fn mixing<L: Length>(
    offsets: &[u32],
    indices: &[u32],
    lengths: &[L],
    deciles: &Deciles,
    window: usize,
) -> Option<Mixing> {
    let batches = offsets.len().saturating_sub(1);
    let windows = batches.checked_div(window)?;
    if windows == 0 {
        return None;
    }
    let length = |row: u32| -> u32 { lengths[row as usize].into() };
    let planned = rows(offsets, indices, 0, windows * window);
    let epoch_mean = mean_length(planned, length);
    let (mut tv, mut gap) = (Vec::with_capacity(windows), Vec::with_capacity(windows));
    for w in 0..windows {
        let members = rows(offsets, indices, w * window, (w + 1) * window);
        let mut mass = [0u64; 10];
        for &row in members {
            mass[deciles.of(length(row))] += u64::from(length(row));
        }
        let total: u64 = mass.iter().sum();
        let distance: f64 = mass
            .iter()
            .zip(&deciles.share)
            .map(|(&m, &q)| (fraction(m, total) - q).abs())
            .sum();
        tv.push(distance / 2.0);
        gap.push(if epoch_mean > 0.0 {
            (mean_length(members, length) / epoch_mean - 1.0).abs()
        } else {
            0.0
        });
    }
    let tail = windows - windows.div_ceil(10);
    Some(Mixing {
        window_tv: mean(&tv),
        window_tv_tail: mean(&tv[tail..]),
        length_gap: mean(&gap),
        length_gap_tail: mean(&gap[tail..]),
    })
}

fn mean_length(members: &[u32], length: impl Fn(u32) -> u32) -> f64 {
    let total: u64 = members.iter().map(|&r| u64::from(length(r))).sum();
    // Counts and token totals stay far below 2^53.
    #[allow(clippy::cast_precision_loss)]
    let mean = if members.is_empty() {
        0.0
    } else {
        total as f64 / members.len() as f64
    };
    mean
}

fn mean(values: &[f64]) -> f64 {
    // Window counts stay far below 2^53.
    #[allow(clippy::cast_precision_loss)]
    let mean = values.iter().sum::<f64>() / values.len().max(1) as f64;
    mean
}

/// Per-step rank imbalance (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Imbalance {
    /// Median over steps of max/min padded tokens among the step's batches.
    pub p50: f64,
    /// 99th percentile over steps.
    pub p99: f64,
    /// Worst step.
    pub max: f64,
}

/// The cost of every batch of a CSR plan: `cost(members)` of each, in order. Computed once and
/// shared by [`rank_imbalance`] and [`synchronous`].
pub fn batch_costs(offsets: &[u32], indices: &[u32], cost: impl Fn(&[u32]) -> f64) -> Vec<f64> {
    (0..offsets.len().saturating_sub(1))
        .map(|b| cost(rows(offsets, indices, b, b + 1)))
        .collect()
}

/// The rank imbalance of a plan whose batch `i` costs `costs[i]`; `None` for an empty plan.
pub fn rank_imbalance(costs: &[f64], world_size: usize) -> Option<Imbalance> {
    let steps = costs.len().checked_div(world_size)?;
    let mut ratios: Vec<f64> = (0..steps)
        .map(|s| {
            let step = &costs[s * world_size..(s + 1) * world_size];
            let (lo, hi) = step.iter().fold((f64::INFINITY, 0.0f64), |(lo, hi), &c| {
                (lo.min(c), hi.max(c))
            });
            if lo <= 0.0 {
                f64::INFINITY
            } else {
                hi / lo
            }
        })
        .collect();
    if ratios.is_empty() {
        return None;
    }
    ratios.sort_by(f64::total_cmp);
    let at = |q: f64| {
        // The rank of the quantile, rounded up, within 0..len.
        #[allow(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            clippy::cast_precision_loss
        )]
        let rank = ((q * ratios.len() as f64).ceil() as usize).clamp(1, ratios.len()) - 1;
        ratios[rank]
    };
    Some(Imbalance {
        p50: at(0.5),
        p99: at(0.99),
        max: ratios[ratios.len() - 1],
    })
}

/// The share of GPU time spent on work when ranks wait for each other (see [`synchronous`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Synchronous {
    /// Ranks meet every micro-batch (FSDP / ZeRO-3, DDP without accumulation): each step lasts as
    /// long as its costliest batch.
    pub per_micro_batch: f64,
    /// Ranks meet once per optimizer step (DDP with `no_sync`): each window of `accumulation` steps
    /// lasts as long as the rank whose micro-batches cost the most in it.
    pub per_optimizer_step: f64,
}

/// Synchronous efficiency of a plan whose batch `i` costs `costs[i]`: the batches' total cost
/// over `world_size ×` the time the ranks take when they wait for the slowest (per micro-batch, and
/// per window of `accumulation` steps, the last one possibly shorter). Batch `s × world_size + r` is
/// rank `r`'s step `s`. Sorted static batches score ≈ 1; `None` for a plan without a step or cost.
pub fn synchronous(costs: &[f64], world_size: usize, accumulation: usize) -> Option<Synchronous> {
    let steps = costs.len().checked_div(world_size)?;
    let (mut total, mut micro, mut windows) = (0.0, 0.0, 0.0);
    let mut sums = vec![0.0f64; world_size];
    for s in 0..steps {
        let mut slowest = 0.0f64;
        for (r, sum) in sums.iter_mut().enumerate() {
            let c = costs[s * world_size + r];
            total += c;
            slowest = slowest.max(c);
            *sum += c;
        }
        micro += slowest;
        if (s + 1) % accumulation.max(1) == 0 || s + 1 == steps {
            windows += sums.iter().copied().fold(0.0, f64::max);
            sums.iter_mut().for_each(|x| *x = 0.0);
        }
    }
    // Ranks below 2^32: exact in f64.
    #[allow(clippy::cast_precision_loss)]
    let world = world_size as f64;
    (micro > 0.0).then(|| Synchronous {
        per_micro_batch: total / (world * micro),
        per_optimizer_step: total / (world * windows),
    })
}

/// The share of sample pairs that share a batch in plan `a` and again in plan `b` (plans over the same
/// `samples` sample ids); `None` when `a` has no pair at all.
pub fn churn(
    a: (&[u32], &[u32]),
    b: (&[u32], &[u32]),
    samples: usize,
) -> crate::error::Result<Option<f64>> {
    // Each sample's batch in `a`, and the largest batch of `b`'s members.
    crate::memory::reserve("scoring churn", samples as u64 * 8)?;
    let batch_in_a = batch_of(a, samples);
    let pairs = |k: u64| k * k.saturating_sub(1) / 2;
    let total: u64 = a.0.windows(2).map(|w| pairs(u64::from(w[1] - w[0]))).sum();
    if total == 0 {
        return Ok(None);
    }
    let (mut again, mut members) = (0u64, Vec::new());
    for i in 0..b.0.len().saturating_sub(1) {
        members.clear();
        members.extend(
            rows(b.0, b.1, i, i + 1)
                .iter()
                .map(|&r| batch_in_a.get(r as usize).copied().unwrap_or(u32::MAX))
                .filter(|&id| id != u32::MAX),
        );
        members.sort_unstable();
        for run in members.chunk_by(|x, y| x == y) {
            again += pairs(run.len() as u64);
        }
    }
    Ok(Some(fraction(again, total)))
}

/// `batch[sample]`: the batch of each sample in `plan`, `u32::MAX` for samples not in it.
fn batch_of((offsets, indices): (&[u32], &[u32]), samples: usize) -> Vec<u32> {
    let mut batch = vec![u32::MAX; samples];
    for i in 0..offsets.len().saturating_sub(1) {
        // Batch counts fit in u32: there are at most as many batches as samples.
        #[allow(clippy::cast_possible_truncation)]
        let id = i as u32;
        for &r in rows(offsets, indices, i, i + 1) {
            if let Some(slot) = batch.get_mut(r as usize) {
                *slot = id;
            }
        }
    }
    batch
}

pub mod context_parallel;
mod report;
pub use report::{end_to_end, report, Report};
pub mod sources;

#[cfg(test)]
mod tests;

pub mod score;
