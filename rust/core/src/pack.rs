//! Packed batches: samples concatenated end to end into rows of `max_tokens` tokens, for kernels
//! that take `cu_seqlens` (FlashAttention varlen, SDPA with document masks) and need no padding.
//!
//! A stream of samples in the epoch's random order is packed **best-fit over a bounded window**:
//! each sample goes into the open row (of at most [`WINDOW`], per length bucket when `bucketed`)
//! whose free room fits it most tightly (to within a room class); when none has room, a new row
//! opens, and when the window is full the fullest open row is closed to make room. A row with no room for even the shortest sample closes at once. Which samples share a row
//! is therefore random every epoch — no sorting by decreasing length, which would make rows (and
//! consecutive batches) correlate with length — while the window keeps rows nearly full: on the seed
//! workload (C = 16,384) 0.9938 of every row is real tokens, against 0.9932 for a Python first-fit
//! over 64 rows (`benchmarks/packing.py`). First-fit by scanning the window cost ~300 instructions a
//! sample, search trees over the slots ~280; room classes with linked lists ~130 (measured).
//! Closed rows are written back into the stream's own buffer behind the read cursor (every row
//! written was read already), as `form.rs` does for padded batches, so packing needs no extra
//! epoch-sized memory. The rows are then ordered and rank-balanced like padded batches (by mean
//! sample length; cost `a·Σl + b·Σl²`).
//!
//! `bucketed`: each bucket has its own window, so a row holds samples of one length range and its
//! longest sample — the attention kernel's `max_seqlen` — is bounded by the bucket's top.

use crate::config::Config;
use crate::form::{gather_block, mean_length, Formed, GATHER_BLOCK};
use crate::lengths::Length;
use crate::rng::{shuffle, Pcg64, Stream};
use crate::rules::Rules;

/// Open rows per bucket. Rows are indexed by their free room, so a placement costs the same for
/// any window (tens of instructions); the window only trades fill for the rows left open at the
/// end of the epoch. Rows left open when a forming group ends are packed again together at the end
/// of the epoch (`leftovers`), so 16 groups do not leave 16 windows of half-full rows.
pub(crate) const WINDOW: usize = 256;

/// One open row.
#[derive(Debug, Default)]
struct Row {
    samples: Vec<u32>,
    used: u32,
    squares: f64,
}

/// Room classes: a row with `room` free tokens is in class `room >> shift`, at most this many.
const CLASSES: usize = 1024;

/// Rows of the sample's own class looked at for the tightest fit before taking one of the next
/// class: nearly full rows crowd the low classes, and walking all of them cost more than the rest
/// of a placement (measured).
const OWN_CLASS_LOOK: usize = 8;

// `Window::summary` has a bit per word of the class bitmap.
const _: () = assert!(CLASSES / 64 <= 64);

/// No slot (end of a class list, or a free slot's class).
const NONE: u16 = u16::MAX;

/// A bucket's open rows in fixed slots, indexed by free room: each class is a doubly linked list of
/// the slots whose room is in `[c << shift, (c + 1) << shift)` (fixed arrays, no allocation per
/// sample), and a bitmap marks the classes that hold any.
struct Window {
    rows: Vec<Row>,
    room: [u32; WINDOW],
    head: [u16; CLASSES],
    next: [u16; WINDOW],
    prev: [u16; WINDOW],
    /// The class of each open slot; `NONE` for a free slot.
    class_of: [u16; WINDOW],
    nonempty: [u64; CLASSES / 64],
    /// Bit `w` set when word `w` of `nonempty` is: finding the next class takes two bit scans, where
    /// walking the words was a quarter of a placement (measured).
    summary: u64,
    free: Vec<u16>,
    shift: u32,
}

impl Window {
    fn new(capacity: u32) -> Self {
        // The smallest shift that maps every room up to `capacity` below CLASSES.
        let shift = (0..32)
            .find(|&s| ((capacity >> s) as usize) < CLASSES)
            .unwrap_or(31);
        Self {
            rows: (0..WINDOW).map(|_| Row::default()).collect(),
            room: [0; WINDOW],
            head: [NONE; CLASSES],
            next: [NONE; WINDOW],
            prev: [NONE; WINDOW],
            class_of: [NONE; WINDOW],
            nonempty: [0; CLASSES / 64],
            summary: 0,
            // Slots fit in u16 (WINDOW < 65535); the lowest is taken first.
            #[allow(clippy::cast_possible_truncation)]
            free: (0..WINDOW as u16).rev().collect(),
            shift,
        }
    }

    fn class(&self, room: u32) -> usize {
        (room >> self.shift) as usize
    }

    /// The first nonempty class at or above `from`.
    fn next_class(&self, from: usize) -> Option<usize> {
        let word = from / 64;
        let bits = self.nonempty.get(word)? & (u64::MAX << (from % 64));
        if bits != 0 {
            return Some(word * 64 + bits.trailing_zeros() as usize);
        }
        // Words above `word` that hold a class (`word + 1` ≤ 16 < 64, so the shift is in range).
        let later = self.summary & (u64::MAX << (word + 1));
        if later == 0 {
            return None;
        }
        let word = later.trailing_zeros() as usize;
        Some(word * 64 + self.nonempty[word].trailing_zeros() as usize)
    }

    /// Best fit (to within a class): the tightest fitting row of the class of `length` itself, else
    /// a row of the lowest class above it (which surely fits).
    fn best_fit(&self, length: u32) -> Option<usize> {
        let own = self.class(length);
        let mut best: Option<usize> = None;
        let mut at = self.head.get(own).copied().unwrap_or(NONE);
        for _ in 0..OWN_CLASS_LOOK {
            if at == NONE {
                break;
            }
            let slot = usize::from(at);
            let room = self.room[slot];
            if room >= length && best.is_none_or(|b| room < self.room[b]) {
                best = Some(slot);
            }
            at = self.next[slot];
        }
        best.or_else(|| {
            let c = self.next_class(own + 1)?;
            Some(usize::from(self.head[c]))
        })
    }

    /// An open row with the least room (the head of the lowest nonempty class).
    fn fullest(&self) -> Option<usize> {
        let c = self.next_class(0)?;
        Some(usize::from(self.head[c]))
    }

    /// Whether `slot` holds an open row.
    fn is_open(&self, slot: usize) -> bool {
        self.class_of[slot] != NONE
    }

    /// Removes `slot` from its class.
    fn unindex(&mut self, slot: usize) {
        let class = self.class_of[slot];
        if class == NONE {
            return;
        }
        let c = usize::from(class);
        let (before, after) = (self.prev[slot], self.next[slot]);
        if before == NONE {
            self.head[c] = after;
        } else {
            self.next[usize::from(before)] = after;
        }
        if after != NONE {
            self.prev[usize::from(after)] = before;
        }
        if self.head[c] == NONE {
            self.nonempty[c / 64] &= !(1 << (c % 64));
            if self.nonempty[c / 64] == 0 {
                self.summary &= !(1 << (c / 64));
            }
        }
        self.class_of[slot] = NONE;
    }

    /// Indexes `slot` with `room` free tokens (at the head of its class).
    fn index(&mut self, slot: usize, room: u32) {
        self.room[slot] = room;
        let c = self.class(room);
        let first = self.head[c];
        // Slots and classes fit in u16 (WINDOW, CLASSES < 65535).
        #[allow(clippy::cast_possible_truncation)]
        {
            self.next[slot] = first;
            self.prev[slot] = NONE;
            if first != NONE {
                self.prev[usize::from(first)] = slot as u16;
            }
            self.head[c] = slot as u16;
            self.class_of[slot] = c as u16;
        }
        self.nonempty[c / 64] |= 1 << (c % 64);
        self.summary |= 1 << (c / 64);
    }
}

/// The open rows of every bucket, and what closing needs.
pub(crate) struct Packer<'a> {
    config: &'a Config,
    rules: &'a Rules,
    capacity: u32,
    /// The shortest admitted length: a row with less room than this is full.
    shortest: u32,
    open: Vec<Option<Window>>,
}

impl<'a> Packer<'a> {
    /// A packer for rows of `capacity` tokens over the buckets of `rules` (one bucket unless
    /// bucketed), whose shortest admitted sample has `shortest` tokens.
    pub(crate) fn new(
        config: &'a Config,
        rules: &'a Rules,
        buckets: usize,
        capacity: u32,
        shortest: u32,
    ) -> Self {
        Self {
            config,
            rules,
            capacity,
            shortest: shortest.max(1),
            open: (0..buckets).map(|_| None).collect(),
        }
    }

    /// Packs the samples of `order` (lengths in `values`, or looked up in `lengths`) in order,
    /// writing closed rows back into `order` behind the read cursor.
    pub(crate) fn stream<L: Length>(
        &mut self,
        lengths: &[L],
        order: &mut [u32],
        values: Option<&[L]>,
        formed: &mut Formed,
    ) {
        let mut rows = [0u32; GATHER_BLOCK];
        let mut block_lengths = [0u32; GATHER_BLOCK];
        for start in (0..order.len()).step_by(GATHER_BLOCK) {
            let count = gather_block(order, start, values, lengths, &mut rows, &mut block_lengths);
            for k in 0..count {
                let (sample, length) = (rows[k], block_lengths[k]);
                let bucket = if self.open.len() == 1 {
                    // One bucket (unbucketed packing): admission (a sample fits an empty row, as
                    // the planner's rules say for packed mode) is the only question.
                    if length > self.capacity {
                        continue;
                    }
                    0
                } else {
                    match self.rules.get(length) {
                        Some((bucket, _)) => bucket,
                        None => continue,
                    }
                };
                self.place(order, formed, bucket, sample, length);
            }
        }
    }

    /// Best fit in `bucket`'s window; else a new row in a free slot; else the fullest row closes
    /// and a new one takes its slot.
    fn place(
        &mut self,
        order: &mut [u32],
        formed: &mut Formed,
        bucket: usize,
        sample: u32,
        length: u32,
    ) {
        let (config, capacity, shortest) = (self.config, self.capacity, self.shortest);
        let window = self.open[bucket].get_or_insert_with(|| Window::new(capacity));
        let slot = match window.best_fit(length) {
            Some(slot) => {
                window.unindex(slot);
                slot
            }
            None => match window.free.pop() {
                Some(slot) => usize::from(slot),
                None => {
                    let fullest = window.fullest().unwrap_or(0);
                    window.unindex(fullest);
                    emit(config, capacity, order, formed, &mut window.rows[fullest]);
                    fullest
                }
            },
        };
        let row = &mut window.rows[slot];
        row.samples.push(sample);
        row.used += length;
        row.squares += f64::from(length) * f64::from(length);
        let room = capacity - row.used;
        if room < shortest {
            emit(config, capacity, order, formed, &mut window.rows[slot]);
            // Slots fit in u16.
            #[allow(clippy::cast_possible_truncation)]
            window.free.push(slot as u16);
        } else {
            window.index(slot, room);
        }
    }

    /// The samples of every open row, emptying the window (at the end of a forming group: they are
    /// packed again with the other groups' at the end of the epoch). Buckets go in a seeded order,
    /// slots in order.
    pub(crate) fn leftovers(&mut self, flush_stream: (u64, u32)) -> Vec<u32> {
        let mut samples = Vec::new();
        for b in self.bucket_order(Some(flush_stream)) {
            let Some(mut window) = self.open[b].take() else {
                continue;
            };
            for slot in 0..WINDOW {
                if window.is_open(slot) {
                    samples.append(&mut window.rows[slot].samples);
                }
            }
        }
        samples
    }

    /// Closes every open row (at the end of the epoch's last stream), buckets in a seeded order
    /// for shuffled epochs, slots in order.
    pub(crate) fn flush(
        &mut self,
        order: &mut [u32],
        formed: &mut Formed,
        flush_stream: Option<(u64, u32)>,
    ) {
        for b in self.bucket_order(flush_stream) {
            let Some(mut window) = self.open[b].take() else {
                continue;
            };
            for slot in 0..WINDOW {
                if window.is_open(slot) {
                    emit(
                        self.config,
                        self.capacity,
                        order,
                        formed,
                        &mut window.rows[slot],
                    );
                }
            }
        }
    }

    fn bucket_order(&self, flush_stream: Option<(u64, u32)>) -> Vec<usize> {
        let mut buckets: Vec<usize> = (0..self.open.len()).collect();
        if let Some((epoch, segment)) = flush_stream {
            let mut rng = Pcg64::new(self.config.seed, epoch, Stream::Flush(segment));
            shuffle(&mut rng, &mut buckets);
        }
        buckets
    }
}

/// Writes `row` at the write cursor and closes it, leaving it empty (its buffer kept): it occupies
/// `capacity` tokens, its mean is `Σl / samples` and its cost `a·Σl + b·Σl²`.
fn emit(config: &Config, capacity: u32, order: &mut [u32], formed: &mut Formed, row: &mut Row) {
    let end = formed.written + row.samples.len();
    order[formed.written..end].copy_from_slice(&row.samples);
    let (used, squares) = (row.used, row.squares);
    let cost = || {
        let model = config.cost;
        // Matched, not summed (see `Formed::cost`).
        #[allow(clippy::cast_possible_truncation)]
        let cost = (model.linear * f64::from(used) + model.quadratic * squares) as f32;
        cost
    };
    let mean = mean_length(u64::from(used), row.samples.len() as u64);
    formed.record(end, u64::from(capacity), mean, cost);
    row.samples.clear();
    row.used = 0;
    row.squares = 0.0;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The two-level bitmap finds the same class as scanning every class would.
    #[test]
    fn next_class_is_the_first_nonempty_class_at_or_above() {
        let mut window = Window::new(16_384);
        let mut rng = Pcg64::new(1, 2, Stream::Workload);
        for _ in 0..2_000 {
            // Slots and rooms fit their types (WINDOW slots, rooms below the capacity).
            #[allow(clippy::cast_possible_truncation)]
            let (slot, room) = (rng.below(WINDOW as u64) as usize, rng.below(16_384) as u32);
            if window.is_open(slot) {
                window.unindex(slot);
            } else {
                window.index(slot, room);
            }
            let naive = |from: usize| (from..CLASSES).find(|&c| window.head[c] != NONE);
            for from in [0, 1, 63, 64, 65, 300, 511, 512, 1000, 1023] {
                assert_eq!(window.next_class(from), naive(from), "from {from}");
            }
        }
    }
}
