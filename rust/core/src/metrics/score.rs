//! Scoring any batching, not only this crate's plans: a baseline's or another library's batches,
//! given as CSR (`offsets`, `indices`), are checked first and then scored by the code that scores
//! plans, so every figure in a comparison is measured the same way.

use crate::error::{ErrorKind, Result};
use crate::lengths::to_usize;
use crate::metrics::{
    batch_costs, churn, end_to_end, mixing, rank_imbalance, synchronous, Deciles, Imbalance,
    Mixing, Synchronous,
};
use crate::plan::config::{Batching, Config, CostModel};

/// Checks that `offsets` is a CSR over `indices` whose rows all lie below `samples`.
pub fn check_csr(offsets: &[u32], indices: &[u32], samples: usize) -> Result<()> {
    // What scoring builds: a cost per batch (and a step's ratio), the lengths' deciles (a sorted copy
    // and a mass per distinct length, at worst), each sample's batch for churn.
    crate::memory::reserve(
        "scoring a batching",
        offsets.len() as u64 * 16 + samples as u64 * 56,
    )?;
    let rising = offsets.windows(2).all(|w| w[0] <= w[1]);
    let spans =
        offsets.first() == Some(&0) && offsets.last().map(|&o| o as usize) == Some(indices.len());
    if !(rising && spans) {
        return Err(ErrorKind::BadBatching {
            problem: "offsets must start at 0, never decrease, and end at len(indices)",
        }
        .into());
    }
    if indices.iter().any(|&r| r as usize >= samples) {
        return Err(ErrorKind::BadBatching {
            problem: "indices must be rows of lengths (each below len(lengths))",
        }
        .into());
    }
    Ok(())
}

fn at_least_one(name: &'static str, value: u64, expected: &'static str) -> Result<()> {
    if value == 0 {
        return Err(ErrorKind::InvalidSetting {
            name,
            value: 0,
            expected,
        }
        .into());
    }
    Ok(())
}

/// Real tokens over padded tokens (each batch's rows × its longest length rounded up to `multiple`),
/// the figure `Stats::efficiency` reports for plans; `None` when the batches hold no token.
pub fn score_efficiency(
    (offsets, indices): (&[u32], &[u32]),
    lengths: &[u32],
    multiple: u64,
) -> Result<Option<f64>> {
    check_csr(offsets, indices, lengths.len())?;
    at_least_one("pad_to_multiple_of", multiple, "≥ 1")?;
    let (mut real, mut padded) = (0u64, 0u64);
    for w in offsets.windows(2) {
        let rows = &indices[to_usize(w[0])..to_usize(w[1])];
        let longest = rows.iter().map(|&r| u64::from(lengths[r as usize])).max();
        real += rows
            .iter()
            .map(|&r| u64::from(lengths[r as usize]))
            .sum::<u64>();
        padded += rows.len() as u64 * longest.unwrap_or(0).div_ceil(multiple) * multiple;
    }
    // Token counts stay far below 2^53.
    #[allow(clippy::cast_precision_loss)]
    Ok((padded > 0).then(|| real as f64 / padded as f64))
}

/// [`window_tv`] of any batching, against the token deciles of `lengths`.
pub fn score_window_tv(
    csr: (&[u32], &[u32]),
    lengths: &[u32],
    window: usize,
) -> Result<Option<f64>> {
    Ok(score_mixing(csr, lengths, window)?.map(|m| m.window_tv))
}

/// [`mixing`] of any batching, against the token deciles of `lengths`.
pub fn score_mixing(
    (offsets, indices): (&[u32], &[u32]),
    lengths: &[u32],
    window: usize,
) -> Result<Option<Mixing>> {
    check_csr(offsets, indices, lengths.len())?;
    at_least_one("window", window as u64, "≥ 1 batch")?;
    let deciles = Deciles::new(lengths);
    Ok(mixing(offsets, indices, lengths, &deciles, window))
}

/// [`rank_imbalance`] of any batching in padded tokens: a batch costs its rows × its longest length
/// rounded up to `multiple`.
pub fn score_rank_imbalance(
    (offsets, indices): (&[u32], &[u32]),
    lengths: &[u32],
    world_size: usize,
    multiple: u64,
) -> Result<Option<Imbalance>> {
    check_csr(offsets, indices, lengths.len())?;
    at_least_one("world_size", world_size as u64, "≥ 1")?;
    at_least_one("pad_to_multiple_of", multiple, "≥ 1")?;
    let costs = padded_costs((offsets, indices), lengths, multiple, CostModel::TOKENS);
    Ok(rank_imbalance(&costs, world_size))
}

/// [`synchronous`] efficiency of any padded batching on `world_size` ranks with `accumulation`
/// micro-batches per optimizer step: a batch costs its rows × `cost.row(L)`, `L` its longest length
/// rounded up to `multiple`.
pub fn score_synchronous(
    (offsets, indices): (&[u32], &[u32]),
    lengths: &[u32],
    (world_size, accumulation): (usize, usize),
    multiple: u64,
    cost: CostModel,
) -> Result<Option<Synchronous>> {
    check_timing(
        (offsets, indices),
        lengths,
        (world_size, accumulation),
        multiple,
        cost,
    )?;
    let costs = padded_costs((offsets, indices), lengths, multiple, cost);
    Ok(synchronous(&costs, world_size, accumulation))
}

/// [`end_to_end`] efficiency of any batching on `world_size` ranks with `accumulation` micro-batches
/// per optimizer step, under `cost`: padded batches (a batch takes its rows × `cost.row(L)`, `L` its
/// longest length rounded up to `multiple`), or with `capacity`, packed rows of that many tokens (a
/// row takes `a·capacity + b·Σl²`). The useful work is every sample's `a·l + b·l²`.
pub fn score_end_to_end(
    (offsets, indices): (&[u32], &[u32]),
    lengths: &[u32],
    (world_size, accumulation): (usize, usize),
    (multiple, capacity): (u64, Option<u64>),
    cost: CostModel,
) -> Result<Option<Synchronous>> {
    check_timing(
        (offsets, indices),
        lengths,
        (world_size, accumulation),
        multiple,
        cost,
    )?;
    let timed = match capacity {
        Some(capacity) => {
            if (0..offsets.len().saturating_sub(1)).any(|b| {
                let members = &indices[to_usize(offsets[b])..to_usize(offsets[b + 1])];
                members
                    .iter()
                    .map(|&r| u64::from(lengths[r as usize]))
                    .sum::<u64>()
                    > capacity
            }) {
                return Err(ErrorKind::BadBatching {
                    problem: "a packed row holds more tokens than capacity",
                }
                .into());
            }
            // Capacities and lengths stay far below 2^53.
            #[allow(clippy::cast_precision_loss)]
            batch_costs(offsets, indices, |members: &[u32]| {
                cost.linear * capacity as f64
                    + members
                        .iter()
                        .map(|&r| {
                            let l = f64::from(lengths[r as usize]);
                            cost.quadratic * l * l
                        })
                        .sum::<f64>()
            })
        }
        None => padded_costs((offsets, indices), lengths, multiple, cost),
    };
    let useful = batch_costs(offsets, indices, |members: &[u32]| {
        members
            .iter()
            .map(|&r| cost.row(u64::from(lengths[r as usize])))
            .sum()
    });
    Ok(end_to_end(&timed, &useful, world_size, accumulation))
}

/// What scoring the ranks' time takes, checked: a CSR over `lengths`, counts of at least one, and a
/// cost the planner would accept.
fn check_timing(
    (offsets, indices): (&[u32], &[u32]),
    lengths: &[u32],
    (world_size, accumulation): (usize, usize),
    multiple: u64,
    cost: CostModel,
) -> Result<()> {
    check_csr(offsets, indices, lengths.len())?;
    at_least_one("world_size", world_size as u64, "≥ 1")?;
    at_least_one("accumulation", accumulation as u64, "≥ 1")?;
    at_least_one("pad_to_multiple_of", multiple, "≥ 1")?;
    let mut config = Config::new(Batching::Tokens(u64::MAX));
    config.cost = cost;
    config.validate_cost()
}

/// Each batch's rows × `cost.row(L)`, `L` its longest length rounded up to `multiple` (exact padded
/// tokens under [`CostModel::TOKENS`]: counts stay far below 2^53).
fn padded_costs(
    csr: (&[u32], &[u32]),
    lengths: &[u32],
    multiple: u64,
    cost: CostModel,
) -> Vec<f64> {
    batch_costs(csr.0, csr.1, |members: &[u32]| {
        let longest = members
            .iter()
            .map(|&r| u64::from(lengths[r as usize]))
            .max()
            .unwrap_or(0);
        #[allow(clippy::cast_precision_loss)]
        let rows = members.len() as f64;
        rows * cost.row(longest.div_ceil(multiple) * multiple)
    })
}

/// [`churn`] between two batchings of the same `samples` samples.
pub fn score_churn(
    a: (&[u32], &[u32]),
    b: (&[u32], &[u32]),
    samples: usize,
) -> Result<Option<f64>> {
    check_csr(a.0, a.1, samples)?;
    check_csr(b.0, b.1, samples)?;
    churn(a, b, samples)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn end_to_end_is_useful_work_over_what_the_ranks_spend() {
        let lengths = [3, 5, 8, 13];
        let good: (&[u32], &[u32]) = (&[0, 2, 4], &[0, 1, 2, 3]);
        let tokens = CostModel::TOKENS;
        // Padded: batches take 2 × 5 and 2 × 13; the step waits for 26 on both ranks.
        let padded = score_end_to_end(good, &lengths, (2, 1), (1, None), tokens)
            .unwrap()
            .unwrap();
        assert!((padded.per_micro_batch - 29.0 / 52.0).abs() < 1e-12);
        // Packed rows of 21 tokens: each row takes 21, the ranks never wait.
        let packed = score_end_to_end(good, &lengths, (2, 1), (1, Some(21)), tokens)
            .unwrap()
            .unwrap();
        assert!((packed.per_micro_batch - 29.0 / 42.0).abs() < 1e-12);
        assert!(score_end_to_end(good, &lengths, (2, 1), (1, Some(20)), tokens).is_err());
        // Attention: a·C + b·Σl² per row, useful Σ a·l + b·l².
        let price = CostModel {
            linear: 1.0,
            quadratic: 0.5,
        };
        let got = score_end_to_end(good, &lengths, (2, 1), (1, Some(21)), price)
            .unwrap()
            .unwrap();
        let rows = [21.0 + 0.5 * (9.0 + 25.0), 21.0 + 0.5 * (64.0 + 169.0)];
        let useful = 29.0 + 0.5 * (9.0 + 25.0 + 64.0 + 169.0);
        assert!((got.per_micro_batch - useful / (2.0 * rows[1])).abs() < 1e-12);
    }

    #[test]
    fn bad_csr_and_settings_are_errors_and_good_ones_scores() {
        let lengths = [3, 5, 8, 13];
        let good: (&[u32], &[u32]) = (&[0, 2, 4], &[0, 1, 2, 3]);
        assert!(score_window_tv(good, &lengths, 1).unwrap().is_some());
        let imbalance = score_rank_imbalance(good, &lengths, 2, 1).unwrap().unwrap();
        assert_eq!(imbalance.max, 26.0 / 10.0);
        assert_eq!(score_churn(good, good, 4).unwrap(), Some(1.0));
        // (3 + 5) / (2 × 5) and (8 + 13) / (2 × 13); padded to 8: 2 × 8 and 2 × 16.
        assert_eq!(
            score_efficiency(good, &lengths, 1).unwrap(),
            Some(29.0 / 36.0)
        );
        assert_eq!(
            score_efficiency(good, &lengths, 8).unwrap(),
            Some(29.0 / 48.0)
        );
        assert_eq!(score_efficiency((&[0], &[]), &lengths, 1).unwrap(), None);
        for bad in [
            (&[0u32, 3, 2][..], &[0u32, 1][..]),
            (&[1, 2], &[0]),
            (&[0, 1], &[9]),
        ] {
            let err = score_window_tv(bad, &lengths, 1).unwrap_err();
            assert!(matches!(err.kind(), ErrorKind::BadBatching { .. }), "{err}");
        }
        let named = |r: Result<Option<Imbalance>>| match r.unwrap_err().kind() {
            ErrorKind::InvalidSetting { name, .. } => *name,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            named(score_rank_imbalance(good, &lengths, 0, 1)),
            "world_size"
        );
        assert_eq!(
            named(score_rank_imbalance(good, &lengths, 2, 0)),
            "pad_to_multiple_of"
        );
        assert!(score_window_tv(good, &lengths, 0).is_err());
        // Steps (3 + 5 → 2 × 5 = 10 padded tokens) and (8 + 13 → 26) on one rank each; two ranks.
        let sync = score_synchronous(good, &lengths, (2, 1), 1, CostModel::TOKENS)
            .unwrap()
            .unwrap();
        assert_eq!(sync.per_micro_batch, 36.0 / (2.0 * 26.0));
        let bad_cost = CostModel {
            linear: -1.0,
            quadratic: 0.0,
        };
        assert!(score_synchronous(good, &lengths, (2, 1), 1, bad_cost).is_err());
    }
}
