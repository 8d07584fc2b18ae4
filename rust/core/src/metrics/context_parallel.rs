//! How evenly a context-parallel split shares each packed row's causal attention among the `cp`
//! ranks that hold pieces of it, and what padding every piece to the multiple costs.
//!
//! Position `p` of a document (0-based, padding tokens included: the kernel computes them) attends
//! to `p + 1` keys, so a range `[a, b)` of it costs `Σ (p + 1) = (b(b+1) − a(a+1)) / 2`. A row's pieces
//! lie end to end at their padded lengths. Two layouts:
//!
//! * **zigzag** (ring-flash-attn's varlen zigzag, Megatron THD): each piece is cut into `2·cp` equal
//!   chunks and rank `i` takes chunks `i` and `2·cp − 1 − i` — a cheap early chunk paired with a dear
//!   late one, equal for every rank by construction (what the padding to `2·cp` buys);
//! * **contiguous** (llama3-style context parallelism, a plain `torch` split): rank `i` takes row
//!   tokens `[i·C/cp, (i+1)·C/cp)`; a long document's late tokens — the dear ones — all land on the
//!   last ranks.
//!
//! A row waits for its slowest rank, so the figure is `Σ_rows max_i W_i / Σ_rows mean_i W_i − 1`: the
//! share of the attention time lost to the spread (0 when every row is even).

use crate::plan::config::{padded_piece, Config};

/// The context-parallel figures of a plan.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ContextParallel {
    /// Attention spread under the zigzag layout (0 when every row is even).
    pub zigzag: f64,
    /// Attention spread under the contiguous layout.
    pub contiguous: f64,
}

/// Causal attention work of positions `[a, b)` of one document.
#[inline]
fn work(a: u64, b: u64) -> u128 {
    let (a, b) = (u128::from(a), u128::from(b));
    (b * (b + 1) - a * (a + 1)) / 2
}

/// Adds to `ranks` the work each of `ranks.len()` ranks does on a row of `capacity` tokens whose
/// pieces have the padded lengths `pieces`, under the zigzag layout (`zigzag`) or the contiguous one.
pub fn row_work(pieces: &[u32], capacity: u64, zigzag: bool, ranks: &mut [u128]) {
    let cp = ranks.len() as u64;
    if cp == 0 {
        return;
    }
    if zigzag {
        let halves = 2 * cp;
        for &piece in pieces {
            let chunk = u64::from(piece) / halves;
            for (i, w) in (0..cp).zip(ranks.iter_mut()) {
                let late = halves - 1 - i;
                *w += work(i * chunk, (i + 1) * chunk) + work(late * chunk, (late + 1) * chunk);
            }
        }
        return;
    }
    let share = capacity / cp;
    let mut start = 0u64;
    for &piece in pieces {
        let end = start + u64::from(piece);
        // The rank holding the piece's first token (past the last: none, the piece lies in the tail).
        let first = usize::try_from(start / share.max(1)).unwrap_or(usize::MAX);
        for (i, w) in (0u64..).zip(ranks.iter_mut()).skip(first) {
            let (lo, hi) = (i * share, (i + 1) * share);
            if lo >= end {
                break;
            }
            let (a, b) = (start.max(lo), end.min(hi));
            if a < b {
                *w += work(a - start, b - start);
            }
        }
        start = end;
    }
}

/// The spread `Σ_rows max / Σ_rows mean − 1` of the rows of a plan (CSR) whose entries have the
/// lengths `length(entry)`, padded as `config` pads pieces, for `config.context_parallel` ranks;
/// `None` without context parallelism, a row capacity, or any attention.
pub fn context_parallel(
    config: &Config,
    (offsets, indices): (&[u32], &[u32]),
    length: impl Fn(u32) -> u32,
) -> Option<ContextParallel> {
    let cp = config.context_parallel as usize;
    let crate::plan::config::Batching::Tokens(capacity) = config.batching else {
        return None;
    };
    if cp <= 1 {
        return None;
    }
    let multiple = config.piece_multiple();
    let mut pieces = Vec::new();
    let mut ranks = vec![0u128; cp];
    let mut spread = [(0.0f64, 0.0f64); 2];
    for row in offsets.windows(2) {
        // Offsets index `indices`: each below its length, a usize.
        #[allow(clippy::cast_possible_truncation)]
        let members = &indices[row[0] as usize..row[1] as usize];
        pieces.clear();
        pieces.extend(members.iter().map(|&e| padded_piece(length(e), multiple)));
        for (layout, sums) in spread.iter_mut().enumerate() {
            ranks.fill(0);
            row_work(&pieces, capacity, layout == 0, &mut ranks);
            let max = ranks.iter().copied().max().unwrap_or(0);
            let total: u128 = ranks.iter().sum();
            // Work in a row stays far below 2^96; f64 keeps 53 bits, enough for a ratio.
            #[allow(clippy::cast_precision_loss)]
            {
                sums.0 += max as f64;
                sums.1 += total as f64 / cp as f64;
            }
        }
    }
    let ratio = |(max, mean): (f64, f64)| max / mean - 1.0;
    (spread[0].1 > 0.0).then(|| ContextParallel {
        zigzag: ratio(spread[0]),
        contiguous: ratio(spread[1]),
    })
}

/// Tokens of padding the pieces of a plan's entries take beyond their own lengths.
pub fn piece_padding(config: &Config, indices: &[u32], length: impl Fn(u32) -> u32) -> u64 {
    let multiple = config.piece_multiple();
    if multiple == 1 {
        return 0;
    }
    indices
        .iter()
        .map(|&e| {
            let l = length(e);
            u64::from(padded_piece(l, multiple) - l)
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::{context_parallel, row_work, work};
    use crate::plan::config::{Batching, Config, Mode};

    /// Work of each rank, position by position (the oracle).
    #[allow(clippy::cast_possible_truncation)]
    fn naive(pieces: &[u32], capacity: u64, cp: usize, zigzag: bool) -> Vec<u128> {
        let mut ranks = vec![0u128; cp];
        let mut start = 0u64;
        for &piece in pieces {
            let piece = u64::from(piece);
            for p in 0..piece {
                let rank = if zigzag {
                    let chunk = (p / (piece / (2 * cp as u64))) as usize;
                    chunk.min(2 * cp - 1 - chunk)
                } else {
                    ((start + p) / (capacity / cp as u64)) as usize
                };
                ranks[rank] += u128::from(p + 1);
            }
            start += piece;
        }
        ranks
    }

    #[test]
    fn row_work_matches_counting_position_by_position() {
        let rows: [&[u32]; 4] = [&[16], &[8, 8], &[24, 8, 16, 8], &[8]];
        for cp in [1usize, 2, 4] {
            for pieces in rows {
                for zigzag in [true, false] {
                    let mut ranks = vec![0u128; cp];
                    row_work(pieces, 64, zigzag, &mut ranks);
                    assert_eq!(
                        ranks,
                        naive(pieces, 64, cp, zigzag),
                        "{pieces:?} {cp} {zigzag}"
                    );
                }
            }
        }
        assert_eq!(work(0, 4), 10);
        assert_eq!(work(2, 4), 7);
    }

    #[test]
    fn zigzag_is_even_and_contiguous_is_not() {
        let config = Config {
            mode: Mode::Packed { bucketed: false },
            context_parallel: 2,
            ..Config::new(Batching::Tokens(16))
        };
        // One row: a 12-token sample (padded to 12) and a 3-token one (padded to 4).
        let lengths = [12u32, 3];
        let figures = context_parallel(&config, (&[0, 2], &[0, 1]), |e| lengths[e as usize]);
        let figures = figures.unwrap();
        assert_eq!(figures.zigzag, 0.0);
        // Contiguous: rank 0 has positions 0..8 of the first (36), rank 1 its 8..12 (42) and the
        // second's 0..4 (10): max 52 over a mean of 44.
        assert!((figures.contiguous - (52.0 / 44.0 - 1.0)).abs() < 1e-12);
        let none = Config {
            context_parallel: 1,
            ..config
        };
        assert!(context_parallel(&none, (&[0, 2], &[0, 1]), |e| lengths[e as usize]).is_none());
    }
}
