//! The crate's one error type.
//!
//! Every failure is an [`Error`] carrying an [`ErrorKind`] with the offending value and, where there is
//! one, its row. `Display` is a lowercase sentence that names the value and says how to fix it, because
//! the message travels unchanged to a Python user who never sees this code.

use std::fmt;

use crate::read_error::ReadProblem;

/// What went wrong, with the values needed to say so precisely.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// No lengths were given.
    EmptyLengths,
    /// A length is zero or negative (a sample needs at least one token).
    NonPositiveLength {
        /// Row of the sample.
        row: usize,
        /// The value found there.
        value: i128,
    },
    /// A length does not fit in `u32`.
    LengthTooLarge {
        /// Row of the sample.
        row: usize,
        /// The value found there.
        value: i128,
    },
    /// More samples than a `u32` index can address.
    TooManySamples {
        /// Number of samples given.
        count: usize,
    },
    /// Both `batch_size` and `max_tokens` were given, or neither.
    BatchSpec {
        /// True when both were given, false when neither was.
        both: bool,
    },
    /// A numeric setting is out of range.
    InvalidSetting {
        /// The setting's name.
        name: &'static str,
        /// The value given.
        value: i128,
        /// What the value must satisfy, e.g. "≥ 1".
        expected: &'static str,
    },
    /// The cost model `(linear, quadratic)` is not two finite, non-negative numbers with a positive sum.
    InvalidCost {
        /// The pair as given, formatted.
        given: String,
    },
    /// Under the cost model a row or batch of the data costs more than rank balance can compare.
    CostOverflow {
        /// The pair as given, formatted.
        given: String,
        /// The padded length priced.
        length: u64,
        /// Rows of the batch priced.
        rows: u64,
    },
    /// A packed batch's samples hold more tokens than its row.
    PackedRowTooLong {
        /// Tokens of the samples.
        tokens: usize,
        /// The row's capacity.
        capacity: usize,
    },
    /// A token window (`collate_packed_windows`) starts past its sample's end, or the windows do not
    /// match the indices one to one.
    BadWindow {
        /// What is wrong, in words.
        problem: String,
    },
    /// A setting that packed batches cannot honour.
    PackedSetting {
        /// What is wrong, as the rest of a sentence after "mode='packed'".
        problem: &'static str,
    },
    /// Fewer than two bucket edges.
    TooFewEdges {
        /// Number of edges given.
        count: usize,
    },
    /// Edges are not strictly increasing.
    EdgesNotIncreasing {
        /// Position in the edge list of the offending edge.
        position: usize,
        /// The edge before it.
        previous: u32,
        /// The offending edge.
        value: u32,
    },
    /// A length falls outside the edges.
    EdgesDoNotCover {
        /// Row of the sample.
        row: usize,
        /// Its length.
        length: u32,
        /// First edge (exclusive lower bound).
        low: u32,
        /// Last edge (inclusive upper bound).
        high: u32,
    },
    /// `max_tokens` is smaller than every sample, so no batch can be formed.
    MaxTokensBelowShortest {
        /// The budget.
        max_tokens: u64,
        /// Shortest padded sample length.
        shortest: u64,
        /// That sample's own length (before `pad_to_multiple_of`).
        length: u32,
        /// Row of that sample.
        row: usize,
        /// Under a cost model: the model `(linear, quadratic)` and the price of one row of that sample.
        priced: Option<(String, String)>,
    },
    /// A sample is longer than `max_tokens` and `oversize="error"`.
    Oversize {
        /// Row of the sample.
        row: usize,
        /// Its padded length.
        length: u64,
        /// The budget.
        max_tokens: u64,
        /// The longest length whose row fits the budget (under the cost model and padding).
        longest: u32,
    },
    /// The memory an operation needs could not be reserved up front.
    OutOfMemory {
        /// What needed it, in words.
        what: &'static str,
        /// Bytes it asked for.
        bytes: u64,
    },
    /// Not enough samples to give every rank at least one batch.
    TooFewSamplesForRanks {
        /// Samples in the plan.
        samples: usize,
        /// Ranks requested.
        world_size: u32,
        /// Whether `drop_last` dropped every batch (its message cannot suggest passing it).
        drop_last: bool,
        /// Batches formed within the budget.
        batches: usize,
        /// Batches the plan needs (a multiple of `world_size`: every rank runs the same steps).
        needed: usize,
    },
    /// A step index past the end of the plan.
    StepOutOfRange {
        /// Requested step.
        step: u64,
        /// Steps in the epoch.
        steps: u64,
    },
    /// A dataset file could not be read (see [`ReadProblem`]).
    Read {
        /// The file, as given (or the source, for [`ReadProblem::Empty`]).
        path: String,
        /// What went wrong.
        problem: ReadProblem,
    },
    /// A caller-provided output buffer cannot hold the batch.
    BufferTooSmall {
        /// Which buffer.
        name: &'static str,
        /// Elements the batch needs (`rows × padded length`; four times that for a slot).
        needed: usize,
        /// Elements the buffer has.
        got: usize,
    },
    /// A token id does not fit the output dtype.
    TokenOutOfRange {
        /// The token id.
        value: i64,
        /// The output dtype.
        dtype: &'static str,
    },
    /// A row index past the end of a dataset.
    RowOutOfRange {
        /// The index asked for.
        row: i128,
        /// Rows in the dataset.
        rows: u64,
    },
}

/// The error type of this crate: a kind plus the context needed to act on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    kind: ErrorKind,
}

/// Shorthand used across the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// The kind of failure, for matching.
    pub fn kind(&self) -> &ErrorKind {
        &self.kind
    }
}

impl From<ErrorKind> for Error {
    fn from(kind: ErrorKind) -> Self {
        Self { kind }
    }
}

impl std::error::Error for Error {}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use ErrorKind as K;
        match &self.kind {
            K::EmptyLengths => write!(f, "lengths is empty; pass at least one sample length"),
            K::NonPositiveLength { row, value } => write!(
                f,
                "length {value} at row {row} is not positive; every sample needs at least one token \
                 (filter empty samples out of the dataset first)"
            ),
            K::LengthTooLarge { row, value } => write!(
                f,
                "length {value} at row {row} exceeds the largest supported length {}; check the column",
                u32::MAX
            ),
            K::TooManySamples { count } => write!(
                f,
                "{count} samples exceed the supported maximum of {}; split the dataset",
                u32::MAX
            ),
            K::BatchSpec { both: true } => write!(
                f,
                "both batch_size and max_tokens were given; pass exactly one of them"
            ),
            K::BatchSpec { both: false } => write!(
                f,
                "neither batch_size nor max_tokens was given; pass exactly one of them \
                 (e.g. max_tokens=16384 or batch_size=8)"
            ),
            K::InvalidSetting { name, value, expected } => {
                write!(f, "{name}={value} is invalid; {name} must be {expected}")
            }
            K::InvalidCost { given } => write!(
                f,
                "cost={given} is invalid; pass cost=\"tokens\" or (a, b) with finite a, b ≥ 0 and a + b > 0 \
                 (a row of padded length L costs a·L + b·L²)"
            ),
            K::CostOverflow { given, length, rows } => write!(
                f,
                "cost={given} prices a batch of {rows} row(s) of {length} tokens beyond 3.4e38, past what rank \
                 balance compares (f32); scale a and b down together (only their ratio shapes the plan)"
            ),
            K::PackedRowTooLong { tokens, capacity } => write!(
                f,
                "the samples hold {tokens} tokens, more than the packed row's capacity {capacity}; \
                 pass the capacity of the plan (its max_tokens) or plan with mode='packed'"
            ),
            K::BadWindow { problem } => write!(
                f,
                "{problem}; pass the starts and lengths that sampler.pieces(batch) returns for the batch"
            ),
            K::PackedSetting { problem } => write!(f, "mode='packed' {problem}"),
            K::TooFewEdges { count } => write!(
                f,
                "boundaries has {count} edge(s); give at least two, e.g. [0, 8192] for one bucket"
            ),
            K::EdgesNotIncreasing { position, previous, value } => write!(
                f,
                "boundaries must be strictly increasing, but edge {position} ({value}) is not above \
                 edge {} ({previous}); sort the edges and remove duplicates",
                position - 1
            ),
            K::EdgesDoNotCover { row, length, low, high } => {
                if length <= low {
                    write!(
                        f,
                        "length {length} at row {row} is not above the first edge {low}; lower the first \
                         edge (buckets hold lengths in (edge[i], edge[i+1]])"
                    )
                } else {
                    write!(
                        f,
                        "length {length} at row {row} exceeds the last edge {high}; append an edge \
                         ≥ {length} (buckets hold lengths in (edge[i], edge[i+1]])"
                    )
                }
            }
            K::MaxTokensBelowShortest {
                max_tokens,
                shortest,
                length,
                row,
                priced: Some((model, price)),
            } => write!(
                f,
                "cost={model} prices one row of the shortest sample ({length} tokens at row {row}, \
                 {shortest} padded) at {price}, above max_tokens {max_tokens} (the budget in the \
                 cost's units), so no batch can be formed; raise max_tokens or lower the cost's \
                 coefficients"
            ),
            K::MaxTokensBelowShortest {
                max_tokens,
                shortest,
                length,
                row,
                priced: None,
            } if u64::from(*length) != *shortest => write!(
                f,
                "max_tokens {max_tokens} is smaller than the shortest sample padded to \
                 pad_to_multiple_of ({length} tokens at row {row}, {shortest} padded), so no batch \
                 can be formed; raise max_tokens or lower pad_to_multiple_of"
            ),
            K::MaxTokensBelowShortest {
                max_tokens,
                shortest,
                row,
                ..
            } => write!(
                f,
                "max_tokens {max_tokens} is smaller than the shortest sample ({shortest} tokens at row \
                 {row}), so no batch can be formed; raise max_tokens"
            ),
            K::Oversize {
                row,
                length,
                max_tokens,
                longest,
            } => write!(
                f,
                "length {length} at row {row} exceeds max_tokens {max_tokens} (the longest row that \
                 fits is {longest} tokens); raise max_tokens or pass oversize='skip'"
            ),
            K::TooFewSamplesForRanks {
                samples,
                world_size,
                drop_last: false,
                batches,
                needed,
            } => {
                write!(
                    f,
                    "{samples} sample(s) cannot give each of world_size {world_size} ranks a batch \
                     without repeating samples: they formed {batches} batch(es) within the budget, the \
                     plan needs {needed} (every rank runs the same steps), and a batch cannot be split \
                     below one sample; use fewer ranks or a smaller max_tokens"
                )?;
                if batches >= &(*world_size as usize) {
                    write!(
                        f,
                        ", or pass drop_last=True (it leaves out the samples of {} batch(es))",
                        batches % *world_size as usize
                    )?;
                }
                Ok(())
            }
            K::TooFewSamplesForRanks {
                samples,
                world_size,
                drop_last: true,
                ..
            } => write!(
                f,
                "{samples} sample(s) cannot give each of world_size {world_size} ranks a batch: fewer \
                 batches than ranks, and drop_last=True dropped them all; use fewer ranks or smaller \
                 batches"
            ),
            K::OutOfMemory { what, bytes } => write!(
                f,
                "{what} needs {:.1} MiB, which cannot be allocated (this process's address space limit, \
                 `ulimit -v`, or the machine's memory is exhausted); free memory, raise the limit or use \
                 fewer samples",
                *bytes as f64 / f64::from(1u32 << 20)
            ),
            K::StepOutOfRange { step, steps } => write!(
                f,
                "step {step} is past the end of the epoch ({steps} steps); resume from a step < {steps}"
            ),
            K::Read { path, problem } => write!(f, "{path} {problem}"),
            K::BufferTooSmall { name, needed, got } => write!(
                f,
                "buffer {name} holds {got} elements but the batch needs {needed} ({}rows × padded \
                 length); pass larger buffers or let the function allocate them",
                // A slot holds the four arrays back to back.
                if *name == "slot" { "4 arrays × " } else { "" }
            ),
            K::TokenOutOfRange { value, dtype } => write!(
                f,
                "token id {value} does not fit in {dtype}; collate with dtype=int64"
            ),
            K::RowOutOfRange { row, rows } => write!(
                f,
                "row {row} is out of range for a dataset of {rows} rows; valid rows are 0..{rows}"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_lowercase_and_name_the_value() {
        let e: Error = ErrorKind::Oversize {
            row: 17,
            length: 9000,
            max_tokens: 8192,
            longest: 8192,
        }
        .into();
        assert_eq!(
            e.to_string(),
            "length 9000 at row 17 exceeds max_tokens 8192 (the longest row that fits is 8192 tokens); \
             raise max_tokens or pass oversize='skip'"
        );
        let e: Error = ErrorKind::EdgesDoNotCover {
            row: 3,
            length: 5,
            low: 10,
            high: 20,
        }
        .into();
        assert!(e
            .to_string()
            .starts_with("length 5 at row 3 is not above the first edge 10"));
    }
}
