//! Trimming steps to a common cost (`Config::trim_steps`): forming after ordering, for the ranks.
//!
//! Under a token budget a batch of short rows can cost almost anything up to the budget, while a
//! batch of `k` long rows costs `k·L`, fixed by its samples (two rows of 5.5K tokens: 0.67 of a 16K
//! budget). A step whose ranks get one of each waits for the short one. Once a group's batches are
//! in training order and matched to ranks (`balance.rs`), every step is trimmed:
//!
//! 1. **Choose a target** `T` among the step's batch costs (at most [`MAX_CANDIDATES`] of them),
//!    minimising `world_size × (costliest batch kept) + (cost moved out) / EXTRA_SYNC` — the step's
//!    time plus the time the moved rows will take in steps of their own — and only where that beats
//!    the step as it is.
//! 2. **Trim** each batch costlier than `T`: rows leave from its end (its rows are in shuffled
//!    order, so which leave is random) until it costs at most `T`; a batch keeps at least one row.
//! 3. **Re-form** the trimmed rows bucket by bucket with the batching rule (`by_bucket.rs`'s cut),
//!    sort the new batches by cost, and match their whole windows like any others.
//! 4. **Spread** those extra windows evenly among the group's own windows, so the epoch does not
//!    end on them; a last part window joins the epoch's tail.
//!
//! Every sample stays in the plan once and every batch within budget. Accumulation windows stay
//! whole: a trimmed window keeps its batches, only lighter. Because the plan is formed with the
//! trim, the epoch's step count is calibrated with it (`steps.rs`) and stays the same every epoch.
//!
//! Measured on the seed workload (902,087 lengths, `max_tokens=16384`, 8 ranks; `mixing.py`):
//!
//! | plan | sync / micro-batch | batches | `window_tv` |
//! |---|---|---|---|
//! | accumulation 1, padded tokens | 0.911 → 0.935 | +5.1% | 0.216 → 0.234 |
//! | accumulation 4, attention price `cost=(1, 1/30720)` | 0.934 → 0.943 | +2.4% | 0.070 → 0.090 |
//! | accumulation 4, padded tokens | 0.966 → 0.966 | +0.2% | 0.054 → 0.055 |
//!
//! With accumulation 4 the extra windows hold only short rows, which is what `window_tv` pays;
//! under the token price the steps are already cost-sorted inside each window, so nothing is
//! gained. Hence an option, not the default: it changes how many steps an epoch has, and so every
//! checkpoint's fingerprint. Planning takes 2–3× as long (28–32 against 9–15 ms an
//! epoch at accumulation 1, 41 against 17 under the attention price; 2 threads), the time going
//! to reading each step's rows in training order.
//!
//! Rejected after measuring: trimming every step to its cheapest batch (the naive construction,
//! 0.83: most of a step's cost moves into extra steps that wait just as much); re-ordering the
//! whole group again after trimming, so extra batches mix into every window (`window_tv` 0.074,
//! but synchronous efficiency 0.932, below no trimming: the trimmed batches lose the partners
//! they were trimmed to); spreading extra steps one micro-batch at a time instead of whole windows
//! (`window_tv` 0.16: a window's steps are cost-sorted, hence length bands, and shifting them
//! across windows doubles bands); putting all steps, own and extra, in the stratified order of
//! their mean lengths and matching the new windows (0.949 and 0.983 per optimizer step under the
//! attention price, but `window_tv` 0.168: a step's mean says little about its lengths); trimming
//! only steps below a synchronous efficiency (0.8: 0.935, `window_tv` 0.071; 0.85: 0.941, 0.088 —
//! no point reaches both targets).

use std::ops::Range;

use crate::lengths::Length;
use crate::plan::balance::match_windows;
use crate::plan::config::Config;
use crate::plan::form::cut::{group_by_bucket, length_of, Batches};
use crate::plan::form::stream::Former;
use crate::rng::Pcg64;

/// The synchronous efficiency assumed for the extra steps the moved rows make, when pricing a
/// trim: they are re-formed from short rows, which can hit any cost, and sorted by cost, so they
/// match well (0.97–0.99 on the seed workload).
const EXTRA_SYNC: f64 = 0.97;

/// Most targets tried per step: a step's batch costs, thinned evenly past this many, so a step of
/// 1,024 ranks prices 16 targets, not 1,024.
pub(crate) const MAX_CANDIDATES: usize = 16;

impl<L: Length> Former<'_, L> {
    /// Trims every step of `main` (whole windows of batch numbers in training order, `world_size`
    /// a step) as the module docs say, in place in `batches`; returns the trimmed rows' pairs.
    pub(crate) fn trim_steps(
        &self,
        batches: &mut Batches,
        shuffled: &[u64],
        main: &[u32],
    ) -> Vec<u64> {
        let world = self.config.world_size as usize;
        let mut spill = Vec::new();
        if world < 2 {
            return spill;
        }
        let mut prefixes = Prefixes::default();
        let mut targets = Vec::with_capacity(world);
        for step in main.chunks_exact(world) {
            prefixes.fill(
                self.config,
                step.iter().map(|&id| run(batches, shuffled, id as usize)),
            );
            let Some(target) = best_target(&prefixes, &mut targets) else {
                continue;
            };
            for (k, &id) in step.iter().enumerate() {
                if prefixes.cost(k) > target {
                    trim(
                        batches,
                        shuffled,
                        id as usize,
                        prefixes.kept(k, target),
                        &mut spill,
                    );
                }
            }
        }
        spill
    }

    /// The trimmed rows `spill` grouped by bucket (`group_by_bucket`) and cut into batches by
    /// the rule, bucket by bucket; the batches address the grouped pairs from `base` on, past the
    /// epoch buffer (see [`super::cut::place`]).
    pub(crate) fn reform(&self, spill: &[u64], base: usize) -> (Vec<u64>, Batches) {
        let buckets = self.bucket_capacity.len();
        let (grouped, starts) = group_by_bucket(spill.iter().copied(), self.rules, buckets);
        let mut extra = Batches::default();
        for b in 0..buckets {
            let range = starts[b]..starts[b + 1];
            if !range.is_empty() {
                let cut = self.cut(&grouped[range.clone()], base + range.start);
                extra.extend(&cut, 0..cut.len());
            }
        }
        (grouped, extra)
    }
}

/// The target cost that prices a step lowest (its batches' prefix costs `prefixes`; `targets` is
/// scratch), if any beats no trim; of equal prices, the lowest target.
fn best_target(prefixes: &Prefixes, targets: &mut Vec<f64>) -> Option<f64> {
    let batches = prefixes.starts.len() - 1;
    let top = (0..batches).map(|k| prefixes.cost(k)).fold(0.0, f64::max);
    candidates((0..batches).map(|k| prefixes.cost(k)), top, targets);
    // Batch counts per step are far below 2^53.
    #[allow(clippy::cast_precision_loss)]
    let world = batches as f64;
    let mut best = (world * top, None);
    for &target in targets.iter() {
        // A target is one of the step's costs, so it prices the step at least `world·T`: past the
        // best price no higher target can win.
        if world * target >= best.0 {
            break;
        }
        let (mut high, mut moved) = (0.0f64, 0.0f64);
        for k in 0..batches {
            let cost = prefixes.cost(k);
            let left = if cost <= target {
                cost
            } else {
                prefixes.of(k)[prefixes.kept(k, target) - 1]
            };
            high = high.max(left);
            moved += cost - left;
        }
        let score = world * high + moved / EXTRA_SYNC;
        if score < best.0 {
            best = (score, Some(target));
        }
    }
    best.1
}

/// The cost of every prefix of each batch of a step, end to end: `rows × cost(longest row so far)`,
/// which only grows with the rows, so what a batch keeps under a target is a binary search. Priced
/// once per row: pricing each target's prefixes afresh cost a fifth more planning time (measured).
#[derive(Default)]
struct Prefixes {
    cost: Vec<f64>,
    /// Batch `k`'s prefixes are `cost[starts[k]..starts[k + 1]]`.
    starts: Vec<usize>,
}

impl Prefixes {
    /// Refills for the batches `runs` (their pairs), reusing the buffers.
    fn fill<'a>(&mut self, config: &Config, runs: impl Iterator<Item = &'a [u64]>) {
        self.cost.clear();
        self.starts.clear();
        self.starts.push(0);
        for pairs in runs {
            let mut longest = 0;
            self.cost.extend((1u64..).zip(pairs).map(|(rows, &pair)| {
                longest = longest.max(length_of(pair));
                config.batch_cost(rows, longest)
            }));
            self.starts.push(self.cost.len());
        }
    }

    /// Batch `k`'s prefix costs.
    fn of(&self, k: usize) -> &[f64] {
        &self.cost[self.starts[k]..self.starts[k + 1]]
    }

    /// Batch `k`'s cost, whole.
    fn cost(&self, k: usize) -> f64 {
        self.of(k).last().copied().unwrap_or(0.0)
    }

    /// The rows batch `k` keeps under `target`: the longest prefix that costs at most `target`,
    /// and at least one row.
    fn kept(&self, k: usize, target: f64) -> usize {
        self.of(k).partition_point(|&c| c <= target).max(1)
    }
}

/// Trims batch `id` to its first `rows` rows, appending the rows it loses to `spill`.
fn trim(batches: &mut Batches, shuffled: &[u64], id: usize, rows: usize, spill: &mut Vec<u64>) {
    let pairs = run(batches, shuffled, id);
    let (kept, lost) = pairs.split_at(rows);
    spill.extend_from_slice(lost);
    // Bounds are below the admitted count, a u32.
    #[allow(clippy::cast_possible_truncation)]
    {
        batches.ends[id] = batches.starts[id] + rows as u32;
    }
    batches.longest[id] = kept.iter().map(|&p| length_of(p)).max().unwrap_or(0);
    batches.tokens[id] = kept.iter().map(|&p| u64::from(length_of(p))).sum();
}

/// Batch `id`'s pairs in the epoch buffer.
fn run<'a>(batches: &Batches, shuffled: &'a [u64], id: usize) -> &'a [u64] {
    &shuffled[batches.starts[id] as usize..batches.ends[id] as usize]
}

/// The targets worth trying for a step whose costliest batch costs `top`: its other distinct
/// costs, ascending, thinned evenly to at most [`MAX_CANDIDATES`].
fn candidates(costs: impl Iterator<Item = f64>, top: f64, out: &mut Vec<f64>) {
    out.clear();
    out.extend(costs.filter(|&c| c < top));
    out.sort_unstable_by(f64::total_cmp);
    out.dedup();
    if out.len() > MAX_CANDIDATES {
        let all = out.len();
        for i in 0..MAX_CANDIDATES {
            // Ascending picks from an ascending list: each reads an entry at or after its own slot.
            out[i] = out[i * (all - 1) / (MAX_CANDIDATES - 1)];
        }
        out.truncate(MAX_CANDIDATES);
    }
}

/// The group's training order with the extra batches `extra` (numbers past its own) in it:
/// sorted by cost (costliest first, ties by number), their whole windows matched and spread evenly
/// among the group's `main` batches (whole windows of `sequence`); the rest after them, for the
/// tail. Returns the order and its new count of main batches.
pub(crate) fn spread(
    sequence: &[u32],
    main: usize,
    extra: Range<usize>,
    costs: &[f32],
    config: &Config,
    rng: &mut Pcg64,
) -> (Vec<u32>, usize) {
    let window = config.window();
    // Batch numbers fit in u32: at most one batch per sample.
    #[allow(clippy::cast_possible_truncation)]
    let mut ids: Vec<u32> = extra.map(|id| id as u32).collect();
    ids.sort_unstable_by_key(|&id| (std::cmp::Reverse(costs[id as usize].to_bits()), id));
    let whole = ids.len() / window * window;
    match_windows(&mut ids[..whole], costs, config, rng);
    let (own, added) = (main / window, whole / window);
    let mut order = Vec::with_capacity(sequence.len() + ids.len());
    let mut placed = 0;
    for w in 0..own {
        // Extra window k goes before own window ⌊(2k + 1)·own / (2·added)⌋: evenly, centred.
        while placed < added && (2 * placed + 1) * own / (2 * added) <= w {
            order.extend_from_slice(&ids[placed * window..(placed + 1) * window]);
            placed += 1;
        }
        order.extend_from_slice(&sequence[w * window..(w + 1) * window]);
    }
    order.extend_from_slice(&ids[placed * window..whole]);
    let new_main = order.len();
    order.extend_from_slice(&sequence[main..]);
    order.extend_from_slice(&ids[whole..]);
    (order, new_main)
}

#[cfg(test)]
mod tests;
