//! Resuming an epoch on another number of ranks (elastic training).
//!
//! A checkpoint taken after `step` steps of epoch `e` on `W` ranks resumes on `W'`: the samples those
//! steps did not reach are planned again across the `W'` ranks, with the same seed and epoch, so every
//! rank computes the same plan and nothing is lost or repeated.
//!
//! Near an epoch's end the rest may be too small for that: every rank must run the same steps, a
//! batch holds at least one sample, and the budget caps how few batches the rest can form — so 15
//! samples that form 12 batches cannot fill whole steps of 8 ranks (16 batches needed). The rest is
//! then **carried** into epoch `e + 1`: epoch `e` has no steps left on the new ranks, and epoch `e + 1`
//! plans its samples plus the carried ones (each carried sample is trained twice in that epoch, once
//! for each epoch). Rejected: repeating samples to fill the last step (a sample trained twice in one
//! step's gradient, and the plan no longer says which), and empty batches on some ranks (a trainer
//! cannot run a step on nothing, and DDP would wait on the rank that skips).

use crate::error::{ErrorKind, Result};
use crate::lengths::to_usize;
use crate::lengths::{lengths_of, with_lengths, Lengths};
use crate::plan::output::{Plan, Stats};
use crate::plan::planner::Planner;

/// An epoch's rest, planned on this planner's ranks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resumed {
    /// The rest of the epoch (no batches when it was finished, or carried).
    pub plan: Plan,
    /// Rows carried into the next epoch (see the module docs), ascending; empty when the rest fit.
    pub carried: Vec<u32>,
}

impl Planner {
    /// The rows of `epoch` that its first `step` steps on `old_world` ranks did not reach, ascending.
    pub fn rows_left(&self, epoch: u64, old_world: u32, step: u64) -> Result<Vec<u32>> {
        self.lengths().check()?;
        // A copy of the lengths (at most a u32 each) and the rows left, beside the old plan's own.
        crate::memory::reserve("resuming on other ranks", self.lengths().len() as u64 * 8)?;
        let mut config = self.config().clone();
        config.world_size = old_world;
        let old = match &self.mix {
            Some(mix) => Planner::with_mixture(self.lengths().clone(), config, mix.spec.clone()),
            None => Planner::new(Lengths::clone(self.lengths()), config),
        }?
        .plan(epoch)?;
        let steps = old.len() as u64 / u64::from(old_world);
        if step > steps {
            return Err(ErrorKind::ResumeStepOutOfRange {
                step,
                steps,
                epoch,
                world_size: old_world,
            }
            .into());
        }
        // Batches are consecutive in the plan, so the steps done are a prefix of its indices.
        let done = to_usize(old.offsets()[to_usize(step * u64::from(old_world))]);
        let mut left = old.indices()[done..].to_vec();
        left.sort_unstable();
        Ok(left)
    }

    /// Plans `epoch` over only the samples `rows` (row numbers of this planner's lengths, repeated
    /// where a mixture repeats them), with this configuration: the rest of an epoch re-planned after a
    /// resume on another number of ranks. Indices are row numbers of the full lengths; buckets are
    /// chosen for the subset; a mixture's batches are chosen for its sources as in any epoch.
    pub fn plan_subset(&self, epoch: u64, rows: &[u32]) -> Result<Plan> {
        self.lengths().check()?;
        let n = self.lengths().len();
        if let Some(&row) = rows.iter().find(|&&r| r as usize >= n) {
            return Err(ErrorKind::RowOutOfRange {
                row: i128::from(row),
                rows: n as u64,
            }
            .into());
        }
        if u32::try_from(rows.len()).is_err() {
            return Err(ErrorKind::TooManySamples { count: rows.len() }.into());
        }
        // The subset's lengths, and their narrower copy inside the sub-planner; with sources, the
        // rows grouped by source and those labelled, for its forming to choose batches by them.
        crate::memory::reserve("re-planning the rest of an epoch", rows.len() as u64 * 12)?;
        let (rows, labels) = match &self.labels {
            Some(labels) => {
                let (grouped, labels) = labels.group(rows);
                (std::borrow::Cow::Owned(grouped), Some(labels))
            }
            None => (std::borrow::Cow::Borrowed(rows), None),
        };
        let lengths: Vec<u32> = with_lengths!(self.lengths(), v => lengths_of(v, &rows));
        let mut sub = Planner::new(lengths, self.config().clone())?;
        sub.labels = labels;
        let sub = sub.plan(epoch)?;
        let (world_size, epoch) = (sub.world_size(), sub.epoch());
        let (offsets, mut indices, stats) = sub.into_parts();
        for index in &mut indices {
            *index = rows[*index as usize];
        }
        Ok(Plan::new(offsets, indices, world_size, epoch, stats))
    }

    /// Plans the rest of `epoch` after `step` steps on `old_world` ranks across this planner's ranks,
    /// or carries it into the next epoch when it cannot give every rank whole steps (module docs).
    pub fn plan_resumed(&self, epoch: u64, old_world: u32, step: u64) -> Result<Resumed> {
        let left = self.rows_left(epoch, old_world, step)?;
        if left.is_empty() {
            return Ok(Resumed {
                plan: self.empty_plan(epoch),
                carried: left,
            });
        }
        match self.plan_subset(epoch, &left) {
            Ok(plan) => Ok(Resumed {
                plan,
                carried: Vec::new(),
            }),
            Err(error) if matches!(error.kind(), ErrorKind::TooFewSamplesForRanks { .. }) => {
                Ok(Resumed {
                    plan: self.empty_plan(epoch),
                    carried: left,
                })
            }
            Err(error) => Err(error),
        }
    }

    /// Plans `epoch` over every row (a mixture's selection for it) plus `carried` (rows carried from
    /// the epoch before, see [`Planner::plan_resumed`]); indices are rows of the dataset.
    pub fn plan_carrying(&self, epoch: u64, carried: &[u32]) -> Result<Plan> {
        if carried.is_empty() {
            return self.plan(epoch);
        }
        self.lengths().check()?;
        let mut all = self.selected_rows(epoch);
        all.extend_from_slice(carried);
        self.plan_subset(epoch, &all)
    }

    /// A plan of no batches: an epoch with nothing left to run.
    fn empty_plan(&self, epoch: u64) -> Plan {
        let stats = Stats {
            buckets: self.buckets().count() as u64,
            ..Stats::default()
        };
        Plan::new(vec![0], Vec::new(), self.config().world_size, epoch, stats)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::config::{Batching, Config};
    use proptest::prelude::*;

    fn planner(lengths: Vec<u32>, max_tokens: u64, world_size: u32, seed: u64) -> Planner {
        let config = Config {
            world_size,
            seed,
            ..Config::new(Batching::Tokens(max_tokens))
        };
        Planner::new(lengths, config).unwrap()
    }

    #[test]
    fn a_rest_too_small_for_the_new_ranks_is_carried_into_the_next_epoch() {
        let lengths: Vec<u32> = (0..40).map(|i| 20 + (i * 37) % 200).collect();
        let old = planner(lengths.clone(), 600, 1, 3);
        let steps = old.plan(2).unwrap().len() as u64;
        let new = planner(lengths.clone(), 600, 8, 3);
        let resumed = new.plan_resumed(2, 1, steps - 1).unwrap();
        assert_eq!(
            resumed.plan.len(),
            0,
            "one batch cannot make a step of 8 ranks"
        );
        let last = old.plan(2).unwrap();
        let mut expected = last.batch(last.len() - 1).unwrap().to_vec();
        expected.sort_unstable();
        assert_eq!(resumed.carried, expected);
        let next = new.plan_carrying(3, &resumed.carried).unwrap();
        let mut rows = next.indices().to_vec();
        rows.sort_unstable();
        let mut want: Vec<u32> = (0..40).chain(expected.iter().copied()).collect();
        want.sort_unstable();
        assert_eq!(rows, want, "every row once, the carried ones twice");
        assert_eq!(next.len() % 8, 0);
    }

    #[test]
    fn a_step_past_the_old_epoch_is_refused_with_its_length() {
        let p = planner(vec![100; 30], 400, 2, 0);
        let err = p.plan_resumed(0, 3, 1000).unwrap_err();
        assert!(
            matches!(
                err.kind(),
                ErrorKind::ResumeStepOutOfRange {
                    step: 1000,
                    world_size: 3,
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn a_finished_epoch_leaves_nothing_and_carries_nothing() {
        let p = planner(vec![100; 30], 400, 2, 0);
        let steps = planner(vec![100; 30], 400, 3, 0).steps();
        let resumed = p.plan_resumed(0, 3, steps).unwrap();
        assert_eq!((resumed.plan.len(), resumed.carried.len()), (0, 0));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// Whatever the ranks and the step, the rest is planned or carried, never lost or repeated.
        #[test]
        fn the_rest_is_planned_or_carried_exactly(
            lengths in prop::collection::vec(1u32..300, 10..200),
            max_tokens in 300u64..2000,
            old_world in 1u32..6,
            new_world in 1u32..10,
            seed in 0u64..1000,
            back in 0u64..4,
        ) {
            let n = u32::try_from(lengths.len()).unwrap();
            let config = Config { world_size: old_world, seed, ..Config::new(Batching::Tokens(max_tokens)) };
            let Ok(old) = Planner::new(lengths.clone(), config) else { return Ok(()) };
            let Ok(plan) = old.plan(1) else { return Ok(()) };
            let steps = plan.len() as u64 / u64::from(old_world);
            let step = steps.saturating_sub(back);
            let new = planner(lengths, max_tokens, new_world, seed);
            let resumed = new.plan_resumed(1, old_world, step).unwrap();
            let done = to_usize(plan.offsets()[to_usize(step * u64::from(old_world))]);
            let mut seen = plan.indices()[..done].to_vec();
            seen.extend_from_slice(resumed.plan.indices());
            seen.extend_from_slice(&resumed.carried);
            seen.sort_unstable();
            prop_assert_eq!(seen, (0..n).collect::<Vec<_>>());
            prop_assert_eq!(resumed.plan.len() % new_world as usize, 0);
            prop_assert!(resumed.carried.is_empty() || resumed.plan.is_empty());
        }
    }
}
