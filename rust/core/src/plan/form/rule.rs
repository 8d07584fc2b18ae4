//! The forming rule and the pass that applies it, written once for every way an epoch is formed.
//!
//! **The rule.** A padded batch closes when the next sample would break the batching rule
//! (`batch_size` rows, or `rows × cost(round_up(longest)) ≤ max_tokens`: [`Rules`] turns both into
//! `fits(length)`, the most rows a batch holding that length may have), or as soon as it is full —
//! no sample of its bucket could still join, since a sample's `fits` is at most that of its bucket's
//! shortest length. [`take`] applies it to one sample and its bucket's open batch, whatever keeps
//! the batch ([`OpenBatches`]): a `Vec` per bucket (`open.rs`), flat arrays indexed by a bucket byte
//! (`tight.rs`), or a run of a shuffled bucket (`cut.rs`). Each is a type, so every
//! combination is compiled into its own loop with nothing dispatched per sample. Packed rows have
//! their own rule, best fit over a window (`pack.rs`).
//!
//! **The pass.** A stream reads its rows in blocks whose lengths are gathered first
//! ([`for_each_sample`]) and writes each closed batch back into the same buffer *behind* the read
//! cursor — every row written has already been read — so an epoch needs one `u32` per sample.
//!
//! [`Rules`]: crate::plan::rules::Rules

use crate::lengths::Length;
use crate::plan::config::Config;
use crate::plan::form::batches::Formed;
use crate::rng::{shuffle, Pcg64, Stream};

/// Rows whose lengths are gathered together before forming (see [`for_each_sample`]).
pub(crate) const GATHER_BLOCK: usize = 256;

/// One open padded batch: its rows, how many more it may take, and what closing records.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Filling {
    pub(crate) len: u32,
    /// The most rows this batch may hold given its members: the smallest member `fits`.
    pub(crate) capacity: u32,
    pub(crate) longest: u32,
    /// Sum of the members' lengths.
    pub(crate) tokens: u64,
}

impl Filling {
    /// No rows yet.
    pub(crate) const EMPTY: Self = Self {
        len: 0,
        capacity: u32::MAX,
        longest: 0,
        tokens: 0,
    };
}

/// Where a forming loop keeps the open batch of each bucket, and where a closed one goes (`Out`).
pub(crate) trait OpenBatches<Out> {
    /// Bucket `bucket`'s open batch.
    fn get(&self, bucket: usize) -> Filling;
    /// Stores bucket `bucket`'s open batch.
    fn set(&mut self, bucket: usize, fill: Filling);
    /// `row` joins bucket `bucket`'s open batch as its row `at`.
    fn join(&mut self, bucket: usize, at: u32, row: u32);
    /// Closes bucket `bucket`'s open batch, `fill`, into `out` (the caller empties it).
    fn close(&mut self, bucket: usize, fill: &Filling, out: &mut Out);
}

/// The rule: `row` (of `length`, allowing `fits` rows) joins `bucket`'s open batch, which closes
/// first if the row cannot join, and after if it is then full. The batch is read once and stored
/// once, so it stays in registers.
#[inline(always)]
pub(crate) fn take<Out, O: OpenBatches<Out>>(
    open: &mut O,
    out: &mut Out,
    bucket: usize,
    fits: u32,
    (row, length): (u32, u32),
) {
    let mut fill = open.get(bucket);
    let limit = fill.capacity.min(fits);
    if fill.len >= limit {
        open.close(bucket, &fill, out);
        fill = Filling {
            capacity: fits,
            ..Filling::EMPTY
        };
    } else {
        fill.capacity = limit;
    }
    open.join(bucket, fill.len, row);
    fill.len += 1;
    fill.longest = fill.longest.max(length);
    fill.tokens += u64::from(length);
    if fill.len >= fill.capacity {
        open.close(bucket, &fill, out);
        fill = Filling::EMPTY;
    }
    open.set(bucket, fill);
}

/// The buffer a stream reads and writes closed batches back into, and the record of them.
pub(crate) struct Written<'a> {
    pub(crate) order: &'a mut [u32],
    pub(crate) formed: &'a mut Formed,
    pub(crate) config: &'a Config,
}

impl Written<'_> {
    /// Writes a closed padded batch's `rows` at the write cursor and records it. Safe in place:
    /// every row of an open batch was read from a position at or after the cursor.
    #[inline]
    pub(crate) fn put(&mut self, rows: &[u32], batch: &Filling) {
        let end = self.formed.written + rows.len();
        self.order[self.formed.written..end].copy_from_slice(rows);
        self.formed
            .close(end, rows.len(), batch.longest, batch.tokens, self.config);
    }
}

/// The pass: every row of `out.order` in order, with its length (from `values` when the scatter
/// carried them, else looked up in `lengths`), handed to `take` with the buffer to write batches
/// into.
#[inline(always)]
pub(crate) fn for_each_sample<L: Length>(
    out: &mut Written<'_>,
    values: Option<&[L]>,
    lengths: &[L],
    mut take: impl FnMut(&mut Written<'_>, (u32, u32)),
) {
    let mut rows = [0u32; GATHER_BLOCK];
    let mut block_lengths = [0u32; GATHER_BLOCK];
    for start in (0..out.order.len()).step_by(GATHER_BLOCK) {
        let count = gather_block(
            out.order,
            start,
            values,
            lengths,
            &mut rows,
            &mut block_lengths,
        );
        for k in 0..count {
            take(out, (rows[k], block_lengths[k]));
        }
    }
}

/// Copies the block of `order` at `start` into `rows` and its lengths into `block_lengths`;
/// returns the block's size. Rows and lengths are copied out first because the length loads are
/// random and overlap when issued together, where loads interleaved with the forming logic would
/// wait one by one. Out of line: the forming loop stays small.
#[inline(never)]
fn gather_block<L: Length>(
    order: &[u32],
    start: usize,
    values: Option<&[L]>,
    lengths: &[L],
    rows: &mut [u32; GATHER_BLOCK],
    block_lengths: &mut [u32; GATHER_BLOCK],
) -> usize {
    let block = &order[start..(start + GATHER_BLOCK).min(order.len())];
    let count = block.len();
    rows[..count].copy_from_slice(block);
    match values {
        // Carried by the scatter: `values[i]` is the length of `order[i]`.
        Some(values) => {
            for (slot, &l) in block_lengths.iter_mut().zip(&values[start..start + count]) {
                *slot = l.into();
            }
        }
        None => {
            for (slot, &row) in block_lengths.iter_mut().zip(block) {
                *slot = lengths[row as usize].into();
            }
        }
    }
    count
}

/// `buckets` in the order a stream's end closes their open batches: shuffled with the stream's
/// own seeded draw for shuffled epochs (`flush_stream`: the epoch and the stream's number), as
/// given for sorted ones.
pub(crate) fn closing_order(
    seed: u64,
    mut buckets: Vec<usize>,
    flush_stream: Option<(u64, u32)>,
) -> Vec<usize> {
    if let Some((epoch, segment)) = flush_stream {
        shuffle(
            &mut Pcg64::new(seed, epoch, Stream::Flush(segment)),
            &mut buckets,
        );
    }
    buckets
}

/// Closes the batches of `buckets` buckets still open at a stream's end, in [`closing_order`].
pub(crate) fn flush<Out, O: OpenBatches<Out>>(
    open: &mut O,
    out: &mut Out,
    seed: u64,
    buckets: usize,
    flush_stream: Option<(u64, u32)>,
) {
    let open_ones = (0..buckets).filter(|&b| open.get(b).len > 0).collect();
    for b in closing_order(seed, open_ones, flush_stream) {
        open.close(b, &open.get(b), out);
        open.set(b, Filling::EMPTY);
    }
}
