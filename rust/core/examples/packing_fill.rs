//! Utilization of packed plans on the seed workload: `cargo run --release --example packing_fill`.
#![allow(
    clippy::expect_used,
    missing_docs,
    clippy::print_stdout,
    clippy::cast_precision_loss
)]
use dflash_batch_core::planner::{Batching, Boundaries, Config, Mode, Planner};
use dflash_batch_core::workload::{seed_lengths, SEED_SAMPLES};

fn main() {
    let lengths = seed_lengths(SEED_SAMPLES, 0);
    let mut runs = vec![(false, Boundaries::Auto)];
    runs.extend((2..=6).map(|k| (true, Boundaries::Count(k))));
    for (bucketed, boundaries) in runs {
        let config = Config {
            world_size: 8,
            accumulation: 4,
            boundaries: boundaries.clone(),
            mode: Mode::Packed { bucketed },
            ..Config::new(Batching::Tokens(16_384))
        };
        let planner = Planner::new(lengths.clone(), config).expect("valid");
        let mut times: Vec<f64> = (0..7)
            .map(|e| {
                let start = std::time::Instant::now();
                std::hint::black_box(planner.plan(e + 2).expect("plan"));
                start.elapsed().as_secs_f64() * 1e3
            })
            .collect();
        times.sort_by(f64::total_cmp);
        let ms = times[3];
        let plan = planner.plan(1).expect("plan");
        let s = plan.stats();
        println!(
            "bucketed {bucketed} {boundaries:?}: utilization {:.4}, rows {}, {ms:.1} ms, edges {:?}",
            s.real_tokens as f64 / s.padded_tokens as f64,
            s.batches,
            planner.buckets().edges()
        );
    }
}
