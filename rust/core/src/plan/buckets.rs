//! Bucket edges: validation, assignment of lengths to buckets, and the default edges.
//!
//! Edges `e_0 < e_1 < … < e_K` define `K` buckets; bucket `i` holds lengths `L` with
//! `e_i < L ≤ e_{i+1}`. This is the convention of the seed's `[0, 770, 1216, …, 8192]`: a first edge of
//! `0` admits every positive length and a last edge equal to the longest sample admits it.
//!
//! Assignment is O(1) per sample through a lookup table indexed by length when the longest sample is
//! short enough for the table to stay in cache (≤ [`LUT_MAX_LENGTH`]); otherwise a binary search over
//! the edges.
//!
//! The edges themselves come from the optimizer (`optimize.rs`) or the caller.

use crate::error::{ErrorKind, Result};
use crate::lengths::Length;

/// Longest length for which assignment uses a lookup table (a `u16` per length: 512 KiB at most).
pub const LUT_MAX_LENGTH: u32 = 1 << 18;

/// Validated bucket edges.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Buckets {
    edges: Vec<u32>,
}

impl Buckets {
    /// Validates explicit edges: at least two, strictly increasing.
    pub fn from_edges(edges: Vec<u32>) -> Result<Self> {
        if edges.len() < 2 {
            return Err(ErrorKind::TooFewEdges { count: edges.len() }.into());
        }
        if let Some(position) = (1..edges.len()).find(|&i| edges[i] <= edges[i - 1]) {
            let (previous, value) = (edges[position - 1], edges[position]);
            return Err(ErrorKind::EdgesNotIncreasing {
                position,
                previous,
                value,
            }
            .into());
        }
        if edges.len() - 1 > usize::from(u16::MAX) {
            return Err(invalid(
                "boundaries (bucket count)",
                edges.len() - 1,
                "at most 65535",
            )
            .into());
        }
        Ok(Self { edges })
    }

    /// The edges, `K + 1` of them.
    pub fn edges(&self) -> &[u32] {
        &self.edges
    }

    /// Number of buckets `K`.
    pub fn count(&self) -> usize {
        self.edges.len() - 1
    }

    /// The bucket holding `length`, or `None` when it is outside the edges.
    pub fn bucket_of(&self, length: u32) -> Option<usize> {
        let upper = self.edges.partition_point(|&e| e < length);
        (upper > 0 && upper < self.edges.len()).then(|| upper - 1)
    }

    /// Checks that every length for which `keep` holds lies inside the edges; the error names the
    /// first row that does not.
    pub fn check_covers<L: Length>(&self, lengths: &[L], keep: impl Fn(u32) -> bool) -> Result<()> {
        let (low, high) = (self.edges[0], self.edges[self.edges.len() - 1]);
        let outside = |l: u32| keep(l) && (l <= low || l > high);
        match lengths.iter().position(|&l| outside(l.into())) {
            None => Ok(()),
            Some(row) => Err(ErrorKind::EdgesDoNotCover {
                row,
                length: lengths[row].into(),
                low,
                high,
            }
            .into()),
        }
    }

    /// An assignment function for lengths up to `longest` (longer ones get no bucket): a lookup table
    /// when that is small.
    pub fn assigner(&self, longest: u32) -> Assigner {
        let table = (longest <= LUT_MAX_LENGTH).then(|| {
            (0..=longest)
                .map(|l| {
                    self.bucket_of(l)
                        .and_then(|b| u16::try_from(b).ok())
                        .unwrap_or(NO_BUCKET)
                })
                .collect()
        });
        Assigner {
            table,
            buckets: self.clone(),
            longest,
        }
    }
}

const NO_BUCKET: u16 = u16::MAX;

/// Maps a length to its bucket (see [`Buckets::assigner`]).
#[derive(Debug, Clone)]
pub struct Assigner {
    /// `table[length]` is the bucket, or `NO_BUCKET`.
    table: Option<Vec<u16>>,
    buckets: Buckets,
    longest: u32,
}

impl Assigner {
    /// The bucket of `length`, or `None`.
    #[inline]
    pub fn get(&self, length: u32) -> Option<usize> {
        match &self.table {
            Some(t) => match t.get(length as usize) {
                Some(&b) if b != NO_BUCKET => Some(usize::from(b)),
                _ => None,
            },
            None if length <= self.longest => self.buckets.bucket_of(length),
            None => None,
        }
    }
}

fn invalid(name: &'static str, value: usize, expected: &'static str) -> ErrorKind {
    ErrorKind::InvalidSetting {
        name,
        value: value as i128,
        expected,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edges_are_validated() {
        assert_eq!(
            Buckets::from_edges(vec![5]).unwrap_err().kind(),
            &ErrorKind::TooFewEdges { count: 1 }
        );
        assert_eq!(
            Buckets::from_edges(vec![0, 10, 10]).unwrap_err().kind(),
            &ErrorKind::EdgesNotIncreasing {
                position: 2,
                previous: 10,
                value: 10
            }
        );
        assert!(Buckets::from_edges(vec![0, 20, 10]).is_err());
    }

    #[test]
    fn bucket_of_uses_half_open_intervals() {
        let b = Buckets::from_edges(vec![0, 10, 20]).unwrap();
        let got: Vec<_> = [1, 10, 11, 20, 21, 0]
            .iter()
            .map(|&l| b.bucket_of(l))
            .collect();
        assert_eq!(got, [Some(0), Some(0), Some(1), Some(1), None, None]);
        for limit in [15, LUT_MAX_LENGTH + 1] {
            let a = b.assigner(limit);
            for l in 0..25 {
                let expected = if l <= limit { b.bucket_of(l) } else { None };
                assert_eq!(a.get(l), expected, "length {l}");
            }
        }
    }

    #[test]
    fn coverage_names_first_bad_row() {
        let b = Buckets::from_edges(vec![0, 10]).unwrap();
        assert_eq!(
            b.check_covers(&[3u32, 12, 40], |_| true)
                .unwrap_err()
                .kind(),
            &ErrorKind::EdgesDoNotCover {
                row: 1,
                length: 12,
                low: 0,
                high: 10
            }
        );
    }

    #[test]
    fn edges_cover_the_lengths_they_bound() {
        let b = Buckets::from_edges(vec![0, 25, 50, 75, 100]).unwrap();
        let lengths: Vec<u32> = (1..=100).collect();
        b.check_covers(&lengths, |_| true).unwrap();
        assert!(b.check_covers(&[3u16, 200], |l| l < 100).is_ok());
        assert!(b.check_covers(&[3u16, 200], |_| true).is_err());
    }
}
