//! Open batches for any stream: one growable batch per bucket, for rules without a table (lengths
//! past 2^18), 256 buckets or more, or batches too large for the flat buffer of `tight.rs`.

use crate::plan::form::rule::{Filling, OpenBatches, Written};

/// A batch being filled while the epoch streams by.
#[derive(Debug)]
pub(crate) struct Open {
    rows: Vec<u32>,
    fill: Filling,
}

/// The open batch of every bucket.
pub(crate) struct PerBucket(pub(crate) Vec<Open>);

impl PerBucket {
    /// Empty batches for buckets whose largest batches hold `bucket_capacity` rows.
    pub(crate) fn new(bucket_capacity: &[u32]) -> Self {
        Self(
            bucket_capacity
                .iter()
                .map(|&full| Open {
                    rows: Vec::with_capacity(full.min(1 << 16) as usize),
                    fill: Filling::EMPTY,
                })
                .collect(),
        )
    }
}

impl OpenBatches<Written<'_>> for PerBucket {
    #[inline(always)]
    fn get(&self, bucket: usize) -> Filling {
        self.0[bucket].fill
    }

    #[inline(always)]
    fn set(&mut self, bucket: usize, fill: Filling) {
        self.0[bucket].fill = fill;
    }

    #[inline(always)]
    fn join(&mut self, bucket: usize, _: u32, row: u32) {
        self.0[bucket].rows.push(row);
    }

    fn close(&mut self, bucket: usize, fill: &Filling, out: &mut Written<'_>) {
        let batch = &mut self.0[bucket];
        out.put(&batch.rows, fill);
        batch.rows.clear();
    }
}
