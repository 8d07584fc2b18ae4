//! `oversize="truncate"` for packed rows: a sample longer than the row capacity `C` is planned as
//! `⌈L / C⌉` pieces — tokens `[0, C)`, `[C, 2C)`, … — each packed like a sample of its own.
//!
//! The planner plans *entries*: entry `r < n` is row `r`'s first piece (the whole row when it fits),
//! and entries `n, n + 1, …` are the later pieces, long rows in row order and each row's pieces in
//! token order. [`Pieces`] keeps what maps an entry back to its row and token window ([`locate`]).

use crate::error::{ErrorKind, Result};
use crate::lengths::{with_lengths, Length, Lengths};
use crate::memory;
use crate::plan::config::{Batching, Config, Oversize};

/// What a planner keeps of [`Pieces`]: the later pieces (their lengths are planned entries).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Later {
    /// The row of each later piece (entry `n + k` is piece `rows[k]`).
    pub rows: Vec<u32>,
    /// The first token of each later piece in its row.
    pub starts: Vec<u32>,
    /// Rows that were split.
    pub split: u64,
}

/// The lengths a planner plans under `config`: `lengths` itself, or under `Oversize::Truncate`
/// with samples longer than the row capacity, every entry's length and the later pieces.
pub(crate) fn cut_long(lengths: Lengths, config: &Config) -> Result<(Lengths, Option<Later>)> {
    let capacity = match (config.oversize, config.batching) {
        (Oversize::Truncate, Batching::Tokens(capacity)) => capacity,
        _ => return Ok((lengths, None)),
    };
    Ok(match split(&lengths, capacity)? {
        None => (lengths, None),
        Some(Pieces {
            planned,
            rows,
            starts,
            split,
        }) => (
            planned.into(),
            Some(Later {
                rows,
                starts,
                split,
            }),
        ),
    })
}

/// Long samples cut into pieces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pieces {
    /// The length of every entry: each row's first piece, then the later pieces.
    pub planned: Vec<u32>,
    /// The row of each later piece (entry `n + k` is piece `rows[k]`).
    pub rows: Vec<u32>,
    /// The first token of each later piece in its row.
    pub starts: Vec<u32>,
    /// Rows that were split.
    pub split: u64,
}

/// The pieces of `lengths` under a row capacity of `capacity` tokens, or `None` when no sample is
/// longer (or the capacity is 0, which the planner refuses with its own message).
pub fn split(lengths: &Lengths, capacity: u64) -> Result<Option<Pieces>> {
    with_lengths!(lengths, v => split_long(v, capacity))
}

/// [`split`] for one storage width of the lengths.
pub(crate) fn split_long<L: Length>(lengths: &[L], capacity: u64) -> Result<Option<Pieces>> {
    let too_long = |l: &L| u64::from(Into::<u32>::into(*l)) > capacity;
    if capacity == 0 || !lengths.iter().any(too_long) {
        return Ok(None);
    }
    // A length is at most u32::MAX, so a capacity below one fits u32.
    let cap = u32::try_from(capacity).unwrap_or(u32::MAX);
    let later = |l: u32| u64::from(l.div_ceil(cap) - 1);
    let (mut split, mut total) = (0u64, 0u64);
    for &l in lengths.iter().filter(|l| too_long(l)) {
        split += 1;
        total += later(l.into());
    }
    if lengths.len() as u64 + total > u64::from(u32::MAX) {
        return Err(ErrorKind::TooManyPieces {
            samples: split,
            pieces: total,
            capacity,
        }
        .into());
    }
    // Below u32::MAX entries (checked above).
    #[allow(clippy::cast_possible_truncation)]
    let (entries, pieces) = ((lengths.len() as u64 + total) as usize, total as usize);
    let mut planned = memory::vec_with_capacity("cutting long samples into pieces", entries)?;
    let mut rows = memory::vec_with_capacity("cutting long samples into pieces", pieces)?;
    let mut starts = memory::vec_with_capacity("cutting long samples into pieces", pieces)?;
    planned.extend(lengths.iter().map(|&l| Into::<u32>::into(l).min(cap)));
    for (row, &l) in lengths.iter().enumerate() {
        let l: u32 = l.into();
        let mut start = cap;
        while start < l {
            // Rows fit u32: the entry count does.
            #[allow(clippy::cast_possible_truncation)]
            rows.push(row as u32);
            starts.push(start);
            planned.push((l - start).min(cap));
            start = start.saturating_add(cap);
        }
    }
    Ok(Some(Pieces {
        planned,
        rows,
        starts,
        split,
    }))
}

/// The token windows of `entries` of a plan over `planned` lengths, the first `samples` of them
/// dataset rows: `(rows, starts, lengths)`, entry `s` being tokens `starts[s] .. starts[s] +
/// lengths[s]` of row `rows[s]`. `later`: the rows and starts of the later pieces ([`Pieces`]);
/// without them every entry is a whole row.
pub fn locate<L: Length>(
    entries: &[i64],
    samples: usize,
    planned: &[L],
    later: Option<(&[u32], &[u32])>,
) -> Result<(Vec<u32>, Vec<u32>, Vec<u32>)> {
    let count = planned.len();
    let index = |e: i64| usize::try_from(e).ok().filter(|&e| e < count);
    if let Some(&bad) = entries.iter().find(|&&e| index(e).is_none()) {
        return Err(ErrorKind::EntryOutOfRange {
            entry: i128::from(bad),
            entries: count as u64,
        }
        .into());
    }
    const WHAT: &str = "locating a plan's pieces";
    let mut rows = memory::vec_with_capacity(WHAT, entries.len())?;
    let mut starts = memory::vec_with_capacity(WHAT, entries.len())?;
    let mut lengths = memory::vec_with_capacity(WHAT, entries.len())?;
    for &e in entries {
        let e = index(e).unwrap_or(0);
        lengths.push(planned[e].into());
        match later {
            Some((piece_rows, piece_starts)) if e >= samples => {
                rows.push(piece_rows.get(e - samples).copied().unwrap_or(0));
                starts.push(piece_starts.get(e - samples).copied().unwrap_or(0));
            }
            _ => {
                // Entries fit u32 (a plan's indices are u32).
                #[allow(clippy::cast_possible_truncation)]
                rows.push(e as u32);
                starts.push(0);
            }
        }
    }
    Ok((rows, starts, lengths))
}

/// The dataset rows' lengths from a planner's entries: the first `samples` entries' lengths, with the
/// later pieces (`later`) summed back into their rows.
pub(crate) fn dataset_lengths(
    lengths: &Lengths,
    samples: usize,
    later: Option<&Later>,
) -> Result<Vec<u32>> {
    let mut out = memory::vec_with_capacity("copying the lengths", samples)?;
    with_lengths!(lengths, v => {
        out.extend(v[..samples].iter().map(|&l| Into::<u32>::into(l)));
        if let Some(later) = later {
            // The pieces of a row sum to its length, which fits u32.
            for (&row, &piece) in later.rows.iter().zip(&v[samples..]) {
                out[row as usize] += Into::<u32>::into(piece);
            }
        }
    });
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::planner::Planner;
    use proptest::prelude::*;

    #[test]
    fn long_samples_become_capacity_pieces_after_every_first_piece() {
        let p = split_long(&[50u32, 300, 7, 129, 64][..], 64)
            .unwrap()
            .unwrap();
        assert_eq!(p.planned, [50, 64, 7, 64, 64, 64, 64, 64, 44, 64, 1]);
        assert_eq!(p.rows, [1, 1, 1, 1, 3, 3]);
        assert_eq!(p.starts, [64, 128, 192, 256, 64, 128]);
        assert_eq!(p.split, 2);
        let (rows, starts, lengths) = locate(
            &[0, 8, 10, 1],
            5,
            &p.planned[..],
            Some((&p.rows, &p.starts)),
        )
        .unwrap();
        assert_eq!(
            (rows, starts, lengths),
            (vec![0, 1, 3, 1], vec![0, 256, 128, 0], vec![50, 44, 1, 64])
        );
    }

    #[test]
    fn nothing_to_split_is_none_and_too_many_pieces_is_refused() {
        assert_eq!(split_long(&[5u32, 64][..], 64).unwrap(), None);
        assert_eq!(split_long(&[5u32, 64][..], 0).unwrap(), None);
        let err = split_long(&[u32::MAX, u32::MAX, 5][..], 1).unwrap_err();
        assert!(
            matches!(
                err.kind(),
                ErrorKind::TooManyPieces {
                    samples: 3,
                    pieces: 8_589_934_592,
                    ..
                }
            ),
            "{err}"
        );
        let err = locate(&[3], 3, &[5u32, 64, 6][..], None).unwrap_err();
        assert!(matches!(
            err.kind(),
            ErrorKind::EntryOutOfRange {
                entry: 3,
                entries: 3
            }
        ));
        assert!(locate(&[-1], 3, &[5u32, 64, 6][..], None).is_err());
    }

    proptest! {
        /// The pieces of every row, in order, are exactly its tokens.
        #[test]
        fn pieces_tile_every_row(lengths in prop::collection::vec(1u32..5000, 1..60), cap in 1u64..700) {
            let n = lengths.len();
            let Some(p) = split_long(&lengths[..], cap).unwrap() else {
                prop_assert!(lengths.iter().all(|&l| u64::from(l) <= cap));
                return Ok(());
            };
            let entries: Vec<i64> = (0..p.planned.len() as i64).collect();
            let (rows, starts, lens) = locate(&entries, n, &p.planned[..], Some((&p.rows, &p.starts))).unwrap();
            let mut covered = vec![0u64; n];
            for ((&r, &s), &l) in rows.iter().zip(&starts).zip(&lens) {
                prop_assert!(u64::from(l) <= cap && l > 0);
                prop_assert_eq!(u64::from(s), covered[r as usize], "pieces of row {} not in order", r);
                covered[r as usize] += u64::from(l);
            }
            prop_assert_eq!(covered, lengths.iter().map(|&l| u64::from(l)).collect::<Vec<_>>());
        }

        /// A planner under `Oversize::Truncate` plans every piece once, locates each in its row,
        /// and gives back the rows' lengths it was built from.
        #[test]
        fn a_truncating_planner_plans_every_piece_once(
            lengths in prop::collection::vec(1u32..5000, 1..60),
            cap in 64u64..700,
        ) {
            use crate::plan::config::Mode;
            let config = Config {
                oversize: Oversize::Truncate,
                mode: Mode::Packed { bucketed: false },
                ..Config::new(Batching::Tokens(cap))
            };
            let planner = Planner::new(lengths.clone(), config).unwrap();
            prop_assert_eq!(planner.samples(), lengths.len());
            prop_assert_eq!(planner.dataset_lengths().unwrap(), lengths.clone());
            let long = lengths.iter().filter(|&&l| u64::from(l) > cap).count() as u64;
            prop_assert_eq!(planner.truncated(), long);
            let mut entries: Vec<i64> = planner.plan(0).unwrap().indices().iter().map(|&e| i64::from(e)).collect();
            entries.sort_unstable();
            prop_assert_eq!(entries.len(), planner.lengths().len());
            let (rows, starts, lens) = planner.locate(&entries).unwrap();
            let mut covered = vec![0u64; lengths.len()];
            for ((&r, &s), &l) in rows.iter().zip(&starts).zip(&lens) {
                prop_assert_eq!(u64::from(s), covered[r as usize]);
                covered[r as usize] += u64::from(l);
            }
            prop_assert_eq!(covered, lengths.iter().map(|&l| u64::from(l)).collect::<Vec<_>>());
        }
    }

    #[test]
    fn truncating_padded_batches_is_refused_naming_the_fix() {
        let config = Config {
            oversize: Oversize::Truncate,
            ..Config::new(Batching::Tokens(64))
        };
        let err = Planner::new(vec![5u32, 100], config).unwrap_err();
        assert_eq!(err.kind().setting(), Some("oversize"));
        assert!(
            err.to_string()
                .starts_with("oversize='truncate' splits long samples"),
            "{err}"
        );
    }
}
