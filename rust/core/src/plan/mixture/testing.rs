//! Helpers of the mixture tests.

use crate::plan::config::{Batching, Config};
use crate::plan::mixture::{Mixture, Unit};
use std::collections::HashMap;

/// A mixture of `(name, rows, weight)`.
pub(super) fn mixture(sources: &[(&str, u32, f64)], unit: Unit) -> Mixture {
    Mixture::new(sources.iter().map(|&(n, r, w)| (n.to_string(), r, w)), unit)
}

/// How many times each row appears in `rows`.
pub(super) fn counts(rows: &[u32]) -> HashMap<u32, u32> {
    let mut counts = HashMap::new();
    for &r in rows {
        *counts.entry(r).or_insert(0) += 1;
    }
    counts
}

/// A configuration of `world_size` ranks × `accumulation`, a 64-token budget, seed 11.
pub(super) fn config(world_size: u32, accumulation: u32) -> Config {
    Config {
        world_size,
        accumulation,
        seed: 11,
        ..Config::new(Batching::Tokens(64))
    }
}
