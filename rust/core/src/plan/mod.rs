//! Planning: lengths + configuration → the [`Plan`](crate::Plan) of one epoch (see `planner.rs` for the
//! pipeline an epoch goes through, stage by stage).

pub(crate) mod arrange;
pub(crate) mod balance;
pub(crate) mod buckets;
pub(crate) mod config;
pub(crate) mod draws;
pub(crate) mod fingerprint;
pub(crate) mod form;
pub(crate) mod histogram;
pub(crate) mod keys;
pub(crate) mod merge;
pub mod mixture;
pub(crate) mod optimize;
pub(crate) mod output;
pub(crate) mod permute;
pub(crate) mod planner;
pub(crate) mod predict;
pub(crate) mod prepare;
pub(crate) mod ranks;
pub(crate) mod resume;
pub(crate) mod revision;
pub(crate) mod rules;
pub(crate) mod split;
pub(crate) mod steps;
pub mod truncate;
pub mod window;
