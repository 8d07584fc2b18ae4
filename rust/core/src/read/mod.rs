//! Reading a dataset: Arrow IPC files memory-mapped (`arrow.rs`), an integer or list column's
//! lengths (`column.rs`), the files of a dataset in order (`dataset.rs`), and random access to any
//! row's tokens (`tokens.rs`, their typed buffers in `values.rs`) with a loss mask beside them (`mask.rs`); a table already in memory read by the same rules (`table.rs`), and
//! Megatron-LM indexed datasets (`.bin` + `.idx`) as one more kind of file (`megatron.rs`); mapped
//! files are checked for changes before their rows are read (`guard.rs`).

// First, and with its macros in scope for the modules below (`mask.rs`, `megatron.rs` match over the
// token types with them); `#[macro_export]` also places them at the crate root for the binding.
#[macro_use]
pub mod values;

pub mod arrow;
pub mod column;
pub mod dataset;
pub mod guard;
pub mod mask;
pub mod megatron;
pub mod table;
pub mod tokens;
