//! Planning: lengths + configuration → the [`Plan`] of one epoch (see `planner.rs` for the
//! pipeline an epoch goes through, stage by stage).

pub(crate) mod arrange;
pub(crate) mod balance;
pub mod buckets;
pub mod config;
pub(crate) mod fingerprint;
pub(crate) mod form;
pub(crate) mod optimize;
pub mod output;
pub(crate) mod permute;
pub mod planner;
pub(crate) mod prepare;
pub mod resume;
pub(crate) mod rules;
pub(crate) mod split;
pub(crate) mod steps;
pub mod truncate;

pub use output::{Plan, Stats};
