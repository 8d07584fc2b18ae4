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
//! Here too the planner's part of it: the target set once ([`Planner::steps`]) and an epoch formed
//! within it.

use crate::error::{ErrorKind, Result};
use crate::lengths::{with_lengths, Length};
use crate::plan::config::{Batching, Config, Mode};
use crate::plan::form::{Epoch, Former};
use crate::plan::merge::merge_to;
use crate::plan::planner::Planner;

/// The draws that set every epoch's batch count: epoch 0's.
pub(crate) const REFERENCE_KEY: u64 = 0;

/// Other draws of an epoch tried when its own form more batches than the target (each does with a
/// probability well under a half: the margin is set for that), before the reference draws.
pub(crate) const REFORM_ATTEMPTS: u64 = 16;

/// The key of the `attempt`-th other draw of `epoch` (attempt 0 is the epoch's own).
pub(crate) fn reform_key(epoch: u64, attempt: u64) -> u64 {
    epoch.wrapping_add(attempt.wrapping_mul(0x9E37_79B9_7F4A_7C15))
}

/// Other draws formed once, besides epoch 0's, to measure how much the count scatters (epochs up to
/// `ARRANGE_MAX_SAMPLES` samples; each costs one forming pass, once per planner).
pub(crate) const CALIBRATION_DRAWS: u64 = 3;

/// The key of the `i`-th calibration draw (none is an epoch's own or retry draw in practice).
pub(crate) fn calibration_key(i: u64) -> u64 {
    reform_key(REFERENCE_KEY, REFORM_ATTEMPTS + i)
}

/// The batches of every epoch from the counts the reference and calibration draws formed: above the
/// largest by their standard deviation (about two standard deviations above the mean), a multiple of
/// the ranks, split up to it; under `drop_last` below the smallest by as much, the rest dropped.
/// Without calibration draws (huge epochs), `√batches / 20` stands in for the deviation (~0.02·√batches
/// was measured on the seed workload with narrow buckets).
/// The target never asks for more batches than `samples` can fill (one row each) when the reference
/// draws fit under that: a tiny dataset on many ranks (8 samples, 5 ranks) would otherwise be
/// refused for want of splits though a plan of fewer steps exists; an epoch that forms more than
/// the capped target is formed again, down to the reference draws, as above.
pub(crate) fn steps_target(counts: &[usize], config: &Config, samples: u64) -> usize {
    let world = config.world_size as usize;
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

impl Planner {
    /// Forms `epoch` with no more batches than the target (see [`Planner::steps`]): the epoch's own
    /// draws, or — in the rare epoch that forms more — up to [`REFORM_ATTEMPTS`] other keyed draws
    /// of it, and at last the reference draws, which form exactly the reference count. Returns the
    /// rows, the epoch, the key used and how many extra forming passes it took.
    pub(super) fn form_within<L: Length>(
        &self,
        former: &Former<'_, L>,
        epoch: u64,
    ) -> Result<(Vec<u32>, Epoch, u64, u64)> {
        let (order, formed) = self.form(former, (epoch, epoch));
        let target = self.target_batches(former, (epoch == REFERENCE_KEY).then_some(&formed));
        if self.fits(&formed, target) {
            return Ok((order, formed, epoch, 0));
        }
        // Released before forming again: one form at a time is what `plan_bytes` reserves.
        drop((order, formed));
        for attempt in 1..=REFORM_ATTEMPTS {
            let key = reform_key(epoch, attempt);
            // A mixture keeps the epoch's selection (only the forming draws change, so a
            // down-sampled source's cycle holds: `mixture/select.rs`).
            let (order, formed) = self.form(former, (epoch, key));
            if self.fits(&formed, target) {
                return Ok((order, formed, key, attempt));
            }
        }
        if self.mix.is_some() {
            // The reference draws would select epoch 0's rows (the cycle broken): a padded epoch's
            // own batches are merged down to the count (`merge.rs`); else refused.
            let (mut order, mut formed) = self.form(former, (epoch, epoch));
            if self.config.mode == Mode::Padded {
                let (lengths, config) = (former.lengths, &self.config);
                let capacity = |longest: u32| {
                    self.rules
                        .get(longest)
                        .map_or(0, |(_, rows)| u64::from(rows))
                };
                if merge_to(lengths, config, capacity, &mut order, &mut formed, target)
                    && self.fits(&formed, target)
                {
                    return Ok((order, formed, epoch, REFORM_ATTEMPTS + 1));
                }
            }
            return Err(ErrorKind::MixtureSetting {
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
            .into());
        }
        let (order, formed) = self.form(former, (REFERENCE_KEY, REFERENCE_KEY));
        Ok((order, formed, REFERENCE_KEY, REFORM_ATTEMPTS + 1))
    }

    /// Whether a formed epoch reaches the `target` batches: no more batches (under `drop_last` the
    /// extra ones are dropped), and — for a mixture, whose selection in tokens holds more or fewer
    /// samples from one draw to the next — samples enough to split into that many. The reference
    /// draws, which set the target, always reach it (hypothesis found a tokens-weighted epoch of 4
    /// samples under a target of 5 batches).
    fn fits(&self, formed: &Epoch, target: usize) -> bool {
        let batches = formed.offsets.len() - 1;
        let enough = self.mix.is_none() || formed.written >= target;
        (self.config.drop_last || batches <= target) && enough
    }

    /// Batches every epoch's plan has, all ranks together, decided once from the reference draws
    /// (`reference`, when the caller has just formed them) and the calibration draws.
    pub(super) fn target_batches<L: Length>(
        &self,
        former: &Former<'_, L>,
        reference: Option<&Epoch>,
    ) -> usize {
        *self.target.get_or_init(|| {
            let count = |key| self.form(former, (key, key)).1.offsets.len() - 1;
            let first = reference.map_or_else(|| count(REFERENCE_KEY), |f| f.offsets.len() - 1);
            let fixed = !self.config.shuffle
                || (self.by_bucket.is_some() && matches!(self.config.batching, Batching::Rows(_)));
            if fixed {
                return steps_target(&[first, first], &self.config, self.admitted);
            }
            let mut counts = vec![first];
            if self.arranged() {
                counts.extend((1..=CALIBRATION_DRAWS).map(|i| count(calibration_key(i))));
            }
            steps_target(&counts, &self.config, self.admitted)
        })
    }

    /// Steps per rank of every epoch: the same for every epoch of this configuration and data.
    pub fn steps(&self) -> u64 {
        self.plan_target() / u64::from(self.config.world_size)
    }

    fn plan_target(&self) -> u64 {
        let target = with_lengths!(&self.lengths, v => self.target_batches(&self.former(v), None));
        target as u64
    }
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
}
