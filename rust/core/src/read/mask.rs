//! A loss mask beside the tokens: a second list column, row for row with the token column, that says
//! which positions carry a label. Two kinds, as datasets write them: `labels` (the label of every
//! position, `-100` where the loss ignores it — what Hugging Face models take) and a 0/1 mask
//! (`completion_mask`, `assistant_masks`, `loss_mask`: 1 where the loss counts).
//!
//! The mask is mapped like the tokens (it is a [`TokenStore`] of its own, over the same files and row
//! mapping) and attached to the token store, so every collation of the store — padded, packed, packed
//! pieces — applies it without another argument: labels hold `label_pad_id` on masked positions
//! (`collate/masked.rs`). A 0/1 mask's masked runs (a prompt, a system turn: a few per row) are found
//! once, when it is attached, so collating a batch does not read the mask again.

use crate::error::{ErrorKind, Result};
use crate::memory;
use crate::read::tokens::{Located, Mask, MaskKind, TokenStore, Tokens};

/// The value a `labels` column writes where the loss ignores a position.
const IGNORED: i64 = -100;

/// A mask value of any stored type: zero, or the ignored label.
pub(crate) trait MaskValue: Copy {
    fn is_zero(self) -> bool;
    fn is_ignored(self) -> bool;
    /// 0 or 1: all a 0/1 mask may hold.
    fn is_binary(self) -> bool;
    /// The value as a message shows it.
    fn shown(self) -> String;
}

macro_rules! mask_values {
    ($($t:ty),*) => {$(
        impl MaskValue for $t {
            fn is_zero(self) -> bool {
                self == 0 as $t
            }
            fn is_binary(self) -> bool {
                self == 0 as $t || self == 1 as $t
            }
            fn shown(self) -> String {
                self.to_string()
            }
            #[allow(clippy::cast_possible_truncation, clippy::cast_lossless, clippy::cast_possible_wrap)]
            fn is_ignored(self) -> bool {
                self as i64 == IGNORED
            }
        }
    )*};
}
mask_values!(i8, i16, i32, i64, u8, u16, u32, u64, f32, f64);

impl Mask {
    /// Checks `column` row for row against the token store's lengths: a row whose mask is not as long
    /// as its tokens is an error naming the row and both lengths.
    pub(crate) fn new(column: TokenStore, kind: MaskKind, lengths: &[u32]) -> Result<Self> {
        if column.len() != lengths.len() {
            return Err(ErrorKind::MaskLength {
                row: None,
                tokens: lengths.len() as u64,
                mask: column.len() as u64,
            }
            .into());
        }
        if let Some(row) = (0..lengths.len()).find(|&r| column.lengths()[r] != lengths[r]) {
            return Err(ErrorKind::MaskLength {
                row: Some(row as u64),
                tokens: u64::from(lengths[row]),
                mask: u64::from(column.lengths()[row]),
            }
            .into());
        }
        if column.dtype().starts_with("float") {
            // A Megatron mask pair can carry a float dtype code: a mask of 0.5 applies to no loss.
            let found = column.dtype().to_string();
            return Err(ErrorKind::MaskValue {
                row: None,
                position: 0,
                found,
            }
            .into());
        }
        let (runs, run_starts) = match kind {
            MaskKind::Binary => masked_runs(&column)?,
            MaskKind::Labels => (Vec::new(), Vec::new()),
        };
        Ok(Self {
            column,
            kind,
            runs,
            run_starts,
        })
    }

    /// Row `row`'s masked runs (a 0/1 mask; none for a `labels` column), as `[start, end)` pairs.
    pub(crate) fn runs(&self, row: usize) -> impl Iterator<Item = (usize, usize)> + '_ {
        let (from, to) = match self.run_starts.get(row..=row + 1) {
            Some(&[from, to]) => (from, to),
            _ => (0, 0),
        };
        self.runs[from..to]
            .chunks_exact(2)
            .map(|r| (r[0] as usize, r[1] as usize))
    }

    /// The kind of mask.
    pub fn kind(&self) -> MaskKind {
        self.kind
    }

    /// Whether position `j` of `values` carries a label.
    fn counts<V: MaskValue>(&self, value: V) -> bool {
        match self.kind {
            MaskKind::Labels => !value.is_ignored(),
            MaskKind::Binary => !value.is_zero(),
        }
    }

    /// Label tokens of every row: positions after the first that carry a label (a causal LM never
    /// predicts a row's first token).
    pub fn label_counts(&self) -> Result<Vec<u32>> {
        let n = self.column.len() as u64;
        memory::reserve("counting label tokens", n * (8 + LOCATED_BYTES + 4))?;
        let rows: Vec<u64> = (0..n).collect();
        // Every row of the column resolves.
        let places = self.column.locate_all(&rows)?;
        Ok(places
            .iter()
            .map(|place| self.count(self.at(place), 1..usize::MAX))
            .collect())
    }

    /// Positions of `values` within `range` (cut at the row's end) that carry a label.
    pub(crate) fn count(&self, values: Tokens<'_>, range: std::ops::Range<usize>) -> u32 {
        each_token!(Tokens, values, m => {
            let end = range.end.min(m.len());
            let start = range.start.min(end);
            // A row holds fewer than 2^32 tokens (lengths are u32).
            #[allow(clippy::cast_possible_truncation)]
            let n = m[start..end].iter().filter(|&&v| self.counts(v)).count() as u32;
            n
        })
    }

    /// The mask values at a location of the mask column.
    pub(crate) fn at(&self, place: &Located) -> Tokens<'_> {
        self.column.tokens_at(place)
    }
}

/// Positions scanned at once by [`pad_where`].
const CHUNK: usize = 64;

/// `label_pad` wherever `masked(value)` (a `labels` column's -100), `CHUNK` positions at a time: a
/// stretch with nothing masked costs one vectorized scan, a masked run one fill; only chunks that mix
/// the two go position by position (a select per position did not vectorize).
pub(crate) fn pad_where<T: Copy, V: MaskValue>(
    labels: &mut [T],
    m: &[V],
    label_pad: T,
    masked: impl Fn(V) -> bool,
) {
    for (labels, m) in labels.chunks_mut(CHUNK).zip(m.chunks(CHUNK)) {
        if !m.iter().fold(false, |any, &v| any | masked(v)) {
            continue;
        }
        if m.iter().fold(true, |all, &v| all & masked(v)) {
            labels.fill(label_pad);
            continue;
        }
        for (label, &v) in labels.iter_mut().zip(m) {
            if masked(v) {
                *label = label_pad;
            }
        }
    }
}

/// Bytes of one [`Located`] (a record batch and a range in it).
const LOCATED_BYTES: u64 = std::mem::size_of::<Located>() as u64;

/// Every row's masked runs of a 0/1 mask column, found in one pass over its values.
fn masked_runs(column: &TokenStore) -> Result<(Vec<u32>, Vec<usize>)> {
    const WHAT: &str = "indexing the loss mask";
    let n = column.len() as u64;
    memory::reserve(WHAT, n * (8 + LOCATED_BYTES + 8))?;
    let rows: Vec<u64> = (0..n).collect();
    let mut runs: Vec<u32> = Vec::new();
    let mut run_starts = Vec::with_capacity(column.len() + 1);
    run_starts.push(0);
    for (row, place) in column.locate_all(&rows)?.iter().enumerate() {
        each_token!(Tokens, column.tokens_at(place), m => {
            if let Some(position) = m.iter().position(|v| !v.is_binary()) {
                let found = m[position].shown();
                return Err(ErrorKind::MaskValue { row: Some(row as u64), position: position as u64, found }.into());
            }
            let mut j = 0;
            while let Some(k) = m[j..].iter().position(|v| v.is_zero()) {
                let start = j + k;
                let end = m[start..].iter().position(|v| !v.is_zero()).map_or(m.len(), |k| start + k);
                // The runs grow with the data: a failed growth is an error, not an abort.
                runs.try_reserve(2).map_err(|_| ErrorKind::OutOfMemory {
                    what: WHAT,
                    bytes: (runs.len() as u64 + 2) * 8,
                })?;
                // A row holds fewer than 2^32 tokens (lengths are u32).
                #[allow(clippy::cast_possible_truncation)]
                runs.extend([start as u32, end as u32]);
                j = end;
            }
        });
        run_starts.push(runs.len());
    }
    Ok((runs, run_starts))
}

impl TokenStore {
    /// This store with `column` (over the same rows, checked row for row) as its loss mask.
    pub fn with_mask(mut self, column: TokenStore, kind: MaskKind) -> Result<Self> {
        self.mask = Some(Box::new(Mask::new(column, kind, self.lengths())?));
        Ok(self)
    }

    /// The loss mask, if the store has one.
    pub fn mask(&self) -> Option<&Mask> {
        self.mask.as_deref()
    }

    /// The store rows of `indices` and where their mask values lie, when the store has a mask.
    pub(crate) fn locate_masks<I: Copy + Into<i128>>(
        &self,
        indices: &[I],
    ) -> Result<Option<(Vec<usize>, Vec<Located>)>> {
        let Some(mask) = self.mask() else {
            return Ok(None);
        };
        let rows = indices
            .iter()
            .map(|&i| self.resolve(i))
            .collect::<Result<Vec<_>>>()?;
        Ok(Some((rows, mask.column.locate_all(indices)?)))
    }

    /// Label tokens of each entry: tokens `starts[e] .. starts[e] + lengths[e]` of row `indices[e]`
    /// (cut at the row's end; whole rows without windows), less the entry's first token — a causal LM
    /// never predicts it, and packed rows mask it — and, with a mask, only the positions it labels.
    pub fn label_counts<I: Copy + Into<i128>>(
        &self,
        indices: &[I],
        windows: Option<(&[u32], &[u32])>,
    ) -> Result<Vec<u32>> {
        // Each entry's place (and its mask's), row and count.
        let per_entry = 2 * LOCATED_BYTES + 8 + 4;
        memory::reserve("counting label tokens", indices.len() as u64 * per_entry)?;
        let located = self.locate_all(indices)?;
        let masks = self.locate_masks(indices)?.map(|(_, places)| places);
        let window = |e: usize, len: usize| match windows {
            Some((starts, lengths)) => {
                let start = (starts[e] as usize).min(len);
                start..(start + lengths[e] as usize).min(len)
            }
            None => 0..len,
        };
        if let Some((starts, lengths)) = windows {
            if starts.len() != indices.len() || lengths.len() != indices.len() {
                let problem = format!(
                    "{} indices but {} starts and {} lengths",
                    indices.len(),
                    starts.len(),
                    lengths.len()
                );
                return Err(ErrorKind::BadWindow { problem }.into());
            }
        }
        Ok((0..located.len())
            .map(|e| {
                let range = window(e, located[e].1.len());
                match (self.mask(), &masks) {
                    (Some(mask), Some(places)) => {
                        mask.count(mask.at(&places[e]), range.start + 1..range.end)
                    }
                    // A row holds fewer than 2^32 tokens (lengths are u32).
                    #[allow(clippy::cast_possible_truncation)]
                    _ => range.len().saturating_sub(1) as u32,
                }
            })
            .collect())
    }
}
