//! Streaming an epoch: shuffled epochs past `ARRANGE_MAX_SAMPLES` samples and packed ones stream a
//! uniformly random permutation through the open batches of every bucket; sorted (evaluation)
//! epochs stream the rows sorted by length, and a bucket closes when the next one begins.
//!
//! Shuffled epochs stream fixed groups of the permutation's chunks in parallel (each flushes its own
//! partial batches at its end), then order and rank-balance each group's batches while its rows are
//! in cache (see [`Epoch`]). Which store keeps the open batches — flat arrays (`tight.rs`) when the
//! rules fit a table and batches are bounded, else a `Vec` per bucket (`open.rs`) — or whether a
//! packer does (`pack.rs`), is decided once, in [`Former::stream`].

use crate::lengths::Length;
use crate::plan::config::{Batching, Config, Mode};
use crate::plan::form::batches::{Epoch, Formed};
use crate::plan::form::choose::Labels;
use crate::plan::form::compose::compose;
use crate::plan::form::open::PerBucket;
use crate::plan::form::pack::Packer;
use crate::plan::form::rule::{flush, for_each_sample, take, Filling, OpenBatches, Written};
use crate::plan::form::tight::Tight;
use crate::plan::form::MAX_GROUPS;
use crate::plan::permute::{
    scatter_into_chunks, scatter_runs, shuffle_chunk, shuffle_chunk_pair, Runs, Scattered,
};
use crate::plan::rules::{table_lookup, Rules};
use crate::tasks::{run, split_chunks};

/// Where a stream ends: sorted epochs close every open batch in bucket order; a shuffled group
/// closes its padded batches in a seeded order, or hands its packed rows' samples on (`pack.rs`);
/// `Last`, the packed epoch's final stream, closes them in a seeded order.
#[derive(Clone, Copy)]
enum End {
    Sorted,
    Group(u64, u32),
    Last(u64, u32),
}

/// The read-only state the stream needs, borrowed from the planner for one epoch.
pub(crate) struct Former<'a, L> {
    pub(crate) lengths: &'a [L],
    pub(crate) config: &'a Config,
    pub(crate) rules: &'a Rules,
    /// Per bucket, the most rows any batch of it can hold.
    pub(crate) bucket_capacity: &'a [u32],
    /// Epoch size from which lengths travel with the permutation (see [`COMPANION_MIN_SAMPLES`]).
    pub(crate) companion_min: usize,
    /// Always keep open batches in the general store (tests compare it with `tight.rs`).
    pub(crate) general_only: bool,
    /// The shortest admitted length (a packed row with less room than this is full).
    pub(crate) shortest: u32,
    /// Whether epochs are small enough to order and balance their batches (`ARRANGE_MAX_SAMPLES`).
    pub(crate) arranged: bool,
    /// A mixture's sources: each group's batches are then chosen for them (`choose.rs`).
    pub(crate) labels: Option<&'a Labels>,
}

impl<L: Length> Former<'_, L> {
    /// Forms the sorted (evaluation) epoch: one stream of the rows sorted by `(length, row)`.
    pub(crate) fn form_sorted(&self) -> (Vec<u32>, Epoch) {
        let mut order = sorted_by_length(self.lengths);
        let mut formed = Formed::new(false);
        self.stream(&mut order, None, &mut formed, End::Sorted);
        formed.main = formed.offsets.len() - 1;
        let mut total = Epoch::with_room(formed.main, self.config.world_size);
        total.append(&mut order, 0, formed);
        total.finish(&mut order);
        (order, total)
    }

    /// Forms a shuffled epoch of every row, or of `population` (a mixture's selection: rows,
    /// repeated where a source is up-sampled, with their lengths, where its groups hold them). The
    /// permutation's chunks are grouped into fixed groups (set by `n` alone); each parallel task
    /// shuffles its group's chunks and streams them right away while they are in cache, writing
    /// batches into the group's own slice and flushing its partial batches at its end. The groups
    /// are then concatenated, closing any gaps left by skipped samples.
    pub(crate) fn form_shuffled(
        &self,
        population: Option<Runs<'_>>,
        epoch: u64,
        pool: Option<&rayon::ThreadPool>,
    ) -> (Vec<u32>, Epoch) {
        let seed = self.config.seed;
        let n = population.map_or(self.lengths.len(), |runs| runs.len());
        let arranged = self.arranged;
        // Past a few cache sizes the stream's random length lookups go to DRAM; then the scatter
        // carries each row's length along (one sequential read) so the stream reads them in order.
        // A population carries its lengths anyway.
        let source = (n >= self.companion_min).then_some(self.lengths);
        let Scattered {
            rows: mut order,
            mut companion,
            starts,
        } = match population {
            Some(runs) => scatter_runs(runs, seed, epoch, pool),
            None => scatter_into_chunks(n, None, source, seed, epoch, pool),
        };
        let chunks = starts.len() - 1;
        let groups = chunks.min(MAX_GROUPS);
        let group_starts: Vec<usize> = (0..=groups).map(|g| starts[g * chunks / groups]).collect();
        let pieces = split_chunks(&mut order, &group_starts);
        let values: Vec<Option<&mut [L]>> = match &mut companion {
            Some(values) => split_chunks(values, &group_starts)
                .into_iter()
                .map(Some)
                .collect(),
            None => pieces.iter().map(|_| None).collect(),
        };
        let tasks: Vec<_> = pieces.into_iter().zip(values).enumerate().collect();
        let parts = run(pool, tasks, |(g, (piece, mut values))| {
            let (first, base) = (g * chunks / groups, group_starts[g]);
            let bounds: Vec<usize> = starts[first..=(g + 1) * chunks / groups]
                .iter()
                .map(|s| s - base)
                .collect();
            match values.as_deref_mut() {
                Some(values) => {
                    let chunked = split_chunks(piece, &bounds)
                        .into_iter()
                        .zip(split_chunks(values, &bounds));
                    for (k, (chunk, chunk_values)) in chunked.enumerate() {
                        shuffle_chunk_pair(seed, epoch, first + k, chunk, chunk_values);
                    }
                }
                None => {
                    for (k, chunk) in split_chunks(piece, &bounds).into_iter().enumerate() {
                        shuffle_chunk(seed, epoch, first + k, chunk);
                    }
                }
            }
            let mut formed = Formed::new(arranged);
            // Groups number at most MAX_GROUPS.
            #[allow(clippy::cast_possible_truncation)]
            let group = g as u32;
            // Batches closed full; the partial ones flushed after them stay at the group's end.
            let end = End::Group(epoch, group);
            let composed = self.composed_capacity();
            let complete = match composed {
                Some(capacity) => {
                    let (config, values) = ((self.config, capacity), values.as_deref());
                    compose(
                        piece,
                        values,
                        self.lengths,
                        config,
                        (epoch, group),
                        &mut formed,
                    );
                    formed.offsets.len() - 1
                }
                None => self.stream(piece, values.as_deref(), &mut formed, end),
            };
            formed.main = formed.offsets.len() - 1;
            if arranged {
                let arranged = composed.is_some();
                self.arrange_and_balance(piece, &mut formed, complete, (epoch, group), arranged);
            } else {
                self.choose_in_place(piece, &mut formed, complete);
            }
            formed
        });

        drop(companion);
        let batches: usize = parts.iter().map(|p| p.offsets.len() - 1).sum();
        let mut total = Epoch::with_room(batches, self.config.world_size);
        for (g, part) in parts.into_iter().enumerate() {
            total.append(&mut order, group_starts[g], part);
        }
        total.finish(&mut order);
        if matches!(self.config.mode, Mode::Packed { .. }) {
            // Rows the groups left open, packed together (see `pack.rs`); they join the tail.
            let mut rows = std::mem::take(&mut total.leftover);
            let mut formed = Formed::new(arranged);
            // The epoch's last stream: its own flush stream id, after the groups'.
            #[allow(clippy::cast_possible_truncation)]
            let last = End::Last(epoch, MAX_GROUPS as u32);
            self.stream(&mut rows, None, &mut formed, last);
            total.push_rows(&mut order, &rows, formed);
        }
        (order, total)
    }

    /// Streams `order` (lengths in `values`, or looked up) into `formed`, ending as `end` says;
    /// returns how many batches closed full (before the end closed the rest). The one place that
    /// chooses how a stream keeps its open batches.
    fn stream(
        &self,
        order: &mut [u32],
        values: Option<&[L]>,
        formed: &mut Formed,
        end: End,
    ) -> usize {
        let mut out = Written {
            order,
            formed,
            config: self.config,
        };
        if let Some(mut packer) = self.packer() {
            packer.stream(self.lengths, &mut out, values);
            let complete = out.formed.offsets.len() - 1;
            match end {
                End::Group(epoch, group) => out.formed.leftover = packer.leftovers((epoch, group)),
                End::Sorted => packer.flush(&mut out, None),
                End::Last(epoch, group) => packer.flush(&mut out, Some((epoch, group))),
            }
            return complete;
        }
        let table = self.rules.table.as_deref();
        let tight = table
            .filter(|_| !self.general_only)
            .and_then(|_| Tight::new(self.bucket_capacity));
        match (table, tight) {
            (Some(table), Some(mut open)) => {
                self.padded(&mut open, &mut out, values, |l| table_lookup(table, l), end)
            }
            (Some(table), None) => {
                let mut open = PerBucket::new(self.bucket_capacity);
                self.padded(&mut open, &mut out, values, |l| table_lookup(table, l), end)
            }
            (None, _) => {
                let mut open = PerBucket::new(self.bucket_capacity);
                self.padded(&mut open, &mut out, values, |l| self.rules.compute(l), end)
            }
        }
    }

    /// [`Self::stream_padded`] compiled for sorted input or not.
    #[inline(always)]
    fn padded<O: for<'w> OpenBatches<Written<'w>>>(
        &self,
        open: &mut O,
        out: &mut Written<'_>,
        values: Option<&[L]>,
        lookup: impl Fn(u32) -> Option<(usize, u32)>,
        end: End,
    ) -> usize {
        if matches!(end, End::Sorted) {
            self.stream_padded::<true, _>(open, out, values, lookup, end)
        } else {
            self.stream_padded::<false, _>(open, out, values, lookup, end)
        }
    }

    /// A padded stream through the rule ([`take`]), its open batches in `open`, each length's
    /// bucket and `fits` from `lookup`. `SORTED`: the input is sorted by length, so a bucket is
    /// complete when the next one starts.
    // Each instance its own function: one loop's registers are not shared with five others'.
    #[inline(never)]
    fn stream_padded<const SORTED: bool, O: for<'w> OpenBatches<Written<'w>>>(
        &self,
        open: &mut O,
        out: &mut Written<'_>,
        values: Option<&[L]>,
        lookup: impl Fn(u32) -> Option<(usize, u32)>,
        end: End,
    ) -> usize {
        let mut previous = usize::MAX;
        for_each_sample(out, values, self.lengths, |out, (row, length)| {
            let Some((b, fits)) = lookup(length) else {
                return;
            };
            if SORTED {
                if previous != b && previous != usize::MAX && open.get(previous).len > 0 {
                    open.close(previous, &open.get(previous), out);
                    open.set(previous, Filling::EMPTY);
                }
                previous = b;
            }
            take(open, out, b, fits, (row, length));
        });
        let complete = out.formed.offsets.len() - 1;
        let flush_stream = match end {
            End::Sorted => None,
            End::Group(epoch, group) | End::Last(epoch, group) => Some((epoch, group)),
        };
        let buckets = self.bucket_capacity.len();
        flush(open, out, self.config.seed, buckets, flush_stream);
        complete
    }

    /// The row capacity of epochs whose groups are composed by attention (`compose.rs`): see
    /// `Config::composes_rows`.
    fn composed_capacity(&self) -> Option<u32> {
        match self.config.batching {
            Batching::Tokens(t) if self.config.composes_rows(self.arranged) => {
                Some(u32::try_from(t).unwrap_or(u32::MAX))
            }
            _ => None,
        }
    }

    /// The packer of packed epochs (`pack.rs`), `None` for padded ones.
    fn packer(&self) -> Option<Packer<'_>> {
        let Mode::Packed { .. } = self.config.mode else {
            return None;
        };
        let capacity = match self.config.batching {
            Batching::Tokens(t) => u32::try_from(t).unwrap_or(u32::MAX),
            Batching::Rows(_) => return None,
        };
        let buckets = self.bucket_capacity.len();
        Some(Packer::new(
            self.config,
            self.rules,
            buckets,
            capacity,
            self.shortest,
        ))
    }
}

/// Rows sorted by `(length, row)`: a counting sort when lengths are bounded, else a stable sort.
pub(crate) fn sorted_by_length<L: Length>(lengths: &[L]) -> Vec<u32> {
    let longest: u32 = lengths.iter().copied().max().map_or(0, Into::into);
    // Rows fit in u32: the planner rejects more samples than that.
    #[allow(clippy::cast_possible_truncation)]
    let rows = 0..lengths.len() as u32;
    if longest > 1 << 22 {
        let mut order: Vec<u32> = rows.collect();
        order.sort_by_key(|&r| lengths[r as usize]);
        return order;
    }
    let mut next = vec![0usize; longest as usize + 2];
    let index = |l: L| Into::<u32>::into(l) as usize;
    for &l in lengths {
        next[index(l) + 1] += 1;
    }
    for i in 1..next.len() {
        next[i] += next[i - 1];
    }
    let mut order = vec![0u32; lengths.len()];
    for (row, &l) in rows.zip(lengths) {
        order[next[index(l)]] = row;
        next[index(l)] += 1;
    }
    order
}
