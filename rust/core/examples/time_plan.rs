//! Times planning of the seed workload:
//! `cargo run --release --example time_plan -- THREADS EPOCHS [BUCKETS|auto|packed] [ACCUMULATION] [TOLERANCE_PPM] [SAMPLES]`
//! (defaults: 1 thread, 41 epochs, 6 buckets, accumulation 1, no tolerance; `packed`: packed rows;
//! `packed-cost`: packed rows under the
//! attention price `cost=(1, 1/30720)`; `stream`: auto buckets formed by the streaming loop larger epochs use; `sorted`: unshuffled;
//! `rows`: batches of 8 rows; `trim`: auto buckets with `trim_steps`; `mixture` / `mixture-packed`: the
//! seed workload's four sources (`workload::seed_sources`) weighted 0.3/0.3/0.25/0.15 in tokens, as
//! `benchmarks/plan.py` weights them; `TIME_PLAN_TV=1` prints their per-window source TV;
//! `TIME_PLAN_COMPANION=N` carries lengths beside the permutation from N samples on, the speed trade
//! that never changes the plan: 18446744073709551615 never does).
#![allow(clippy::expect_used, missing_docs, clippy::print_stdout)]
use dflash_batch_core::metrics::sources::sources;
use dflash_batch_core::workload::{seed_lengths, seed_sources, SEED_SAMPLES, SEED_SOURCES};
use dflash_batch_core::{Batching, Boundaries, Config, CostModel, Mixture, Mode, Planner, Unit};
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
        Some("auto" | "stream" | "sorted" | "rows" | "trim") => (Boundaries::Auto, Mode::Padded),
        Some("packed" | "packed-cost" | "mixture-packed") => {
            (Boundaries::Auto, Mode::Packed { bucketed: false })
        }
        Some("mixture") => (Boundaries::Auto, Mode::Padded),
        other => (
            Boundaries::Count(other.and_then(|a| a.parse().ok()).unwrap_or(6)),
            Mode::Padded,
        ),
    };
    let accumulation = arg(4).and_then(|a| a.parse().ok()).unwrap_or(1);
    let balance_tolerance_ppm = arg(5).and_then(|a| a.parse().ok());
    let samples = arg(6).and_then(|a| a.parse().ok()).unwrap_or(SEED_SAMPLES);
    let shape = arg(3).unwrap_or_default();
    let config = Config {
        shuffle: shape != "sorted",
        boundaries,
        accumulation,
        balance_tolerance_ppm,
        mode,
        world_size: 8,
        trim_steps: shape == "trim",
        cost: if shape == "packed-cost" {
            CostModel {
                linear: 1.0,
                quadratic: 1.0 / 30_720.0,
            }
        } else {
            CostModel::TOKENS
        },
        ..Config::new(if shape == "rows" {
            Batching::Rows(8)
        } else {
            Batching::Tokens(16_384)
        })
    };
    let mut planner = if shape.starts_with("mixture") {
        let (lengths, counts) = seed_sources(samples, 0).expect("the seed workload fits");
        let sources = SEED_SOURCES
            .iter()
            .zip(counts)
            .zip([0.3, 0.3, 0.25, 0.15])
            .map(|((name, rows), weight)| ((*name).to_string(), rows, weight));
        let mixture = Mixture::new(sources, Unit::Tokens);
        Planner::with_mixture(lengths, config, mixture)
    } else {
        let lengths = seed_lengths(samples, 0).expect("the seed workload fits");
        Planner::new(lengths, config)
    }
    .expect("valid config")
    .with_threads(threads);
    if shape == "stream" {
        planner = planner.with_streamed_epochs();
    }
    if let Some(n) = std::env::var("TIME_PLAN_COMPANION")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        planner = planner.with_companion_threshold(n);
    }
    let mut times: Vec<f64> = (1..=epochs)
        .map(|e| {
            let start = Instant::now();
            let plan = planner.plan(e).expect("plan");
            std::hint::black_box(plan);
            start.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    times.sort_by(f64::total_cmp);
    // A digest of epoch 1's plan: two builds that print the same one planned the same batches.
    let plan = planner.plan(1).expect("plan");
    let digest = plan
        .offsets()
        .iter()
        .map(|&o| u64::from(o))
        .chain(plan.indices().iter().map(|&i| u64::from(i)))
        .fold(0xcbf2_9ce4_8422_2325u64, |h, v| {
            (h ^ v).wrapping_mul(0x0100_0000_01b3)
        });
    if let Some(mixture) = planner
        .mixture()
        .filter(|_| std::env::var_os("TIME_PLAN_TV").is_some())
    {
        // TIME_PLAN_TV=1: the per-window source TV of epochs 1-4 (`metrics::sources`).
        let (lengths, _) = seed_sources(samples, 0).expect("the seed workload fits");
        let window = (accumulation * 8) as usize;
        let tv: Vec<f64> = (1..=4u64)
            .map(|e| {
                let plan = planner.plan(e).expect("plan");
                let figures = sources(
                    (plan.offsets(), plan.indices()),
                    &lengths,
                    mixture,
                    (e, window),
                );
                figures.source_tv.unwrap_or(f64::NAN)
            })
            .collect();
        println!("source tv of epochs 1-4: {tv:.4?}");
    }
    println!(
        "threads {threads}: median {:.2} ms, best {:.2} ms, plan {digest:016x}",
        times[times.len() / 2],
        times[0]
    );
}
