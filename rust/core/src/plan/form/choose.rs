//! The choose stage: which of a forming group's batches takes each place of its training order, so
//! that every stretch of that order carries each source near its share.
//!
//! Arrangement (`arrange.rs`) ranks a group's batches by mean length and spreads the ranks through
//! training order; batches of neighbouring ranks are alike in length, and any of them may stand in
//! for another without changing how the order mixes lengths. So the ranks are cut into blocks of
//! [`BLOCK`] neighbours, and the places of a block — spread through the group's order — are filled,
//! front to back, each with the block's remaining batch whose sources best repay the running
//! deficit: the sum over the places filled so far of what their block gives on average minus what
//! the chosen batch gave, per source (tokens or samples, as the weights count). The batch chosen
//! minimises `|deficit + expected − own|²`. Tracking what each place's block gives on average, not
//! the weights, keeps the target reachable: long batches are mostly the long sources'.
//!
//! Batches keep their rows, so padding, packing, costs and rank balance (matched after this stage,
//! window by window) are those of the same batches without sources; only which window a batch
//! lands in changes, among batches of nearly the same mean length. Measured on the seed workload
//! split into four sources of different length profiles (weights 0.3/0.3/0.25/0.15 in tokens, 8
//! ranks × 4, 16K tokens; `time_plan` with `TIME_PLAN_TV=1`): per-window source TV with blocks of
//! 8, 16, 32 and 64 ranks 0.029, 0.024, 0.020, 0.017 over uniformly shuffled buckets (0.056
//! without the stage), and 0.021, 0.018, 0.015, 0.014 over buckets whose sources are spread
//! (`select.rs`; 0.037 without the stage). Blocks of 32 cost ~3 ms of a 16 ms epoch (2 threads).
//!
//! Deterministic: the figures are f64 sums in a fixed order and ties go to the earlier candidate.

use crate::plan::arrange::rank_by_key;

/// Neighbouring ranks a batch may trade places with (see the module docs).
pub(crate) const BLOCK: usize = 32;

/// Which rows belong to which source, and what a source's share counts: what choosing needs of a
/// mixture (a planner re-planning part of an epoch holds them too, for rows of its own).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Labels {
    /// Source `s` holds rows `bounds[s]..bounds[s + 1]`.
    pub(crate) bounds: Vec<u32>,
    /// Shares count tokens (else samples).
    pub(crate) tokens: bool,
}

impl Labels {
    /// Sources labelled.
    pub(crate) fn len(&self) -> usize {
        self.bounds.len() - 1
    }

    /// Source of `row`: the count of inner bounds at or below it, without branches for the few
    /// sources mixtures have.
    #[inline]
    pub(crate) fn source_of(&self, row: u32) -> usize {
        let inner = &self.bounds[1..self.bounds.len() - 1];
        if inner.len() <= 16 {
            inner.iter().map(|&b| usize::from(b <= row)).sum()
        } else {
            self.bounds.partition_point(|&b| b <= row) - 1
        }
    }

    /// `rows` (of the labelled rows) grouped by source, each source's in their order, and the labels
    /// of those positions.
    pub(crate) fn group(&self, rows: &[u32]) -> (Vec<u32>, Labels) {
        let mut bounds = vec![0u32; self.len() + 1];
        for &row in rows {
            bounds[self.source_of(row) + 1] += 1;
        }
        for s in 0..self.len() {
            bounds[s + 1] += bounds[s];
        }
        let mut next = bounds.clone();
        let mut grouped = vec![0u32; rows.len()];
        for &row in rows {
            let at = &mut next[self.source_of(row)];
            grouped[*at as usize] = row;
            *at += 1;
        }
        let tokens = self.tokens;
        (grouped, Labels { bounds, tokens })
    }

    /// The parts of `batches` batches by source: `add(batch, row, length)` for each row, then
    /// [`Parts::choose`].
    pub(crate) fn parts(&self, batches: usize) -> Parts<'_> {
        Parts {
            labels: self,
            of: vec![0.0; batches * self.len()],
        }
    }
}

/// Places chosen together: a group's training order is chosen in stretches of this many places,
/// each on its own (a huge epoch's groups hold millions of batches; a stretch's figures stay in
/// cache).
const PLACES: usize = 1 << 14;

/// Sources summed in registers when a batch's parts are counted (more are summed in memory).
const FEW: usize = 8;

/// Each batch's mass per source (tokens or samples), `batch × sources + source`.
pub(crate) struct Parts<'a> {
    labels: &'a Labels,
    of: Vec<f32>,
}

impl Parts<'_> {
    /// Counts the rows of `batch`, given as `(row, length)`.
    #[inline]
    pub(crate) fn add_batch(&mut self, batch: usize, rows: impl Iterator<Item = (u32, u32)>) {
        match self.labels.len() {
            0..=2 => self.add_few::<1>(batch, rows),
            3..=4 => self.add_few::<3>(batch, rows),
            5..=FEW => self.add_few::<7>(batch, rows),
            _ => self.add_many(batch, rows),
        }
    }

    /// [`Parts::add_batch`] for at most `K + 1` sources: each row's mass is added to the running
    /// sum of every inner bound at or below it (a compare and a select per bound, in registers),
    /// and a source's part is the difference of two such sums. Summing into the row's source by
    /// index waited on the store of the row before (three times slower, measured).
    #[inline]
    fn add_few<const K: usize>(&mut self, batch: usize, rows: impl Iterator<Item = (u32, u32)>) {
        let (sources, tokens) = (self.labels.len(), self.labels.tokens);
        // Bounds past the last source's start are never reached (rows are below u32::MAX).
        let mut inner = [u32::MAX; K];
        for (b, &bound) in inner.iter_mut().zip(&self.labels.bounds[1..sources]) {
            *b = bound;
        }
        let (mut total, mut above) = (0u64, [0u64; K]);
        for (row, length) in rows {
            let v = if tokens { u64::from(length) } else { 1 };
            total += v;
            for (sum, &bound) in above.iter_mut().zip(&inner) {
                *sum += if row >= bound { v } else { 0 };
            }
        }
        let own = &mut self.of[batch * sources..][..sources];
        for (s, o) in own.iter_mut().enumerate() {
            let from = if s == 0 { total } else { above[s - 1] };
            let past = if s < K { above[s] } else { 0 };
            // A batch's tokens: f32 is ample to choose by.
            #[allow(clippy::cast_precision_loss)]
            let part = (from - past) as f32;
            *o = part;
        }
    }

    fn add_many(&mut self, batch: usize, rows: impl Iterator<Item = (u32, u32)>) {
        let (sources, tokens) = (self.labels.len(), self.labels.tokens);
        let own = &mut self.of[batch * sources..][..sources];
        for (row, length) in rows {
            let v = if tokens { f64::from(length) } else { 1.0 };
            let own = &mut own[self.labels.source_of(row)];
            // As above.
            #[allow(clippy::cast_possible_truncation)]
            let total = (f64::from(*own) + v) as f32;
            *own = total;
        }
    }

    /// Refills the places of `sequence` (batch ids in training order) as the module docs describe,
    /// stretch by stretch; `mean` is every batch's mean length. The ids stay the same set.
    pub(crate) fn choose(&self, sequence: &mut [u32], mean: &[u32]) {
        if self.labels.len() < 2 {
            return;
        }
        for stretch in sequence.chunks_mut(PLACES) {
            self.choose_stretch(stretch, mean);
        }
    }

    /// One stretch, scored with the sources padded to `N` (a power of two, ≥ 4): fixed-size
    /// loops the compiler unrolls and vectorizes (half the stage's time against a loop over the
    /// sources, measured). Padding adds zero masses, which change no score.
    fn choose_stretch(&self, sequence: &mut [u32], mean: &[u32]) {
        match self.labels.len() {
            0..=4 => self.choose_padded::<4>(sequence, mean),
            5..=8 => self.choose_padded::<8>(sequence, mean),
            9..=16 => self.choose_padded::<16>(sequence, mean),
            17..=32 => self.choose_padded::<32>(sequence, mean),
            33..=64 => self.choose_padded::<64>(sequence, mean),
            65..=128 => self.choose_padded::<128>(sequence, mean),
            _ => self.choose_padded::<256>(sequence, mean),
        }
    }

    fn choose_padded<const N: usize>(&self, sequence: &mut [u32], mean: &[u32]) {
        let (m, sources) = (sequence.len(), self.labels.len());
        if m < 2 {
            return;
        }
        let keys: Vec<u32> = sequence.iter().map(|&id| mean[id as usize]).collect();
        let ranked = rank_by_key(&keys);
        // Blocks of neighbouring ranks, each a table of BLOCK candidates: their ids, their masses
        // source by source, and their squared norms, infinite where no candidate is (left, or
        // taken). `block[p]`: the block of place `p`.
        let blocks = m.div_ceil(BLOCK);
        let mut ids = vec![0u32; blocks * BLOCK];
        let mut mass = vec![[[0f32; BLOCK]; N]; blocks];
        let mut norm = vec![[f32::INFINITY; BLOCK]; blocks];
        let mut expected = vec![[0f32; N]; blocks];
        let mut block = vec![0u32; m];
        for (rank, &p) in ranked.iter().enumerate() {
            let (b, slot) = (rank / BLOCK, rank % BLOCK);
            // Blocks are fewer than places, which fit u32 as batch ids do.
            #[allow(clippy::cast_possible_truncation)]
            {
                block[p as usize] = b as u32;
            }
            let id = sequence[p as usize];
            ids[b * BLOCK + slot] = id;
            let own = &self.of[id as usize * sources..][..sources];
            let mut squared = 0f32;
            for (s, &v) in own.iter().enumerate() {
                mass[b][s][slot] = v;
                expected[b][s] += v;
                squared += v * v;
            }
            norm[b][slot] = squared;
        }
        for (b, expected) in expected.iter_mut().enumerate() {
            // At most BLOCK members.
            #[allow(clippy::cast_precision_loss)]
            let members = BLOCK.min(m - b * BLOCK) as f32;
            for e in expected.iter_mut() {
                *e /= members;
            }
        }
        let mut deficit = [0f32; N];
        for (place, &b) in sequence.iter_mut().zip(&block) {
            let (b, expect) = (b as usize, &expected[b as usize]);
            // |aim − own|² less the constant |aim|², with aim = deficit + expected: own·own − 2·aim·own.
            let mut score = norm[b];
            for ((&d, &e), own) in deficit.iter().zip(expect).zip(&mass[b]) {
                let aim = 2.0 * (d + e);
                for (x, &v) in score.iter_mut().zip(own) {
                    *x -= aim * v;
                }
            }
            let best = lowest(&score);
            *place = ids[b * BLOCK + best];
            norm[b][best] = f32::INFINITY;
            for ((d, &e), own) in deficit.iter_mut().zip(expect).zip(&mass[b]) {
                *d += e - own[best];
            }
        }
    }
}

/// The slot of the lowest score, the first among equals: the least found by halving the table
/// lane against lane, then a mask of the slots that reach it; both compile to vector instructions
/// (a scalar scan cost a third of the stage, and pairing neighbours within a lane a sixth,
/// measured). Scores are never NaN, so the least is the same in any order of comparison.
#[inline(always)]
fn lowest(score: &[f32; BLOCK]) -> usize {
    let pick = |a: f32, b: f32| if a < b { a } else { b };
    let mut half = [0f32; BLOCK / 2];
    for (k, h) in half.iter_mut().enumerate() {
        *h = pick(score[k], score[k + BLOCK / 2]);
    }
    let mut width = BLOCK / 2;
    while width > 1 {
        width /= 2;
        for k in 0..width {
            half[k] = pick(half[k], half[k + width]);
        }
    }
    let least = half[0];
    let mut mask = 0u32;
    for (k, &x) in score.iter().enumerate() {
        mask |= u32::from(x == least) << k;
    }
    mask.trailing_zeros() as usize
}
