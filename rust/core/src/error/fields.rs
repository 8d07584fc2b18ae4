//! What a binding tells a program about an error besides its message, declared once as data: each
//! kind's stable snake-case name, the exception family a binding raises for it, whether it is a bad
//! setting (raised as kind `invalid_setting`, this name kept as its `reason`), and the row, setting or
//! file it concerns where the error knows one.
//!
//! [`kinds!`] lists every variant once; it generates [`ErrorKind::name`], [`ErrorKind::family`],
//! [`ErrorKind::is_setting`] and [`KINDS`] as exhaustive matches, so a new variant does not compile until
//! it is declared here.

use crate::error::ErrorKind;

/// The exception family a binding raises for a kind (Python: `PlanError`, `DataError` — both
/// `ValueError`s —, `ValueError`, `IndexError`, `MemoryError`, or `OSError` for a file that cannot be
/// opened, which `Read` errors of an I/O problem become).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// Invalid lengths or settings for planning.
    Plan,
    /// A dataset file (or table) that cannot be read as asked.
    Data,
    /// A bad argument that is neither (a buffer too small, a packed row too long).
    Value,
    /// A row or entry past the end.
    Index,
    /// Memory that cannot be reserved.
    Memory,
}

/// One declared kind: its name, family and whether it is a bad setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Kind {
    /// The stable snake-case name.
    pub name: &'static str,
    /// What a binding raises.
    pub family: Family,
    /// Whether it is a bad setting (raised as `invalid_setting`, with this name as its reason).
    pub setting: bool,
}

macro_rules! kinds {
    ($($variant:ident => $name:literal, $family:ident, $setting:literal;)*) => {
        /// Every kind of error, in declaration order.
        pub const KINDS: &[Kind] = &[$(Kind { name: $name, family: Family::$family, setting: $setting },)*];

        impl ErrorKind {
            /// The kind's name in snake case (`non_positive_length`, `read`, `out_of_memory`, ...):
            /// stable, for programs to branch on instead of parsing messages.
            pub fn name(&self) -> &'static str {
                match self {
                    $(Self::$variant { .. } => $name,)*
                }
            }

            /// The exception family a binding raises for this kind.
            pub fn family(&self) -> Family {
                match self {
                    $(Self::$variant { .. } => Family::$family,)*
                }
            }

            /// Whether this is a bad setting: a binding reports it as kind `invalid_setting` with
            /// [`ErrorKind::setting`] naming the setting and [`ErrorKind::name`] as the finer reason.
            pub fn is_setting(&self) -> bool {
                match self {
                    $(Self::$variant { .. } => $setting,)*
                }
            }
        }
    };
}

kinds! {
    EmptyLengths => "empty_lengths", Plan, false;
    NonPositiveLength => "non_positive_length", Plan, false;
    LengthTooLarge => "length_too_large", Plan, false;
    TooManySamples => "too_many_samples", Plan, false;
    BatchSpec => "batch_spec", Plan, true;
    InvalidSetting => "invalid_setting", Plan, true;
    RankOutOfRange => "rank_out_of_range", Plan, false;
    BadBatching => "bad_batching", Plan, false;
    InvalidRatio => "invalid_ratio", Plan, true;
    InvalidCost => "invalid_cost", Plan, true;
    CostOverflow => "cost_overflow", Plan, true;
    PackedRowTooLong => "packed_row_too_long", Value, false;
    BadWindow => "bad_window", Plan, false;
    TrimSetting => "trim_setting", Plan, true;
    TruncateSetting => "truncate_setting", Plan, true;
    PackedSetting => "packed_setting", Plan, true;
    ContextParallelSetting => "context_parallel_setting", Plan, true;
    PieceMultiple => "piece_multiple", Plan, true;
    TooFewEdges => "too_few_edges", Plan, true;
    EdgesNotIncreasing => "edges_not_increasing", Plan, true;
    EdgesDoNotCover => "edges_do_not_cover", Plan, false;
    MaxTokensBelowShortest => "max_tokens_below_shortest", Plan, false;
    Oversize => "oversize", Plan, false;
    SequenceOverBudget => "sequence_over_budget", Plan, false;
    StepTooSmall => "step_too_small", Plan, false;
    OutOfMemory => "out_of_memory", Memory, false;
    TooFewSamplesForRanks => "too_few_samples_for_ranks", Plan, false;
    ResumeStepOutOfRange => "resume_step_out_of_range", Plan, false;
    TooManyPieces => "too_many_pieces", Plan, false;
    EntryOutOfRange => "entry_out_of_range", Plan, false;
    StepOutOfRange => "step_out_of_range", Plan, false;
    Read => "read", Data, false;
    BufferTooSmall => "buffer_too_small", Value, false;
    TokenOutOfRange => "token_out_of_range", Data, false;
    TokenNotInteger => "token_not_integer", Data, false;
    MaskLength => "mask_length", Data, false;
    MaskValue => "mask_value", Data, false;
    RowOutOfRange => "row_out_of_range", Index, false;
    SharedPlan => "shared_plan", Data, false;
    MixtureSetting => "mixture_setting", Plan, true;
    EmptySource => "empty_source", Plan, false;
    MixtureWeight => "mixture_weight", Plan, true;
    MixtureWeights => "mixture_weights", Plan, true;
    SourceTooSmall => "source_too_small", Plan, false;
    SourcesDiffer => "sources_differ", Data, false;
}

impl ErrorKind {
    /// The row (of the lengths, the dataset or the mask) the error is about, where it names one.
    pub fn row(&self) -> Option<i128> {
        match self {
            Self::NonPositiveLength { row, .. }
            | Self::LengthTooLarge { row, .. }
            | Self::EdgesDoNotCover { row, .. }
            | Self::MaxTokensBelowShortest { row, .. }
            | Self::Oversize { row, .. }
            | Self::SequenceOverBudget { row, .. } => i128::try_from(*row).ok(),
            Self::MaskLength { row, .. } | Self::MaskValue { row, .. } => row.map(i128::from),
            Self::RowOutOfRange { row, .. } => Some(*row),
            _ => None,
        }
    }

    /// The setting the error is about: every kind of [`ErrorKind::is_setting`] names one.
    pub fn setting(&self) -> Option<&'static str> {
        match self {
            Self::InvalidSetting { name, .. } | Self::InvalidRatio { name, .. } => Some(name),
            Self::BatchSpec { .. } => Some("max_tokens"),
            Self::InvalidCost { setting, .. } => Some(setting),
            Self::CostOverflow { .. } => Some("cost"),
            Self::TooFewEdges { .. } | Self::EdgesNotIncreasing { .. } => Some("boundaries"),
            Self::TrimSetting { .. } => Some("trim_steps"),
            Self::TruncateSetting { .. } => Some("oversize"),
            Self::PackedSetting { .. } => Some("mode"),
            Self::ContextParallelSetting { .. } => Some("context_parallel"),
            Self::PieceMultiple { .. } => Some("max_tokens"),
            Self::MixtureSetting { setting, .. } => Some(setting),
            Self::MixtureWeight { .. } | Self::MixtureWeights { .. } => Some("weights"),
            _ => None,
        }
    }

    /// The file the error is about (a read error's, a shared plan's).
    pub fn path(&self) -> Option<&str> {
        match self {
            Self::Read { path, .. } | Self::SharedPlan { path, .. } => Some(path),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Family, KINDS};
    use crate::error::ErrorKind;

    #[test]
    fn names_are_declared_snake_case_and_fields_are_found() {
        let kind = ErrorKind::NonPositiveLength { row: 3, value: -1 };
        assert_eq!(kind.name(), "non_positive_length");
        assert_eq!(kind.row(), Some(3));
        assert_eq!(ErrorKind::EmptyLengths.name(), "empty_lengths");
        assert_eq!(ErrorKind::EmptyLengths.row(), None);
        let read = ErrorKind::Read {
            path: "x.arrow".into(),
            problem: crate::error::read::ReadProblem::Empty,
        };
        assert_eq!(
            (read.name(), read.path(), read.family()),
            ("read", Some("x.arrow"), Family::Data)
        );
    }

    #[test]
    fn every_setting_kind_names_its_setting_and_names_are_unique() {
        let mut names: Vec<&str> = KINDS.iter().map(|k| k.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), KINDS.len());
        for kind in [
            ErrorKind::BatchSpec { both: true },
            ErrorKind::InvalidCost {
                setting: "cost",
                given: "(0, 0)".into(),
            },
            ErrorKind::TooFewEdges { count: 1 },
            ErrorKind::EdgesNotIncreasing {
                position: 1,
                previous: 3,
                value: 2,
            },
            ErrorKind::TrimSetting { problem: "" },
            ErrorKind::TruncateSetting { problem: "" },
            ErrorKind::PackedSetting { problem: "" },
            ErrorKind::ContextParallelSetting {
                problem: "",
                context_parallel: 2,
            },
            ErrorKind::PieceMultiple {
                capacity: 10,
                multiple: 4,
                pad_to_multiple_of: 1,
                context_parallel: 2,
            },
        ] {
            assert!(kind.is_setting() && kind.setting().is_some(), "{kind:?}");
        }
    }
}
