//! Megatron-LM indexed datasets (the `.bin` + `.idx` pair of Megatron-Core, NeMo and GPT-NeoX), read
//! as one Arrow column so that lengths, token stores and collation treat them like any Arrow file.
//!
//! The `.idx` layout (little-endian, as `megatron.core.datasets.indexed_dataset` writes it):
//!
//! | bytes          | what                                                            |
//! |----------------|-----------------------------------------------------------------|
//! | 9              | magic `MMIDIDX\0\0`                                             |
//! | 8 (`u64`)      | version, 1                                                      |
//! | 1 (`u8`)       | token dtype code: 1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64, 7 float32, 8 uint16 |
//! | 8 (`u64`)      | sequence count `n`                                              |
//! | 8 (`u64`)      | document boundary count `d`                                     |
//! | `4n` (`i32`)   | tokens per sequence                                             |
//! | `8n` (`i64`)   | byte offset of each sequence in the `.bin`                      |
//! | `8d` (`i64`)   | document boundaries: sequence numbers, starting at 0            |
//! | `n` (`i8`)     | sequence modes, only in multimodal datasets                     |
//!
//! The `.bin` is the sequences' tokens back to back. Everything is checked before a column exists:
//! counts against the `.idx` size, every length and pointer against the `.bin` size, and that the
//! pointers lay the sequences end to end from byte 0 (what every writer does), so a sequence is
//! the value range between two offsets of an Arrow large list over the mapped `.bin`. The arrays
//! of the `.idx` are not aligned to their types (they start at byte 34), so they are copied out
//! (12 bytes a sequence); the `.bin` stays mapped and is never copied.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::types::{
    Float32Type, Float64Type, Int16Type, Int32Type, Int64Type, Int8Type, UInt16Type, UInt32Type,
    UInt8Type,
};
use arrow_array::{new_empty_array, ArrayRef, ArrowPrimitiveType, LargeListArray, PrimitiveArray};
use arrow_buffer::{Buffer, OffsetBuffer, ScalarBuffer};
use arrow_schema::{DataType, Field, Schema};

use crate::error::read::io_problem;
use crate::error::read::ReadProblem;
use crate::read::arrow::{map_file, Column};
use crate::read::guard::FileGuard;

/// The first 9 bytes of every `.idx`.
pub const MAGIC: &[u8; 9] = b"MMIDIDX\x00\x00";

/// Magic, version, dtype code and the two counts.
const HEADER: usize = 34;

/// Whether `path` names half of a Megatron pair (by its extension, `.idx` or `.bin`).
pub fn is_megatron(path: &Path) -> bool {
    matches!(
        path.extension().and_then(|e| e.to_str()),
        Some("idx" | "bin")
    )
}

/// The `.idx` and `.bin` of the pair `path` names (either half).
pub fn pair(path: &Path) -> (PathBuf, PathBuf) {
    (path.with_extension("idx"), path.with_extension("bin"))
}

/// What an `.idx` holds, checked against itself and its `.bin`. Lengths are the offsets'
/// differences, and the document boundaries are only checked unless asked for: at 902K sequences
/// every array kept is megabytes of fresh pages to fault in.
struct Index {
    code: u8,
    /// `n + 1` element offsets into the `.bin`.
    offsets: Vec<i64>,
    documents: Option<Vec<u64>>,
}

/// The pair `path` names as column `name`: a large list over the mapped `.bin`, one row a sequence.
pub fn read_column(
    path: &Path,
    name: &str,
    accept: impl Fn(&Field) -> Result<(), ReadProblem>,
) -> Result<Column, ReadProblem> {
    let (index, bin, guards) = open(path, name, false)?;
    // The code was checked when the index was parsed.
    let item_type = item_type(index.code).unwrap_or(DataType::UInt16);
    let item = Arc::new(Field::new("item", item_type, false));
    let field = Arc::new(Field::new(name, DataType::LargeList(item.clone()), false));
    accept(&field)?;
    let elements = index.offsets.last().copied().unwrap_or(0);
    let values = values(
        item.data_type(),
        bin,
        usize::try_from(elements).unwrap_or(0),
    );
    let offsets = OffsetBuffer::new(ScalarBuffer::from(index.offsets));
    let list =
        LargeListArray::try_new(item, offsets, values, None).map_err(|e| ReadProblem::Corrupt {
            detail: e.to_string(),
        })?;
    Ok(Column {
        schema: Arc::new(Schema::new(vec![field.clone()])),
        field,
        chunks: vec![Arc::new(list)],
        guards,
    })
}

/// The document boundaries of the pair `path` names: sequence numbers, rising from 0.
pub fn read_documents(path: &Path) -> Result<(Vec<u64>, usize), ReadProblem> {
    let (index, _, _) = open(path, "tokens", true)?;
    Ok((index.documents.unwrap_or_default(), index.offsets.len() - 1))
}

/// Maps and checks both halves of the pair; the guards of what stays mapped (the `.bin`).
fn open(
    path: &Path,
    name: &str,
    documents: bool,
) -> Result<(Index, Buffer, Vec<Arc<FileGuard>>), ReadProblem> {
    let (idx_path, bin_path) = pair(path);
    let present = |p: &Path| p.exists();
    let missing = |half: &Path, other: &Path| ReadProblem::MegatronHalfMissing {
        missing: half.display().to_string(),
        present: other.display().to_string(),
    };
    if !present(&idx_path) && present(&bin_path) {
        return Err(missing(&idx_path, &bin_path));
    }
    let (idx, _) = map_file(&idx_path)?; // parsed into offsets here, then let go
                                         // The `.bin` half's own problems name it, not the `.idx` or prefix the caller gave.
    let in_bin = |problem| ReadProblem::InFile {
        path: bin_path.display().to_string(),
        problem: Box::new(problem),
    };
    let (bin, guards) = match std::fs::metadata(&bin_path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(missing(&bin_path, &idx_path))
        }
        Ok(meta) if meta.is_file() && meta.len() == 0 => {
            // Nothing to map, but a file that cannot be read is said to be so, not to be empty.
            std::fs::File::open(&bin_path).map_err(|e| in_bin(io_problem(e)))?;
            (Buffer::from_vec(Vec::<u64>::new()), Vec::new())
        }
        _ => {
            let (bin, guard) = map_file(&bin_path).map_err(in_bin)?;
            (bin, vec![guard])
        }
    };
    let index = parse(&idx, name, (&bin_path, bin.len()), documents)?;
    Ok((index, bin, guards))
}

fn inconsistent(detail: String) -> ReadProblem {
    ReadProblem::MegatronInconsistent { detail }
}

/// Reads and checks the `.idx` bytes against the `.bin` (its path and size); keeps the document
/// boundaries if `keep_documents`.
fn parse(
    bytes: &[u8],
    name: &str,
    (bin_path, bin_len): (&Path, usize),
    keep_documents: bool,
) -> Result<Index, ReadProblem> {
    if bytes.len() < MAGIC.len() || &bytes[..MAGIC.len()] != MAGIC {
        return Err(ReadProblem::NotMegatron {
            head: bytes[..bytes.len().min(16)].to_vec(),
        });
    }
    if bytes.len() < HEADER {
        return Err(ReadProblem::Truncated {
            detail: format!(
                "the header needs {HEADER} bytes, the file has {}",
                bytes.len()
            ),
        });
    }
    let word = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap_or([0; 8]));
    let version = word(9);
    if version != 1 {
        return Err(ReadProblem::MegatronVersion { version });
    }
    let code = bytes[17];
    let Some(size) = item_type(code).and_then(|t| t.primitive_width()) else {
        return Err(ReadProblem::MegatronDtype { code });
    };
    let (count, documents) = (word(18), word(26));
    let needed = (|| {
        let n = usize::try_from(count).ok()?;
        let d = usize::try_from(documents).ok()?;
        let body = n.checked_mul(12)?.checked_add(d.checked_mul(8)?)?;
        Some((n, d, HEADER.checked_add(body)?))
    })();
    let (n, d, needed) = match needed {
        Some((n, d, needed)) if needed <= bytes.len() => (n, d, needed),
        _ => {
            return Err(ReadProblem::Truncated {
                detail: format!(
                    "its header counts {count} sequences and {documents} document boundaries, \
                     which need {} bytes; the file has {}",
                    u128::from(count) * 12 + u128::from(documents) * 8 + HEADER as u128,
                    bytes.len()
                ),
            })
        }
    };
    // Multimodal indexes end with one mode byte per sequence; anything else is not this index.
    let extra = bytes.len() - needed;
    if extra != 0 && extra != n {
        return Err(inconsistent(format!(
            "the file has {extra} bytes past the {n} sequences and {d} document boundaries its \
             header counts (a multimodal index has {n}): the header or the file was changed"
        )));
    }
    let lengths_at = HEADER;
    let pointers_at = lengths_at + 4 * n;
    let documents_at = pointers_at + 8 * n;
    let mut offsets = Vec::new();
    let mut documents_kept = Vec::new();
    let oom = |bytes: usize| ReadProblem::OutOfMemory {
        what: "reading a Megatron index",
        bytes: bytes as u64,
    };
    offsets
        .try_reserve_exact(n + 1)
        .map_err(|_| oom((n + 1) * 8))?;
    if keep_documents {
        documents_kept
            .try_reserve_exact(d)
            .map_err(|_| oom(d * 8))?;
    }
    let mut end = 0u64;
    let size_u64 = size as u64;
    let (length_bytes, pointer_bytes) = (
        bytes[lengths_at..pointers_at].chunks_exact(4),
        bytes[pointers_at..documents_at].chunks_exact(8),
    );
    for (row, (l, p)) in length_bytes.zip(pointer_bytes).enumerate() {
        let length = i32::from_le_bytes(l.try_into().unwrap_or([0; 4]));
        let pointer = i64::from_le_bytes(p.try_into().unwrap_or([0; 8]));
        let Ok(length) = u32::try_from(length) else {
            return Err(ReadProblem::Negative {
                column: format!("{name} (the .idx sequence lengths)"),
                row: row as u64,
                value: i64::from(length),
            });
        };
        if u64::try_from(pointer).ok() != Some(end) {
            return Err(inconsistent(format!(
                "sequence {row} starts at byte {pointer} of the .bin, but the sequences before it \
                 end at byte {end}; this reader takes the sequences end to end, as \
                 IndexedDatasetBuilder writes them: rebuild the dataset with it"
            )));
        }
        // `end` is at most 12·n·2^31 < 2^63 bytes, so element offsets fit in i64.
        #[allow(clippy::cast_possible_wrap)]
        offsets.push((end / size_u64) as i64);
        end += u64::from(length) * size_u64;
    }
    #[allow(clippy::cast_possible_wrap)]
    offsets.push((end / size_u64) as i64);
    let bin_len = bin_len as u64;
    if bin_len < end {
        return Err(ReadProblem::Truncated {
            detail: format!(
                "its data file {} holds {bin_len} bytes, but its {n} sequences fill {end}",
                bin_path.display()
            ),
        });
    }
    if bin_len > end {
        return Err(inconsistent(format!(
            "its data file {} holds {bin_len} bytes, {} more than its {n} sequences fill: the \
             .idx belongs to another .bin, or was written before the .bin was complete",
            bin_path.display(),
            bin_len - end
        )));
    }
    let documents = bytes[documents_at..documents_at + 8 * d]
        .chunks_exact(8)
        .map(|b| i64::from_le_bytes(b.try_into().unwrap_or([0; 8])));
    let documents = check_documents(documents, n, keep_documents.then_some(documents_kept))?;
    Ok(Index {
        code,
        offsets,
        documents,
    })
}

/// Document boundaries must start at 0 and rise to at most the sequence count. Returns them in
/// `kept` (reserved by the caller) when given.
fn check_documents(
    documents: impl Iterator<Item = i64>,
    n: usize,
    mut kept: Option<Vec<u64>>,
) -> Result<Option<Vec<u64>>, ReadProblem> {
    let mut previous = None;
    for (k, boundary) in documents.enumerate() {
        match previous {
            None if boundary != 0 => {
                return Err(inconsistent(format!(
                    "its document boundaries start at {boundary}, not at sequence 0 as every \
                     writer starts them"
                )))
            }
            Some(before)
                if boundary < before || usize::try_from(boundary).map_or(true, |b| b > n) =>
            {
                return Err(inconsistent(format!(
                    "document boundary {k} is {boundary} after {before}: boundaries must rise \
                     from 0 to at most the {n} sequences"
                )))
            }
            _ => {}
        }
        previous = Some(boundary);
        if let Some(kept) = &mut kept {
            kept.push(boundary.unsigned_abs());
        }
    }
    if previous.is_none() {
        return Err(inconsistent(
            "it has no document boundaries; every writer starts them with sequence 0".to_owned(),
        ));
    }
    Ok(kept)
}

/// The numpy/Arrow type of a dtype code (`None`: not a code the format defines).
fn item_type(code: u8) -> Option<DataType> {
    Some(match code {
        1 => DataType::UInt8,
        2 => DataType::Int8,
        3 => DataType::Int16,
        4 => DataType::Int32,
        5 => DataType::Int64,
        6 => DataType::Float64,
        7 => DataType::Float32,
        8 => DataType::UInt16,
        _ => return None,
    })
}

/// The first `elements` tokens of the mapped `.bin` as an array of `item` (the map is page-aligned),
/// typed through the one list of token types.
fn values(item: &DataType, bin: Buffer, elements: usize) -> ArrayRef {
    macro_rules! typed {
        ($($v:ident $t:ident $arrow:ident $name:literal),*) => {
            $(if *item == <$arrow as ArrowPrimitiveType>::DATA_TYPE {
                return Arc::new(PrimitiveArray::<$arrow>::new(ScalarBuffer::new(bin, 0, elements), None));
            })*
        };
    }
    token_types!(typed);
    new_empty_array(item) // not reached: every dtype code maps to a token type
}
