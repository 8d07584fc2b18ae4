//! Open batches for the common case of a stream: a rules table (every length ≤ 2^18, fewer than
//! 255 buckets) and batches of a bounded number of rows.
//!
//! The open batch of each bucket lives in a fixed array indexed by a bucket *byte*, its rows in one
//! flat buffer at a fixed place per bucket, so the rule's per-sample work is a table load, two
//! comparisons and three stores, with no bounds checks on the bucket arrays and no `Vec` growth
//! checks. It forms exactly the batches of the general store (`open.rs`; a test compares the two on
//! random configurations). Measured on the seed workload (callgrind, one thread): ~61 instructions
//! a sample with gathering and emission against ~70 with a `Vec` per bucket.

use crate::plan::form::rule::{Filling, OpenBatches, Written};

/// Most rows, summed over buckets, that the flat buffer may hold (4 MB a stream); configurations with
/// larger batches use the general store.
const MAX_FLAT_ROWS: usize = 1 << 20;

/// The open batches of every bucket.
pub(crate) struct Tight {
    // Each field of the open batches in its own array (a `[Filling; 256]` ran ~15 instructions a
    // sample slower, measured).
    len: [u32; 256],
    capacity: [u32; 256],
    longest: [u32; 256],
    tokens: [u64; 256],
    /// Where bucket `b`'s rows start in `rows` (each has room for its largest batch).
    base: [usize; 256],
    rows: Vec<u32>,
}

impl Tight {
    /// Open batches for buckets whose largest batches hold `bucket_capacity` rows, or `None` when
    /// they do not fit the flat buffer (or there are 256 buckets or more).
    pub(crate) fn new(bucket_capacity: &[u32]) -> Option<Self> {
        if bucket_capacity.len() >= 256 {
            return None;
        }
        let mut base = [0usize; 256];
        let mut total = 0usize;
        for (b, &c) in bucket_capacity.iter().enumerate() {
            base[b] = total;
            total = total.checked_add(c as usize)?;
        }
        (total <= MAX_FLAT_ROWS).then(|| Self {
            len: [0; 256],
            capacity: [u32::MAX; 256],
            longest: [0; 256],
            tokens: [0; 256],
            base,
            rows: vec![0; total],
        })
    }
}

impl OpenBatches<Written<'_>> for Tight {
    // Buckets are bytes: the masks only spare the bounds checks.
    #[inline(always)]
    fn get(&self, bucket: usize) -> Filling {
        let b = bucket & 0xff;
        Filling {
            len: self.len[b],
            capacity: self.capacity[b],
            longest: self.longest[b],
            tokens: self.tokens[b],
        }
    }

    #[inline(always)]
    fn set(&mut self, bucket: usize, fill: Filling) {
        let b = bucket & 0xff;
        self.len[b] = fill.len;
        self.capacity[b] = fill.capacity;
        self.longest[b] = fill.longest;
        self.tokens[b] = fill.tokens;
    }

    #[inline(always)]
    fn join(&mut self, bucket: usize, at: u32, row: u32) {
        self.rows[self.base[bucket & 0xff] + at as usize] = row;
    }

    fn close(&mut self, bucket: usize, fill: &Filling, out: &mut Written<'_>) {
        let start = self.base[bucket & 0xff];
        out.put(&self.rows[start..start + fill.len as usize], fill);
    }
}
