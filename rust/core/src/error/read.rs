//! What can go wrong reading a dataset file, as the [`ErrorKind::Read`](crate::ErrorKind::Read)
//! error's detail.
//!
//! Kept apart from `error.rs` because these messages carry their own fixes (how to rewrite a file,
//! which column to use instead), and they all share the file's path as context.

use std::fmt;

/// Why a file could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReadProblem {
    /// The operating system refused: missing file, a directory, no permission.
    Io {
        /// The `std::io` kind, so a binding can raise the matching exception.
        kind: std::io::ErrorKind,
        /// The operating system's message.
        message: String,
    },
    /// Neither an Arrow IPC file (`ARROW1` magic) nor an Arrow IPC stream.
    NotArrow {
        /// The file's first bytes, to recognise what it is instead.
        head: Vec<u8>,
    },
    /// The file ends before its data does.
    Truncated {
        /// Where and what was cut.
        detail: String,
    },
    /// A mapped file changed after it was mapped (see `read/guard.rs`).
    Changed {
        /// How it changed.
        detail: String,
    },
    /// Record batches are compressed, so they cannot be mapped without copying.
    Compressed {
        /// The codec, e.g. `LZ4_FRAME`.
        codec: String,
    },
    /// The bytes do not decode as Arrow (the decoder's message).
    Corrupt {
        /// What the decoder reported.
        detail: String,
    },
    /// The column is not in the file.
    ColumnMissing {
        /// The column asked for.
        column: String,
        /// The columns that exist.
        available: Vec<String>,
        /// A list column whose offsets would give the lengths, if there is one.
        suggestion: Option<String>,
    },
    /// The column has a type that cannot hold what was asked for.
    ColumnType {
        /// The column.
        column: String,
        /// Its Arrow type.
        found: String,
        /// What it must be.
        expected: &'static str,
    },
    /// A null where every row needs a value.
    Null {
        /// The column.
        column: String,
        /// The row within the file.
        row: u64,
    },
    /// A null inside a row of a list column (a token, or a loss-mask value).
    NullValue {
        /// The column.
        column: String,
        /// The row within the file.
        row: u64,
        /// What a value of the column is: `token` or `loss-mask value`.
        what: &'static str,
    },
    /// A length below zero.
    Negative {
        /// The column.
        column: String,
        /// The row within the file.
        row: u64,
        /// The value.
        value: i64,
    },
    /// A length above `u32::MAX`.
    TooLarge {
        /// The column.
        column: String,
        /// The row within the file.
        row: u64,
        /// The value.
        value: u64,
    },
    /// The file's schema differs from the first file's.
    SchemaMismatch {
        /// The first file, whose schema the others must match.
        first: String,
        /// The first difference found.
        detail: String,
    },
    /// No rows in any of the files (or no files).
    Empty,
    /// Document boundaries asked of a file that has none (only Megatron indexes do).
    NoDocuments,
    /// A Megatron `.idx` without the `MMIDIDX` magic.
    NotMegatron {
        /// The file's first bytes.
        head: Vec<u8>,
    },
    /// A Megatron `.idx` of a version other than 1.
    MegatronVersion {
        /// The version in the header.
        version: u64,
    },
    /// A Megatron `.idx` whose token dtype code is not one the format defines.
    MegatronDtype {
        /// The code in the header.
        code: u8,
    },
    /// A path that is not a regular file: a directory, a FIFO (whose open would wait for a writer
    /// forever), a device or a socket.
    NotRegular {
        /// What it is instead.
        what: &'static str,
    },
    /// A problem of another file than the one named (the `.bin` half of a Megatron pair named by
    /// its `.idx` or prefix): the error names that file.
    InFile {
        /// The file that is wrong.
        path: String,
        /// What is wrong with it.
        problem: Box<ReadProblem>,
    },
    /// Memory for what a file holds (a Megatron index's offsets and documents) could not be
    /// allocated: reported as [`crate::ErrorKind::OutOfMemory`], not as a problem of the file.
    OutOfMemory {
        /// The work that needed it.
        what: &'static str,
        /// Bytes asked for.
        bytes: u64,
    },
    /// One half of a Megatron `.bin`/`.idx` pair is missing.
    MegatronHalfMissing {
        /// The file that is not there.
        missing: String,
        /// The half that is.
        present: String,
    },
    /// A Megatron index whose parts disagree: its counts with its size, its pointers with each other
    /// or with the `.bin`, or its document boundaries with its sequences.
    MegatronInconsistent {
        /// Which parts disagree, and how.
        detail: String,
    },
}

impl fmt::Display for ReadProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use ReadProblem as P;
        match self {
            P::Io { message, .. } => write!(f, "cannot be read: {message}"),
            P::NotRegular { what } => write!(
                f,
                "is {what}, not a regular file; pass an Arrow file, a save_to_disk directory or a \
                 Megatron prefix"
            ),
            P::InFile { path, problem } => write!(f, "{path} {problem}"),
            P::OutOfMemory { what, bytes } => write!(f, "needs {bytes} bytes for {what}"),
            P::NotArrow { head } => {
                let hint = match head.get(..4) {
                    Some(b"MMID") => "; it looks like a Megatron index: pass its prefix, or name it \
                                      with the .idx extension beside its .bin",
                    Some(b"PAR1") => "; it looks like Parquet: convert it with pyarrow.parquet.read_table + \
                                      pyarrow.feather.write_feather(table, path, compression='uncompressed')",
                    _ => "; pass a file written by datasets.save_to_disk, pyarrow.ipc.new_file or new_stream",
                };
                write!(f, "is not an Arrow IPC file or stream (it starts with {:?}){hint}", EscapedHead(head))
            }
            P::Truncated { detail } => write!(
                f,
                "is truncated ({detail}); it was cut short or is still being written: write it again"
            ),
            P::Changed { detail } => write!(
                f,
                "changed while it was mapped ({detail}); a mapped file (a TokenStore's, or the lengths a \
                 sampler borrows from a read-only numpy.memmap) must not change while it is in use: write new \
                 files and open them again (batches collated and plans made before are copies, intact)"
            ),
            P::Compressed { codec } => write!(
                f,
                "holds {codec}-compressed record batches, which cannot be memory-mapped; rewrite it \
                 uncompressed, e.g. pyarrow.feather.write_feather(table, path, compression='uncompressed')"
            ),
            P::Corrupt { detail } => write!(f, "is not valid Arrow data ({detail}); write it again"),
            P::ColumnMissing { column, available, suggestion } => {
                write!(f, "has no column {column:?}; its columns are {available:?}")?;
                match suggestion {
                    Some(list) => write!(
                        f,
                        "; pass column={list:?} to take each row's length from that list column's offsets"
                    ),
                    None => write!(f, "; pass one of them as column="),
                }
            }
            P::ColumnType { column, found, expected } => {
                write!(f, "has column {column:?} of type {found}, but it must be {expected}")
            }
            P::Null { column, row } => write!(
                f,
                "has a null in column {column:?} at row {row}; every sample needs a length (drop or fill \
                 the null rows first)"
            ),
            P::NullValue { column, row, what } => write!(
                f,
                "has a null {what} in column {column:?} at row {row}; every {what} must be a value (fill \
                 the nulls, or drop the rows that have them)"
            ),
            P::Negative { column, row, value } => write!(
                f,
                "has the negative length {value} in column {column:?} at row {row}; check how the column \
                 was computed"
            ),
            P::TooLarge { column, row, value } => write!(
                f,
                "has the length {value} in column {column:?} at row {row}, above the supported maximum {}",
                u32::MAX
            ),
            P::SchemaMismatch { first, detail } => write!(
                f,
                "has a different schema from {first} ({detail}); every shard must come from one dataset"
            ),
            P::Empty => write!(f, "holds no rows; pass a dataset with at least one sample"),
            P::NoDocuments => write!(
                f,
                "has no document boundaries: only Megatron .bin/.idx datasets record them; pass \
                 Megatron prefixes"
            ),
            P::NotMegatron { head } => write!(
                f,
                "is not a Megatron index (it starts with {:?}, not b'MMIDIDX\\x00\\x00'); pass the prefix \
                 of a .bin/.idx pair written by megatron-core's IndexedDatasetBuilder",
                EscapedHead(head)
            ),
            P::MegatronVersion { version } => write!(
                f,
                "is a Megatron index of version {version}; only version 1 (what megatron-core writes) \
                 is defined: rebuild it with megatron-core's IndexedDatasetBuilder"
            ),
            P::MegatronDtype { code } => write!(
                f,
                "is a Megatron index with token dtype code {code}, which the format does not define \
                 (1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64, 7 float32, 8 uint16); the \
                 header is damaged: rebuild the index"
            ),
            P::MegatronHalfMissing { missing, present } => write!(
                f,
                "is half of a Megatron dataset: {missing} is missing beside {present}; a dataset is a \
                 .bin/.idx pair with one prefix, so copy both files"
            ),
            P::MegatronInconsistent { detail } => write!(
                f,
                "is not a consistent Megatron index ({detail}); rebuild the .idx from its .bin with \
                 the tool that wrote them"
            ),
        }
    }
}

/// Bytes shown the way Python shows `bytes`, so the message reads naturally in a traceback.
struct EscapedHead<'a>(&'a [u8]);

impl fmt::Debug for EscapedHead<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "b'")?;
        for &b in self.0 {
            match b {
                b'\'' | b'\\' => write!(f, "\\{}", char::from(b))?,
                b'\n' => write!(f, "\\n")?,
                b'\r' => write!(f, "\\r")?,
                b'\t' => write!(f, "\\t")?,
                0x20..=0x7e => write!(f, "{}", char::from(b))?,
                _ => write!(f, "\\x{b:02x}")?,
            }
        }
        write!(f, "'")
    }
}

/// What the operating system refused, as a read problem (its `std::io` kind kept for the binding).
pub(crate) fn io_problem(e: std::io::Error) -> ReadProblem {
    ReadProblem::Io {
        kind: e.kind(),
        message: e.to_string(),
    }
}
