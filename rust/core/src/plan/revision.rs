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

use crate::plan::config::Config;

/// The revision of the planning rules this crate implements.
pub const PLAN_REVISION: u32 = 3;

impl Config {
    /// Whether this configuration's plans on `world_size` ranks differ between rules `revision` and
    /// [`PLAN_REVISION`] (a checkpoint written under `revision` cannot resume here).
    pub fn plans_changed_since(&self, revision: u32, world_size: u32) -> bool {
        let swaps = revision < 1 && world_size >= 2 && self.accumulation >= 2;
        let composed = revision < 3 && self.shuffle && self.composes_rows_by_cost();
        swaps || composed
    }
}

#[cfg(test)]
mod tests {
    use crate::plan::config::{Batching, Config, CostModel, Mode};

    #[test]
    fn only_windows_of_several_steps_on_several_ranks_changed_in_revision_1() {
        let config = |accumulation| Config {
            accumulation,
            ..Config::new(Batching::Tokens(64))
        };
        assert!(config(4).plans_changed_since(0, 8));
        assert!(!config(1).plans_changed_since(0, 8));
        assert!(!config(4).plans_changed_since(0, 1));
        assert!(!config(4).plans_changed_since(1, 8));
    }

    #[test]
    fn only_shuffled_unbucketed_packed_rows_under_attention_changed_in_revisions_2_and_3() {
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
        assert!(packed(false, attention, true).plans_changed_since(1, 1));
        assert!(packed(false, attention, true).plans_changed_since(0, 1));
        assert!(packed(false, attention, true).plans_changed_since(2, 8));
        assert!(!packed(false, attention, true).plans_changed_since(3, 8));
        assert!(!packed(true, attention, true).plans_changed_since(1, 8));
        assert!(!packed(false, CostModel::TOKENS, true).plans_changed_since(1, 8));
        assert!(!packed(false, attention, false).plans_changed_since(1, 8));
        let padded = Config {
            cost: attention,
            ..Config::new(Batching::Tokens(64))
        };
        assert!(!padded.plans_changed_since(1, 8));
    }
}
