//! Weights that change from epoch to epoch, declared up front: a [`Schedule`] of named points.
//!
//! The sources' own weights hold at epoch 0; each [`Point`] gives every source's weight from its
//! epoch on. Between points the weights hold (`Interpolation::Constant`) or move in a straight line
//! to the next point's (`Interpolation::Linear`, epoch by epoch); after the last point they hold.
//! An epoch's weights are thus a pure function of the epoch and the declared schedule, so every
//! rank, every resume and every copy plans the same epoch alike.
//!
//! What a change of weights does to a down-sampled source's cycle is `quotas.rs`' part: the slices
//! successive epochs take follow each other through one cycle whatever their sizes, so no row is
//! trained twice within a cycle across a change.
//!
//! Rejected: weights by optimizer step. Every epoch of a planner shares one step count, which is
//! set from epoch 0's draws, so a step's epoch is known only once the weights of epoch 0 are — and
//! within an epoch the spread stage gives every batch of a bucket the sources in proportion, so no
//! order of its batches could follow weights that move inside it. A short epoch (`epoch_size`) is
//! the finer grain.

use crate::error::{ErrorKind, Result};

/// The latest epoch a point may name: successive epochs' slices are walked once per planner up to
/// the last point (`quotas.rs`), a few milliseconds per 100,000 epochs.
pub const MAX_SCHEDULE_EPOCH: u64 = 1 << 20;

/// The most points a schedule holds: the shared step count forms each point's draws once.
pub const MAX_SCHEDULE_POINTS: usize = 64;

/// How weights move between two points.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Interpolation {
    /// A point's weights hold until the next point.
    Constant,
    /// Epoch `e` between points at `a` and `b` takes `w_a + (e − a) / (b − a) · (w_b − w_a)`.
    Linear,
}

/// Every source's weight from `epoch` on (in the sources' order; they sum to 1).
#[derive(Debug, Clone, PartialEq)]
pub struct Point {
    /// The epoch (≥ 1: the sources' own weights are epoch 0's).
    pub epoch: u64,
    /// One weight per source.
    pub weights: Vec<f64>,
}

/// Points in increasing epoch order and how weights move between them (see the module docs).
#[derive(Debug, Clone, PartialEq)]
pub struct Schedule {
    /// The points, each after the one before.
    pub points: Vec<Point>,
    /// How the weights move from one point to the next.
    pub interpolation: Interpolation,
}

impl Schedule {
    /// The weights of `epoch`, from epoch 0's (`first`).
    pub fn weights_at(&self, first: &[f64], epoch: u64) -> Vec<f64> {
        let after = self.points.partition_point(|p| p.epoch <= epoch);
        let (from, from_epoch) = match after {
            0 => (first, 0),
            i => (&self.points[i - 1].weights[..], self.points[i - 1].epoch),
        };
        let Some(next) = self.points.get(after) else {
            return from.to_vec();
        };
        if self.interpolation == Interpolation::Constant || epoch == from_epoch {
            return from.to_vec();
        }
        // Epochs stay below MAX_SCHEDULE_EPOCH, exact in f64.
        #[allow(clippy::cast_precision_loss)]
        let t = (epoch - from_epoch) as f64 / (next.epoch - from_epoch) as f64;
        from.iter()
            .zip(&next.weights)
            .map(|(&a, &b)| (a + t * (b - a)).max(0.0))
            .collect()
    }

    /// The last epoch whose weights differ from the epoch before's can be no later than this.
    pub(crate) fn span(&self) -> u64 {
        self.points.last().map_or(0, |p| p.epoch)
    }

    /// Checks the points against `names` (the sources, in order): each point after the one before,
    /// within [`MAX_SCHEDULE_EPOCH`], with a weight per source, each ≥ 0 and summing to 1.
    pub(crate) fn validate(&self, names: &[&str], tolerance: f64) -> Result<()> {
        let bad = |problem: String| {
            Err(ErrorKind::MixtureSetting {
                setting: "schedule",
                problem,
            }
            .into())
        };
        if self.points.len() > MAX_SCHEDULE_POINTS {
            return bad(format!(
                "a schedule of {} points is too many; give at most {MAX_SCHEDULE_POINTS} (linear \
                 interpolation moves the weights every epoch between two points)",
                self.points.len()
            ));
        }
        let mut before = 0u64;
        for point in &self.points {
            let epoch = point.epoch;
            if epoch == 0 {
                return bad(
                    "a point at epoch 0 is invalid: the sources' own weights are epoch 0's; give \
                     points at epochs ≥ 1"
                        .into(),
                );
            }
            if epoch <= before {
                return bad(format!(
                    "the point at epoch {epoch} follows the one at epoch {before}; give each epoch \
                     once, in increasing order"
                ));
            }
            if epoch > MAX_SCHEDULE_EPOCH {
                return bad(format!(
                    "a point at epoch {epoch} is past the last a schedule names \
                     ({MAX_SCHEDULE_EPOCH}); the weights after the last point hold for every later \
                     epoch"
                ));
            }
            before = epoch;
            if point.weights.len() != names.len() {
                return bad(format!(
                    "the point at epoch {epoch} gives {} weights for {} sources; give one per source",
                    point.weights.len(),
                    names.len()
                ));
            }
            for (name, &weight) in names.iter().zip(&point.weights) {
                if !weight.is_finite() || weight < 0.0 {
                    return bad(format!(
                        "source '{name}' has weight {weight:?} at epoch {epoch}; pass a finite \
                         weight ≥ 0"
                    ));
                }
            }
            let sum: f64 = point.weights.iter().sum();
            if (sum - 1.0).abs() > tolerance {
                return bad(format!(
                    "the weights at epoch {epoch} sum to {sum:?}; give weights that sum to 1"
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
