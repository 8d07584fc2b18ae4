//! Packed batches: samples concatenated end to end into rows of `max_tokens` tokens, for kernels
//! that take `cu_seqlens` (FlashAttention varlen, SDPA with document masks) and need no padding.
//!
//! A stream of samples in the epoch's random order is packed **best-fit over a bounded window**:
//! each sample goes into the open row (of at most [`WINDOW`], per length bucket when `bucketed`)
//! whose free room fits it most tightly (to within a room class of 4 tokens at C = 16,384); when
//! none has room, a new row opens, and when the window is full the fullest open row is closed to
//! make room. A row with no room for even the shortest sample closes at once. Which samples share a row
//! is therefore random every epoch — no sorting by decreasing length, which would make rows (and
//! consecutive batches) correlate with length — while the window keeps rows nearly full: on the seed
//! workload (C = 16,384) 0.9938 of every row is real tokens, against 0.9932 for a Python first-fit
//! over 64 rows (`benchmarks/packing.py`). First-fit by scanning the window cost ~300 instructions a
//! sample, search trees over the slots ~280, room classes with doubly linked lists ~170; stacks of
//! byte-sized slots per class, inlined into the stream, ~125 with the stream's own work (callgrind).
//! Closed rows are written back into the stream's own buffer behind the read cursor (every row
//! written was read already), as `form/stream.rs` does for padded batches, so packing needs no extra
//! epoch-sized memory. The rows are then ordered and rank-balanced like padded batches (by mean
//! sample length). Shuffled unbucketed epochs compose their rows instead (`compose.rs`: fill 0.9996
//! against 0.9938 here), but for epochs past `ARRANGE_MAX_SAMPLES` priced by tokens (`Config::
//! composes_rows`); those, sorted epochs and bucketed rows are packed here (best fit alone:
//! `bucketed=True` with one bucket).
//!
//! `bucketed`: each bucket has its own window, so a row holds samples of one length range and its
//! longest sample — the attention kernel's `max_seqlen` — is bounded by the bucket's top.

use crate::lengths::Length;
use crate::plan::config::{padded_piece, Config};
use crate::plan::form::batches::mean_length;
use crate::plan::form::rule::{closing_order, for_each_sample, Written};
use crate::plan::form::window::{Row, Window, WINDOW};
use crate::plan::rules::Rules;

/// The open rows of every bucket, and what closing needs.
pub(crate) struct Packer<'a> {
    config: &'a Config,
    rules: &'a Rules,
    capacity: u32,
    /// The shortest admitted length (padded as a piece): a row with less room than this is full.
    shortest: u32,
    /// Pieces are padded to a multiple of this (`Config::piece_multiple`; 1: none).
    multiple: u64,
    /// A row with this many samples is full (`max_docs_per_row`; `u32::MAX`: no cap).
    docs: u32,
    /// Each bucket's window, made when its first sample comes (boxed: a window is ~20 KB, and
    /// making one inline put a stack probe of that size into every placement).
    open: Vec<Option<Box<Window>>>,
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
            shortest: config.piece(shortest.max(1)),
            multiple: config.piece_multiple(),
            docs: config.docs_per_row(),
            open: (0..buckets).map(|_| None).collect(),
        }
    }

    /// Packs the samples of `out.order` (lengths in `values`, or looked up in `lengths`) in order,
    /// writing closed rows back into it behind the read cursor.
    pub(crate) fn stream<L: Length>(
        &mut self,
        lengths: &[L],
        out: &mut Written<'_>,
        values: Option<&[L]>,
    ) {
        for_each_sample(out, values, lengths, |out, (sample, length)| {
            let bucket = if self.open.len() == 1 {
                // One bucket (unbucketed packing): admission (a sample fits an empty row, as
                // the planner's rules say for packed mode) is the only question.
                if length > self.capacity {
                    return;
                }
                0
            } else {
                match self.rules.get(length) {
                    Some((bucket, _)) => bucket,
                    None => return,
                }
            };
            let fit = (self.capacity, self.shortest, self.docs);
            // A piece takes its padded length of the row (context parallelism, FP8 multiples).
            let length = padded_piece(length, self.multiple);
            place(fit, self.window(bucket), out, sample, length);
        });
    }

    /// `bucket`'s window, made if it has none yet.
    #[inline]
    fn window(&mut self, bucket: usize) -> &mut Window {
        let capacity = self.capacity;
        self.open[bucket].get_or_insert_with(|| new_window(capacity))
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
    pub(crate) fn flush(&mut self, out: &mut Written<'_>, flush_stream: Option<(u64, u32)>) {
        for b in self.bucket_order(flush_stream) {
            let Some(mut window) = self.open[b].take() else {
                continue;
            };
            for slot in 0..WINDOW {
                if window.is_open(slot) {
                    emit(self.capacity, out, &mut window.rows[slot]);
                }
            }
        }
    }

    /// Every bucket, in the order a stream's end visits their windows (see `rule.rs`).
    fn bucket_order(&self, flush_stream: Option<(u64, u32)>) -> Vec<usize> {
        closing_order(
            self.config.seed,
            (0..self.open.len()).collect(),
            flush_stream,
        )
    }
}

/// A window for rows of `capacity` tokens (out of line: see [`Packer::open`]).
#[cold]
#[inline(never)]
fn new_window(capacity: u32) -> Box<Window> {
    Box::new(Window::new(capacity))
}

/// Best fit in the window; else a new row in a free slot; else the fullest row closes and a new
/// one takes its slot. A row closes once it has less room than `shortest` or `docs` samples.
#[inline(always)]
fn place(
    (capacity, shortest, docs): (u32, u32, u32),
    window: &mut Window,
    out: &mut Written<'_>,
    sample: u32,
    length: u32,
) {
    let slot = match window.best_fit(length) {
        Some(class) => window.pop(class),
        None => match window.free.pop() {
            Some(slot) => slot,
            None => {
                // No slot is free, so every slot is in a class and `fullest` finds one.
                let class = window.fullest();
                debug_assert!(class.is_some());
                let fullest = window.pop(class.unwrap_or(0));
                emit(capacity, out, &mut window.rows[usize::from(fullest)]);
                fullest
            }
        },
    };
    let row = &mut window.rows[usize::from(slot)];
    row.samples.push(sample);
    row.used += length;
    row.squares += f64::from(length) * f64::from(length);
    let room = capacity - row.used;
    if room < shortest || row.samples.len() >= docs as usize {
        emit(capacity, out, row);
        window.free.push(slot);
    } else {
        window.push(slot, room);
    }
}

/// Writes `row` at the write cursor and closes it, leaving it empty (its buffer kept): it occupies
/// `capacity` tokens, its mean is `Σl / samples` and its cost `a·Σl + b·Σl²`.
fn emit(capacity: u32, out: &mut Written<'_>, row: &mut Row) {
    let (config, formed) = (out.config, &mut *out.formed);
    let end = formed.written + row.samples.len();
    out.order[formed.written..end].copy_from_slice(&row.samples);
    let (used, squares) = (row.used, row.squares);
    let cost = || {
        let model = config.balance_cost();
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
