//! Sample counts per distinct admitted length: what the edge optimizer (`optimize.rs`) and the
//! efficiency prediction (`predict.rs`) work on, coarsened past [`MAX_DISTINCT`] distinct lengths.

use crate::lengths::Length;

/// Distinct lengths the DP works on; more are coarsened (bounds its memory to `K × 2^15` words).
pub const MAX_DISTINCT: usize = 1 << 15;

/// Sample counts per distinct admitted length, ascending.
#[derive(Debug, Clone)]
pub struct Histogram {
    pub(crate) values: Vec<u32>,
    pub(crate) counts: Vec<u64>,
    /// The shortest length counted: where the first bucket starts, also once coarsened (whose first
    /// value is its first group's top).
    pub(crate) shortest: u32,
}

impl Histogram {
    /// The histogram of the lengths for which `keep` holds.
    pub fn new<L: Length>(lengths: &[L], keep: impl Fn(u32) -> bool) -> Self {
        let longest = lengths
            .iter()
            .map(|&l| l.into())
            .filter(|&l| keep(l))
            .max()
            .unwrap_or(0);
        let (mut values, mut counts) = (Vec::new(), Vec::new());
        if longest <= crate::plan::buckets::LUT_MAX_LENGTH {
            let mut per_length = vec![0u64; longest as usize + 1];
            for &l in lengths {
                let l: u32 = l.into();
                if keep(l) {
                    per_length[l as usize] += 1;
                }
            }
            for (l, &c) in per_length.iter().enumerate() {
                if c > 0 {
                    // l ≤ longest, a u32.
                    #[allow(clippy::cast_possible_truncation)]
                    values.push(l as u32);
                    counts.push(c);
                }
            }
        } else {
            let mut kept: Vec<u32> = lengths
                .iter()
                .map(|&l| l.into())
                .filter(|&l| keep(l))
                .collect();
            kept.sort_unstable();
            for run in kept.chunk_by(|a, b| a == b) {
                values.push(run[0]);
                counts.push(run.len() as u64);
            }
        }
        let shortest = values.first().copied().unwrap_or(0);
        Self {
            values,
            counts,
            shortest,
        }
    }

    /// Number of distinct lengths.
    pub fn distinct(&self) -> usize {
        self.values.len()
    }

    /// Merges neighbouring lengths into at most `groups` groups of about equal sample counts; a group
    /// is represented by its top length (the only place an edge can fall).
    pub(crate) fn coarsened(&self, groups: usize) -> Self {
        if self.values.len() <= groups {
            return self.clone();
        }
        let total: u64 = self.counts.iter().sum();
        let (mut values, mut counts, mut seen, mut pending) = (Vec::new(), Vec::new(), 0u64, 0u64);
        for (i, (&v, &c)) in self.values.iter().zip(&self.counts).enumerate() {
            pending += c;
            seen += c;
            let boundary = (u128::from(seen) * groups as u128 / u128::from(total.max(1))) as usize;
            if boundary > values.len() || i + 1 == self.values.len() {
                values.push(v);
                counts.push(pending);
                pending = 0;
            }
        }
        Self {
            values,
            counts,
            shortest: self.shortest,
        }
    }
}
