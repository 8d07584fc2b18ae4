//! What can go wrong with a node's shared plan file, as the [`ErrorKind::SharedPlan`](crate::ErrorKind)
//! error's detail: apart from the kinds, as `read.rs` is, because it carries the operating system's own kind.

/// Why a node's shared plan file cannot be used (`shared/`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum SharedProblem {
    /// The operating system refused.
    Io {
        /// What was being done.
        action: &'static str,
        /// The `std::io` kind, so a binding can raise the matching exception.
        kind: std::io::ErrorKind,
        /// The operating system's message.
        message: String,
    },
    /// A file at the plan's name that is not the plan asked for.
    Refused {
        /// What it is instead.
        why: String,
    },
}
