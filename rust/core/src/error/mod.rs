//! The crate's one error type.
//!
//! Every failure is an [`Error`] carrying an [`ErrorKind`] with the offending value and, where there is
//! one, its row. Its `Display` (in `message.rs`) is a lowercase sentence that names the value and says
//! how to fix it, because the message travels unchanged to a Python user who never sees this code.

use crate::error::read::ReadProblem;

mod fields;
pub use fields::{Family, Kind, KINDS};
mod message;
pub mod read;
mod shared;
pub use shared::SharedProblem;

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
    /// A rank that is not one of the plan's.
    RankOutOfRange {
        /// The rank asked for.
        rank: u32,
        /// The plan's ranks.
        world_size: u32,
    },
    /// Batches given as CSR (to be scored) that are not a CSR over the samples.
    BadBatching {
        /// What is wrong, and what it must be.
        problem: &'static str,
    },
    /// A ratio setting (`target_efficiency`, `balance_tolerance`) is out of its range.
    InvalidRatio {
        /// The setting's name.
        name: &'static str,
        /// The value given, formatted (from parts per million, when a `Config` was built directly).
        value: String,
        /// What the value must be, and an example.
        expected: &'static str,
    },
    /// The cost model `(linear, quadratic)` is not two finite, non-negative numbers with a positive sum.
    InvalidCost {
        /// The setting: `cost`, or `rank_cost`.
        setting: &'static str,
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
    /// `trim_steps` with a setting it cannot work with.
    TrimSetting {
        /// What is wrong, as the rest of a sentence after "trim_steps=True".
        problem: &'static str,
    },
    /// `oversize = Truncate` with a setting it cannot work with.
    TruncateSetting {
        /// What is wrong, as the rest of a sentence after "oversize='truncate'".
        problem: &'static str,
    },
    /// A setting that packed batches cannot honour.
    PackedSetting {
        /// What is wrong, as the rest of a sentence after "mode='packed'".
        problem: &'static str,
    },
    /// `context_parallel` with a setting it cannot work with.
    ContextParallelSetting {
        /// What is wrong, as the rest of a sentence after "context_parallel=N".
        problem: &'static str,
        /// The degree given.
        context_parallel: u32,
    },
    /// A packed row's capacity that its padded pieces cannot fill exactly: `max_tokens` is not a
    /// multiple of the piece multiple ([`crate::Config::piece_multiple`]).
    PieceMultiple {
        /// `max_tokens`.
        capacity: u64,
        /// What every piece is padded to a multiple of.
        multiple: u64,
        /// The setting `pad_to_multiple_of`.
        pad_to_multiple_of: u32,
        /// The setting `context_parallel`.
        context_parallel: u32,
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
    /// A sequence of one step (`split_step`) holds more tokens than a micro-batch may: it is never split.
    SequenceOverBudget {
        /// Row of the sequence.
        row: usize,
        /// Its length.
        length: u32,
        /// The budget.
        max_tokens: u64,
    },
    /// One step's sequences (`split_step`) cannot give every rank the same number of micro-batches within
    /// the budget.
    StepTooSmall {
        /// Sequences of the step.
        sequences: usize,
        /// Ranks.
        world_size: u32,
        /// Micro-batches they form, each sequence alone where the budget allows no more.
        formed: usize,
        /// Micro-batches equal counts need (a multiple of `world_size`).
        needed: usize,
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
    /// A checkpoint's step past the end of the epoch it was taken in, on the ranks it was taken on.
    ResumeStepOutOfRange {
        /// The checkpoint's step.
        step: u64,
        /// Steps that epoch had.
        steps: u64,
        /// The epoch.
        epoch: u64,
        /// The ranks it ran on.
        world_size: u32,
    },
    /// `oversize="truncate"` would make more plan entries than a `u32` index addresses.
    TooManyPieces {
        /// Samples longer than the capacity.
        samples: u64,
        /// Pieces after their first ones.
        pieces: u64,
        /// The row capacity (`max_tokens`).
        capacity: u64,
    },
    /// An entry that is not one of a plan's.
    EntryOutOfRange {
        /// The entry given.
        entry: i128,
        /// Entries of the plans (rows and pieces).
        entries: u64,
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
    /// A float token (Megatron's float dtypes) that is not a whole number the output dtype holds.
    TokenNotInteger {
        /// The token, as written.
        value: String,
        /// The output dtype.
        dtype: &'static str,
    },
    /// A loss-mask column that is not row for row with the tokens: a row's lengths differ (`row`), or
    /// the row counts (`row` is `None`).
    MaskLength {
        /// The first row whose lengths differ.
        row: Option<u64>,
        /// Tokens of that row (or rows of the token column).
        tokens: u64,
        /// Mask values of that row (or rows of the mask column).
        mask: u64,
    },
    /// A loss-mask column whose values say nothing a loss can apply: a 0/1 mask holding another value
    /// (at `row`, `position`), or a mask of another type than integers and bools.
    MaskValue {
        /// The first row holding such a value (`None`: the column's type is the problem).
        row: Option<u64>,
        /// Its position in the row.
        position: u64,
        /// The value found, or the column's type.
        found: String,
    },
    /// A mixture's setting that cannot be planned (no sources, a repeated name, `max_repeat`,
    /// `epoch_size`, sources that do not hold the lengths given, or a planning setting a mixture
    /// does not take).
    MixtureSetting {
        /// The setting.
        setting: &'static str,
        /// What is wrong with it, and the fix.
        problem: String,
    },
    /// A mixture's source with no rows.
    EmptySource {
        /// The source's name.
        source: String,
    },
    /// A mixture's weight that is negative, infinite or not a number.
    MixtureWeight {
        /// The source's name.
        source: String,
        /// The weight, formatted.
        weight: String,
    },
    /// A mixture's weights that do not sum to 1.
    MixtureWeights {
        /// The weights and their sum, formatted.
        sum: String,
    },
    /// A source whose weight asks for more of it per epoch than `max_repeat` copies hold.
    SourceTooSmall {
        /// The source's name.
        source: String,
        /// Its weight, formatted.
        weight: String,
        /// Its admitted samples (or tokens).
        total: u64,
        /// What its weight asks for per epoch, in the same unit.
        share: u64,
        /// Whether the unit is tokens.
        tokens: bool,
        /// The cap, formatted.
        max_repeat: String,
    },
    /// Sources of a mixture whose token stores cannot be read as one (another token type, another
    /// loss mask).
    SourcesDiffer {
        /// The source that differs from the first.
        source: String,
        /// What differs, and the fix.
        problem: String,
    },
    /// A node's shared plan file (`shared/`) cannot be used.
    SharedPlan {
        /// The file or directory.
        path: String,
        /// What went wrong.
        problem: SharedProblem,
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
