//! Times padded collation of planned batches from Arrow files, without Python:
//! `cargo run --release --example time_collate -- DIR/*.arrow` (env `THREADS`, default 1; `PASSES`,
//! default 3: the first pays the fresh mapping's page faults; `DTYPE=int64` for int64 output, default
//! int32; `MASK=completion_mask` applies that column as a 0/1 loss mask).
#![allow(
    clippy::expect_used,
    missing_docs,
    clippy::print_stdout,
    clippy::cast_precision_loss
)]
use dflash_batch_core::collate::{collate_padded, Buffers, OutputToken, Padding};
use dflash_batch_core::TokenStore;
use dflash_batch_core::{Batching, Config, Planner};
use std::time::Instant;

fn main() {
    let paths: Vec<String> = std::env::args().skip(1).collect();
    let mut store = TokenStore::open(&paths, "input_ids", None, |_| {}).expect("store");
    if let Some(name) = std::env::var("MASK").ok().filter(|m| !m.is_empty()) {
        let mask = TokenStore::open(&paths, &name, None, |_| {}).expect("mask column");
        store = store
            .with_mask(mask, dflash_batch_core::MaskKind::Binary)
            .expect("mask");
    }
    let planner = Planner::new(
        store.lengths().to_vec(),
        Config::new(Batching::Tokens(16_384)),
    )
    .expect("planner");
    let plan = planner.plan(0).expect("plan");
    let batches: Vec<&[u32]> = (0..300).map(|i| plan.batch(i).expect("batch")).collect();
    let real: u64 = batches
        .iter()
        .flat_map(|b| b.iter())
        .map(|&r| u64::from(store.lengths()[r as usize]))
        .sum();
    let threads: usize = std::env::var("THREADS")
        .ok()
        .and_then(|t| t.parse().ok())
        .unwrap_or(1);
    let pool = (threads > 1).then(|| dflash_batch_core::pool::PrivatePool::new(threads));
    let passes: usize = std::env::var("PASSES")
        .ok()
        .and_then(|t| t.parse().ok())
        .unwrap_or(3);
    let run = Run {
        store: &store,
        batches: &batches,
        real,
        pool: pool.as_ref(),
        passes,
    };
    if std::env::var("DTYPE").as_deref() == Ok("int64") {
        run.time::<i64>();
    } else {
        run.time::<i32>();
    }
}

/// One timing run: `passes` passes over `batches`.
struct Run<'a> {
    store: &'a TokenStore,
    batches: &'a [&'a [u32]],
    real: u64,
    pool: Option<&'a dflash_batch_core::pool::PrivatePool>,
    passes: usize,
}

impl Run<'_> {
    fn time<T: OutputToken + Default>(&self) {
        let mut bufs: [Vec<T>; 4] = std::array::from_fn(|_| vec![T::default(); 16_384]);
        for pass in 0..self.passes {
            let start = Instant::now();
            for b in self.batches {
                let [a, m, l, p] = &mut bufs;
                let out = Buffers {
                    input_ids: a,
                    attention_mask: m,
                    labels: l,
                    position_ids: p,
                };
                collate_padded(self.store, b, &Padding::default(), out, self.pool)
                    .expect("collate");
            }
            let s = start.elapsed().as_secs_f64();
            println!(
                "pass {pass}: {:.0} M tok/s, {:.1} us/batch",
                self.real as f64 / s / 1e6,
                s / self.batches.len() as f64 * 1e6
            );
        }
    }
}
