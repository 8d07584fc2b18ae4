//! The order of a shuffled epoch's batches, arranged per group after forming.
//!
//! **Stratified** (default): the group's batches are ranked by mean row length (real tokens / rows;
//! ties by formation order, which is random), rank `n` gets the time `frac(n·φ + u)` — `φ` the golden
//! ratio, `u` a random phase per epoch and group — and the batches are taken in time order. The
//! times of any run of consecutive ranks are spread evenly over `[0, 1)` (a Kronecker sequence), so
//! conversely every stretch of consecutive batches draws evenly from the whole length range: an
//! accumulation window sees the dataset's length mix. Which samples share a batch is still
//! reshuffled every epoch. Measured on the seed workload (47 buckets, windows of 32 batches), with
//! streamed groups: `window_tv` 0.069, against 0.077 when ranked by bucket (a decile edge inside a
//! bucket then splits it at random), 0.147 for formation order, 0.105 for per-bucket evenly spaced
//! times with independent phases (their misalignment leaves each window a bucket short or over) and
//! 0.206 for `Random`. A streamed group is a fixed set of the permutation's chunks, a uniform random
//! sample of the epoch, so its mix is the dataset's up to chance; a group of `by_bucket.rs` takes the
//! same share of every bucket's batches, so its mix is the dataset's exactly, and `window_tv` falls
//! to 0.055 (measured).
//!
//! **Random**: a seeded shuffle of the batches of each group.
//!
//! Either way only batch ids are ordered here; the rows move once, after rank balance. Epochs of
//! more than `form::ARRANGE_MAX_SAMPLES` (16.7M) samples skip this and keep formation order (see
//! there for the measurements).

use crate::plan::config::Order;
use crate::rng::{shuffle, Pcg64, Stream};

/// The training order of a group's `batches` (mean row lengths `mean`, in formation order), as
/// local batch ids: the first `complete` batches arranged by `order`, then the partial batches flushed
/// after them, which stay last so they touch few steps (spread out, each would unbalance its step's ranks:
/// p99 imbalance 3.1 instead of 1.5, measured). No row moves here: the planner moves every row once,
/// after rank balance (`order::gather`).
pub(crate) fn arrange(
    mean: &[u32],
    batches: usize,
    complete: usize,
    order: Order,
    seed: u64,
    epoch: u64,
    group: u32,
) -> Vec<u32> {
    let complete = complete.min(batches);
    let mut rng = Pcg64::new(seed, epoch, Stream::Order(group));
    let mut sequence = match order {
        Order::Stratified if complete > 1 => interleave(&mean[..complete], &mut rng),
        // Batch counts fit in u32: at most one batch per sample of a group.
        #[allow(clippy::cast_possible_truncation)]
        Order::Stratified => (0..complete as u32).collect(),
        Order::Random => {
            #[allow(clippy::cast_possible_truncation)]
            let mut ids: Vec<u32> = (0..complete as u32).collect();
            shuffle(&mut rng, &mut ids);
            ids
        }
    };
    // Batch counts fit in u32 (as above).
    #[allow(clippy::cast_possible_truncation)]
    sequence.extend(complete as u32..batches as u32);
    sequence
}

/// Batch ids in the order of the module docs: ranked by mean length (`keys`; ties by formation
/// order, which is random), the rank `n` gets the time `frac(n·φ + u)`, and a counting sort on
/// `⌊t·m⌋` places them (O(m); ties in rank order). Times are 64-bit fixed point, so the step and
/// the fraction are one wrapping multiply-add and the slot one widening multiply: exact on every
/// machine, and a fifth of the instructions of the float version (whose `as u64` alone cost ~20
/// a batch, measured).
fn interleave(keys: &[u32], rng: &mut Pcg64) -> Vec<u32> {
    let m = keys.len();
    let ranked = rank_by_key(keys);
    let phase = rng.next_u64();
    // Batch counts fit in u32 (see `arrange`); the slot is below m.
    #[allow(clippy::cast_possible_truncation)]
    let slot = |rank: usize| {
        let time = (rank as u64).wrapping_mul(GOLDEN).wrapping_add(phase);
        ((u128::from(time) * m as u128) >> 64) as u32
    };
    let mut starts = vec![0u32; m + 1];
    for rank in 0..m {
        starts[slot(rank) as usize + 1] += 1;
    }
    for i in 1..=m {
        starts[i] += starts[i - 1];
    }
    let mut sequence = vec![0u32; m];
    for (rank, &id) in ranked.iter().enumerate() {
        let next = &mut starts[slot(rank) as usize];
        sequence[*next as usize] = id;
        *next += 1;
    }
    sequence
}

/// Ids `0..keys.len()` sorted by `(key, id)`: a counting sort when the keys are dense enough (mean
/// lengths of a group's batches: up to the longest sample), else a comparison sort.
pub(crate) fn rank_by_key(keys: &[u32]) -> Vec<u32> {
    let m = keys.len();
    let most = keys.iter().copied().max().unwrap_or(0) as usize;
    // Ids fit in u32 (see `arrange`).
    #[allow(clippy::cast_possible_truncation)]
    let ids = 0..m as u32;
    if most > (4 * m).max(1 << 16) {
        let mut ranked: Vec<u32> = ids.collect();
        ranked.sort_unstable_by_key(|&id| (keys[id as usize], id));
        return ranked;
    }
    // u32 counts: ids fit in u32, and the histogram is zeroed per group (half the bytes of usize).
    let mut starts = vec![0u32; most + 2];
    for &k in keys {
        starts[k as usize + 1] += 1;
    }
    for i in 1..starts.len() {
        starts[i] += starts[i - 1];
    }
    let mut ranked = vec![0u32; m];
    for (id, &k) in ids.zip(keys) {
        ranked[starts[k as usize] as usize] = id;
        starts[k as usize] += 1;
    }
    ranked
}

/// The golden ratio's fractional part in 64-bit fixed point (`⌊2^64 · 0.6180339887…⌋`): the
/// Kronecker step whose points spread most evenly.
const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_sort_by_key_then_id_either_way() {
        let keys = [5u32, 1, 5, 0, 1];
        assert_eq!(rank_by_key(&keys), [3, 1, 4, 0, 2]);
        // Sparse keys take the comparison sort, with the same result.
        let sparse = [5u32 << 20, 1, 5 << 20, 0, 1];
        assert_eq!(rank_by_key(&sparse), [3, 1, 4, 0, 2]);
    }

    #[test]
    fn interleaving_spreads_every_bucket_evenly() {
        // 60 batches of bucket 0, 30 of bucket 1, 10 of bucket 2, formed in bucket order.
        let buckets: Vec<u32> = [0u32; 60]
            .iter()
            .chain(&[1u32; 30])
            .chain(&[2u32; 10])
            .copied()
            .collect();
        let sequence = interleave(&buckets, &mut Pcg64::new(1, 2, Stream::Order(0)));
        let mut sorted = sequence.clone();
        sorted.sort_unstable();
        assert_eq!(
            sorted,
            (0..100).collect::<Vec<u32>>(),
            "a permutation of the batches"
        );
        for window in sequence.windows(10) {
            let count = |b: u32| {
                window
                    .iter()
                    .filter(|&&id| buckets[id as usize] == b)
                    .count()
            };
            assert!(
                (5..=7).contains(&count(0)) && (2..=4).contains(&count(1)) && count(2) <= 2,
                "{window:?}"
            );
        }
        // A different group (phase) gives a different order.
        let other = interleave(&buckets, &mut Pcg64::new(1, 2, Stream::Order(1)));
        assert_ne!(sequence, other);
    }
}
