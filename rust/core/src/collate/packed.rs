//! Packed collation: one packed batch's samples written end to end into one row of `capacity`
//! tokens, with what varlen attention needs to keep them apart.
//!
//! For samples `s = 0..n` of lengths `l_s` starting at `c_s = l_0 + … + l_{s−1}` (tail padding after
//! `c_n` real tokens):
//!
//! | array          | token `j` of sample `s`                 | padding         |
//! |----------------|-----------------------------------------|-----------------|
//! | `input_ids`    | the token                               | `pad_id`        |
//! | `labels`       | the token; `label_pad_id` at `j = 0`    | `label_pad_id`  |
//! | `position_ids` | `j` (restarts at 0 for every sample)    | 0               |
//! | `seq_idx`      | `s`                                     | -1              |
//!
//! and `cu_seqlens = [c_0 = 0, c_1, …, c_n]` (int32, `n + 1` entries) and `max_seqlen = max l_s`.
//!
//! With `padding.pad_to_multiple_of = m > 1` (context parallelism: `m` a multiple of `2·cp`) each
//! sample takes `p_s = ⌈l_s / m⌉·m` tokens of the row: its own, then `p_s − l_s` of `pad_id` with
//! `label_pad_id` labels, `position_ids` counting on (`l_s … p_s − 1`) and `seq_idx` still `s`, so
//! every document splits into `2·cp` equal chunks. `cu_seqlens` still sums the real lengths (what
//! Megatron's THD format calls `cu_seqlens`); where sample `s` starts in the row is
//! `p_0 + … + p_{s−1}` (its `cu_seqlens_padded`, which the caller derives from these and `m`).
//! Labels are the inputs, as for padded batches (the model shifts them); the first token of each
//! sample gets `label_pad_id` so no sample is trained to predict from the previous one's end. A store
//! with a loss mask also gets `label_pad_id` where its mask says so (`read/mask.rs`).

use crate::collate::{output_value, OutputToken, Padding};
use crate::error::{ErrorKind, Result};
use crate::read::tokens::{Located, TokenStore, Tokens};

/// The output arrays of one packed batch: `input_ids`, `labels`, `position_ids` and (optionally)
/// `seq_idx` hold at least `capacity` elements, `cu_seqlens` at least `samples + 1`.
#[derive(Debug)]
pub struct PackedBuffers<'a, T> {
    /// Token ids, tail padded with `pad_id`.
    pub input_ids: &'a mut [T],
    /// Token ids, `label_pad_id` at each sample's first token and on padding.
    pub labels: &'a mut [T],
    /// Position of each token within its sample, 0 on padding.
    pub position_ids: &'a mut [T],
    /// Start of every sample and the end of the last (int32).
    pub cu_seqlens: &'a mut [i32],
    /// Which sample each token belongs to, -1 on padding.
    pub seq_idx: Option<&'a mut [T]>,
}

/// What [`collate_packed`] wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packed {
    /// Samples in the row (`cu_seqlens` holds one more entry).
    pub samples: usize,
    /// Real tokens: `cu_seqlens[samples]` (without the pieces' padding).
    pub tokens: usize,
    /// The longest sample.
    pub max_seqlen: usize,
}

/// Writes the packed batch `indices` of `store` into one row of `capacity` tokens in `out`.
pub fn collate_packed<T: OutputToken, I: Copy + Into<i128>>(
    store: &TokenStore,
    indices: &[I],
    capacity: usize,
    padding: &Padding,
    out: PackedBuffers<'_, T>,
) -> Result<Packed> {
    collate_packed_windows(store, indices, None, capacity, padding, out)
}

/// Token windows of a packed batch's entries: entry `s` is tokens `starts[s] .. starts[s] +
/// lengths[s]` of its sample (cut at the sample's end) — the pieces of over-long samples that
/// `oversize="truncate"` plans separately.
#[derive(Debug, Clone, Copy)]
pub struct Windows<'a> {
    /// First token of each entry within its sample.
    pub starts: &'a [u32],
    /// Most tokens of each entry.
    pub lengths: &'a [u32],
}

/// [`collate_packed`] where each entry is a window of its sample (`None`: whole samples); every
/// window must start inside its sample.
pub fn collate_packed_windows<T: OutputToken, I: Copy + Into<i128>>(
    store: &TokenStore,
    indices: &[I],
    windows: Option<Windows<'_>>,
    capacity: usize,
    padding: &Padding,
    out: PackedBuffers<'_, T>,
) -> Result<Packed> {
    let mut located = store.locate_all(indices)?;
    let mut masks = store.locate_masks(indices)?;
    if let Some(w) = windows {
        cut(&mut located, w, indices.len())?;
        if let Some((_, places)) = masks.as_mut() {
            cut(places, w, indices.len())?;
        }
    }
    let multiple = padding.pad_to_multiple_of.max(1) as usize;
    let padded = |len: usize| len.div_ceil(multiple) * multiple;
    let tokens: usize = located.iter().map(|(_, r)| padded(r.len())).sum();
    if tokens > capacity || i32::try_from(capacity).is_err() {
        return Err(ErrorKind::PackedRowTooLong { tokens, capacity }.into());
    }
    let samples = located.len();
    let mut sized = vec![
        ("input_ids", out.input_ids.len(), capacity),
        ("labels", out.labels.len(), capacity),
        ("position_ids", out.position_ids.len(), capacity),
        ("cu_seqlens", out.cu_seqlens.len(), samples + 1),
    ];
    if let Some(seq_idx) = &out.seq_idx {
        sized.push(("seq_idx", seq_idx.len(), capacity));
    }
    for (name, got, needed) in sized {
        if got < needed {
            return Err(ErrorKind::BufferTooSmall { name, needed, got }.into());
        }
    }
    let pad_id = output_value::<T>("pad_id", padding.pad_id)?;
    let label_pad_id = output_value::<T>("label_pad_id", padding.label_pad_id)?;
    let (ids, labels, positions) = (out.input_ids, out.labels, out.position_ids);
    let mut seq_idx = out.seq_idx;
    let (mut at, mut longest, mut real) = (0usize, 0usize, 0usize);
    out.cu_seqlens[0] = 0;
    for (s, place) in located.iter().enumerate() {
        let len = place.1.len();
        let row = &mut ids[at..at + len];
        crate::each_token!(Tokens, store.tokens_at(place), t => T::convert(t, row)?);
        match (store.mask(), &masks) {
            (Some(mask), Some((rows, places))) => {
                let start = windows.map_or(0, |w| w.starts[s] as usize);
                mask.label(
                    (rows[s], start),
                    mask.at(&places[s]),
                    row,
                    &mut labels[at..at + len],
                    label_pad_id,
                )?;
            }
            _ => labels[at..at + len].copy_from_slice(row),
        }
        if len > 0 {
            labels[at] = label_pad_id;
        }
        let end = at + padded(len);
        ids[at + len..end].fill(pad_id);
        labels[at + len..end].fill(label_pad_id);
        T::write_positions(&mut positions[at..end]);
        if let Some(seq_idx) = seq_idx.as_deref_mut() {
            // Samples in a row are fewer than its capacity, which fits in i32.
            #[allow(clippy::cast_possible_truncation, clippy::cast_possible_wrap)]
            seq_idx[at..end].fill(T::from(s as i32));
        }
        at = end;
        real += len;
        longest = longest.max(len);
        // `real` ≤ `at` ≤ capacity, which fits in i32 (checked above).
        #[allow(clippy::cast_possible_truncation, clippy::cast_possible_wrap)]
        {
            out.cu_seqlens[s + 1] = real as i32;
        }
    }
    ids[at..capacity].fill(pad_id);
    labels[at..capacity].fill(label_pad_id);
    positions[at..capacity].fill(T::from(0));
    if let Some(seq_idx) = seq_idx {
        seq_idx[at..capacity].fill(T::from(-1));
    }
    Ok(Packed {
        samples,
        tokens: real,
        max_seqlen: longest,
    })
}

/// Cuts each entry's range to its window (every window must start inside its sample).
fn cut(located: &mut [Located], w: Windows<'_>, entries: usize) -> Result<()> {
    if w.starts.len() != entries || w.lengths.len() != entries {
        let problem = format!(
            "{} indices but {} starts and {} lengths",
            entries,
            w.starts.len(),
            w.lengths.len()
        );
        return Err(ErrorKind::BadWindow { problem }.into());
    }
    for (s, (_, range)) in located.iter_mut().enumerate() {
        let (start, length) = (w.starts[s] as usize, w.lengths[s] as usize);
        if start > 0 && start >= range.len() {
            let problem = format!(
                "entry {s} starts at token {start}, past the end of its sample ({} tokens)",
                range.len()
            );
            return Err(ErrorKind::BadWindow { problem }.into());
        }
        let end = (range.start + start + length).min(range.end);
        *range = range.start + start..end;
    }
    Ok(())
}
