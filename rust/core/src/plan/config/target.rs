//! The padding efficiency `Boundaries::Auto` aims for: the one given, or the default for the mode,
//! the price and the step shape, with the measurements each default rests on.

use super::{Batching, Config, CostModel, Mode};
use crate::error::{ErrorKind, Result};

/// The padding efficiency `Boundaries::Auto` aims for, in parts per million, where no other default
/// below applies (packed rows, whose buckets, with `bucketed`, are a count).
pub const DEFAULT_TARGET_EFFICIENCY_PPM: u32 = 980_000;

/// What it aims for by default for padded batches whose optimizer step holds 1 or at least
/// [`SMALL_STEP_WINDOW`] micro-batches. A padded batch holds samples of one narrow length range, and
/// where a sample's content goes with its length (it usually does) those samples' gradients are
/// alike: an optimizer step of few such batches is noisier than one of the same tokens drawn at
/// random. Wider buckets trade a little padding for steps that are closer to a shuffle's; from 8
/// micro-batches a step this is where a step's useful tokens per unit of noise (efficiency ÷ R,
/// `benchmarks/step_gradients.py`) is best, R within 3% of a shuffle's after an epoch of training
/// (0.98 left R at 1.035–1.050). One micro-batch a step is one bucket at any target: R 1.04–1.08 at
/// every target from 0.87 to 0.97 (measured), so a wider one would cost padding and buy nothing.
pub const PADDED_TARGET_EFFICIENCY_PPM: u32 = 970_000;

/// What it aims for by default for padded batches whose optimizer step (all ranks × accumulation)
/// holds 2 to 7 micro-batches: there the step holds too few buckets for the interleaved order to
/// cancel their likeness. Measured R after an epoch at 1×4 (`benchmarks/step_gradients.py
/// --shapes`, two model initialisations): 0.97 leaves 1.032–1.035, 0.93 gives 1.000–1.006 (and
/// 1.026–1.029 at a tenth of an epoch, against 1.045–1.047). Wider still is no better (0.90:
/// 1.023; 0.87: 1.015), so this is the target, not a floor.
pub const SMALL_STEP_TARGET_EFFICIENCY_PPM: u32 = 930_000;

/// Micro-batches per optimizer step from which padded batches aim at
/// [`PADDED_TARGET_EFFICIENCY_PPM`] again: with it R is 1.018–1.028 at 1×8 and 2×4, 1.008 at 1×16
/// and 1.015 at 8×4 after an epoch, so 8 ranks without accumulation keep their padding.
pub const SMALL_STEP_WINDOW: usize = 8;

/// What it aims for by default for padded batches priced with an attention term. Under such a price
/// an optimizer step's useful share is capped by its padding (rank balance per step is already
/// ~0.994), so narrower buckets buy end-to-end time: on the seed workload 48 buckets instead of 43
/// lift it per step from 0.9735 to 0.9757, with the windows mixed no worse.
pub const PRICED_TARGET_EFFICIENCY_PPM: u32 = 982_000;

impl Config {
    /// The efficiency `Boundaries::Auto` aims for, in parts per million: the one given, else the
    /// default for this configuration ([`Config::default_target_efficiency_ppm`] at its window). A
    /// function of the configuration, so a copy on other ranks (an elastic resume's old plan) aims
    /// where that plan did.
    pub fn target_efficiency(&self) -> u32 {
        self.target_efficiency_ppm.unwrap_or_else(|| {
            Self::default_target_efficiency_ppm(self.mode, self.batching, self.cost, self.window())
        })
    }

    /// The target of `Boundaries::Auto` when none is given, for optimizer steps of `window`
    /// micro-batches (all ranks × accumulation): [`PRICED_TARGET_EFFICIENCY_PPM`] for padded batches
    /// under a token budget priced with an attention term, [`SMALL_STEP_TARGET_EFFICIENCY_PPM`] for
    /// other padded batches in steps of 2 to 7 micro-batches, [`PADDED_TARGET_EFFICIENCY_PPM`] for
    /// the rest of them, else [`DEFAULT_TARGET_EFFICIENCY_PPM`].
    pub fn default_target_efficiency_ppm(
        mode: Mode,
        batching: Batching,
        cost: CostModel,
        window: usize,
    ) -> u32 {
        let priced_padding = matches!(mode, Mode::Padded)
            && matches!(batching, Batching::Tokens(_))
            && cost.quadratic > 0.0;
        if priced_padding {
            PRICED_TARGET_EFFICIENCY_PPM
        } else if matches!(mode, Mode::Padded) && (2..SMALL_STEP_WINDOW).contains(&window) {
            SMALL_STEP_TARGET_EFFICIENCY_PPM
        } else if matches!(mode, Mode::Padded) {
            PADDED_TARGET_EFFICIENCY_PPM
        } else {
            DEFAULT_TARGET_EFFICIENCY_PPM
        }
    }

    /// `target_efficiency` (a padding efficiency in (0, 1]) in the parts per million a `Config`
    /// keeps: integers hash and compare exactly. At least 1, so a tiny target stays valid.
    pub fn target_efficiency_ppm(target: f64) -> Result<u32> {
        if !(target > 0.0 && target <= 1.0) {
            return Err(ErrorKind::InvalidRatio {
                name: "target_efficiency",
                value: target.to_string(),
                expected: "a padding efficiency in (0, 1], e.g. 0.98",
            }
            .into());
        }
        // In (0, 1] × 1e6, rounded: fits u32.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        Ok(((target * 1e6).round() as u32).max(1))
    }
}
