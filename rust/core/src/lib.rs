//! Seeded, reproducible length-bucketed batch planning for LLM training.
#![forbid(unsafe_code)]
pub mod buckets;
pub mod error;
pub mod lengths;
pub mod order;
pub mod permute;
pub mod plan;
pub mod planner;
pub mod rng;
pub mod workload;
