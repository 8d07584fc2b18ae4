//! Times planning of the seed workload:
//! `cargo run --release --example time_plan -- THREADS EPOCHS [BUCKETS|auto|packed] [ACCUMULATION] [TOLERANCE_PPM]`
//! (defaults: 1 thread, 41 epochs, 6 buckets, accumulation 1, no tolerance; `packed`: packed rows).
#![allow(clippy::expect_used, missing_docs, clippy::print_stdout)]
use dflash_batch_core::planner::{Batching, Boundaries, Config, Mode, Planner};
use dflash_batch_core::workload::{seed_lengths, SEED_SAMPLES};
use std::time::Instant;

fn main() {
    let threads: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1);
    let epochs: u64 = std::env::args()
        .nth(2)
        .and_then(|a| a.parse().ok())
        .unwrap_or(41);
    let arg = |i: usize| std::env::args().nth(i);
    let (boundaries, mode) = match arg(3).as_deref() {
        Some("auto") => (Boundaries::Auto, Mode::Padded),
        Some("packed") => (Boundaries::Auto, Mode::Packed { bucketed: false }),
        other => (
            Boundaries::Count(other.and_then(|a| a.parse().ok()).unwrap_or(6)),
            Mode::Padded,
        ),
    };
    let accumulation = arg(4).and_then(|a| a.parse().ok()).unwrap_or(1);
    let balance_tolerance_ppm = arg(5).and_then(|a| a.parse().ok());
    let config = Config {
        boundaries,
        accumulation,
        balance_tolerance_ppm,
        mode,
        world_size: 8,
        ..Config::new(Batching::Tokens(16_384))
    };
    let planner = Planner::new(seed_lengths(SEED_SAMPLES, 0), config)
        .expect("valid config")
        .with_threads(threads);
    let mut times: Vec<f64> = (1..=epochs)
        .map(|e| {
            let start = Instant::now();
            let plan = planner.plan(e).expect("plan");
            std::hint::black_box(plan);
            start.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    times.sort_by(f64::total_cmp);
    println!(
        "threads {threads}: median {:.2} ms, best {:.2} ms",
        times[times.len() / 2],
        times[0]
    );
}
