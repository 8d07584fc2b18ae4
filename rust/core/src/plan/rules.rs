//! The per-length rules of batch forming: which bucket a length joins, and how many rows a batch
//! whose longest sample has that length may hold.

use crate::plan::buckets::{Assigner, Buckets, LUT_MAX_LENGTH};
use crate::plan::config::{Batching, Config, CostModel};

/// What the stream needs to know per length: its bucket, and its *capacity* — the most rows a batch
/// whose longest sample has this length may hold (`batch_size`, or `⌊max_tokens / padded length⌋`).
/// Capacity never grows with length, so a batch's capacity is the minimum over its members and
/// "does it fit" is one comparison. A table indexed by length answers both in one load; its entries
/// are `u32` (bucket in the top 8 bits) so the table of a 8K-token workload fits in L1 (32 KB; `u64`
/// entries spilled to L2 and cost ~10% of the stream, measured). Configurations whose buckets or
/// capacities do not fit (≥ 255 buckets, or batches of ≥ 2^24 rows) compute each rule instead.
#[derive(Debug)]
pub(crate) struct Rules {
    pub(crate) table: Option<Vec<u32>>,
    assigner: Assigner,
    batching: Batching,
    pad: u32,
    cost: CostModel,
}

/// A table entry for lengths that are not admitted (bucket 255 is never used).
pub(crate) const NO_RULE: u32 = u32::MAX;

/// Bits of a table entry that hold the capacity; the bucket is above them.
const CAPACITY_BITS: u32 = 24;

/// `(bucket, capacity)` from a rules table (see [`Rules`]).
#[inline]
pub(crate) fn table_lookup(table: &[u32], length: u32) -> Option<(usize, u32)> {
    match table.get(length as usize) {
        Some(&e) if e != NO_RULE => Some((
            (e >> CAPACITY_BITS) as usize,
            e & ((1 << CAPACITY_BITS) - 1),
        )),
        _ => None,
    }
}

/// The bucket byte and capacity of an admitted table entry (not [`NO_RULE`]).
#[inline]
pub(crate) fn table_entry_parts(entry: u32) -> (u8, u32) {
    // The bucket is the top byte by construction (see `table_entry`).
    #[allow(clippy::cast_possible_truncation)]
    let bucket = (entry >> CAPACITY_BITS) as u8;
    (bucket, entry & ((1 << CAPACITY_BITS) - 1))
}

/// Packs `(bucket, capacity)` into a table entry, or `None` when either does not fit.
fn table_entry(rule: Option<(usize, u32)>) -> Option<u32> {
    match rule {
        None => Some(NO_RULE),
        Some((bucket, capacity)) => {
            let bucket = u32::try_from(bucket).ok().filter(|&b| b < 255)?;
            (capacity < 1 << CAPACITY_BITS).then_some(bucket << CAPACITY_BITS | capacity)
        }
    }
}

impl Rules {
    pub(crate) fn new(buckets: &Buckets, config: &Config, admit_max: u32, longest: u32) -> Self {
        let assigner = buckets.assigner(admit_max);
        let mut rules = Self {
            table: None,
            assigner,
            batching: config.batching,
            pad: config.pad_to_multiple_of,
            cost: config.cost,
        };
        if longest <= LUT_MAX_LENGTH {
            rules.table = (0..=longest)
                .map(|l| table_entry(rules.compute(l)))
                .collect();
        }
        rules
    }

    pub(crate) fn compute(&self, length: u32) -> Option<(usize, u32)> {
        let bucket = self.assigner.get(length)?;
        let capacity = match self.batching {
            Batching::Rows(n) => n,
            Batching::Tokens(t) => {
                let pad = u64::from(self.pad);
                let padded = u64::from(length).div_ceil(pad) * pad;
                if self.cost.is_tokens() {
                    u32::try_from(t / padded).unwrap_or(u32::MAX)
                } else {
                    capacity_under_cost(t, self.cost.row(padded))
                }
            }
        };
        Some((bucket, capacity))
    }

    /// `(bucket, capacity)` of `length`, or `None` when it is not admitted.
    #[inline]
    pub(crate) fn get(&self, length: u32) -> Option<(usize, u32)> {
        match &self.table {
            Some(table) => table_lookup(table, length),
            None => self.compute(length),
        }
    }
}

/// `⌊budget / row_cost⌋` rows, saturating at `u32::MAX` (a zero-cost row fits without limit).
fn capacity_under_cost(budget: u64, row_cost: f64) -> u32 {
    // Budgets stay far below 2^53; the quotient is clamped into u32 before the cast.
    #[allow(
        clippy::cast_precision_loss,
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss
    )]
    let rows = (budget as f64 / row_cost).floor().min(f64::from(u32::MAX)) as u32;
    rows
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::config::Batching;

    fn rules(batching: Batching, edges: Vec<u32>, longest: u32) -> Rules {
        let buckets = Buckets::from_edges(edges).expect("valid edges");
        Rules::new(&buckets, &Config::new(batching), longest, longest)
    }

    #[test]
    fn table_and_computation_agree() {
        let small = rules(Batching::Tokens(1000), vec![0, 10, 100], 100);
        assert!(small.table.is_some());
        for length in 0..=101 {
            assert_eq!(small.get(length), small.compute(length), "length {length}");
        }
        assert_eq!(small.get(7), Some((0, 142)));
        assert_eq!(small.get(0), None);
    }

    #[test]
    fn a_quadratic_cost_gives_long_rows_fewer_slots() {
        let config = Config {
            cost: CostModel {
                linear: 1.0,
                quadratic: 1.0 / 1024.0,
            },
            ..Config::new(Batching::Tokens(8192))
        };
        let buckets = Buckets::from_edges(vec![0, 4096]).expect("valid edges");
        // The planner admits up to 2048 (2048 + 4096 = 6144 ≤ 8192; 4096 would cost 20480).
        let rules = Rules::new(&buckets, &config, 2048, 4096);
        // 512: 512 + 256 = 768 a row → 10 rows; 1024: 1024 + 1024 → 4; 2048: 6144 → 1.
        assert_eq!(rules.get(512), Some((0, 10)));
        assert_eq!(rules.get(1024), Some((0, 4)));
        assert_eq!(rules.get(2048), Some((0, 1)));
        assert_eq!(rules.get(2049), None);
        assert_eq!(rules.compute(512), rules.get(512));
    }

    #[test]
    fn capacities_too_large_for_the_table_are_computed() {
        let huge = rules(Batching::Rows(1 << 24), vec![0, 10, 100], 100);
        assert!(huge.table.is_none());
        assert_eq!(huge.get(50), Some((1, 1 << 24)));
        let largest_packed = rules(Batching::Rows((1 << 24) - 1), vec![0, 100], 100);
        assert!(largest_packed.table.is_some());
        assert_eq!(largest_packed.get(50), Some((0, (1 << 24) - 1)));
    }

    #[test]
    fn bucket_numbers_too_large_for_the_table_are_computed() {
        let edges: Vec<u32> = (0..=300).collect();
        let many = rules(Batching::Rows(4), edges, 300);
        assert!(many.table.is_none());
        assert_eq!(many.get(300), Some((299, 4)));
        let edges: Vec<u32> = (0..=255).collect();
        let most = rules(Batching::Rows(4), edges, 255);
        assert!(most.table.is_some());
        assert_eq!(most.get(255), Some((254, 4)));
    }
}
