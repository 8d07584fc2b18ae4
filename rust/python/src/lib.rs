//! `dflash_batch._core`: the PyO3 binding of `dflash-batch-core`.
//!
//! Thin by design: each function checks and extracts its inputs, runs the core with the GIL released
//! (`py.detach`), and wraps the result. Plans reach numpy without a copy: the core's `Vec`s are moved
//! into arrays that numpy then owns (`PyArray::from_vec`), marked read-only because a plan is a value.
//! Tokens reach numpy as read-only views of the mapped files, kept alive by their store.
//! State that changes between calls (the epoch, the step) lives in Python.

mod arrays;
mod borrowed;
mod choices;
mod errors;
mod extract;
#[macro_use]
mod reading;
mod collating;
mod config;
mod metrics;
mod mixture;
mod online;
mod plan;
mod planning;
mod settings;
mod table;
mod workload;

use pyo3::prelude::*;

use crate::errors::{DataError, Error, PlanError};

/// Bytes of physical memory, where the system says (`None` elsewhere): what a buffer larger than the
/// machine is refused against.
#[pyfunction]
pub(crate) fn physical_memory() -> Option<u64> {
    dflash_batch_core::memory::physical()
}

/// The seed window `window` of a stream is planned with (the core's `window_seed`).
#[pyfunction]
pub(crate) fn window_seed(seed: u64, window: u64) -> u64 {
    dflash_batch_core::window_seed(seed, window)
}

#[pymodule]
fn _core(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<config::Settings>()?;
    m.add("SETTINGS", settings::declared(m.py())?)?;
    m.add("ERROR_KINDS", errors::declared(m.py())?)?;
    m.add_class::<planning::Planner>()?;
    m.add_class::<mixture::Mixture>()?;
    m.add_class::<plan::Plan>()?;
    m.add_class::<reading::TokenStore>()?;
    m.add_function(wrap_pyfunction!(reading::read_lengths, m)?)?;
    m.add_function(wrap_pyfunction!(reading::read_documents, m)?)?;
    m.add_function(wrap_pyfunction!(reading::read_table_lengths, m)?)?;
    m.add_function(wrap_pyfunction!(collating::collate_into, m)?)?;
    m.add_function(wrap_pyfunction!(physical_memory, m)?)?;
    m.add_function(wrap_pyfunction!(window_seed, m)?)?;
    m.add_function(wrap_pyfunction!(online::split_step, m)?)?;
    m.add_function(wrap_pyfunction!(workload::seed_lengths, m)?)?;
    m.add_function(wrap_pyfunction!(workload::seed_sources, m)?)?;
    m.add(
        "SEED_SOURCES",
        dflash_batch_core::workload::SEED_SOURCES.to_vec(),
    )?;
    m.add_function(wrap_pyfunction!(collating::collate_new, m)?)?;
    m.add_function(wrap_pyfunction!(collating::collate_slot, m)?)?;
    m.add_function(wrap_pyfunction!(collating::packed::collate_packed_slot, m)?)?;
    m.add_function(wrap_pyfunction!(metrics::efficiency, m)?)?;
    m.add_function(wrap_pyfunction!(metrics::window_tv, m)?)?;
    m.add_function(wrap_pyfunction!(metrics::mixing, m)?)?;
    m.add_function(wrap_pyfunction!(metrics::rank_imbalance, m)?)?;
    m.add_function(wrap_pyfunction!(metrics::churn, m)?)?;
    m.add_function(wrap_pyfunction!(metrics::sync_efficiency, m)?)?;
    m.add_function(wrap_pyfunction!(metrics::end_to_end, m)?)?;
    m.add("Error", m.py().get_type::<Error>())?;
    // Every error of the module answers `kind`, `row`, `setting` and `path` (those raised from Python
    // too): class defaults, which an instance raised from a core error overrides.
    let base = m.py().get_type::<Error>();
    for (name, value) in [
        ("kind", Some("error")),
        ("reason", Some("error")),
        ("row", None),
        ("setting", None),
        ("path", None),
    ] {
        base.setattr(name, value)?;
    }
    for (class, kind) in [
        (m.py().get_type::<PlanError>(), "plan"),
        (m.py().get_type::<DataError>(), "data"),
    ] {
        class.setattr("kind", kind)?;
        class.setattr("reason", kind)?;
    }
    m.add("PlanError", m.py().get_type::<PlanError>())?;
    m.add("DataError", m.py().get_type::<DataError>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("PLAN_REVISION", dflash_batch_core::PLAN_REVISION)?;
    Ok(())
}
