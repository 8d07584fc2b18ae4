//! What a planner answers about the pieces it plans under `Oversize::Truncate` (`truncate.rs`): the
//! dataset's rows, the samples split, where each entry's tokens are, and the rows' own lengths.

use crate::error::Result;
use crate::lengths::with_lengths;
use crate::memory;
use crate::plan::planner::Planner;
use crate::plan::truncate::locate;

impl Planner {
    /// Rows of the dataset: the planned entries less the later pieces of split samples.
    pub fn samples(&self) -> usize {
        self.lengths.len() - self.later.as_ref().map_or(0, |l| l.rows.len())
    }

    /// Samples split into pieces (`Oversize::Truncate`; else 0).
    pub fn truncated(&self) -> u64 {
        self.later.as_ref().map_or(0, |l| l.split)
    }

    /// The token windows `(rows, starts, lengths)` of `entries` of this planner's plans (see
    /// [`locate`]).
    pub fn locate(&self, entries: &[i64]) -> Result<(Vec<u32>, Vec<u32>, Vec<u32>)> {
        self.lengths.check()?;
        let later = self.later.as_ref().map(|l| (&l.rows[..], &l.starts[..]));
        let samples = self.samples();
        with_lengths!(&self.lengths, v => locate(entries, samples, v, later))
    }

    /// The dataset rows' lengths (what the planner was built from): the planned lengths, with each
    /// split row's pieces summed back under `Oversize::Truncate`.
    pub fn dataset_lengths(&self) -> Result<Vec<u32>> {
        self.lengths.check()?;
        const WHAT: &str = "copying the lengths";
        let samples = self.samples();
        let mut out = memory::vec_with_capacity(WHAT, samples)?;
        with_lengths!(&self.lengths, v => {
            out.extend(v[..samples].iter().map(|&l| Into::<u32>::into(l)));
            if let Some(later) = &self.later {
                // The pieces of a row sum to its length, which fits u32.
                for (&row, &piece) in later.rows.iter().zip(&v[samples..]) {
                    out[row as usize] += Into::<u32>::into(piece);
                }
            }
        });
        Ok(out)
    }
}
