//! A row's labels under a loss mask (`read/mask.rs`): the tokens, or a `labels` column's values, with
//! `label_pad_id` wherever the mask says the loss ignores a position. Padded and packed collation call
//! it in place of the plain copy of the tokens an unmasked row gets.

use crate::collate::OutputToken;
use crate::error::Result;
use crate::read::mask::{pad_where, MaskValue};
use crate::read::tokens::{Mask, MaskKind, Tokens};

impl Mask {
    /// Writes a row's labels from its converted tokens `ids` and its mask `values`: the token (or a
    /// `labels` column's value) where the mask keeps the position, `label_pad` where it does not.
    ///
    /// `row` is the store row and `start` where the entry starts in it (a packed piece's window); a
    /// 0/1 mask is applied from its runs, found when the store was opened, without reading the mask
    /// (reading it per batch made collation 1.45× slower, measured).
    pub(crate) fn label<T: OutputToken>(
        &self,
        (row, start): (usize, usize),
        values: Tokens<'_>,
        ids: &[T],
        labels: &mut [T],
        label_pad: T,
    ) -> Result<()> {
        match self.kind {
            MaskKind::Labels => crate::each_token!(Tokens, values, m => {
                T::convert(m, labels)?;
                pad_where(labels, m, label_pad, |v| v.is_ignored());
            }),
            MaskKind::Binary => {
                let len = labels.len();
                labels.copy_from_slice(&ids[..len]);
                for (a, b) in self.runs(row) {
                    let (a, b) = (a.max(start).min(start + len), b.min(start + len));
                    if a < b {
                        labels[a - start..b - start].fill(label_pad);
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collate::packed::{collate_packed_windows, PackedBuffers, Windows};
    use crate::collate::{collate_padded, Buffers, Padding};
    use crate::read::tokens::{Gathered, TokenStore};

    fn store(rows: &[&[i64]]) -> TokenStore {
        let mut offsets = vec![0i64];
        for row in rows {
            offsets.push(offsets[offsets.len() - 1] + row.len() as i64);
        }
        let flat = rows.iter().flat_map(|r| r.iter().copied()).collect();
        TokenStore::from_rows(Gathered::I64(flat), offsets).unwrap()
    }

    fn padded(store: &TokenStore, indices: &[i64], label_pad_id: i64) -> Vec<i64> {
        let n = 2 * 4;
        let (mut ids, mut mask, mut labels, mut positions) =
            (vec![0; n], vec![0; n], vec![0; n], vec![0; n]);
        let padding = Padding {
            pad_id: 0,
            label_pad_id,
            pad_to_multiple_of: 1,
        };
        let out = Buffers {
            input_ids: &mut ids,
            attention_mask: &mut mask,
            labels: &mut labels,
            position_ids: &mut positions,
        };
        let (rows, width) = collate_padded(store, indices, &padding, out, None).unwrap();
        labels.truncate(rows * width);
        labels
    }

    #[test]
    fn a_binary_mask_pads_the_labels_it_masks() {
        let tokens = store(&[&[5, 6, 7, 8], &[9, 10]]);
        let masked = tokens
            .with_mask(store(&[&[0, 0, 1, 1], &[1, 0]]), MaskKind::Binary)
            .unwrap();
        assert_eq!(
            padded(&masked, &[0, 1], -100),
            [-100, -100, 7, 8, 9, -100, -100, -100]
        );
        assert_eq!(masked.mask().unwrap().label_counts().unwrap(), [2, 0]);
        assert_eq!(masked.label_counts(&[1i64, 0], None).unwrap(), [0, 2]);
        // Windows: tokens 1..3 of row 0 (mask 0, 1: its first not counted), and row 0 unmasked.
        let windows = (&[1u32][..], &[2u32][..]);
        assert_eq!(masked.label_counts(&[0i64], Some(windows)).unwrap(), [1]);
        assert_eq!(
            tokens_only().label_counts(&[0i64, 1], None).unwrap(),
            [3, 1]
        );
    }

    fn tokens_only() -> TokenStore {
        store(&[&[5, 6, 7, 8], &[9, 10]])
    }

    #[test]
    fn a_labels_column_gives_the_labels_and_its_ignored_ones_the_pad() {
        let tokens = store(&[&[5, 6, 7, 8], &[9, 10]]);
        let labels = store(&[&[-100, 6, 70, 8], &[9, -100]]);
        let masked = tokens.with_mask(labels, MaskKind::Labels).unwrap();
        assert_eq!(padded(&masked, &[0, 1], -1), [-1, 6, 70, 8, 9, -1, -1, -1]);
        assert_eq!(masked.mask().unwrap().label_counts().unwrap(), [3, 0]);
    }

    #[test]
    fn packed_pieces_keep_their_part_of_the_mask() {
        let tokens = store(&[&[5, 6, 7, 8, 9], &[1, 2]]);
        let masked = tokens
            .with_mask(store(&[&[0, 1, 1, 0, 1], &[1, 1]]), MaskKind::Binary)
            .unwrap();
        let (mut ids, mut labels, mut positions, mut cu) =
            (vec![0i64; 8], vec![0i64; 8], vec![0i64; 8], vec![0i32; 4]);
        let out = PackedBuffers {
            input_ids: &mut ids,
            labels: &mut labels,
            position_ids: &mut positions,
            seq_idx: None,
            cu_seqlens: &mut cu,
        };
        let windows = Windows {
            starts: &[2, 0, 0],
            lengths: &[3, 2, 2],
        };
        let padding = Padding::default();
        collate_packed_windows(&masked, &[0i64, 1, 0], Some(windows), 8, &padding, out).unwrap();
        // Piece [7, 8, 9] (mask 1, 0, 1), row 1 [1, 2], piece [5, 6] (mask 0, 1); first tokens padded.
        assert_eq!(ids[..7], [7, 8, 9, 1, 2, 5, 6]);
        assert_eq!(labels, [-100, -100, 9, -100, 2, -100, 6, -100]);
    }

    #[test]
    fn a_mask_not_row_for_row_names_the_row_and_both_lengths() {
        let tokens = store(&[&[5, 6, 7], &[9, 10]]);
        let error = tokens
            .clone()
            .with_mask(store(&[&[1, 1, 1], &[1]]), MaskKind::Binary)
            .unwrap_err();
        assert!(error
            .to_string()
            .starts_with("row 1 has 2 tokens but 1 loss-mask values"));
        let error = tokens
            .with_mask(store(&[&[1, 1, 1]]), MaskKind::Binary)
            .unwrap_err();
        assert!(error
            .to_string()
            .contains("has 1 rows but the token column has 2"));
    }
}
