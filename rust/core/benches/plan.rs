//! Time to plan one epoch of the seed workload (902,087 samples, max_tokens = 16,384).
#![allow(clippy::expect_used, missing_docs)]
use criterion::{criterion_group, criterion_main, Criterion};
use dflash_batch_core::workload::{seed_lengths, SEED_SAMPLES};
use dflash_batch_core::{Batching, Boundaries, Config, Planner};

fn plan_epoch(c: &mut Criterion) {
    let lengths = seed_lengths(SEED_SAMPLES, 0).expect("the seed workload fits");
    for (name, boundaries) in [
        ("6 buckets", Boundaries::Count(6)),
        ("auto", Boundaries::Auto),
    ] {
        let config = Config {
            boundaries,
            world_size: 8,
            ..Config::new(Batching::Tokens(16_384))
        };
        let planner = Planner::new(lengths.clone(), config).expect("valid config");
        let mut epoch = 0;
        c.bench_function(&format!("plan epoch, {name}"), |b| {
            b.iter(|| {
                epoch += 1;
                planner.plan(epoch).expect("plan")
            });
        });
    }
    c.bench_function("new planner (validate + group)", |b| {
        let config = Config::new(Batching::Tokens(16_384));
        b.iter(|| Planner::new(lengths.clone(), config.clone()).expect("valid config"));
    });
}

criterion_group! { name = benches; config = Criterion::default().sample_size(30); targets = plan_epoch }
criterion_main!(benches);
