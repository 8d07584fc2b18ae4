//! Megatron-LM indexed datasets (`.bin` + `.idx`), written here by the documented layout (the
//! Python suite checks the same reader against megatron-core's own writer).
#![allow(
    clippy::expect_used,
    clippy::unwrap_used,
    clippy::panic,
    clippy::cast_possible_truncation,
    clippy::cast_possible_wrap,
    clippy::cast_sign_loss,
    missing_docs
)]

mod common;

use std::path::{Path, PathBuf};

use common::temp_path;
use dflash_batch_core::collate::{collate_padded, Buffers, Padding};
use dflash_batch_core::{
    read_documents, read_lengths, Error, ErrorKind, Gathered, ReadProblem, TokenStore,
};
use proptest::prelude::*;

/// Bytes per token of each dtype code the format defines.
const SIZES: [(u8, usize); 8] = [
    (1, 1),
    (2, 1),
    (3, 2),
    (4, 4),
    (5, 8),
    (6, 8),
    (7, 4),
    (8, 2),
];

/// One token in the dtype of `code`, little-endian.
fn token_bytes(code: u8, value: i64) -> Vec<u8> {
    match code {
        1 => vec![value as u8],
        2 => vec![value as i8 as u8],
        3 => (value as i16).to_le_bytes().to_vec(),
        4 => (value as i32).to_le_bytes().to_vec(),
        5 => value.to_le_bytes().to_vec(),
        6 => (value as f64).to_le_bytes().to_vec(),
        7 => (value as f32).to_le_bytes().to_vec(),
        _ => (value as u16).to_le_bytes().to_vec(),
    }
}

/// The `.idx` and `.bin` bytes of `rows` with document boundaries `documents`.
fn pair_bytes(code: u8, rows: &[Vec<i64>], documents: &[i64]) -> (Vec<u8>, Vec<u8>) {
    let size = SIZES
        .iter()
        .find(|(c, _)| *c == code)
        .map_or(2, |(_, s)| *s);
    let mut idx = b"MMIDIDX\x00\x00".to_vec();
    idx.extend(1u64.to_le_bytes());
    idx.push(code);
    idx.extend((rows.len() as u64).to_le_bytes());
    idx.extend((documents.len() as u64).to_le_bytes());
    idx.extend(rows.iter().flat_map(|r| (r.len() as i32).to_le_bytes()));
    let mut pointer = 0i64;
    for r in rows {
        idx.extend(pointer.to_le_bytes());
        pointer += (r.len() * size) as i64;
    }
    idx.extend(documents.iter().flat_map(|d| d.to_le_bytes()));
    let bin = rows
        .iter()
        .flatten()
        .flat_map(|&t| token_bytes(code, t))
        .collect();
    (idx, bin)
}

/// Writes a pair; returns its prefix.
fn write_pair(idx: &[u8], bin: &[u8]) -> PathBuf {
    let prefix = temp_path("text_document");
    std::fs::write(prefix.with_extension("idx"), idx).unwrap();
    std::fs::write(prefix.with_extension("bin"), bin).unwrap();
    prefix
}

fn sample_rows() -> Vec<Vec<i64>> {
    vec![vec![5, 6, 7], vec![], vec![9], vec![1, 2, 3, 4, 120]]
}

fn idx_of(prefix: &Path) -> PathBuf {
    prefix.with_extension("idx")
}

fn problem(e: &Error) -> &ReadProblem {
    match e.kind() {
        ErrorKind::Read { problem, .. } => problem,
        other => panic!("not a read error: {other:?}"),
    }
}

fn buffers<T>(bufs: &mut [Vec<T>; 4]) -> Buffers<'_, T> {
    let [ids, mask, labels, positions] = bufs;
    Buffers {
        input_ids: ids,
        attention_mask: mask,
        labels,
        position_ids: positions,
    }
}

fn as_i64(g: &Gathered) -> Vec<i64> {
    match g {
        Gathered::I32(t) => t.iter().map(|&v| i64::from(v)).collect(),
        Gathered::I64(t) => t.clone(),
        Gathered::U32(t) => t.iter().map(|&v| i64::from(v)).collect(),
        Gathered::U16(t) => t.iter().map(|&v| i64::from(v)).collect(),
        Gathered::I16(t) => t.iter().map(|&v| i64::from(v)).collect(),
        Gathered::U8(t) => t.iter().map(|&v| i64::from(v)).collect(),
        Gathered::I8(t) => t.iter().map(|&v| i64::from(v)).collect(),
        Gathered::F32(t) => t.iter().map(|&v| v as i64).collect(),
        Gathered::F64(t) => t.iter().map(|&v| v as i64).collect(),
    }
}

#[test]
fn every_dtype_reads_lengths_tokens_and_collates() {
    let rows = sample_rows();
    for (code, _) in SIZES {
        let (idx, bin) = pair_bytes(code, &rows, &[0, 2, 4]);
        let prefix = write_pair(&idx, &bin);
        // Either half names the pair.
        for path in [prefix.with_extension("idx"), prefix.with_extension("bin")] {
            let lengths = read_lengths(&[&path], "input_ids", None, |_| {}).unwrap();
            assert_eq!(lengths, vec![3, 0, 1, 5], "code {code}");
        }
        let store = TokenStore::open(&[idx_of(&prefix)], "input_ids", None, |_| {}).unwrap();
        assert_eq!(store.len(), 4);
        let (flat, offsets) = store.gather(&[3i64, 0, 1]).unwrap();
        assert_eq!(as_i64(&flat), vec![1, 2, 3, 4, 120, 5, 6, 7], "code {code}");
        assert_eq!(offsets, vec![0, 5, 8, 8]);
        let mut bufs = [vec![0i64; 10], vec![0; 10], vec![0; 10], vec![0; 10]];
        let shape = collate_padded(
            &store,
            &[2i64, 0],
            &Padding::default(),
            buffers(&mut bufs),
            None,
        );
        assert_eq!(shape.unwrap(), (2, 3));
        assert_eq!(&bufs[0][..6], &[9, 0, 0, 5, 6, 7]);
        assert_eq!(read_documents(&[idx_of(&prefix)]).unwrap(), vec![0, 2, 4]);
    }
}

#[test]
fn documents_of_several_pairs_share_one_row_space() {
    let (a_idx, a_bin) = pair_bytes(4, &sample_rows(), &[0, 1, 3]); // the last document left open
    let (b_idx, b_bin) = pair_bytes(4, &sample_rows()[..2], &[0, 2]);
    let (a, b) = (write_pair(&a_idx, &a_bin), write_pair(&b_idx, &b_bin));
    let paths = [idx_of(&a), idx_of(&b)];
    assert_eq!(read_documents(&paths).unwrap(), vec![0, 1, 3, 4, 6]);
    let lengths = read_lengths(&paths, "input_ids", None, |_| {}).unwrap();
    assert_eq!(lengths, vec![3, 0, 1, 5, 3, 0]);
}

#[test]
fn multimodal_indexes_with_mode_bytes_are_read() {
    let rows = sample_rows();
    let (mut idx, bin) = pair_bytes(8, &rows, &[0, 4]);
    idx.extend([0u8; 4]); // one mode byte per sequence
    let prefix = write_pair(&idx, &bin);
    let lengths = read_lengths(&[idx_of(&prefix)], "input_ids", None, |_| {}).unwrap();
    assert_eq!(lengths, vec![3, 0, 1, 5]);
}

#[test]
fn a_pair_of_empty_sequences_has_an_empty_bin() {
    let (idx, bin) = pair_bytes(8, &[vec![], vec![]], &[0, 2]);
    assert!(bin.is_empty());
    let prefix = write_pair(&idx, &bin);
    let store = TokenStore::open(&[idx_of(&prefix)], "input_ids", None, |_| {}).unwrap();
    assert_eq!(store.lengths(), &[0, 0]);
}

#[test]
fn float_tokens_must_be_whole_numbers() {
    let (idx, mut bin) = pair_bytes(6, &[vec![1, 2]], &[0, 1]);
    bin[8..].copy_from_slice(&2.5f64.to_le_bytes());
    let prefix = write_pair(&idx, &bin);
    let store = TokenStore::open(&[idx_of(&prefix)], "input_ids", None, |_| {}).unwrap();
    let mut bufs = [vec![0i32; 2], vec![0; 2], vec![0; 2], vec![0; 2]];
    let out = buffers(&mut bufs);
    let err = collate_padded(&store, &[0i64], &Padding::default(), out, None).unwrap_err();
    assert!(
        matches!(err.kind(), ErrorKind::TokenNotInteger { value, dtype: "int32" } if value == "2.5"),
        "{err}"
    );
}

/// Reads the pair and returns the error it must fail with.
fn failure(idx: &[u8], bin: &[u8]) -> Error {
    let prefix = write_pair(idx, bin);
    let err = read_lengths(&[idx_of(&prefix)], "input_ids", None, |_| {}).unwrap_err();
    let again = TokenStore::open(&[idx_of(&prefix)], "input_ids", None, |_| {}).unwrap_err();
    assert_eq!(err, again, "lengths and tokens are checked alike");
    err
}

#[test]
fn each_kind_of_bad_index_is_named() {
    let rows = sample_rows();
    let (idx, bin) = pair_bytes(4, &rows, &[0, 4]);
    let with = |at: usize, bytes: &[u8]| {
        let mut copy = idx.clone();
        copy[at..at + bytes.len()].copy_from_slice(bytes);
        copy
    };
    let err = failure(&with(0, b"ARROW1"), &bin);
    assert!(
        matches!(problem(&err), ReadProblem::NotMegatron { .. }),
        "{err}"
    );
    assert!(err.to_string().contains("MMIDIDX"), "{err}");
    let err = failure(&with(9, &2u64.to_le_bytes()), &bin);
    assert_eq!(problem(&err), &ReadProblem::MegatronVersion { version: 2 });
    let err = failure(&with(17, &[9]), &bin);
    assert_eq!(problem(&err), &ReadProblem::MegatronDtype { code: 9 });
    let err = failure(&idx[..20], &bin);
    assert!(
        err.to_string().contains("the header needs 34 bytes"),
        "{err}"
    );
    let err = failure(&idx[..idx.len() - 3], &bin);
    assert!(
        matches!(problem(&err), ReadProblem::Truncated { .. }),
        "{err}"
    );
    let err = failure(&with(18, &u64::MAX.to_le_bytes()), &bin);
    assert!(
        matches!(problem(&err), ReadProblem::Truncated { .. }),
        "{err}"
    );
    let mut long = idx.clone();
    long.extend([0u8; 3]);
    let err = failure(&long, &bin);
    assert!(err.to_string().contains("3 bytes past"), "{err}");
    let err = failure(&idx, &bin[..bin.len() - 4]);
    assert!(
        matches!(problem(&err), ReadProblem::Truncated { .. }),
        "{err}"
    );
    assert!(
        err.to_string()
            .contains("holds 32 bytes, but its 4 sequences fill 36"),
        "{err}"
    );
    let mut more = bin.clone();
    more.extend([0u8; 4]);
    let err = failure(&idx, &more);
    assert!(
        err.to_string().contains("4 more than its 4 sequences fill"),
        "{err}"
    );
    // Sequence 1's pointer moved: a gap in the .bin.
    let err = failure(&with(34 + 16 + 8, &16i64.to_le_bytes()), &bin);
    assert!(
        err.to_string().contains("sequence 1 starts at byte 16"),
        "{err}"
    );
    let err = failure(&with(34 + 8, &(-1i32).to_le_bytes()), &bin);
    assert!(
        matches!(
            problem(&err),
            ReadProblem::Negative {
                row: 2,
                value: -1,
                ..
            }
        ),
        "{err}"
    );
    let documents_at = 34 + 12 * rows.len();
    let err = failure(&with(documents_at, &1i64.to_le_bytes()), &bin);
    assert!(err.to_string().contains("not at sequence 0"), "{err}");
    let err = failure(&with(documents_at + 8, &5i64.to_le_bytes()), &bin);
    assert!(err.to_string().contains("boundary 1 is 5 after 0"), "{err}");
    let (no_documents, _) = pair_bytes(4, &rows, &[]);
    let err = failure(&no_documents, &bin);
    assert!(err.to_string().contains("no document boundaries"), "{err}");
    let (empty, none) = pair_bytes(4, &[], &[0]);
    assert_eq!(problem(&failure(&empty, &none)), &ReadProblem::Empty);
}

#[test]
fn a_missing_half_is_named() {
    let (idx, bin) = pair_bytes(4, &sample_rows(), &[0, 4]);
    for (remove, kept) in [("bin", "idx"), ("idx", "bin")] {
        let prefix = write_pair(&idx, &bin);
        std::fs::remove_file(prefix.with_extension(remove)).unwrap();
        let err = read_lengths(&[prefix.with_extension(kept)], "t", None, |_| {}).unwrap_err();
        let ReadProblem::MegatronHalfMissing { missing, .. } = problem(&err) else {
            panic!("{err}");
        };
        assert!(missing.ends_with(remove), "{err}");
    }
    let err = read_lengths(&[temp_path("nothing.idx")], "t", None, |_| {}).unwrap_err();
    assert!(matches!(
        problem(&err),
        ReadProblem::Io {
            kind: std::io::ErrorKind::NotFound,
            ..
        }
    ));
}

#[test]
fn documents_of_an_arrow_file_are_refused() {
    let err = read_documents(&[temp_path("data.arrow")]).unwrap_err();
    assert_eq!(problem(&err), &ReadProblem::NoDocuments);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Any rows in any dtype read back exactly.
    #[test]
    fn rows_round_trip(
        code in 1u8..=8,
        rows in prop::collection::vec(prop::collection::vec(0i64..120, 0..40), 1..30),
    ) {
        let (idx, bin) = pair_bytes(code, &rows, &[0, rows.len() as i64]);
        let prefix = write_pair(&idx, &bin);
        let store = TokenStore::open(&[idx_of(&prefix)], "input_ids", None, |_| {}).unwrap();
        let all: Vec<i64> = (0..rows.len() as i64).collect();
        let (flat, _) = store.gather(&all).unwrap();
        prop_assert_eq!(as_i64(&flat), rows.concat());
        let lengths: Vec<u32> = rows.iter().map(|r| r.len() as u32).collect();
        prop_assert_eq!(store.lengths(), &lengths[..]);
    }

    /// A damaged `.idx` is read or refused, never a panic: every byte may change or the file end.
    #[test]
    fn damaged_indexes_never_panic(
        flips in prop::collection::vec((0usize..200, any::<u8>()), 1..6),
        cut in prop::option::of(0usize..200),
    ) {
        let (mut idx, bin) = pair_bytes(3, &sample_rows(), &[0, 2, 4]);
        for (at, byte) in flips {
            let at = at % idx.len();
            idx[at] = byte;
        }
        if let Some(cut) = cut {
            idx.truncate(cut.min(idx.len()));
        }
        let prefix = write_pair(&idx, &bin);
        let _ = read_lengths(&[idx_of(&prefix)], "input_ids", None, |_| {});
        if let Ok(store) = TokenStore::open(&[idx_of(&prefix)], "input_ids", None, |_| {}) {
            let all: Vec<i64> = (0..store.len() as i64).collect();
            prop_assert!(store.gather(&all).is_ok());
        }
        let _ = read_documents(&[idx_of(&prefix)]);
    }
}
