//! Seeded, reproducible length-bucketed batch planning for LLM training.
pub mod buckets;
pub mod error;
pub mod lengths;
pub mod order;
pub mod permute;
pub mod plan;
pub mod planner;
pub mod rng;
pub mod workload;
