//! Packed rows composed by attention (`mode="packed"`, unbucketed, shuffled; under every cost model
//! since planning rules 4, but for epochs past `ARRANGE_MAX_SAMPLES` priced by tokens alone, which
//! stream best fit: `Config::composes_rows`). The price only balances ranks: rows are the same.
//!
//! Rows have the fixed shape `[1, max_tokens]` (what `torch.compile` and CUDA graphs want), so every
//! row does the same linear work and rows differ only by their samples' attention, `Σ l²`: a row of
//! one 8K sample and 8K of short ones costs twice the attention of a row of four 4K samples. Rows that
//! best-fit packing fills at random (`pack.rs`) spread that cost widely, and a step's ranks wait for
//! its dearest row. Here each forming group (a uniform random share of the epoch) is composed whole:
//!
//! 1. **Rows by attention.** Its samples, longest first (ties in the shuffled order), each go to the
//!    row with the least attention so far that has room (to within 1/4096 of twice a row's mean;
//!    `⌈tokens / max_tokens⌉` rows are opened, and more only when no row has room). The longest
//!    samples spread one to a row, and each shorter one evens the rows' `Σ l²` out; the shortest
//!    come last and fill what room is left. **Closing fits** come first: a sample that fills the
//!    tightest room it fits to within a few tokens (`close_slack`) goes there whatever its
//!    attention. Without them every row's room ends up a random remainder the last, shortest
//!    samples cannot all close (fill 0.9960: 509 rows more than ⌈Σ l / max_tokens⌉ on the seed
//!    workload); with them rows close as the chances come (0.9996: 53 more) and the attention still
//!    evens out.
//! 2. **Windows from strata.** The rows are ranked by their longest sample and cut into as many strata
//!    as an optimizer window has rows (`world_size × accumulation`); every window takes one random row
//!    of each stratum, so each window holds the dataset's mix of lengths, and rank balance
//!    (`balance.rs`) then deals each window's rows to steps and ranks by cost. `order="random"`
//!    shuffles the rows instead.
//!
//! Seed workload, 8 ranks × 4, `cost=(1, 1/30720)` (`benchmarks/mixing.py`): end to end per
//! micro-batch 0.944 → 0.992 against rows filled best fit (0.976 when those were matched by cost),
//! fill 0.994 → 0.996, `window_tv` 0.091 → 0.020 (revision 2; closing fits then took them to
//! 0.995, 0.9996 and 0.019, planning 16 against 14 ms); planning no slower (16 against 17 ms an epoch with 2
//! threads, `examples/time_plan.rs`; 100M samples: 2.5 against 1.6 s, peak RSS 1.49 against 1.23 GiB).
//! As the default (`cost="tokens"`, rules 4; `benchmarks/packing.py`, one run): fill 0.9996 against
//! best fit's 0.9937, `window_tv` 0.019 against 0.091, planning 1.09× best fit's (22.5 against 20.6
//! ms). Rows of 32K tokens fill less than best fit's (0.9980 against 0.9989; 64K: 0.9991 against
//! 0.9993): the slack is tuned at 16K, where a wider one loses (measured: four times it gives 0.9991
//! at 32K but 0.9994 at 16K).
//! Which samples share a row still changes every epoch (the groups and the ties are drawn anew), but a
//! row's shape — one long sample and shorter ones — is the same every epoch by design.
//!
//! Tried and dropped (measured on the seed workload and on mixes of short samples, 200K each):
//! samples up to `max_tokens / 16` placed best fit after the rest, longest first — rows of short samples
//! then spread their attention 10× more than best-fit rows (the shortest come last, together); the same in
//! shuffled order — fill and end to end 0.9948 / 0.9909 against 0.9956 / 0.9920; attention classes over
//! `[0, max_tokens²)` — with short samples (`Σ l²` ~10^5 a row) ties went to one row until it changed
//! class and the spread rose 20% above best-fit rows'; windows from strata by cost instead of longest
//! sample — `window_tv` 0.028 against 0.023 (numpy prototype).

use crate::lengths::Length;
use crate::plan::arrange::rank_by_key;
use crate::plan::config::{padded_piece, Config, Order};
use crate::plan::form::batches::{mean_length, Formed};
use crate::plan::form::classes::{Lists, CLASSES};
use crate::rng::{shuffle, Pcg64, Stream};

/// Lengths up to this are sorted by counting (a histogram of this many entries per group at most).
const COUNTING_MAX: u32 = 1 << 22;

/// The rows of one group under construction.
struct Rows {
    capacity: u32,
    room: Vec<u32>,
    attention: Vec<u64>,
    samples: Vec<u32>,
    longest: Vec<u32>,
}

impl Rows {
    fn open(&mut self) -> u32 {
        // Rows fit in u32: at most one per sample of a group.
        #[allow(clippy::cast_possible_truncation)]
        let row = self.room.len() as u32;
        self.room.push(self.capacity);
        self.attention.push(0);
        self.samples.push(0);
        self.longest.push(0);
        row
    }

    fn place(&mut self, row: u32, length: u32) {
        let r = row as usize;
        self.room[r] -= length;
        self.attention[r] += u64::from(length) * u64::from(length);
        self.samples[r] += 1;
        self.longest[r] = self.longest[r].max(length);
    }
}

/// Composes the samples of `piece` (a forming group; lengths in `values`, or looked up in
/// `lengths`) into rows of `capacity` tokens as the module docs describe, writes them back into
/// `piece` in training order and records them in `formed`. Samples longer than `capacity` are left
/// out (as the packer does: the planner's rules decide what is admitted).
pub(crate) fn compose<L: Length>(
    piece: &mut [u32],
    values: Option<&[L]>,
    lengths: &[L],
    (config, capacity): (&Config, u32),
    (epoch, group): (u64, u32),
    formed: &mut Formed,
) {
    let (samples, mut sorted) = longest_first(piece, values, lengths, capacity);
    let multiple = config.piece_multiple();
    if multiple > 1 {
        // Pieces take their padded lengths (context parallelism): rounding up keeps the order
        // longest first, and a sample that fits still fits (the multiple divides `capacity`).
        sorted
            .iter_mut()
            .for_each(|l| *l = padded_piece(*l, multiple));
    }
    let Some(&shortest) = sorted.last() else {
        return;
    };
    let tokens: u64 = sorted.iter().map(|&l| u64::from(l)).sum();
    let mut rows = Rows {
        capacity,
        room: Vec::new(),
        attention: Vec::new(),
        samples: Vec::new(),
        longest: Vec::new(),
    };
    let docs = config.docs_per_row();
    let row_of = place_all(&sorted, &mut rows, (tokens, shortest.max(1), docs));
    let mut rng = Pcg64::new(config.seed, epoch, Stream::Order(group));
    let sequence = match config.order {
        Order::Random => {
            // Rows fit in u32 (see `Rows::open`).
            #[allow(clippy::cast_possible_truncation)]
            let mut ids: Vec<u32> = (0..rows.room.len() as u32).collect();
            shuffle(&mut rng, &mut ids);
            ids
        }
        Order::Stratified => strata(&rows.longest, config.window(), &mut rng),
    };
    write_rows(piece, &samples, &row_of, &rows, &sequence, config, formed);
}

/// The admitted samples of `piece` and their lengths, longest first, ties in `piece`'s order.
fn longest_first<L: Length>(
    piece: &[u32],
    values: Option<&[L]>,
    lengths: &[L],
    capacity: u32,
) -> (Vec<u32>, Vec<u32>) {
    // Each length read once (a random lookup unless the scatter carried them).
    let own: Vec<u32> = match values {
        Some(values) => values.iter().map(|&l| l.into()).collect(),
        None => piece.iter().map(|&s| lengths[s as usize].into()).collect(),
    };
    let admitted = own.iter().filter(|&&l| l <= capacity).count();
    let longest = own
        .iter()
        .copied()
        .filter(|&l| l <= capacity)
        .max()
        .unwrap_or(0);
    let mut samples = vec![0u32; admitted];
    let mut sorted = vec![0u32; admitted];
    if longest <= COUNTING_MAX {
        // starts[l]: how many admitted samples are longer than l.
        let mut starts = vec![0usize; longest as usize + 2];
        for &l in own.iter().filter(|&&l| l <= capacity) {
            starts[l as usize] += 1;
        }
        let mut above = 0;
        for l in (0..=longest as usize).rev() {
            let count = starts[l];
            starts[l] = above;
            above += count;
        }
        for (&s, &l) in piece.iter().zip(&own) {
            if l <= capacity {
                let at = &mut starts[l as usize];
                samples[*at] = s;
                sorted[*at] = l;
                *at += 1;
            }
        }
    } else {
        let mut keyed: Vec<u64> = own
            .iter()
            .enumerate()
            .map(|(i, &l)| (l, i))
            .filter(|&(l, _)| l <= capacity)
            .map(|(l, i)| u64::from(u32::MAX - l) << 32 | i as u64)
            .collect();
        keyed.sort_unstable();
        for (k, &packed) in keyed.iter().enumerate() {
            // The low half is a position in the piece.
            #[allow(clippy::cast_possible_truncation)]
            let i = (packed & u64::from(u32::MAX)) as usize;
            samples[k] = piece[i];
            sorted[k] = own[i];
        }
    }
    (samples, sorted)
}

/// The row of each of the `sorted` lengths (longest first), placed as the module docs say: into a
/// row it fills to within [`close_slack`] if there is one, else into the row with the least
/// attention so far (to within an attention class) that has room, a new one when none has. `tokens`
/// is their sum and `shortest` the least of them (a row with less room is full, as is one of `docs`
/// samples: `max_docs_per_row`).
fn place_all(
    sorted: &[u32],
    rows: &mut Rows,
    (tokens, shortest, docs): (u64, u32, u32),
) -> Vec<u32> {
    let capacity = rows.capacity;
    let room_shift = (0..32)
        .find(|&s| ((capacity >> s) as usize) < CLASSES)
        .unwrap_or(31);
    // The least room class whose every row has room for `length` (in u64: no wrap near u32::MAX);
    // below CLASSES + 1, a usize.
    #[allow(clippy::cast_possible_truncation)]
    let fitting =
        |length: u32| ((u64::from(length) + (1 << room_shift) - 1) >> room_shift) as usize;
    let room_class = |room: u32| (room >> room_shift) as usize;
    let slack = close_slack(room_shift, capacity);
    // As many rows as the tokens need, or as the cap on samples a row needs.
    let by_docs = sorted.len().div_ceil(docs as usize);
    let opened = usize::try_from(tokens.div_ceil(u64::from(capacity.max(1))))
        .unwrap_or(0)
        .max(by_docs);
    // Attention classes of 2^attention_shift cover twice a row's mean attention and the longest
    // sample's (rows above share the last class: they are never the least). Sized by the data,
    // not by capacity²: rows of short samples (Σ l² ~ 10^5 at 4K tokens) would otherwise share a
    // handful of classes, and ties go to one row until it changes class (measured: their spread
    // rose 20% above best-fit rows').
    let squares: u128 = sorted.iter().map(|&l| u128::from(l) * u128::from(l)).sum();
    let mean = squares / (opened.max(1) as u128);
    let longest = sorted.first().map_or(0, |&l| u128::from(l) * u128::from(l));
    let top = u64::try_from((2 * mean).max(longest)).unwrap_or(u64::MAX);
    let attention_shift = (0..64).find(|&s| (top >> s) < CLASSES as u64).unwrap_or(63);
    // Clamped below CLASSES, a usize.
    #[allow(clippy::cast_possible_truncation)]
    let attention_class =
        |attention: u64| ((attention >> attention_shift) as usize).min(CLASSES - 1);

    // Rows that may take the current length, by attention; rows with too little room for it wait
    // by room, and every room class from `released` up has been handed back (lengths only fall).
    // Rows a later length could close are also indexed by room: those left with less room than the
    // length just placed plus the slack. A row with more can never close (the lengths to come are
    // no longer) until it takes a sample; leaving the others out halves the index's upkeep.
    let mut by_attention = Lists::new(opened);
    let mut waiting = Lists::new(opened);
    let mut by_room = Lists::new(opened);
    let mut released = CLASSES;
    for _ in 0..opened {
        let row = rows.open();
        by_attention.push(row, 0);
    }
    let mut row_of = vec![0u32; sorted.len()];
    for (slot, &length) in row_of.iter_mut().zip(sorted) {
        let need = fitting(length);
        while released > need {
            released -= 1;
            while let Some(row) = waiting.pop(released) {
                by_attention.push(row, attention_class(rows.attention[row as usize]));
            }
        }
        // The tightest room that fits, if this length leaves it with less than `slack`.
        let closing = by_room
            .lowest_from(need)
            .and_then(|class| by_room.first(class))
            .filter(|&row| rows.room[row as usize] - length < slack);
        let row = match closing {
            Some(row) => {
                if !by_attention.remove(row) {
                    waiting.remove(row);
                }
                row
            }
            None => loop {
                let lowest = by_attention.lowest_from(0);
                let Some(row) = lowest.and_then(|class| by_attention.pop(class)) else {
                    break rows.open();
                };
                let room = rows.room[row as usize];
                if room >= length {
                    break row;
                }
                // Below `need`, so below `released`: handed back once the lengths fall to its room.
                waiting.push(row, room_class(room));
            },
        };
        by_room.remove(row);
        rows.place(row, length);
        *slot = row;
        let room = rows.room[row as usize];
        // A row with less room than the shortest sample, or with `docs` samples, takes no more.
        if room >= shortest && rows.samples[row as usize] < docs {
            by_attention.push(row, attention_class(rows.attention[row as usize]));
            if room < length.saturating_add(slack) {
                by_room.push(row, room_class(room));
            }
        }
    }
    row_of
}

/// The room a closing fit may leave: four room classes, at least 16 tokens, at most `capacity /
/// 256` (none below 256 tokens: rows of a few samples have no room to spare): 32 tokens at
/// `max_tokens` = 16,384, whose room classes are 8 tokens. Seed workload, 8 ranks × 4,
/// `cost=(1, 1/30720)`, fill and end to end per micro-batch, by slack: none 0.9960, 0.9923; 4
/// (under a room class: the tightest class rarely holds a closing fit) 0.9961, 0.9923; 8: 0.9977,
/// 0.9936; 16: 0.9996, 0.9953; **32: 0.9996, 0.9948**; 64: 0.9995, 0.9937 (a closing fit then
/// often takes a row the least-attention rule was evening out; 16 and 32 differ by a few rows). At
/// `max_tokens` = 8,192 fill rises 0.977 → 0.996 (slack 16), at 32,768 0.9974 → 0.9980 (64).
fn close_slack(room_shift: u32, capacity: u32) -> u32 {
    (4u32 << room_shift).max(16).min(capacity / 256)
}

/// Row numbers in the order of step 3: ranked by `key` (ties by number), cut into `window` strata
/// (sizes differing by at most one), each shuffled; window `j` takes the `j`-th row of every stratum,
/// and the strata's extra rows follow the last whole window.
fn strata(key: &[u32], window: usize, rng: &mut Pcg64) -> Vec<u32> {
    let mut ranked = rank_by_key(key);
    let rows = ranked.len();
    let window = window.clamp(1, rows.max(1));
    let bound = |s: usize| s * rows / window;
    for s in 0..window {
        shuffle(rng, &mut ranked[bound(s)..bound(s + 1)]);
    }
    let whole = rows / window;
    let mut sequence = Vec::with_capacity(rows);
    for j in 0..whole {
        sequence.extend((0..window).map(|s| ranked[bound(s) + j]));
    }
    for s in 0..window {
        if bound(s + 1) - bound(s) > whole {
            sequence.push(ranked[bound(s) + whole]);
        }
    }
    sequence
}

/// Writes the rows into `piece` in `sequence` order (each row's samples longest first) and records
/// each: it occupies `capacity` tokens and costs `a·capacity + b·Σl²` (`Config::cost`).
fn write_rows(
    piece: &mut [u32],
    samples: &[u32],
    row_of: &[u32],
    rows: &Rows,
    sequence: &[u32],
    config: &Config,
    formed: &mut Formed,
) {
    // Where each row starts in `piece`: rows laid out in `sequence` order.
    let mut start = vec![0u32; rows.room.len()];
    let mut at = 0u32;
    for &row in sequence {
        start[row as usize] = at;
        at += rows.samples[row as usize];
    }
    for (&sample, &row) in samples.iter().zip(row_of) {
        let slot = &mut start[row as usize];
        piece[*slot as usize] = sample;
        *slot += 1;
    }
    let capacity = u64::from(rows.capacity);
    let model = config.balance_cost();
    for &row in sequence {
        let r = row as usize;
        let used = capacity - u64::from(rows.room[r]);
        // Below 2^53 (at most capacity²), and costs are matched, not summed (see `Formed::cost`).
        #[allow(clippy::cast_precision_loss, clippy::cast_possible_truncation)]
        let cost =
            || (model.linear * capacity as f64 + model.quadratic * rows.attention[r] as f64) as f32;
        let end = start[r] as usize;
        let mean = mean_length(used, u64::from(rows.samples[r]));
        formed.record(end, capacity, mean, cost);
    }
}

#[cfg(test)]
mod tests;
