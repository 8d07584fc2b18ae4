//! The plan file: a fixed header, the CSR offsets and the indices (`u32` each), little-endian,
//! each array at an 8-byte aligned place so a reader maps them as arrays without a copy.
//!
//! ```text
//! 0    magic "DFLPLAN\0"        8    format, revision (u32 each)
//! 16   fingerprint              24   epoch             32  world_size (u32), 0 (u32)
//! 40   batches                  48   samples (indices) 56  rows (every index is below it)
//! 64   the 13 Stats fields      168  checksum of what follows the header
//! 176  checksum of bytes 0..176 184..256 zero
//! 256  offsets: batches + 1 × u32, zeros to a multiple of 8 bytes, then indices: samples × u32
//! ```
//!
//! The header says what the file is (which data and settings, which epoch, which rules); the two
//! checksums say it is whole. A reader checks both and every structural rule (offsets start at 0,
//! never fall, end at the indices' count; every index below `rows`) before anything is mapped, so
//! a file that was cut short, written by another run or version, or changed since is refused.

use std::fs::File;
use std::io::{Read, Seek, Write};
use std::path::Path;

use crate::plan::output::{Plan, Stats};

/// Bytes before the offsets.
pub(crate) const HEADER: usize = 256;
const MAGIC: &[u8; 8] = b"DFLPLAN\0";
/// Bumped when the layout changes (2: `u32` offsets).
pub(crate) const FORMAT: u32 = 2;
/// Bytes read or written at a time.
pub(crate) const BLOCK: usize = 1 << 20;

/// What a plan file must be to stand for one epoch's plan of one planner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Key {
    pub(crate) fingerprint: u64,
    pub(crate) revision: u32,
    pub(crate) epoch: u64,
    pub(crate) world_size: u32,
    /// Entries the planner plans over: every index is below it.
    pub(crate) rows: u64,
}

/// Where a valid file's arrays lie, and its figures.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// Batches, all ranks together.
    pub batches: u64,
    /// Entries of the indices array.
    pub samples: u64,
    /// Byte offset of the offsets array (`batches + 1` × `u32`).
    pub offsets_at: u64,
    /// Byte offset of the indices array (`samples` × `u32`).
    pub indices_at: u64,
    /// Ranks the plan was made for.
    pub world_size: u32,
    /// The epoch.
    pub epoch: u64,
    /// The plan's figures.
    pub stats: Stats,
}

impl Layout {
    fn of(batches: u64, samples: u64, key: &Key, stats: Stats) -> Self {
        Self {
            batches,
            samples,
            offsets_at: HEADER as u64,
            indices_at: HEADER as u64 + offsets_bytes(batches),
            world_size: key.world_size,
            epoch: key.epoch,
            stats,
        }
    }

    /// The layout `plan` is written in under `key`.
    pub(crate) fn of_plan(plan: &Plan, key: &Key) -> Self {
        let (offsets, indices) = (plan.offsets(), plan.indices());
        let batches = (offsets.len() - 1) as u64;
        Self::of(batches, indices.len() as u64, key, plan.stats().clone())
    }

    /// Bytes of a file with this layout.
    fn file_bytes(&self) -> u64 {
        self.indices_at + 4 * self.samples
    }
}

/// Bytes of the offsets of `batches` batches (`batches + 1` × `u32`) and the zeros that align the
/// indices after them to 8 bytes.
fn offsets_bytes(batches: u64) -> u64 {
    (4 * (batches + 1)).next_multiple_of(8)
}

/// A 64-bit checksum of a byte stream fed in pieces of whole 8-byte words: four lanes so the
/// multiplications overlap (a reader checks gigabytes of it at 1B samples).
pub(super) struct Checksum {
    lanes: [u64; 4],
    words: usize,
}

impl Checksum {
    pub(super) fn new() -> Self {
        Self {
            lanes: [
                0x9E37_79B9_7F4A_7C15,
                0xC2B2_AE3D_27D4_EB4F,
                0x1656_67B1_9E37_79F9,
                0x27D4_EB2F_1656_67C5,
            ],
            words: 0,
        }
    }

    /// Feeds `bytes`, whose length is a multiple of 8 (the caller pads the last piece).
    pub(super) fn feed(&mut self, bytes: &[u8]) {
        for (i, word) in bytes.chunks_exact(8).enumerate() {
            let w = u64::from_le_bytes(word.try_into().unwrap_or([0; 8]));
            // By the word's place in the stream, so how it is cut into pieces does not matter.
            let lane = &mut self.lanes[(self.words + i) & 3];
            *lane = (*lane ^ w).wrapping_mul(0x0100_0000_01B3).rotate_left(29);
        }
        self.words += bytes.len() / 8;
    }

    pub(super) fn finish(&self) -> u64 {
        self.lanes.iter().fold(self.words as u64, |h, &l| {
            (h ^ l).wrapping_mul(0x9E37_79B9_7F4A_7C15).rotate_left(31)
        })
    }
}

/// The header of `plan` under `key`, its data checksum given.
fn header(key: &Key, layout: &Layout, data_sum: u64) -> [u8; HEADER] {
    let mut h = [0u8; HEADER];
    let s = &layout.stats;
    let words: [u64; 20] = [
        key.fingerprint,
        key.epoch,
        u64::from(key.world_size),
        layout.batches,
        layout.samples,
        key.rows,
        s.batches,
        s.steps,
        s.samples,
        s.real_tokens,
        s.padded_tokens,
        s.skipped,
        s.dropped,
        s.dropped_batches,
        s.split_batches,
        s.reformed,
        s.buckets,
        s.min_rows,
        s.max_rows,
        data_sum,
    ];
    h[..8].copy_from_slice(MAGIC);
    h[8..12].copy_from_slice(&FORMAT.to_le_bytes());
    h[12..16].copy_from_slice(&key.revision.to_le_bytes());
    for (i, w) in words.iter().enumerate() {
        h[16 + 8 * i..24 + 8 * i].copy_from_slice(&w.to_le_bytes());
    }
    let mut sum = Checksum::new();
    sum.feed(&h[..176]);
    h[176..184].copy_from_slice(&sum.finish().to_le_bytes());
    h
}

/// Writes `plan` as a plan file of `key` to `path` (created; the caller renames it into place),
/// through `block` ([`BLOCK`] bytes, allocated by the caller where running out is an error).
pub(crate) fn write(path: &Path, key: &Key, plan: &Plan, block: &mut [u8]) -> std::io::Result<()> {
    let (offsets, indices) = (plan.offsets(), plan.indices());
    let layout = Layout::of_plan(plan, key);
    // One pass: the data written and summed after a blank header, the header written last.
    let mut file = File::create(path)?;
    file.write_all(&[0u8; HEADER])?;
    let mut sum = Checksum::new();
    each_block(offsets, indices, block, |bytes, real| {
        sum.feed(bytes);
        file.write_all(&bytes[..real])
    })?;
    file.seek(std::io::SeekFrom::Start(0))?;
    file.write_all(&header(key, &layout, sum.finish()))?;
    // A published file is whole on disk before any reader can find it (the rename follows).
    file.sync_all()
}

/// Hands the offsets then the indices to `f` as little-endian bytes in blocks, with how many of
/// them are the file's: the last block is padded with zeros to whole 8-byte words, as the checksum
/// reads it.
fn each_block(
    offsets: &[u32],
    indices: &[u32],
    block: &mut [u8],
    mut f: impl FnMut(&[u8], usize) -> std::io::Result<()>,
) -> std::io::Result<()> {
    for piece in offsets.chunks(BLOCK / 4) {
        let real = 4 * piece.len();
        for (out, o) in block[..real].chunks_exact_mut(4).zip(piece) {
            out.copy_from_slice(&o.to_le_bytes());
        }
        // The zeros that align the indices are the file's.
        let padded = real.next_multiple_of(8);
        block[real..padded].fill(0);
        f(&block[..padded], padded)?;
    }
    for piece in indices.chunks(BLOCK / 4) {
        let real = 4 * piece.len();
        for (out, i) in block[..real].chunks_exact_mut(4).zip(piece) {
            out.copy_from_slice(&i.to_le_bytes());
        }
        let padded = real.next_multiple_of(8);
        block[real..padded].fill(0);
        f(&block[..padded], real)?;
    }
    Ok(())
}

/// Why a file is not the plan asked for: a sentence for the error message.
pub(crate) type Refusal = String;

/// Reads and checks the plan file at `path` against `key` through `block` ([`BLOCK`] bytes):
/// `Ok(Ok(layout))` when it is that plan, `Ok(Err(why))` when it is not, `Err` when it cannot be
/// read.
pub(crate) fn check(
    path: &Path,
    key: &Key,
    block: &mut [u8],
) -> std::io::Result<Result<Layout, Refusal>> {
    let mut file = super::open::open_regular(path)?;
    let size = file.metadata()?.len();
    let mut h = [0u8; HEADER];
    if size < HEADER as u64 {
        return Ok(Err(format!(
            "it holds {size} bytes, less than a plan file's header"
        )));
    }
    file.read_exact(&mut h)?;
    let word = |at: usize| u64::from_le_bytes(h[at..at + 8].try_into().unwrap_or([0; 8]));
    let half = |at: usize| u32::from_le_bytes(h[at..at + 4].try_into().unwrap_or([0; 4]));
    if &h[..8] != MAGIC {
        return Ok(Err("it is not a dflash_batch plan file".into()));
    }
    let mut sum = Checksum::new();
    sum.feed(&h[..176]);
    if sum.finish() != word(176) {
        return Ok(Err(
            "its header does not match its checksum (it was changed)".into(),
        ));
    }
    if half(8) != FORMAT {
        return Ok(Err(format!(
            "it is in plan file format {}, this version writes {FORMAT}",
            half(8)
        )));
    }
    let found = Key {
        fingerprint: word(16),
        revision: half(12),
        epoch: word(24),
        world_size: u32::try_from(word(32)).unwrap_or(u32::MAX),
        rows: word(56),
    };
    if found != *key {
        return Ok(Err(differences(&found, key)));
    }
    let stats = Stats {
        batches: word(64),
        steps: word(72),
        samples: word(80),
        real_tokens: word(88),
        padded_tokens: word(96),
        skipped: word(104),
        dropped: word(112),
        dropped_batches: word(120),
        split_batches: word(128),
        reformed: word(136),
        buckets: word(144),
        min_rows: word(152),
        max_rows: word(160),
    };
    let (batches, samples) = (word(40), word(48));
    if batches > samples.max(1) || samples > key.rows.max(1) * 2 {
        return Ok(Err(format!(
            "its header counts {batches} batches of {samples} samples, more than {} rows allow",
            key.rows
        )));
    }
    let layout = Layout::of(batches, samples, key, stats);
    if size != layout.file_bytes() {
        return Ok(Err(format!(
            "it holds {size} bytes where its header asks for {} (it was cut short or grown)",
            layout.file_bytes()
        )));
    }
    Ok(check_data(&mut file, &layout, (key.rows, word(168)), block)?.map(|()| layout))
}

/// Reads the arrays once: their checksum and structure (offsets from 0 up to the samples, never
/// falling; indices below `rows`).
fn check_data(
    file: &mut File,
    layout: &Layout,
    (rows, expected): (u64, u64),
    block: &mut [u8],
) -> std::io::Result<Result<(), Refusal>> {
    let mut sum = Checksum::new();
    let mut previous = 0u64;
    let mut problem: Option<Refusal> = None;
    // Whole 8-byte words (BLOCK is a multiple of 8): the alignment's zeros come in the last read.
    let mut remaining = offsets_bytes(layout.batches);
    let mut unread = layout.batches + 1;
    let mut first = true;
    while remaining > 0 {
        let n = usize::try_from(remaining.min(BLOCK as u64)).unwrap_or(BLOCK);
        file.read_exact(&mut block[..n])?;
        sum.feed(&block[..n]);
        for word in block[..n].chunks_exact(4) {
            let o = u64::from(u32::from_le_bytes(word.try_into().unwrap_or([0; 4])));
            if unread == 0 {
                if o != 0 {
                    problem.get_or_insert_with(|| "its offsets are not a plan's (padding)".into());
                }
                continue;
            }
            if (first && o != 0) || o < previous || o > layout.samples {
                problem.get_or_insert_with(|| format!("its offsets are not a plan's (offset {o})"));
            }
            (previous, first, unread) = (o, false, unread - 1);
        }
        remaining -= n as u64;
    }
    if previous != layout.samples {
        problem.get_or_insert_with(|| "its offsets do not end at its samples".into());
    }
    let mut remaining = 4 * layout.samples;
    while remaining > 0 {
        let n = usize::try_from(remaining.min(BLOCK as u64)).unwrap_or(BLOCK);
        file.read_exact(&mut block[..n])?;
        let padded = n.next_multiple_of(8);
        block[n..padded].fill(0);
        sum.feed(&block[..padded]);
        let past = block[..n]
            .chunks_exact(4)
            .map(|w| u32::from_le_bytes(w.try_into().unwrap_or([0; 4])))
            .find(|&i| u64::from(i) >= rows);
        if let Some(i) = past {
            problem.get_or_insert_with(|| format!("index {i} is past the {rows} rows"));
        }
        remaining -= n as u64;
    }
    if sum.finish() != expected {
        problem
            .get_or_insert_with(|| "its data does not match its checksum (it was changed)".into());
    }
    Ok(problem.map_or(Ok(()), Err))
}

/// What differs between the key a file holds and the one asked for.
fn differences(found: &Key, wanted: &Key) -> Refusal {
    let (f, w) = (found, wanted);
    let fields = [
        (
            f.fingerprint != w.fingerprint,
            format!(
                "fingerprint {:016x} (this planner's: {:016x}; other data or settings)",
                f.fingerprint, w.fingerprint
            ),
        ),
        (
            f.revision != w.revision,
            format!(
                "planning revision {} (this version: {})",
                f.revision, w.revision
            ),
        ),
        (
            f.epoch != w.epoch,
            format!("epoch {} (asked: {})", f.epoch, w.epoch),
        ),
        (
            f.world_size != w.world_size,
            format!("world_size {} (asked: {})", f.world_size, w.world_size),
        ),
        (
            f.rows != w.rows,
            format!("{} rows (this planner: {})", f.rows, w.rows),
        ),
    ];
    let parts: Vec<String> = fields
        .into_iter()
        .filter_map(|(differs, part)| differs.then_some(part))
        .collect();
    format!("it holds the plan of {}", parts.join(", "))
}
