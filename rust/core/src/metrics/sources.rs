//! How a mixture's sources are spread through a plan: each source's samples and tokens, its share in
//! the mixture's unit, and `source_tv` — for each window of `G = accumulation × world_size`
//! consecutive batches (an optimizer step's micro-batches on every rank; an incomplete last window
//! is left out), the total-variation distance `½ Σ_s |p_s − w_s|` between the window's share of each
//! source `p` (in samples or tokens, as the weights count) and the weights `w` (the plan's epoch's,
//! under a schedule); the mean over windows. 0: every optimizer step sees the sources exactly at their weights.

use crate::lengths::Length;
use crate::metrics::{fraction, rows};
use crate::plan::mixture::{Mixture, Unit};

/// One source's part of a plan.
#[derive(Debug, Clone, PartialEq)]
pub struct SourcePart {
    /// Samples of the source in the plan (a row repeated counts each time).
    pub samples: u64,
    /// Their tokens.
    pub tokens: u64,
    /// Its share of the plan, in the mixture's unit.
    pub share: f64,
}

/// The sources of a plan (see the module docs).
#[derive(Debug, Clone, PartialEq)]
pub struct SourceFigures {
    /// Each source's part, in the mixture's order.
    pub parts: Vec<SourcePart>,
    /// The mean per-window source TV; `None` without a complete window.
    pub source_tv: Option<f64>,
}

/// The figures of the sources of `mixture` (source `s` holding rows `bounds[s]..bounds[s + 1]`) in a
/// plan given as CSR, with windows of `window` batches.
pub fn sources<L: Length>(
    (offsets, indices): (&[u32], &[u32]),
    lengths: &[L],
    mixture: &Mixture,
    (epoch, window): (u64, usize),
) -> SourceFigures {
    let bounds = mixture.bounds();
    let count = mixture.sources.len();
    let tokens = mixture.unit == Unit::Tokens;
    let source_of = |row: u32| bounds.partition_point(|&b| b <= row) - 1;
    let weight = |row: u32| {
        if tokens {
            u64::from(lengths[row as usize].into())
        } else {
            1
        }
    };
    let (mut samples, mut token_sums, mut mass) =
        (vec![0u64; count], vec![0u64; count], vec![0u64; count]);
    for &row in indices {
        let s = source_of(row);
        samples[s] += 1;
        token_sums[s] += u64::from(lengths[row as usize].into());
        mass[s] += weight(row);
    }
    let total: u64 = mass.iter().sum();
    let parts = (0..count)
        .map(|s| SourcePart {
            samples: samples[s],
            tokens: token_sums[s],
            share: fraction(mass[s], total),
        })
        .collect();
    let weights = mixture.weights_at(epoch);
    let sum: f64 = weights.iter().sum();
    let batches = offsets.len().saturating_sub(1);
    let windows = batches.checked_div(window).unwrap_or(0);
    let source_tv = (windows > 0).then(|| {
        let mut distance = 0.0;
        let mut mass = vec![0u64; count];
        for w in 0..windows {
            mass.fill(0);
            for &row in rows(offsets, indices, w * window, (w + 1) * window) {
                mass[source_of(row)] += weight(row);
            }
            let total: u64 = mass.iter().sum();
            let gap: f64 = mass
                .iter()
                .zip(&weights)
                .map(|(&m, &q)| (fraction(m, total) - q / sum).abs())
                .sum();
            distance += gap / 2.0;
        }
        // Window counts stay far below 2^53.
        #[allow(clippy::cast_precision_loss)]
        let mean = distance / windows as f64;
        mean
    });
    SourceFigures { parts, source_tv }
}
