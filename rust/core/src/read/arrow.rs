//! One column of an Arrow IPC file, memory-mapped and decoded without copying.
//!
//! Both IPC flavours are read: the **file** format (`ARROW1` magic, a footer that lists the record
//! batches: `pyarrow.ipc.new_file`, uncompressed Feather v2) and the **stream** format (a schema
//! message, then record batches, then an end-of-stream marker: what Hugging Face `datasets` writes,
//! in batches of ≤ 1000 rows). The framing is walked here; every message is decoded by `arrow-ipc`
//! with a projection onto the one column asked for, so other columns (strings, images) are never
//! decoded or validated, and their pages are never touched.
//!
//! Rules that keep bad files from crashing the process:
//! * every offset and length read from the file is checked against the file's size before use;
//! * flatbuffers are verified by `arrow-ipc`, and decoded arrays are validated (offsets in bounds);
//! * a stream must end with its end-of-stream marker, so a file cut at a message boundary is
//!   reported as truncated rather than read as a shorter dataset;
//! * compressed record batches are refused up front (they cannot be mapped), naming the codec;
//! * anything `arrow-ipc` still panics on is caught and reported as corrupt data.
//!
//! The map is shared by every array decoded from it, so it lives as long as any of them. Mapped files
//! must not change while mapped: the OS would fault the process on a page that no longer exists.
//! Callers that only need lengths copy them out right away (see `dataset.rs`).

use std::collections::HashMap;
use std::fs::File;
use std::ops::Range;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::sync::Arc;

use arrow_array::ArrayRef;
use arrow_buffer::Buffer;
use arrow_ipc::reader::RecordBatchDecoder;
use arrow_ipc::{root_as_footer, root_as_message, MessageHeader, MetadataVersion};
use arrow_schema::{DataType, Field, Schema, SchemaRef};

use crate::error::read::{io_problem, ReadProblem};
use crate::read::guard::FileGuard;

/// The 6-byte magic of the IPC file format, at both ends of the file.
const MAGIC: &[u8; 6] = b"ARROW1";

/// Marks the start of a message (since Arrow 0.15).
const CONTINUATION: [u8; 4] = [0xff; 4];

/// One column of one file: its field, and one array per record batch.
#[derive(Debug)]
pub struct Column {
    /// The whole schema of the file (to check that shards agree).
    pub schema: SchemaRef,
    /// The column's field.
    pub field: Arc<Field>,
    /// The column, one array per record batch, in file order.
    pub chunks: Vec<ArrayRef>,
    /// The mapped files the chunks read (none for a table in memory).
    pub guards: Vec<Arc<FileGuard>>,
}

impl Column {
    /// Rows in the file.
    pub fn rows(&self) -> usize {
        self.chunks.iter().map(|c| c.len()).sum()
    }
}

/// Reads column `name` of the IPC file or stream at `path`. `accept` checks the column's field
/// before any record batch is decoded, so a column of the wrong type fails fast.
pub fn read_column(
    path: &Path,
    name: &str,
    accept: impl Fn(&Field) -> Result<(), ReadProblem>,
) -> Result<Column, ReadProblem> {
    let (buffer, guard) = map_file(path)?;
    // Arrow-ipc may still panic on some malformed inputs; a panic must not reach the caller.
    let decoded = catch_unwind(AssertUnwindSafe(|| decode_file(&buffer, name, &accept)));
    let mut column = decoded.unwrap_or_else(|panic| {
        let detail = panic
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| panic.downcast_ref::<&str>().copied())
            .unwrap_or("the decoder panicked");
        Err(ReadProblem::Corrupt {
            detail: detail.to_owned(),
        })
    })?;
    column.guards.push(guard);
    Ok(column)
}

/// Maps `path` read-only into a [`Buffer`] that keeps the map alive, and the guard that tells when the
/// file changes under it (`guard.rs`).
pub(crate) fn map_file(path: &Path) -> Result<(Buffer, Arc<FileGuard>), ReadProblem> {
    // Checked before opening: opening a FIFO waits for a writer, forever for a dataset.
    regular(&std::fs::metadata(path).map_err(io_problem)?)?;
    let file = File::open(path).map_err(io_problem)?;
    let meta = file.metadata().map_err(io_problem)?;
    regular(&meta)?;
    if meta.len() == 0 {
        return Err(ReadProblem::Truncated {
            detail: "the file is empty".into(),
        });
    }
    // SAFETY: the map is read-only and owned by the returned buffer, so no reference outlives it.
    // The remaining hazard — another process truncating the file while it is mapped — cannot be
    // excluded by any mapping API; the crate documents that mapped files must not change.
    #[allow(unsafe_code)]
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io_problem)?;
    let guard = FileGuard::new(path, file, map.len() as u64, meta.modified().ok());
    Ok((Buffer::from(bytes::Bytes::from_owner(map)), Arc::new(guard)))
}

/// [`ReadProblem::NotRegular`] unless `meta` is a regular file's.
fn regular(meta: &std::fs::Metadata) -> Result<(), ReadProblem> {
    use std::os::unix::fs::FileTypeExt;
    let kind = meta.file_type();
    let what = if kind.is_file() {
        return Ok(());
    } else if kind.is_dir() {
        "a directory"
    } else if kind.is_fifo() {
        "a FIFO"
    } else if kind.is_socket() {
        "a socket"
    } else {
        "a device"
    };
    Err(ReadProblem::NotRegular { what })
}

/// Where one message's metadata and body lie in the file.
struct Framed {
    meta: Range<usize>,
    body: Range<usize>,
}

fn decode_file(
    buffer: &Buffer,
    name: &str,
    accept: &dyn Fn(&Field) -> Result<(), ReadProblem>,
) -> Result<Column, ReadProblem> {
    let bytes = buffer.as_slice();
    let (schema, messages) = if bytes.starts_with(MAGIC) {
        file_layout(bytes)?
    } else if bytes.starts_with(&CONTINUATION) {
        stream_layout(bytes)?
    } else {
        return Err(ReadProblem::NotArrow {
            head: bytes[..bytes.len().min(8)].to_vec(),
        });
    };
    let index = schema
        .index_of(name)
        .map_err(|_| missing_column(&schema, name))?;
    let field = Arc::new(schema.field(index).clone());
    accept(&field)?;
    let mut chunks = Vec::with_capacity(messages.len());
    let no_dictionaries = HashMap::new();
    // Dictionary batches belong only to files with dictionary-encoded columns (never the one read).
    let dictionaries = schema
        .fields()
        .iter()
        .any(|f| holds_dictionary(f.data_type()));
    for framed in messages {
        let message = root_as_message(&bytes[framed.meta.clone()]).map_err(corrupt)?;
        let batch = match message.header_type() {
            MessageHeader::DictionaryBatch if dictionaries => continue,
            MessageHeader::RecordBatch => message.header_as_record_batch(),
            _ => None,
        };
        // Skipping a message the reader does not understand would drop its rows without a word.
        let Some(batch) = batch else {
            let kind = message
                .header_type()
                .variant_name()
                .unwrap_or("an unknown kind of");
            return Err(corrupt(format!(
                "the message at byte {} is {kind} message where a record batch belongs",
                framed.meta.start
            )));
        };
        if let Some(compression) = batch.compression() {
            let codec = compression
                .codec()
                .variant_name()
                .unwrap_or("an unknown codec");
            return Err(ReadProblem::Compressed {
                codec: codec.to_owned(),
            });
        }
        let body = buffer.slice_with_length(framed.body.start, framed.body.len());
        let version = message.version();
        let decoded =
            RecordBatchDecoder::try_new(&body, batch, schema.clone(), &no_dictionaries, &version)
                .and_then(|d| d.with_projection(Some(&[index])).read_record_batch())
                .map_err(corrupt)?;
        chunks.push(decoded.column(0).clone());
    }
    Ok(Column {
        schema,
        field,
        chunks,
        guards: Vec::new(),
    })
}

/// Whether a column of this type is, or holds, a dictionary-encoded array.
fn holds_dictionary(data_type: &DataType) -> bool {
    match data_type {
        DataType::Dictionary(..) => true,
        DataType::List(f)
        | DataType::LargeList(f)
        | DataType::FixedSizeList(f, _)
        | DataType::Map(f, _)
        | DataType::ListView(f)
        | DataType::LargeListView(f) => holds_dictionary(f.data_type()),
        DataType::Struct(fields) => fields.iter().any(|f| holds_dictionary(f.data_type())),
        DataType::Union(fields, _) => fields.iter().any(|(_, f)| holds_dictionary(f.data_type())),
        _ => false,
    }
}

fn corrupt(e: impl std::fmt::Display) -> ReadProblem {
    ReadProblem::Corrupt {
        detail: e.to_string(),
    }
}

fn truncated(detail: impl Into<String>) -> ReadProblem {
    ReadProblem::Truncated {
        detail: detail.into(),
    }
}

/// A list of the columns that exist, and a list column to derive lengths from, if any.
pub(crate) fn missing_column(schema: &Schema, name: &str) -> ReadProblem {
    let available = schema.fields().iter().map(|f| f.name().clone()).collect();
    let suggestion = schema
        .fields()
        .iter()
        .find(|f| f.data_type().is_nested() && crate::read::column::list_of_numbers(f.data_type()))
        .map(|f| f.name().clone());
    ReadProblem::ColumnMissing {
        column: name.to_owned(),
        available,
        suggestion,
    }
}

/// The byte range `start..start + len` if it lies inside `bytes`.
fn within(bytes: &[u8], start: usize, len: i64, what: &str) -> Result<Range<usize>, ReadProblem> {
    let len = usize::try_from(len).map_err(|_| corrupt(format!("negative {what} length {len}")))?;
    match start.checked_add(len) {
        Some(end) if end <= bytes.len() => Ok(start..end),
        _ => Err(truncated(format!(
            "{what} of {len} bytes at offset {start} ends past the file's {} bytes",
            bytes.len()
        ))),
    }
}

/// Reads the frame of the message at `pos`: `Ok(None)` at the end-of-stream marker, else the
/// metadata's range and the position right after it.
fn frame_at(bytes: &[u8], pos: usize) -> Result<Option<(Range<usize>, usize)>, ReadProblem> {
    let word = |at: usize| -> Result<[u8; 4], ReadProblem> {
        bytes
            .get(at..at + 4)
            .and_then(|w| w.try_into().ok())
            .ok_or_else(|| {
                truncated(format!(
                    "the file ends at byte {} inside a message header",
                    bytes.len()
                ))
            })
    };
    let first = word(pos)?;
    let (len, header) = if first == CONTINUATION {
        (i32::from_le_bytes(word(pos + 4)?), 8)
    } else {
        (i32::from_le_bytes(first), 4) // before Arrow 0.15: no continuation marker
    };
    if len == 0 {
        return Ok(None);
    }
    let meta = within(bytes, pos + header, i64::from(len), "message metadata")?;
    let next = meta.end;
    Ok(Some((meta, next)))
}

/// The schema and record-batch messages of a stream-format file, which must end with its
/// end-of-stream marker.
fn stream_layout(bytes: &[u8]) -> Result<(SchemaRef, Vec<Framed>), ReadProblem> {
    let Some((meta, mut pos)) = frame_at(bytes, 0)? else {
        return Err(corrupt("the stream ends before its schema"));
    };
    let schema = schema_message(&bytes[meta])?;
    let mut messages = Vec::new();
    loop {
        if pos == bytes.len() {
            return Err(truncated(format!(
                "the stream stops after {} record batch(es) without its end-of-stream marker",
                messages.len()
            )));
        }
        let Some((meta, after)) = frame_at(bytes, pos)? else {
            // A zero length inside the file, e.g. reached through a corrupted body length, is not
            // the end: the rows after it would be lost without a word.
            let marker = if bytes[pos..].starts_with(&CONTINUATION) {
                8
            } else {
                4
            };
            if pos + marker != bytes.len() {
                return Err(corrupt(format!(
                    "an end-of-stream marker at byte {pos} is followed by {} more bytes",
                    bytes.len() - pos - marker
                )));
            }
            return Ok((schema, messages));
        };
        let message = root_as_message(&bytes[meta.clone()]).map_err(corrupt)?;
        let body = within(bytes, after, message.bodyLength(), "message body")?;
        pos = body.end;
        match message.header_type() {
            MessageHeader::RecordBatch | MessageHeader::DictionaryBatch => {
                messages.push(Framed { meta, body });
            }
            other => {
                return Err(corrupt(format!(
                    "unexpected {} message in the stream",
                    other.variant_name().unwrap_or("unknown")
                )))
            }
        }
    }
}

fn schema_message(meta: &[u8]) -> Result<SchemaRef, ReadProblem> {
    let message = root_as_message(meta).map_err(corrupt)?;
    let schema = message
        .header_as_schema()
        .ok_or_else(|| corrupt("the first message is not a schema"))?;
    Ok(Arc::new(
        arrow_ipc::convert::try_fb_to_schema(schema).map_err(corrupt)?,
    ))
}

/// The schema and record-batch messages of a file-format file, from its footer.
fn file_layout(bytes: &[u8]) -> Result<(SchemaRef, Vec<Framed>), ReadProblem> {
    let len = bytes.len();
    if len < 2 * MAGIC.len() + 4 || !bytes.ends_with(MAGIC) {
        return Err(truncated(
            "the file lacks the footer that ends every Arrow IPC file",
        ));
    }
    let trailer = len - MAGIC.len() - 4;
    let footer_len = i32::from_le_bytes([
        bytes[trailer],
        bytes[trailer + 1],
        bytes[trailer + 2],
        bytes[trailer + 3],
    ]);
    let footer_len = usize::try_from(footer_len)
        .ok()
        .filter(|&l| l <= trailer)
        .ok_or_else(|| corrupt(format!("footer length {footer_len} does not fit the file")))?;
    let footer = root_as_footer(&bytes[trailer - footer_len..trailer]).map_err(corrupt)?;
    if footer.version() < MetadataVersion::V4 {
        return Err(corrupt("metadata versions before V4 are not supported"));
    }
    let schema = footer
        .schema()
        .ok_or_else(|| corrupt("the footer has no schema"))?;
    let schema = Arc::new(arrow_ipc::convert::try_fb_to_schema(schema).map_err(corrupt)?);
    let mut messages = Vec::new();
    for block in footer.recordBatches().into_iter().flatten() {
        let offset =
            usize::try_from(block.offset()).map_err(|_| corrupt("negative block offset"))?;
        let Some((meta, _)) = frame_at(bytes, offset)? else {
            return Err(corrupt(format!(
                "empty record batch block at offset {offset}"
            )));
        };
        let meta_len = i64::from(block.metaDataLength());
        let body_start = within(bytes, offset, meta_len, "record batch metadata")?.end;
        if meta.end > body_start {
            return Err(corrupt(format!(
                "record batch metadata at offset {offset} overruns its block"
            )));
        }
        let body = within(bytes, body_start, block.bodyLength(), "record batch body")?;
        messages.push(Framed { meta, body });
    }
    Ok((schema, messages))
}
