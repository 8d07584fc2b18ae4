//! The padding efficiency a plan is predicted to measure with given bucket edges: each bucket's
//! samples padded to the expected longest row of a batch drawn from it (see `optimize.rs`).

use crate::plan::config::{Batching, Config, CostModel};
use crate::plan::histogram::Histogram;

/// The efficiency the planner is predicted to measure with `edges` (see the module docs).
pub fn predicted_efficiency(histogram: &Histogram, edges: &[u32], config: &Config) -> f64 {
    let (mut real, mut padded) = (0.0f64, 0.0f64);
    let mut start = 0;
    for &top in &edges[1..] {
        let end = start + histogram.values[start..].partition_point(|&v| v <= top);
        let (values, counts) = (&histogram.values[start..end], &histogram.counts[start..end]);
        start = end;
        // Counts stay far below 2^53.
        #[allow(clippy::cast_precision_loss)]
        let total = counts.iter().sum::<u64>() as f64;
        if total == 0.0 {
            continue;
        }
        #[allow(clippy::cast_precision_loss)]
        let tokens: f64 = values
            .iter()
            .zip(counts)
            .map(|(&v, &c)| f64::from(v) * c as f64)
            .sum();
        real += tokens;
        padded += total * expected_batch_max(values, counts, total, config);
    }
    if padded == 0.0 {
        0.0
    } else {
        real / padded
    }
}

/// `E[padded max]` of a batch from a bucket, its rows solved from the batching rule.
fn expected_batch_max(values: &[u32], counts: &[u64], total: f64, config: &Config) -> f64 {
    let expected_max = |rows: f64| {
        let (mut below, mut sum) = (0.0f64, 0.0f64);
        for (&v, &c) in values.iter().zip(counts) {
            // Counts stay far below 2^53.
            #[allow(clippy::cast_precision_loss)]
            let upto = below + c as f64;
            let share = (upto / total).powf(rows) - (below / total).powf(rows);
            #[allow(clippy::cast_precision_loss)]
            let padded = config.padded(v) as f64;
            sum += padded * share;
            below = upto;
        }
        sum
    };
    match config.batching {
        Batching::Rows(n) => expected_max(f64::from(n).min(total)),
        Batching::Tokens(budget) => {
            #[allow(clippy::cast_precision_loss)]
            let budget = budget as f64;
            let top = values.last().map_or(1.0, |&v| {
                #[allow(clippy::cast_precision_loss)]
                let padded = config.padded(v) as f64;
                padded
            });
            // Rows from the cost of a row as long as the expected longest (exactly that many tokens
            // under the default cost model).
            let row_cost = |padded: f64| {
                let CostModel { linear, quadratic } = config.cost;
                linear * padded + quadratic * padded * padded
            };
            let mut rows = (budget / row_cost(top)).floor().clamp(1.0, total);
            for _ in 0..3 {
                rows = (budget / row_cost(expected_max(rows).max(1.0)))
                    .floor()
                    .clamp(1.0, total);
            }
            expected_max(rows)
        }
    }
}
