//! Every planning setting of a `BucketSampler`, declared once: its name, Python type, default, range,
//! what it does, and the typed group that holds it (`Group`: `db.Padded` / `db.Packed`, `db.Balance`,
//! `db.World`, whose classes are written from this declaration). `Config` takes exactly these keyword arguments in this order (`config.rs`); Python builds
//! the sampler's docstring and the settings table of `docs/usage.md` from `_core.SETTINGS`, and the tests
//! check `BucketSampler`'s signature, `Config`'s text signature and the stubs against it — so a setting
//! added here and forgotten elsewhere fails a test, and its documentation cannot drift.
//!
//! Each setting's `apply` extracts and checks its value (the helpers of `extract.rs`, `choices.rs`) into
//! the core's configuration, so a new setting is its core field (`Config`, its rule in
//! `Config::validate`, its word in the fingerprint) and one entry here; the sampler's signature, the
//! stub, `Config`'s text signature, the typed groups and the docs table are written from `_core.SETTINGS`
//! (`python -m dflash_batch.tools.docs`) and checked against it by the tests. `range` says in words
//! what the core accepts.

use dflash_batch_core::Config as CoreConfig;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

mod declared;
pub(crate) use declared::SETTINGS;

/// How a setting's value reaches the core's configuration: extracted from its keyword argument
/// (`None` when left out), checked, recorded in `given` as a plain value, and written into the draft.
pub(crate) type Apply =
    for<'py> fn(&mut Draft<'py>, &Bound<'py, PyDict>, Option<&Bound<'py, PyAny>>) -> PyResult<()>;

/// The core's configuration as the settings are read, in declaration order; the settings a rule
/// combines (`batch_size` with `max_tokens`, `mode` with `bucketed`, the default `target_efficiency`
/// of a mode and price) are kept aside and resolved once every setting is read (`config.rs`).
pub(crate) struct Draft<'py> {
    pub(crate) core: CoreConfig,
    pub(crate) threads: Option<usize>,
    pub(crate) batch_size: Option<i64>,
    pub(crate) max_tokens: Option<i64>,
    pub(crate) mode: Option<Bound<'py, PyAny>>,
    pub(crate) bucketed: Option<Bound<'py, PyAny>>,
    pub(crate) target_efficiency: Option<f64>,
}

/// Whether checkpoints record a setting (`Config.settings()`), which they compare on resume.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Recorded {
    /// Always: every checkpoint holds it.
    Always,
    /// Only when not its declared default, so checkpoints written before the setting existed still
    /// resume (the core's fingerprint folds it in only then too).
    UnlessDefault,
    /// Only when set (not `None`).
    WhenSet,
    /// Never: it does not shape a plan (`threads`).
    Never,
}

/// Which typed group of `dflash_batch` holds a setting (`planning/groups.py`, written from this): the
/// groups mirror the core's own types — `Padded` and `Packed` its `Mode` (with `Batching` inside),
/// `Balance` and `World` the settings of rank balance and of the ranks — so a rule between settings
/// that a type can hold is a field one group has and the other has not (`trim_steps` and `batch_size`
/// only padded, `bucketed` and `context_parallel` only packed, `max_tokens` required packed).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Group {
    /// A keyword of its own beside the groups (`seed`, `boundaries`, ...).
    Own,
    /// Which batching group is given: `mode` is the group's type, not a field.
    Mode,
    /// A field of both batching groups, `Padded` and `Packed` (`Packed` requires `max_tokens`).
    Batching,
    /// A field of `Padded` only.
    Padded,
    /// A field of `Packed` only.
    Packed,
    /// A field of `Balance`, by this name.
    Balance(&'static str),
    /// A field of `World`, by this name.
    World(&'static str),
}

/// One setting: what a user reads about it, and how it is read, in one place.
pub(crate) struct Setting {
    pub(crate) name: &'static str,
    /// The Python annotation of the keyword argument.
    pub(crate) kind: &'static str,
    /// The default, as Python source.
    pub(crate) default: &'static str,
    /// The values accepted, in words.
    pub(crate) range: &'static str,
    pub(crate) doc: &'static str,
    pub(crate) group: Group,
    pub(crate) recorded: Recorded,
    pub(crate) apply: Apply,
}

/// Whether `name` is a setting.
pub(crate) fn is_setting(name: &str) -> bool {
    SETTINGS.iter().any(|s| s.name == name)
}

/// The names, comma separated (for messages).
pub(crate) fn names() -> String {
    SETTINGS
        .iter()
        .map(|s| s.name)
        .collect::<Vec<_>>()
        .join(", ")
}

/// `_core.SETTINGS`: the declaration as a tuple of dicts (`name`, `type`, `default`, `range`, `doc`,
/// `recorded`, and `group` with `field`: the group's name in lower case, `"own"` or `"mode"`, and the
/// setting's name inside it).
pub(crate) fn declared(py: Python<'_>) -> PyResult<Bound<'_, PyTuple>> {
    let rows = SETTINGS
        .iter()
        .map(|s| {
            let row = PyDict::new(py);
            row.set_item("name", s.name)?;
            row.set_item("type", s.kind)?;
            row.set_item("default", s.default)?;
            row.set_item("range", s.range)?;
            row.set_item("doc", s.doc)?;
            let recorded = match s.recorded {
                Recorded::Always => "always",
                Recorded::UnlessDefault => "unless default",
                Recorded::WhenSet => "when set",
                Recorded::Never => "never",
            };
            row.set_item("recorded", recorded)?;
            let (group, field) = match s.group {
                Group::Own => ("own", s.name),
                Group::Mode => ("mode", s.name),
                Group::Batching => ("batching", s.name),
                Group::Padded => ("padded", s.name),
                Group::Packed => ("packed", s.name),
                Group::Balance(field) => ("balance", field),
                Group::World(field) => ("world", field),
            };
            row.set_item("group", group)?;
            row.set_item("field", field)?;
            Ok(row)
        })
        .collect::<PyResult<Vec<_>>>()?;
    PyTuple::new(py, rows)
}
