//! The shuffled epoch's hot loop, specialised for the common case: a rules table (every length ≤
//! 2^18, fewer than 255 buckets) and batches of a bounded number of rows.
//!
//! It forms exactly the batches, in exactly the order, of the general stream in `form.rs` (a test
//! compares the two on random configurations); only the bookkeeping differs. The open batch of each
//! bucket lives in fixed arrays indexed by a bucket *byte* — `len`, `capacity`, `longest` as
//! `[u32; 256]` (and the open batch's `tokens`), rows in one flat buffer at a fixed place per bucket — so the per-sample work is a
//! table load, two comparisons and three stores, with no bounds checks on the bucket arrays and no
//! `Vec` growth checks. Measured on the seed workload (callgrind, one thread): ~61 instructions a
//! sample with gathering and emission against ~70 for the general loop — emission (a `memcpy` of ~6
//! rows and an offset push per batch) is now a fifth of it.

use crate::config::Config;
use crate::form::{gather_block, Formed, GATHER_BLOCK};
use crate::lengths::Length;
use crate::rng::{shuffle, Pcg64, Stream};
use crate::rules::{table_entry_parts, NO_RULE};

/// Most rows, summed over buckets, that the flat buffer may hold (4 MB a stream); configurations with
/// larger batches use the general loop.
pub(crate) const MAX_FLAT_ROWS: usize = 1 << 20;

/// The open batches of every bucket.
pub(crate) struct Tight {
    len: [u32; 256],
    capacity: [u32; 256],
    longest: [u32; 256],
    /// Tokens of the open batch (for its mean length: `stratify.rs` ranks batches by it).
    tokens: [u64; 256],
    /// Where bucket `b`'s rows start in `rows` (each has room for its largest batch).
    base: [usize; 256],
    rows: Vec<u32>,
    buckets: usize,
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
            buckets: bucket_capacity.len(),
        })
    }
}

/// Streams `order` (its lengths in `values`, or looked up in `lengths`) through `table`, writing
/// closed batches back into `order` behind the read cursor, as the general stream does.
pub(crate) fn stream<L: Length>(
    config: &Config,
    table: &[u32],
    lengths: &[L],
    order: &mut [u32],
    values: Option<&[L]>,
    open: &mut Tight,
    formed: &mut Formed,
) {
    let mut rows = [0u32; GATHER_BLOCK];
    let mut block_lengths = [0u32; GATHER_BLOCK];
    for start in (0..order.len()).step_by(GATHER_BLOCK) {
        let count = gather_block(order, start, values, lengths, &mut rows, &mut block_lengths);
        for k in 0..count {
            let (row, length) = (rows[k], block_lengths[k]);
            let entry = table.get(length as usize).copied().unwrap_or(NO_RULE);
            if entry == NO_RULE {
                continue;
            }
            let (bucket, fits) = table_entry_parts(entry);
            let b = usize::from(bucket);
            let mut len = open.len[b];
            let mut capacity = open.capacity[b].min(fits);
            if len >= capacity {
                emit(config, order, formed, open, b);
                (len, capacity) = (0, fits);
            }
            open.rows[open.base[b] + len as usize] = row;
            len += 1;
            open.len[b] = len;
            open.capacity[b] = capacity;
            open.longest[b] = open.longest[b].max(length);
            open.tokens[b] += u64::from(length);
            if len >= capacity {
                emit(config, order, formed, open, b);
            }
        }
    }
}

/// Emits the batches still open in the seeded order of the general stream's flush.
pub(crate) fn flush(
    config: &Config,
    order: &mut [u32],
    open: &mut Tight,
    formed: &mut Formed,
    (epoch, segment): (u64, u32),
) {
    let mut leftover: Vec<usize> = (0..open.buckets).filter(|&b| open.len[b] > 0).collect();
    shuffle(
        &mut Pcg64::new(config.seed, epoch, Stream::Flush(segment)),
        &mut leftover,
    );
    for b in leftover {
        emit(config, order, formed, open, b);
    }
}

/// Writes bucket `b`'s open batch at the write cursor and closes it (safe in place: its rows were
/// all read from positions at or after the cursor).
fn emit(config: &Config, order: &mut [u32], formed: &mut Formed, open: &mut Tight, b: usize) {
    let len = open.len[b] as usize;
    let end = formed.written + len;
    order[formed.written..end].copy_from_slice(&open.rows[open.base[b]..open.base[b] + len]);
    formed.close(end, len, open.longest[b], open.tokens[b], config);
    open.len[b] = 0;
    open.capacity[b] = u32::MAX;
    open.longest[b] = 0;
    open.tokens[b] = 0;
}
