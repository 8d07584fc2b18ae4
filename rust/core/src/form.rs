//! Forming batches from a stream of samples: the hot loop of planning.
//!
//! Each admitted sample joins the open batch of its bucket; a batch is closed when the next sample
//! would break the rule (`batch_size` rows, or `rows × round_up(longest, pad_to_multiple_of) ≤
//! max_tokens`) or when no sample of its bucket could still fit. A closed batch is written back into
//! the same buffer *behind* the read cursor — every row written has already been read — so an epoch
//! needs one `u32` per sample and nothing more. Batches therefore appear in the order they fill.
//!
//! Shuffled epochs stream fixed groups of the permutation's chunks in parallel (each flushes its own
//! partial batches at its end), then order and rank-balance each group's batches while its rows are
//! in cache (see [`Epoch`]); sorted epochs are one stream in which a bucket closes when the next
//! begins. When the rules fit a table and batches are bounded, shuffled epochs run the specialised
//! loop of `fast_stream.rs`, which forms the same batches with less bookkeeping. Packed epochs
//! (`pack.rs`) stream the same groups through a packer instead.
//!
//! Shuffled *padded* epochs of up to [`ARRANGE_MAX_SAMPLES`] samples do not stream: `by_bucket.rs`
//! forms them with a third of the work (6.4 against 16.5 ms an epoch on the seed workload, 2
//! threads, measured), at 16 more bytes a sample. The stream stays for larger epochs, where that
//! memory matters, and for packed ones.

use crate::balance::{match_windows, stream, Unit};
use crate::config::{Batching, Config, Mode};
use crate::fast_stream::{self, Tight};
use crate::lengths::Length;
use crate::order::reorder_region;
use crate::pack::Packer;
use crate::permute::{
    run, scatter_into_chunks, shuffle_chunk, shuffle_chunk_pair, split_chunks, Scattered,
};
use crate::rng::{shuffle, Pcg64, Stream};
use crate::rules::{table_lookup, Rules};
use crate::stratify::arrange;

/// Samples from which the scatter carries lengths along for the stream: below, the lengths array
/// (2 or 4 bytes a sample) stays in cache and random lookups are cheaper than a second buffer.
pub(crate) const COMPANION_MIN_SAMPLES: usize = 1 << 23;

/// Epochs up to this size are formed bucket by bucket (padded: `by_bucket.rs`) and have their batches
/// ordered by `stratify.rs` and balanced by `balance.rs`; larger ones stream and keep formation
/// order. Ordering moves every row once more, through a group-sized buffer, in a random batch order,
/// and keeps a cost and a mean length per batch: at 1M samples that costs ~2.5 ms, but at 100M it
/// doubled the epoch's time (1.9 → 3.9 s) and pushed peak memory past 1 GB (measured), where
/// formation order already mixes fairly (window_tv ≈ 0.15).
pub(crate) const ARRANGE_MAX_SAMPLES: usize = 1 << 24;

/// Most parallel forming groups: enough for 16 threads; each flushes its partial batches at its end.
const MAX_GROUPS: usize = 16;

/// Rows whose lengths are gathered together before forming (see [`gather_block`]).
pub(crate) const GATHER_BLOCK: usize = 256;

/// A batch being filled while the epoch streams by.
#[derive(Debug)]
struct Open {
    rows: Vec<u32>,
    longest: u32,
    /// Sum of the members' lengths.
    tokens: u64,
    /// The most rows this batch may hold given its members: the smallest member capacity. A batch
    /// that reaches it is full — no sample of any length could join — since a sample's capacity is
    /// at most that of the bucket's shortest length, which bounds every member's.
    capacity: u32,
}

impl Open {
    /// An empty batch with room for `full` rows, the most any batch of its bucket holds.
    fn new(full: u32) -> Self {
        let rows = Vec::with_capacity(full.min(1 << 16) as usize);
        Self {
            rows,
            longest: 0,
            tokens: 0,
            capacity: u32::MAX,
        }
    }
}

/// The batches of one stream, in training order, written into its slice of the permutation buffer.
/// Offsets are relative to the slice and `u32` (a slice never holds more rows than that): at 100M
/// samples this halves the largest temporary of the plan.
pub(crate) struct Formed {
    pub(crate) offsets: Vec<u32>,
    pub(crate) written: usize,
    padded_tokens: u64,
    /// The mean row length of each batch (real tokens / rows, rounded down): `stratify.rs` ranks
    /// batches by it to order them.
    pub(crate) mean: Vec<u32>,
    /// The cost of each batch (`Config::batch_cost`), for rank balance (`balance.rs`); `f32` is
    /// ample for matching costs and halves the array.
    pub(crate) cost: Vec<f32>,
    /// Batches that stay in the group's place; those after them go to the epoch's tail (see
    /// [`Epoch`]).
    pub(crate) main: usize,
    /// Whether `mean` and `cost` are recorded (see [`Formed::new`]).
    ranked: bool,
    /// Packed streams: samples of the rows still open at the end, packed again with every other
    /// stream's at the end of the epoch (`pack.rs`).
    pub(crate) leftover: Vec<u32>,
}

impl Formed {
    /// Records a padded batch with `rows` rows written up to `end`, whose longest row has `longest`
    /// tokens and whose rows hold `tokens` in all.
    #[inline]
    pub(crate) fn close(
        &mut self,
        end: usize,
        rows: usize,
        longest: u32,
        tokens: u64,
        config: &Config,
    ) {
        let padded_tokens = rows as u64 * config.padded(longest);
        let cost = || {
            // Costs are matched, not summed: f32 precision is plenty.
            #[allow(clippy::cast_possible_truncation, clippy::cast_precision_loss)]
            let cost = if config.cost.is_tokens() {
                padded_tokens as f32
            } else {
                config.batch_cost(rows as u64, longest) as f32
            };
            cost
        };
        self.record(end, padded_tokens, mean_length(tokens, rows as u64), cost);
    }

    /// Records a batch written up to `end` that occupies `padded_tokens`, with mean row length `mean`
    /// and cost `cost()` (evaluated only when ranked).
    #[inline]
    pub(crate) fn record(
        &mut self,
        end: usize,
        padded_tokens: u64,
        mean: u64,
        cost: impl FnOnce() -> f32,
    ) {
        if self.ranked {
            self.cost.push(cost());
            // The mean is at most the longest length, a u32.
            #[allow(clippy::cast_possible_truncation)]
            self.mean.push(mean as u32);
        }
        self.written = end;
        // `end` ≤ the stream's length, which fits in u32.
        #[allow(clippy::cast_possible_truncation)]
        self.offsets.push(end as u32);
        self.padded_tokens += padded_tokens;
    }
}

impl Formed {
    /// Batches placed by `by_bucket.rs`: ends `offsets` (from 0), one cost each, `main` of them
    /// staying in place.
    pub(crate) fn placed(
        offsets: Vec<u32>,
        cost: Vec<f32>,
        padded_tokens: u64,
        main: usize,
    ) -> Self {
        Self {
            written: offsets.last().map_or(0, |&o| o as usize),
            offsets,
            padded_tokens,
            mean: Vec::new(),
            cost,
            main,
            ranked: true,
            leftover: Vec::new(),
        }
    }

    /// An empty stream; `ranked`: record each batch's mean length and cost, which only ordering and
    /// rank balance use (skipped past `ARRANGE_MAX_SAMPLES`: at 100M samples the two arrays would add
    /// ~120 MB to the plan's peak, measured).
    pub(crate) fn new(ranked: bool) -> Self {
        Self {
            offsets: vec![0],
            written: 0,
            padded_tokens: 0,
            mean: Vec::new(),
            cost: Vec::new(),
            main: 0,
            ranked,
            leftover: Vec::new(),
        }
    }
}

/// `⌊tokens / rows⌋` through a float division: exact for totals below 2^53 (the quotient's rounding
/// error is smaller than its distance to the next integer, `1 / rows`), and several times cheaper
/// than a 64-bit integer division, which cost ~2 ms an epoch at one per batch (measured).
#[inline]
pub(crate) fn mean_length(tokens: u64, rows: u64) -> u64 {
    // Both far below 2^53; the quotient is non-negative and below 2^32.
    #[allow(
        clippy::cast_precision_loss,
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss
    )]
    let mean = (tokens as f64 / rows as f64) as u64;
    mean
}

/// The whole epoch: the streams' batches concatenated, offsets absolute.
///
/// Rank balance matches batches inside windows of `accumulation × world_size` batches, and does it
/// while each group's rows are still in cache (right after forming it), so windows must not cross
/// group boundaries: each group keeps the largest multiple of a window of its batches in place (its
/// *main* batches), and its last few — mostly the partial batches flushed at its end — go to a *tail*
/// after every group. The epoch is then main batches in whole windows, then the tail, which is where
/// rank splitting and dropping happen and is matched on its own (`planner.rs`).
#[derive(Default)]
pub(crate) struct Epoch {
    pub(crate) offsets: Vec<u64>,
    /// The cost of each batch (see [`Formed::cost`]).
    pub(crate) cost: Vec<f32>,
    /// The first batch of the tail.
    pub(crate) tail_start: usize,
    pub(crate) written: usize,
    pub(crate) padded_tokens: u64,
    /// Packed streams' leftover samples (see [`Formed::leftover`]).
    pub(crate) leftover: Vec<u32>,
    /// Rows, sizes and costs of tail batches waiting for every group to be placed.
    tail_rows: Vec<u32>,
    tail_sizes: Vec<u32>,
    tail_cost: Vec<f32>,
}

impl Epoch {
    /// An empty epoch whose offsets hold `batches` plus the splits up to the epoch's shared count
    /// without reallocating (a reallocation of the offsets cost ~2 ms of fresh pages an epoch at 1M
    /// samples, measured): a multiple of the ranks and a margin over the count epochs scatter by
    /// (`planner.rs`; ~0.1% of the batches on the seed workload). The room is capped by the batches,
    /// not sized by a world of 2^31 ranks (16 GB: an abort).
    pub(crate) fn with_room(batches: usize, world_size: u32) -> Self {
        let splits = (world_size as usize)
            .saturating_add(batches / 256 + 64)
            .min(batches + 1);
        let mut offsets = Vec::with_capacity(batches + 1 + splits);
        offsets.push(0);
        Self {
            offsets,
            cost: Vec::with_capacity(batches + splits),
            ..Self::default()
        }
    }

    /// Appends a stream that wrote its batches at `start` of `order`: its main batches move up to
    /// close the gap left by earlier tails and skipped samples; its tail is set aside.
    pub(crate) fn append(&mut self, order: &mut [u32], start: usize, part: Formed) {
        let batches = part.offsets.len() - 1;
        let main_rows = part.offsets[part.main] as usize;
        self.tail_rows
            .extend_from_slice(&order[start + main_rows..start + part.written]);
        for b in part.main..batches {
            self.tail_sizes.push(part.offsets[b + 1] - part.offsets[b]);
        }
        // Costs are recorded only for ranked streams (see `Formed::new`).
        let (main_cost, tail_cost) = part.cost.split_at(part.main.min(part.cost.len()));
        self.tail_cost.extend_from_slice(tail_cost);
        self.leftover.extend_from_slice(&part.leftover);
        if start != self.written {
            order.copy_within(start..start + main_rows, self.written);
        }
        let shift = self.written as u64;
        let main_ends = &part.offsets[1..=part.main];
        self.offsets
            .extend(main_ends.iter().map(|&o| u64::from(o) + shift));
        self.cost.extend_from_slice(main_cost);
        self.written += main_rows;
        self.padded_tokens += part.padded_tokens;
    }

    /// Appends the closed rows of a stream that lives in its own buffer `rows` after everything
    /// placed so far (the packed leftovers).
    fn push_rows(&mut self, order: &mut [u32], rows: &[u32], part: Formed) {
        order[self.written..self.written + part.written].copy_from_slice(&rows[..part.written]);
        let shift = self.written as u64;
        self.offsets
            .extend(part.offsets[1..].iter().map(|&o| u64::from(o) + shift));
        self.cost.extend_from_slice(&part.cost);
        self.written += part.written;
        self.padded_tokens += part.padded_tokens;
    }

    /// Places the tail after every group's main batches.
    pub(crate) fn finish(&mut self, order: &mut [u32]) {
        self.tail_start = self.offsets.len() - 1;
        let end = self.written + self.tail_rows.len();
        order[self.written..end].copy_from_slice(&self.tail_rows);
        for &size in &self.tail_sizes {
            self.written += size as usize;
            self.offsets.push(self.written as u64);
        }
        self.cost.append(&mut self.tail_cost);
        self.tail_rows = Vec::new();
        self.tail_sizes = Vec::new();
    }
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
    /// Always use the general loop (tests compare it with `fast_stream`).
    pub(crate) general_only: bool,
    /// The shortest admitted length (a packed row with less room than this is full).
    pub(crate) shortest: u32,
}

impl<L: Length> Former<'_, L> {
    /// Forms the sorted (evaluation) epoch: one stream; a bucket closes when the next one starts.
    pub(crate) fn form_sorted(&self, order: &mut [u32]) -> Epoch {
        let mut formed = Formed::new(false);
        if let Some(mut packer) = self.packer() {
            packer.stream(self.lengths, order, None, &mut formed);
            packer.flush(order, &mut formed, None);
        } else {
            let mut open = self.open_batches();
            self.stream::<true>(order, None, &mut open, &mut formed);
            self.flush(order, &mut open, &mut formed, None);
        }
        formed.main = formed.offsets.len() - 1;
        let mut total = Epoch::with_room(formed.main, self.config.world_size);
        total.append(order, 0, formed);
        total.finish(order);
        total
    }

    /// Forms a shuffled epoch. The permutation's chunks are grouped into fixed groups (set by `n`
    /// alone); each parallel task shuffles its group's chunks and streams them right away while they
    /// are in cache, writing batches into the group's own slice and flushing its partial batches at
    /// its end. The groups are then concatenated, closing any gaps left by skipped samples.
    pub(crate) fn form_shuffled(
        &self,
        epoch: u64,
        pool: Option<&rayon::ThreadPool>,
    ) -> (Vec<u32>, Epoch) {
        let seed = self.config.seed;
        let n = self.lengths.len();
        // Past a few cache sizes the stream's random length lookups go to DRAM; then the scatter
        // carries each row's length along (one sequential read) so the stream reads them in order.
        let source = (n >= self.companion_min).then_some(self.lengths);
        let Scattered {
            rows: mut order,
            mut companion,
            starts,
        } = scatter_into_chunks(n, source, seed, epoch, pool);
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
            let mut formed = Formed::new(n <= ARRANGE_MAX_SAMPLES);
            // Groups number at most MAX_GROUPS.
            #[allow(clippy::cast_possible_truncation)]
            let flush_stream = (epoch, g as u32);
            let fast = self.rules.table.as_deref().filter(|_| !self.general_only);
            // Batches closed full; the partial ones flushed after them stay at the group's end.
            let complete;
            let tight = || fast.and_then(|_| Tight::new(self.bucket_capacity));
            match (self.packer(), fast, tight()) {
                (Some(mut packer), _, _) => {
                    packer.stream(self.lengths, piece, values.as_deref(), &mut formed);
                    complete = formed.offsets.len() - 1;
                    formed.leftover = packer.leftovers(flush_stream);
                }
                (None, Some(table), Some(mut open)) => {
                    let (config, lengths) = (self.config, self.lengths);
                    fast_stream::stream(
                        config,
                        table,
                        lengths,
                        piece,
                        values.as_deref(),
                        &mut open,
                        &mut formed,
                    );
                    complete = formed.offsets.len() - 1;
                    fast_stream::flush(config, piece, &mut open, &mut formed, flush_stream);
                }
                _ => {
                    let mut open = self.open_batches();
                    self.stream::<false>(piece, values.as_deref(), &mut open, &mut formed);
                    complete = formed.offsets.len() - 1;
                    self.flush(piece, &mut open, &mut formed, Some(flush_stream));
                }
            }
            formed.main = formed.offsets.len() - 1;
            if n <= ARRANGE_MAX_SAMPLES {
                self.arrange_and_balance(piece, &mut formed, complete, epoch, flush_stream.1);
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
        if let Some(mut packer) = self.packer() {
            // Rows the groups left open, packed together (see `pack.rs`); they join the tail.
            let mut rows = std::mem::take(&mut total.leftover);
            let mut formed = Formed::new(n <= ARRANGE_MAX_SAMPLES);
            packer.stream(self.lengths, &mut rows, None, &mut formed);
            // The epoch's last stream: its own flush stream id, after the groups'.
            #[allow(clippy::cast_possible_truncation)]
            let last = (epoch, MAX_GROUPS as u32);
            packer.flush(&mut rows, &mut formed, Some(last));
            total.push_rows(&mut order, &rows, formed);
        }
        (order, total)
    }

    /// Puts a formed group's batches in training order (`stratify.rs`), matches its main batches'
    /// ranks window by window (`balance.rs`), and moves the rows once, while they are in cache.
    fn arrange_and_balance(
        &self,
        piece: &mut [u32],
        formed: &mut Formed,
        complete: usize,
        epoch: u64,
        group: u32,
    ) {
        let config = self.config;
        let batches = formed.offsets.len() - 1;
        let mut sequence = arrange(
            &formed.mean,
            batches,
            complete,
            config.order,
            config.seed,
            epoch,
            group,
        );
        formed.main = sequence.len() / config.window() * config.window();
        // Cost classes regroup the whole epoch later and need the stratified order as it is: any
        // stretch of it mixes well, where a window matched here mixes well only as a whole.
        if config.balance_tolerance_ppm.is_none() {
            let mut rng = Pcg64::new(config.seed, epoch, stream(Unit::Group(group)));
            match_windows(&mut sequence[..formed.main], &formed.cost, config, &mut rng);
        }
        let mut offsets = Vec::with_capacity(formed.offsets.len());
        offsets.push(0u32);
        let bound = |i: usize| formed.offsets[i] as usize;
        reorder_region(piece, bound, &sequence, |_, end| {
            // Rows of a group fit in u32 (formed offsets are u32 already).
            #[allow(clippy::cast_possible_truncation)]
            offsets.push(end as u32);
        });
        formed.cost = sequence
            .iter()
            .map(|&id| formed.cost[id as usize])
            .collect();
        formed.offsets = offsets;
        // Means were only needed to choose the order.
        formed.mean.clear();
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

    fn open_batches(&self) -> Vec<Open> {
        self.bucket_capacity.iter().map(|&c| Open::new(c)).collect()
    }

    /// Emits the batches still open, in a seeded order for shuffled epochs (`flush_stream`).
    fn flush(
        &self,
        order: &mut [u32],
        open: &mut [Open],
        formed: &mut Formed,
        flush_stream: Option<(u64, u32)>,
    ) {
        let mut leftover: Vec<usize> = (0..open.len())
            .filter(|&b| !open[b].rows.is_empty())
            .collect();
        if let Some((epoch, segment)) = flush_stream {
            shuffle(
                &mut Pcg64::new(self.config.seed, epoch, Stream::Flush(segment)),
                &mut leftover,
            );
        }
        for b in leftover {
            self.emit(order, formed, &mut open[b]);
        }
    }

    /// Streams with the table lookup when there is a table, else with the computation; chosen once
    /// so each hot loop is compiled for its lookup.
    fn stream<const SORTED: bool>(
        &self,
        order: &mut [u32],
        values: Option<&[L]>,
        open: &mut [Open],
        formed: &mut Formed,
    ) {
        match &self.rules.table {
            Some(table) => {
                self.stream_with::<SORTED>(order, values, open, formed, |l| table_lookup(table, l))
            }
            None => {
                self.stream_with::<SORTED>(order, values, open, formed, |l| self.rules.compute(l))
            }
        }
    }

    /// The general loop (~70 instructions a sample with gathering and emission, measured). Rows and
    /// lengths of a block are copied out first (see [`gather_block`]) and the loop reads only the
    /// block copies. Lengths come from `values` when the scatter carried them along.
    fn stream_with<const SORTED: bool>(
        &self,
        order: &mut [u32],
        values: Option<&[L]>,
        open: &mut [Open],
        formed: &mut Formed,
        lookup: impl Fn(u32) -> Option<(usize, u32)>,
    ) {
        let mut rows = [0u32; GATHER_BLOCK];
        let mut lengths = [0u32; GATHER_BLOCK];
        let mut previous = usize::MAX;
        for start in (0..order.len()).step_by(GATHER_BLOCK) {
            let count = gather_block(order, start, values, self.lengths, &mut rows, &mut lengths);
            for (&row, &length) in rows[..count].iter().zip(&lengths[..count]) {
                let Some((b, capacity)) = lookup(length) else {
                    continue;
                };
                if SORTED
                    && previous != b
                    && previous != usize::MAX
                    && !open[previous].rows.is_empty()
                {
                    // Sorted input: a bucket is complete when the next one starts.
                    self.emit(order, formed, &mut open[previous]);
                }
                previous = b;
                let batch = &mut open[b];
                if batch.rows.len() >= batch.capacity.min(capacity) as usize {
                    self.emit(order, formed, batch);
                }
                batch.rows.push(row);
                batch.longest = batch.longest.max(length);
                batch.tokens += u64::from(length);
                batch.capacity = batch.capacity.min(capacity);
                if batch.rows.len() >= batch.capacity as usize {
                    self.emit(order, formed, batch);
                }
            }
        }
    }

    /// Writes `batch` at the write cursor and closes it. Safe in place: every row in an open batch was
    /// read from a position at or after the write cursor.
    fn emit(&self, order: &mut [u32], formed: &mut Formed, batch: &mut Open) {
        let end = formed.written + batch.rows.len();
        order[formed.written..end].copy_from_slice(&batch.rows);
        formed.close(
            end,
            batch.rows.len(),
            batch.longest,
            batch.tokens,
            self.config,
        );
        batch.rows.clear();
        batch.longest = 0;
        batch.tokens = 0;
        batch.capacity = u32::MAX;
    }
}

/// Copies the block of `order` at `start` into `rows` and its lengths into `lengths` (from `values`
/// when the scatter carried them, else looked up); returns the block's size. The length loads are
/// random and overlap when issued together, where loads interleaved with the forming logic would
/// wait one by one.
pub(crate) fn gather_block<L: Length>(
    order: &[u32],
    start: usize,
    values: Option<&[L]>,
    all_lengths: &[L],
    rows: &mut [u32; GATHER_BLOCK],
    lengths: &mut [u32; GATHER_BLOCK],
) -> usize {
    let block = &order[start..(start + GATHER_BLOCK).min(order.len())];
    let count = block.len();
    rows[..count].copy_from_slice(block);
    match values {
        // Carried by the scatter: `values[i]` is the length of `order[i]`.
        Some(values) => {
            for (slot, &l) in lengths.iter_mut().zip(&values[start..start + count]) {
                *slot = l.into();
            }
        }
        None => {
            for (slot, &row) in lengths.iter_mut().zip(block) {
                *slot = all_lengths[row as usize].into();
            }
        }
    }
    count
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
