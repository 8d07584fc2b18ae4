//! Revisions of the planning rules. A checkpoint names the step its epoch reached, and resuming it
//! replays that epoch's plan: if the rules changed in between for the checkpoint's configuration, the
//! plan replayed is not the one trained, and the rest of the epoch would repeat some samples and skip
//! others without a word. Checkpoints record the revision they were planned under; a configuration whose
//! plans changed since refuses them instead. Fingerprints stay as they are: they identify data and
//! settings, which did not change.
//!
//! * Revision 0: plans as first released.
//! * Revision 1: on two ranks or more with accumulation above 1, each optimizer window's ranks are
//!   evened out by pairwise swaps after the longest-first assignment (`balance.rs`).
//! * Revision 2: shuffled unbucketed packed rows under a cost model with an attention term are
//!   composed by cost, and windows drawn from strata (`form/compose.rs`).
//! * Revision 3: those composed rows take a sample that fills one to within a few tokens before the
//!   least attention (`form/compose.rs`, closing fits).
//! * Revision 4: shuffled unbucketed packed rows are composed that way under every cost model, the
//!   default `cost="tokens"` included (they were packed best fit over a window, `form/pack.rs`).
//! * Revision 5: padded batches left to the default target (`boundaries="auto"`, no attention price)
//!   aim at 0.93 in optimizer steps of 2 to 7 micro-batches (0.97 before; `config.rs`).

use crate::plan::config::{Boundaries, Config, SMALL_STEP_TARGET_EFFICIENCY_PPM};
use crate::plan::planner::Planner;

/// The revision of the planning rules this crate implements.
pub const PLAN_REVISION: u32 = 5;

impl Config {
    /// Whether this configuration's plans on `world_size` ranks differ between rules `revision` and
    /// [`PLAN_REVISION`] (a checkpoint written under `revision` cannot resume here), for epochs
    /// small enough to be `arranged` or not (`Planner::plans_changed_since` knows which).
    pub fn plans_changed_since(&self, revision: u32, world_size: u32, arranged: bool) -> bool {
        let swaps = revision < 1 && world_size >= 2 && self.accumulation >= 2;
        let priced = self.cost.quadratic > 0.0;
        let composed = self.shuffle
            && self.composes_rows(arranged)
            && (revision < 3 || (!priced && revision < 4));
        swaps || composed || (revision < 5 && self.small_step_default(world_size))
    }

    /// Whether, on `world_size` ranks, this configuration's buckets aim at the default of padded
    /// batches in small optimizer steps (revision 5), where they aimed at 0.97 before.
    fn small_step_default(&self, world_size: u32) -> bool {
        let on_ranks = Config {
            world_size,
            ..self.clone()
        };
        matches!(self.boundaries, Boundaries::Auto)
            && self.target_efficiency_ppm.is_none()
            && on_ranks.target_efficiency() == SMALL_STEP_TARGET_EFFICIENCY_PPM
    }
}

impl Planner {
    /// Whether this planner's plans on `world_size` ranks differ between rules `revision` and
    /// [`PLAN_REVISION`]: its configuration's, for epochs of its size.
    pub fn plans_changed_since(&self, revision: u32, world_size: u32) -> bool {
        self.config()
            .plans_changed_since(revision, world_size, self.arranged())
    }
}

#[cfg(test)]
mod tests {
    use crate::plan::config::{Batching, Config, CostModel, Mode};

    #[test]
    fn only_windows_of_several_steps_on_several_ranks_changed_in_revision_1() {
        // A target given, so revision 5's default does not apply.
        let config = |accumulation| Config {
            accumulation,
            target_efficiency_ppm: Some(970_000),
            ..Config::new(Batching::Tokens(64))
        };
        assert!(config(4).plans_changed_since(0, 8, true));
        assert!(!config(1).plans_changed_since(0, 8, true));
        assert!(!config(4).plans_changed_since(0, 1, true));
        assert!(!config(4).plans_changed_since(1, 8, true));
    }

    #[test]
    fn only_shuffled_unbucketed_packed_rows_changed_in_revisions_2_to_4() {
        let attention = CostModel {
            linear: 1.0,
            quadratic: 1e-4,
        };
        let packed = |bucketed, cost, shuffle| Config {
            mode: Mode::Packed { bucketed },
            cost,
            shuffle,
            ..Config::new(Batching::Tokens(64))
        };
        assert!(packed(false, attention, true).plans_changed_since(1, 1, true));
        assert!(packed(false, attention, true).plans_changed_since(0, 1, true));
        assert!(packed(false, attention, true).plans_changed_since(2, 8, true));
        assert!(!packed(false, attention, true).plans_changed_since(3, 8, true));
        assert!(!packed(true, attention, true).plans_changed_since(1, 8, true));
        // Rows priced by tokens alone were packed best fit until revision 4.
        assert!(packed(false, CostModel::TOKENS, true).plans_changed_since(3, 8, true));
        assert!(packed(false, CostModel::TOKENS, true).plans_changed_since(1, 1, true));
        assert!(!packed(false, CostModel::TOKENS, true).plans_changed_since(4, 8, true));
        assert!(!packed(true, CostModel::TOKENS, true).plans_changed_since(3, 8, true));
        assert!(!packed(false, CostModel::TOKENS, false).plans_changed_since(3, 8, true));
        assert!(!packed(false, attention, true).plans_changed_since(4, 8, true));
        // Epochs too large to arrange keep rows priced by tokens best fit; priced ones compose.
        assert!(!packed(false, CostModel::TOKENS, true).plans_changed_since(3, 8, false));
        assert!(packed(false, attention, true).plans_changed_since(2, 8, false));
        assert!(!packed(false, attention, false).plans_changed_since(1, 8, true));
        let padded = Config {
            cost: attention,
            ..Config::new(Batching::Tokens(64))
        };
        assert!(!padded.plans_changed_since(1, 8, true));
    }

    #[test]
    fn only_padded_default_targets_in_steps_of_2_to_7_micro_batches_changed_in_revision_5() {
        let padded = |accumulation, target| Config {
            accumulation,
            target_efficiency_ppm: target,
            ..Config::new(Batching::Tokens(64))
        };
        assert!(padded(4, None).plans_changed_since(4, 1, true));
        assert!(padded(1, None).plans_changed_since(4, 2, true));
        assert!(padded(1, None).plans_changed_since(0, 7, false));
        assert!(!padded(4, None).plans_changed_since(5, 1, true));
        assert!(!padded(1, None).plans_changed_since(4, 1, true));
        assert!(!padded(4, None).plans_changed_since(4, 2, true));
        assert!(!padded(1, None).plans_changed_since(4, 16, true));
        assert!(!padded(4, Some(970_000)).plans_changed_since(4, 1, true));
        assert!(!padded(4, Some(930_000)).plans_changed_since(4, 1, true));
        let edges = Config {
            boundaries: crate::plan::config::Boundaries::Count(8),
            ..padded(4, None)
        };
        assert!(!edges.plans_changed_since(4, 1, true));
        let packed = Config {
            mode: Mode::Packed { bucketed: true },
            ..padded(4, None)
        };
        assert!(!packed.plans_changed_since(4, 1, true));
    }
}
