use super::*;

fn sizes(offsets: &[u32]) -> Vec<u32> {
    offsets.windows(2).map(|w| w[1] - w[0]).collect()
}

#[test]
fn splits_largest_batches_into_near_equal_parts() {
    let indices: Vec<u32> = (0..10).collect();
    let mut offsets = vec![0, 2, 7, 10];
    let rows = |m: &[u32]| m.len() as u64;
    let got = split_for_ranks(&mut offsets, &indices, 5, 0, rows).unwrap();
    // Two more batches are needed. The 5-row batch splits into 3+2; its 3-row part then ties with
    // the 3-row batch and, being earlier, splits again: 2+2+1.
    assert_eq!(sizes(&offsets), [2, 2, 2, 1, 3]);
    assert_eq!(offsets, [0, 2, 4, 6, 7, 10]);
    assert_eq!((got.batches, got.before, got.after), (1, 5, 5));
    assert_eq!(got.parts, [(1, 3)]);
    // Values per batch follow: the split batch's parts get theirs from their rows.
    let mut first_rows = vec![0u32, 2, 7];
    expand_per_batch(&mut first_rows, &got, &offsets, |start, _| start);
    assert_eq!(first_rows, [0, 2, 4, 6, 7]);
}

#[test]
fn splits_several_batches() {
    let indices: Vec<u32> = (0..12).collect();
    let mut offsets = vec![0, 4, 8, 9, 12];
    split_for_ranks(&mut offsets, &indices, 3, 0, |m| m.len() as u64).unwrap();
    assert_eq!(sizes(&offsets), [2, 2, 2, 2, 1, 3]);
}

#[test]
fn batches_move_whole_into_a_new_order() {
    // Batches [0,1] [2,3,4,5] [6]; two ranks need one more batch: the 4-row batch splits into
    // [2,3] [4,5]. Then the order 3, 1, 2, 0.
    let order: Vec<u32> = (0..7).collect();
    let mut offsets = vec![0, 2, 6, 7];
    let split = split_for_ranks(&mut offsets, &order, 2, 0, |m| m.len() as u64).unwrap();
    assert_eq!(split.parts, [(1, 2)]);
    let sequence = vec![3, 1, 2, 0];
    let (rows, new_offsets) = gather(&order, &offsets, &sequence, vec![9; 3], None);
    assert_eq!(rows, [6, 2, 3, 4, 5, 0, 1]);
    assert_eq!(new_offsets, [0, 1, 3, 5, 7]);
    // The same order in place, for a region: batches 1..4 (rows 2..7) as 3, 1, 2.
    let mut in_place = order.clone();
    let mut ends = Vec::new();
    let bound = |i: usize| to_usize(offsets[1 + i]);
    reorder_region(&mut in_place, bound, &[2, 0, 1], |_, e| ends.push(e));
    assert_eq!(in_place, [0, 1, 6, 2, 3, 4, 5]);
    assert_eq!(ends, [3, 5, 7]);
    // Batches left out of the sequence are left out of the plan.
    let (rows, new_offsets) = gather(&order, &offsets, &[0, 3], Vec::new(), None);
    assert_eq!((rows, new_offsets), (vec![0, 1, 6], vec![0, 2, 3]));
}

#[test]
fn no_split_when_already_a_multiple() {
    let mut offsets = vec![0, 1, 2];
    let got = split_for_ranks(&mut offsets, &[0, 1], 2, 0, |m| m.len() as u64).unwrap();
    assert_eq!((offsets, got), (vec![0, 1, 2], Split::default()));
}

#[test]
fn too_few_samples_is_an_error() {
    let err = split_for_ranks(&mut vec![0, 2], &[0, 1], 4, 0, |m| m.len() as u64).unwrap_err();
    assert_eq!(
        err.kind(),
        &ErrorKind::TooFewSamplesForRanks {
            samples: 2,
            world_size: 4,
            drop_last: false,
            batches: 1,
            needed: 4,
        }
    );
    // A world far larger than the samples is refused before anything is sized by it.
    let err = split_for_ranks(&mut vec![0, 2, 5], &[0, 1, 2, 3, 4], 1 << 31, 0, |m| {
        m.len() as u64
    })
    .unwrap_err();
    assert!(matches!(
        err.kind(),
        ErrorKind::TooFewSamplesForRanks { samples: 5, .. }
    ));
}

#[test]
fn drop_remainder_keeps_a_multiple() {
    let mut offsets = vec![0, 1, 3, 4, 6, 7, 9, 10];
    let indices: Vec<u32> = (0..10).collect();
    let dropped = drop_remainder(&mut offsets, &indices, 3, |m| 10 * m.len() as u64);
    assert_eq!(
        dropped,
        Dropped {
            batches: 1,
            rows: 9..10,
            cost: 10
        }
    );
    assert_eq!(offsets, [0, 1, 3, 4, 6, 7, 9]);
}
