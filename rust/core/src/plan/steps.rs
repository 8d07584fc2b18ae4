//! **Every epoch has the same steps** (`Planner::steps`): trainers and LR schedules read the count
//! once. Under a token budget the count an epoch forms scatters with its shuffle — by a few batches
//! with narrow buckets, by tens with the seed's 6 wide ones (measured) — so the target is set once:
//! epoch 0's draws and three calibration draws are formed, and the target is the largest count plus
//! their standard deviation (about two deviations above the mean), rounded up to a multiple of
//! `world_size`. A fixed margin of 0.02·√batches sent 7 of 8 epochs with 6 buckets back for more
//! draws (3× the planning time) and one to epoch 0's draws. An epoch
//! that forms fewer batches splits some; one that forms more is formed again from other keyed draws
//! of the same epoch (each exceeds with probability well under a half), and after
//! 16 attempts from epoch 0's draws, which form exactly the reference count — so the loop
//! ends and no sample is ever repeated or dropped. A mixture's selection is part of the epoch's key
//! and is never drawn again: every attempt forms the epoch's own selection (a down-sampled source's
//! cycle holds: no row twice within a cycle, none skipped). Drawing it again after eight attempts
//! (the rule before) repeated 1,484 of 8,000 slots of a cycle in ~0.5% of epochs; an epoch whose own
//! selection forms too many batches under every forming draw is refused, naming the fix. Rejected: an analytic worst-case count (a bucket's
//! batches all cut at the rows its top edge allows), which would split batches in every epoch to
//! reach a count no shuffle forms.
//!
//! Here: the target set once ([`target_batches`]) and an epoch formed within it ([`form_within`]), over
//! the draws `draws.rs` forms.

use std::sync::OnceLock;

use crate::error::{ErrorKind, Result};
use crate::lengths::Length;
use crate::plan::config::{Batching, Config, Mode};
use crate::plan::draws::{Draws, Population};
use crate::plan::form::Epoch;
use crate::plan::keys::{
    calibration_key, reform_key, CALIBRATION_DRAWS, REFERENCE_KEY, REFORM_ATTEMPTS,
};
use crate::plan::merge::merge_to;

/// The batches of every epoch from the counts the reference and calibration draws formed: above the
/// largest by their standard deviation (about two standard deviations above the mean), a multiple of
/// the ranks (of ranks × accumulation with `whole_steps`), split up to it; under `drop_last` below the smallest by as much, the rest dropped.
/// Without calibration draws (huge epochs), `√batches / 20` stands in for the deviation (~0.02·√batches
/// was measured on the seed workload with narrow buckets).
/// The target never asks for more batches than `samples` can fill (one row each) when the reference
/// draws fit under that: a tiny dataset on many ranks (8 samples, 5 ranks) would otherwise be
/// refused for want of splits though a plan of fewer steps exists; an epoch that forms more than
/// the capped target is formed again, down to the reference draws, as above.
pub(crate) fn steps_target(counts: &[usize], config: &Config, samples: u64) -> usize {
    // A step of every rank, or with `whole_steps` an optimizer step of every rank: what the count rounds to.
    let world = config.world_size as usize
        * if config.whole_steps {
            config.accumulation as usize
        } else {
            1
        };
    let (lo, hi) = (
        counts.iter().min().copied().unwrap_or(0),
        counts.iter().max().copied().unwrap_or(0),
    );
    let margin = if counts.len() > 1 {
        // Counts are far below 2^53; the deviation only sizes a margin.
        #[allow(clippy::cast_precision_loss)]
        let (n, mean) = (
            counts.len() as f64,
            counts.iter().sum::<usize>() as f64 / counts.len() as f64,
        );
        #[allow(clippy::cast_precision_loss)]
        let variance = counts
            .iter()
            .map(|&c| (c as f64 - mean).powi(2))
            .sum::<f64>()
            / n;
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let margin = variance.sqrt().ceil() as usize;
        margin
    } else {
        hi.isqrt() / 20
    };
    if config.drop_last {
        let steps = lo.saturating_sub(margin) / world;
        return if steps == 0 { lo / world } else { steps } * world;
    }
    let target = (hi + margin).next_multiple_of(world);
    let most = usize::try_from(samples).unwrap_or(usize::MAX) / world * world;
    let reference = counts.first().copied().unwrap_or(0).next_multiple_of(world);
    if target > most && reference <= most && most > 0 {
        return most;
    }
    target
}

/// The batch count every epoch of a planner shares, set once (see the module docs), and what bounds it.
pub(crate) struct StepCount<'a> {
    pub(crate) target: &'a OnceLock<usize>,
    /// Samples an epoch plans: the target never asks for more batches than they fill.
    pub(crate) admitted: u64,
}

/// An epoch formed within the shared count: what splitting for ranks takes (`ranks.rs`).
pub(crate) struct FormedEpoch {
    /// The rows in batch order.
    pub(crate) order: Vec<u32>,
    pub(crate) epoch: Epoch,
    /// The key of the draws that formed it.
    pub(crate) key: u64,
    /// Extra forming passes it took.
    pub(crate) reformed: u64,
}

/// Forms `epoch` with no more batches than the target: the epoch's own draws, or — in the rare epoch
/// that forms more — up to [`REFORM_ATTEMPTS`] other keyed draws of it, and at last the reference
/// draws, which form exactly the reference count.
pub(crate) fn form_within<L: Length>(
    draws: &Draws<'_, L>,
    steps: &StepCount<'_>,
    epoch: u64,
) -> Result<FormedEpoch> {
    let formed = |(order, formed): (Vec<u32>, Epoch), key, reformed| FormedEpoch {
        order,
        epoch: formed,
        key,
        reformed,
    };
    let (order, first) = draws.form((epoch, epoch));
    let target = target_batches(draws, steps, (epoch == REFERENCE_KEY).then_some(&first));
    if fits(draws, &first, target) {
        return Ok(formed((order, first), epoch, 0));
    }
    // Released before forming again: one form at a time is what `plan_bytes` reserves.
    drop((order, first));
    for attempt in 1..=REFORM_ATTEMPTS {
        let key = reform_key(epoch, attempt);
        // A mixture keeps the epoch's selection (only the forming draws change, so a
        // down-sampled source's cycle holds: `mixture/select.rs`).
        let (order, again) = draws.form((epoch, key));
        if fits(draws, &again, target) {
            return Ok(formed((order, again), key, attempt));
        }
    }
    if draws.is_mixture() {
        return merged_or_refused(draws, epoch, target)
            .map(|own| formed(own, epoch, REFORM_ATTEMPTS + 1));
    }
    let reference = draws.form((REFERENCE_KEY, REFERENCE_KEY));
    Ok(formed(reference, REFERENCE_KEY, REFORM_ATTEMPTS + 1))
}

/// A mixture's epoch whose own selection formed too many batches under every draw: the reference
/// draws would select epoch 0's rows (the cycle broken), so a padded epoch's own batches are merged
/// down to the count (`merge.rs`); else it is refused.
fn merged_or_refused<L: Length>(
    draws: &Draws<'_, L>,
    epoch: u64,
    target: usize,
) -> Result<(Vec<u32>, Epoch)> {
    let (mut order, mut formed) = draws.form((epoch, epoch));
    let (lengths, config, rules) = (
        draws.former.lengths,
        draws.former.config,
        draws.former.rules,
    );
    if config.mode == Mode::Padded {
        let capacity = |longest: u32| rules.get(longest).map_or(0, |(_, rows)| u64::from(rows));
        if merge_to(lengths, config, capacity, &mut order, &mut formed, target)
            && fits(draws, &formed, target)
        {
            return Ok((order, formed));
        }
    }
    Err(ErrorKind::MixtureSetting {
        setting: "batch_size",
        problem: format!(
            "epoch {epoch}'s selection of the mixture forms more than the {target} batches every \
             epoch has under each of {} forming draws, and drawing other rows would break a \
             down-sampled source's cycle (rows twice, others skipped), and its batches cannot be \
             merged down to that count; pass drop_last=True, or a lower target_efficiency \
             (narrower buckets leave fewer rows over)",
            REFORM_ATTEMPTS + 1
        ),
    }
    .into())
}

/// Whether a formed epoch reaches the `target` batches: no more batches (under `drop_last` the
/// extra ones are dropped), and — for a mixture, whose selection in tokens holds more or fewer
/// samples from one draw to the next — samples enough to split into that many. The reference
/// draws, which set the target, always reach it (hypothesis found a tokens-weighted epoch of 4
/// samples under a target of 5 batches).
fn fits<L: Length>(draws: &Draws<'_, L>, formed: &Epoch, target: usize) -> bool {
    let batches = formed.offsets.len() - 1;
    let enough = !draws.is_mixture() || formed.written >= target;
    (draws.former.config.drop_last || batches <= target) && enough
}

/// Batches every epoch's plan has, all ranks together, decided once from the reference draws
/// (`reference`, when the caller has just formed them) and the calibration draws.
pub(crate) fn target_batches<L: Length>(
    draws: &Draws<'_, L>,
    steps: &StepCount<'_>,
    reference: Option<&Epoch>,
) -> usize {
    *steps.target.get_or_init(|| {
        let config = draws.former.config;
        let count = |key| draws.form((key, key)).1.offsets.len() - 1;
        let first = reference.map_or_else(|| count(REFERENCE_KEY), |f| f.offsets.len() - 1);
        let by_bucket = matches!(draws.population, Population::ByBucket(_));
        let fixed = !config.shuffle || (by_bucket && matches!(config.batching, Batching::Rows(_)));
        if fixed {
            return steps_target(&[first, first], config, steps.admitted);
        }
        let mut counts = vec![first];
        if draws.former.arranged {
            counts.extend((1..=CALIBRATION_DRAWS).map(|i| count(calibration_key(i))));
        }
        // A schedule's epochs select other shares: the count covers the draws of each point's.
        counts.extend(draws.schedule_epochs().into_iter().map(count));
        steps_target(&counts, config, steps.admitted)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::config::Batching;

    #[test]
    fn the_target_stays_within_what_the_samples_can_fill() {
        let config = Config {
            world_size: 5,
            ..Config::new(Batching::Tokens(700))
        };
        // Draws of 4, 5, 6 batches: a margin above 6 asks for 10 batches, more than 8 samples fill.
        assert_eq!(steps_target(&[4, 5, 6], &config, 8), 5);
        assert_eq!(steps_target(&[4, 5, 6], &config, 1000), 10);
        // The reference draws must fit: 6 batches cannot become 5.
        assert_eq!(steps_target(&[6, 5, 4], &config, 8), 10);
    }

    #[test]
    fn whole_steps_round_to_optimizer_steps_of_every_rank() {
        let config = Config {
            world_size: 5,
            accumulation: 4,
            ..Config::new(Batching::Tokens(700))
        };
        assert_eq!(steps_target(&[41, 42, 43], &config, 1000), 45);
        let whole = Config {
            whole_steps: true,
            ..config.clone()
        };
        assert_eq!(steps_target(&[41, 42, 43], &whole, 1000), 60);
        let dropping = Config {
            drop_last: true,
            ..whole
        };
        assert_eq!(steps_target(&[41, 42, 43], &dropping, 1000), 40);
    }
}
