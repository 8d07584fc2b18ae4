use super::file::HEADER;
use super::*;
use crate::{Batching, Config};

fn planner(seed: u64) -> Planner {
    let lengths: Vec<u32> = (0..5000u32).map(|i| 1 + (i * 7919) % 3000).collect();
    let config = Config {
        world_size: 4,
        seed,
        ..Config::new(Batching::Tokens(8192))
    };
    Planner::new(lengths, config).unwrap()
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("dflash-shared-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// A plan file's offsets and indices.
type Arrays = (Vec<u32>, Vec<u32>);

/// The file's arrays, read back as a reader maps them.
fn arrays(shared: &SharedPlan) -> Arrays {
    let bytes = std::fs::read(&shared.path).unwrap();
    let at = |x: u64| usize::try_from(x).unwrap();
    let layout = &shared.layout;
    let end = at(layout.offsets_at) + 4 * at(layout.batches + 1);
    let offsets = bytes[at(layout.offsets_at)..end]
        .chunks_exact(4)
        .map(|w| u32::from_le_bytes(w.try_into().unwrap()))
        .collect();
    assert!(bytes[end..at(layout.indices_at)].iter().all(|&b| b == 0));
    let indices = bytes[at(layout.indices_at)..]
        .chunks_exact(4)
        .map(|w| u32::from_le_bytes(w.try_into().unwrap()))
        .collect();
    (offsets, indices)
}

/// Writes the checksum of a changed header back into it (a forged file of another format).
fn reseal_header(bytes: &mut [u8]) {
    let mut sum = super::file::Checksum::new();
    sum.feed(&bytes[..176]);
    bytes[176..184].copy_from_slice(&sum.finish().to_le_bytes());
}

fn refusal(err: &crate::Error) -> &str {
    match err.kind() {
        ErrorKind::SharedPlan {
            problem: SharedProblem::Refused { why },
            ..
        } => why,
        other => panic!("not a refusal: {other:?}"),
    }
}

#[test]
fn the_first_call_plans_and_the_rest_find_the_same_plan() {
    let (dir, p) = (scratch("first"), planner(1));
    let plan = p.plan(3).unwrap();
    let first = p.plan_shared(&dir, 3).unwrap();
    assert!(first.planned);
    let (offsets, indices) = arrays(&first);
    assert_eq!(
        (&offsets[..], &indices[..]),
        (plan.offsets(), plan.indices())
    );
    assert_eq!(&first.layout.stats, plan.stats());
    drop(first);
    // Another planner of the same data and settings (another process) finds it.
    let again = planner(1).plan_shared(&dir, 3).unwrap();
    assert!(!again.planned);
    assert_eq!(arrays(&again), (offsets, indices));
    assert_eq!(again.layout.world_size, 4);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn threads_racing_for_one_epoch_plan_it_once() {
    let (dir, p) = (scratch("race"), planner(2));
    let results: Vec<(bool, Arrays)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..6)
            .map(|_| {
                s.spawn(|| {
                    let shared = p.plan_shared(&dir, 0).unwrap();
                    (shared.planned, arrays(&shared))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(results.iter().filter(|(planned, _)| *planned).count(), 1);
    let plan = p.plan(0).unwrap();
    for (_, (offsets, indices)) in &results {
        assert_eq!(
            (&offsets[..], &indices[..]),
            (plan.offsets(), plan.indices())
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_file_of_other_settings_at_the_name_is_refused_naming_the_difference() {
    let dir = scratch("foreign");
    let (ours, theirs) = (planner(3), planner(4));
    let path = ours.plan_shared(&dir, 1).unwrap().path.clone();
    let other = theirs.plan_shared(&dir, 1).unwrap().path.clone();
    std::fs::rename(&other, &path).unwrap();
    let err = ours.plan_shared(&dir, 1).unwrap_err();
    assert!(refusal(&err).contains("fingerprint"), "{err}");
    assert_eq!(err.kind().path(), Some(path.display().to_string().as_str()));
    assert!(err.to_string().contains("delete it"), "{err}");
    // Another epoch's file moved to this epoch's name.
    std::fs::remove_file(&path).unwrap();
    let epoch_2 = ours.plan_shared(&dir, 2).unwrap().path.clone();
    std::fs::rename(&epoch_2, &path).unwrap();
    let err = ours.plan_shared(&dir, 1).unwrap_err();
    assert!(refusal(&err).contains("epoch 2 (asked: 1)"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_changed_cut_or_foreign_file_is_refused() {
    let (dir, p) = (scratch("changed"), planner(5));
    let path = p.plan_shared(&dir, 0).unwrap().path.clone();
    let whole = std::fs::read(&path).unwrap();
    let cases: Vec<(Vec<u8>, &str)> = vec![
        // One index changed: the data's checksum.
        (
            {
                let mut b = whole.clone();
                // The low byte of the last index: still a row, another one.
                let last = b.len() - 4;
                b[last] ^= 1;
                b
            },
            "checksum",
        ),
        // The header's epoch changed: its checksum.
        (
            {
                let mut b = whole.clone();
                b[24] ^= 1;
                b
            },
            "header",
        ),
        // A file of format 1 (u64 offsets), its header whole: named, not read as this format.
        (
            {
                let mut b = whole.clone();
                b[8..12].copy_from_slice(&1u32.to_le_bytes());
                reseal_header(&mut b);
                b
            },
            "plan file format 1, this version writes 2",
        ),
        // An offset past the samples (the second: the first batch's end).
        (
            {
                let mut b = whole.clone();
                b[HEADER + 4..HEADER + 8].copy_from_slice(&u32::MAX.to_le_bytes());
                b
            },
            "offsets are not a plan's (offset 4294967295)",
        ),
        // The zeros after the offsets (4 ranks: batches + 1 offsets is odd, so there are 4).
        (
            {
                let mut b = whole.clone();
                let batches = p.plan(0).unwrap().len();
                assert_eq!(batches % 2, 0);
                b[HEADER + 4 * (batches + 1)] = 1;
                b
            },
            "(padding)",
        ),
        (whole[..whole.len() - 4].to_vec(), "cut short"),
        (whole[..100].to_vec(), "less than"),
        (
            b"not a plan at all, but long enough to hold a header ".repeat(8),
            "not a dflash_batch",
        ),
    ];
    for (bytes, expected) in cases {
        std::fs::write(&path, &bytes).unwrap();
        let err = p.plan_shared(&dir, 0).unwrap_err();
        assert!(refusal(&err).contains(expected), "{expected}: {err}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn publishing_an_epoch_deletes_those_before_the_previous_and_dead_writers_temporaries() {
    let (dir, p) = (scratch("tidy"), planner(6));
    let e0 = p.plan_shared(&dir, 0).unwrap().path.clone();
    let e1 = p.plan_shared(&dir, 1).unwrap().path.clone();
    let stem = format!("dflash-{:016x}", p.fingerprint());
    // What a writer killed mid-write leaves: never at a plan's name, so never read.
    let dead = dir.join(format!("{stem}-e2.tmp-999999"));
    std::fs::write(&dead, b"half a plan").unwrap();
    let other = dir.join("dflash-0000000000000000-r2-e0.plan");
    std::fs::write(&other, b"another planner's").unwrap();
    // This planner's epoch 2 as an older version named it (format 1: u64 offsets): not read.
    let older = dir.join(format!("{stem}-r{PLAN_REVISION}-e2.plan"));
    std::fs::write(&older, b"an older version's").unwrap();
    let e2 = p.plan_shared(&dir, 2).unwrap();
    assert!(
        e2.planned,
        "a temporary is not a plan, nor an older version's file"
    );
    assert!(!e0.exists() && !dead.exists() && !older.exists());
    assert!(
        e1.exists(),
        "a rank may still be finishing the previous epoch"
    );
    assert!(
        e2.path.exists() && other.exists(),
        "later and other planners' files stay"
    );
    drop(e2);
    drop(p.plan_shared(&dir, 3).unwrap());
    assert!(!e1.exists());
    // A rank behind plans its epoch again (correct, only slower); later epochs stay.
    let late = p.plan_shared(&dir, 1).unwrap();
    assert!(late.planned);
    assert!(dir
        .join(format!("{stem}-r{PLAN_REVISION}-f2-e2.plan"))
        .exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_directory_that_cannot_be_made_is_an_io_error_naming_it() {
    let base = scratch("io");
    std::fs::create_dir_all(&base).unwrap();
    let file = base.join("a-file");
    std::fs::write(&file, b"x").unwrap();
    let err = planner(7).plan_shared(&file.join("plans"), 0).unwrap_err();
    match err.kind() {
        ErrorKind::SharedPlan {
            problem: SharedProblem::Io { action, .. },
            path,
        } => {
            assert_eq!(*action, "create the plan directory");
            assert!(path.ends_with("plans"), "{path}");
        }
        other => panic!("{other:?}"),
    }
    assert!(err.to_string().contains("plan_dir"), "{err}");
    std::fs::remove_dir_all(&base).unwrap();
}
