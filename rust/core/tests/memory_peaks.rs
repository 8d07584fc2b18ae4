//! What each data-sized entry point of the core allocates at its peak, against what it reserves
//! before starting (`memory::reserve`): a reservation below the real peak lets an address-space
//! limit abort the process instead of returning `OutOfMemory`.
// A counting global allocator needs `unsafe impl GlobalAlloc`; it only forwards to `System`.
#![allow(unsafe_code, clippy::unwrap_used, clippy::cast_possible_truncation)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use dflash_batch_core::metrics::{self, Deciles};
use dflash_batch_core::{memory, Batching, Config, CostModel, Mode, Oversize, Planner};

struct Counting;
static CURRENT: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);
/// The size of `memory::reserve`'s probe, which is released at once and not the work's memory.
static PROBE: AtomicUsize = AtomicUsize::new(usize::MAX);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() && layout.size() != PROBE.load(Ordering::Relaxed) {
            let now = CURRENT.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        if layout.size() != PROBE.load(Ordering::Relaxed) {
            CURRENT.fetch_sub(layout.size(), Ordering::Relaxed);
        }
    }
}

#[global_allocator]
static COUNTING: Counting = Counting;

/// The counters are global: one measuring test at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn peak_of<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let base = CURRENT.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    let out = f();
    (out, PEAK.load(Ordering::Relaxed) - base)
}

/// `n` lengths uniform in `1..=max` (a fixed xorshift stream).
fn lengths(n: usize, max: u64) -> Vec<u32> {
    let mut x = 0x9e37_79b9_u64;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            1 + (x % max) as u32
        })
        .collect()
}

fn configs() -> Vec<(&'static str, Config)> {
    let base = Config::new(Batching::Tokens(65536));
    let packed = Mode::Packed { bucketed: false };
    vec![
        ("default", base.clone()),
        (
            "packed",
            Config {
                mode: packed,
                ..base.clone()
            },
        ),
        (
            "packed bucketed",
            Config {
                mode: Mode::Packed { bucketed: true },
                ..base.clone()
            },
        ),
        (
            "trim",
            Config {
                trim_steps: true,
                world_size: 4,
                ..base.clone()
            },
        ),
        (
            "sorted",
            Config {
                shuffle: false,
                ..base.clone()
            },
        ),
        (
            "cost",
            Config {
                cost: CostModel {
                    linear: 1.0,
                    quadratic: 1e-4,
                },
                oversize: Oversize::Skip,
                ..base.clone()
            },
        ),
        (
            "balance",
            Config {
                balance_tolerance_ppm: Some(50_000),
                world_size: 8,
                ..base.clone()
            },
        ),
        (
            "ranks",
            Config {
                world_size: 8,
                accumulation: 4,
                ..base.clone()
            },
        ),
        ("rows", Config::new(Batching::Rows(16))),
        (
            "drop_last",
            Config {
                world_size: 7,
                drop_last: true,
                ..base
            },
        ),
    ]
}

/// Every configuration, on short and on near-budget lengths (one or two samples a batch), formed
/// bucket by bucket and streamed: the first plan and a later one peak within `plan_bytes`.
#[test]
fn every_plan_peaks_within_its_reservation() {
    let _serial = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let n: usize = std::env::var("PEAK_SAMPLES").map_or(200_000, |s| s.parse().unwrap());
    let mut worst = 0.0_f64;
    for (max, budget) in [(4095, 65536), (60_000, 65536)] {
        let v = lengths(n, max);
        for (name, mut config) in configs() {
            match config.batching {
                Batching::Tokens(_) => config.batching = Batching::Tokens(budget),
                Batching::Rows(_) if max > 4095 => continue, // 16 rows of 60K tokens are over the row cap
                Batching::Rows(_) => {}
            }
            // Formed bucket by bucket, streamed, and streamed as huge epochs are (unarranged).
            for streamed in [0, 1, 2] {
                let mut planner = Planner::new(v.clone(), config.clone()).unwrap();
                if streamed > 0 {
                    planner = planner.with_streamed_epochs().with_companion_threshold(0);
                }
                if streamed > 1 {
                    planner = planner.with_arrange_limit(0);
                }
                for epoch in [0, 1] {
                    let reserved = planner.plan_bytes();
                    PROBE.store((reserved + memory::SLACK_BYTES) as usize, Ordering::Relaxed);
                    let (plan, peak) = peak_of(|| planner.plan(epoch).unwrap());
                    let ratio = peak as f64 / reserved as f64;
                    worst = worst.max(ratio);
                    println!(
                        "{name} max {max} streamed {streamed} epoch {epoch}: peak {:.1} B/sample {peak}, \
                         {:.2} of the reservation, {} batches",
                        peak as f64 / n as f64,
                        ratio,
                        plan.len()
                    );
                    if std::env::var("PEAK_REPORT").is_err() {
                        assert!(
                            peak as u64 <= reserved,
                            "{name}, max {max}, streamed {streamed}"
                        );
                    }
                }
            }
        }
    }
    println!("worst: {worst:.2} of the reservation");
}

/// A plan's stats (the deciles built on first use, a cost per batch) peak within their reservation,
/// on lengths that take the table and on lengths that take the sorted copy.
#[test]
fn stats_peak_within_their_reservation() {
    let _serial = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let n = 300_000;
    for max in [4095, 1 << 30] {
        let v = lengths(n, max);
        let config = Config {
            oversize: Oversize::Skip,
            ..Config::new(Batching::Tokens(1 << 16))
        };
        let planner = Planner::new(v, config).unwrap();
        let plan = planner.plan(0).unwrap();
        let deciles = std::sync::OnceLock::new();
        let reserved = Deciles::bytes(planner.lengths()) + plan.offsets().len() as u64 * 24;
        PROBE.store((reserved + memory::SLACK_BYTES) as usize, Ordering::Relaxed);
        let (report, peak) = peak_of(|| {
            metrics::report(&planner, &deciles, (plan.offsets(), plan.indices()), (0, 8)).unwrap()
        });
        assert!(report.mixing.is_some());
        println!("stats, lengths up to {max}: peak {peak}, reserved {reserved}");
        assert!(
            peak as u64 <= reserved,
            "lengths up to {max}: {peak} > {reserved}"
        );
    }
}

/// A mixture's planner (four sources, up- and down-sampled, in tokens) peaks within what it
/// reserves, built and planning, formed bucket by bucket and streamed, padded and packed.
#[test]
fn mixture_plans_peak_within_their_reservation() {
    use dflash_batch_core::{Mixture, Unit};
    let _serial = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let n: usize = std::env::var("PEAK_SAMPLES").map_or(200_000, |s| s.parse().unwrap());
    let v = lengths(n, 4095);
    let rows = [n * 4 / 10, n * 3 / 10, n * 2 / 10, n - n * 9 / 10];
    let names = ["a", "b", "c", "d"];
    let sources = names
        .iter()
        .zip(rows)
        .zip([0.3, 0.3, 0.25, 0.15])
        .map(|((name, rows), weight)| ((*name).to_string(), rows as u32, weight));
    let mixture = Mixture::new(sources, Unit::Tokens);
    for mode in [Mode::Padded, Mode::Packed { bucketed: false }] {
        let config = Config {
            mode,
            world_size: 8,
            accumulation: 4,
            ..Config::new(Batching::Tokens(65536))
        };
        let reserved = memory::PLAN_FIXED_BYTES
            + n as u64 * (memory::PREPARE_BYTES_PER_SAMPLE + memory::MIXTURE_GROUP_BYTES);
        // The caller's lengths are the caller's: cloned before measuring.
        let (input, given) = (v.clone(), mixture.clone());
        PROBE.store((reserved + memory::SLACK_BYTES) as usize, Ordering::Relaxed);
        let (planner, peak) =
            peak_of(|| Planner::with_mixture(input, config.clone(), given).unwrap());
        println!(
            "mixture {mode:?} built: peak {:.1} B/sample, {:.2} of the reservation",
            peak as f64 / n as f64,
            peak as f64 / reserved as f64
        );
        assert!(peak as u64 <= reserved, "built, {mode:?}");
        for streamed in [false, true] {
            let planner = if streamed {
                Planner::with_mixture(v.clone(), config.clone(), mixture.clone())
                    .unwrap()
                    .with_arrange_limit(0)
            } else {
                Planner::with_mixture(v.clone(), config.clone(), mixture.clone()).unwrap()
            };
            for epoch in [0, 1] {
                let reserved = planner.plan_bytes();
                PROBE.store((reserved + memory::SLACK_BYTES) as usize, Ordering::Relaxed);
                let (_, peak) = peak_of(|| planner.plan(epoch).unwrap());
                println!(
                    "mixture {mode:?} streamed {streamed} epoch {epoch}: peak {:.1} B/sample, {:.2} of the reservation",
                    peak as f64 / n as f64,
                    peak as f64 / reserved as f64
                );
                assert!(peak as u64 <= reserved, "{mode:?}, streamed {streamed}");
            }
        }
        drop(planner);
    }
}
