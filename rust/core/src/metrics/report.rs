//! The figures `Plan.stats()` computes on demand for one of a planner's plans: mixing (`window_tv`),
//! rank imbalance, synchronous efficiency (the balance), and the end-to-end figure a user gets from
//! it — useful work over what the ranks spend, waiting and padding included.

use crate::lengths::{with_lengths, Length};
use crate::metrics::context_parallel::{context_parallel, piece_padding, ContextParallel};
use crate::metrics::sources::{sources, SourceFigures};
use crate::metrics::{
    batch_costs, mixing, rank_imbalance, synchronous, Deciles, Imbalance, Mixing, Synchronous,
};
use crate::plan::config::padded_piece;

/// The mixing and balance figures of one of `planner`'s plans, given as CSR.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    /// [`mixing`] over windows of the given size; `None` without a complete window.
    pub mixing: Option<Mixing>,
    /// [`rank_imbalance`] in padded tokens; `None` for an empty plan.
    pub imbalance: Option<Imbalance>,
    /// [`synchronous`] efficiency under the configuration's cost model.
    pub synchronous: Option<Synchronous>,
    /// [`end_to_end`] efficiency under the configuration's cost model.
    pub end_to_end: Option<Synchronous>,
    /// The sources of a mixture's plan ([`sources`](crate::metrics::sources::sources)).
    pub sources: Option<SourceFigures>,
    /// Attention spread over the ranks of a context-parallel row, by layout; `None` without context
    /// parallelism ([`context_parallel`](crate::metrics::context_parallel::context_parallel)).
    pub context_parallel: Option<ContextParallel>,
    /// Tokens of padding that pieces take beyond their lengths (to `Config::piece_multiple`).
    pub piece_padding: u64,
}

/// End-to-end efficiency: the useful work of the plan's steps (each sample's own `a·l + b·l²`; batch
/// `i`'s is `useful[i]`) over `world_size ×` the time the ranks take, waiting for the slowest (per
/// micro-batch, and per window of `accumulation` steps), when batch `i` takes `timed[i]` — padding
/// included (a padded batch of `k` rows of padded length `L` takes `k·(a·L + b·L²)`; a packed row of
/// capacity `C`, `a·C + b·Σl²`). It is the synchronous efficiency of `timed` times the share of
/// `timed`'s work that is useful: sorted static batches score their padding efficiency. Batches past
/// the last whole step count in neither; `None` without a step or any cost.
pub fn end_to_end(
    timed: &[f64],
    useful: &[f64],
    world_size: usize,
    accumulation: usize,
) -> Option<Synchronous> {
    let sync = synchronous(timed, world_size, accumulation)?;
    let whole = timed.len() / world_size.max(1) * world_size;
    let total: f64 = timed[..whole].iter().sum();
    let useful: f64 = useful[..whole.min(useful.len())].iter().sum();
    (total > 0.0).then(|| Synchronous {
        per_micro_batch: sync.per_micro_batch * useful / total,
        per_optimizer_step: sync.per_optimizer_step * useful / total,
    })
}

/// [`mixing`] and [`rank_imbalance`] of a plan of epoch `epoch` made by `planner` (whose lengths
/// `deciles` were built from), for windows of `window` batches.
/// `deciles` are the lengths' (built here on first use, and kept). [`ErrorKind::OutOfMemory`] when
/// its working memory (a cost per batch, the deciles' tables) cannot be allocated.
///
/// [`ErrorKind::OutOfMemory`]: crate::error::ErrorKind::OutOfMemory
pub fn report(
    planner: &crate::plan::planner::Planner,
    deciles: &std::sync::OnceLock<Deciles>,
    (offsets, indices): (&[u32], &[u32]),
    (epoch, window): (u64, usize),
) -> crate::error::Result<Report> {
    planner.lengths().check()?;
    // A batch's cost, a step's ratio, and (packed) a batch's time.
    let mut bytes = offsets.len() as u64 * 24;
    let mixture = planner.mixture();
    if mixture.is_some() {
        // The plan's own lengths and their deciles: a mixture's epoch is not the rows once each.
        bytes += indices.len() as u64 * 16;
    } else if deciles.get().is_none() {
        bytes += Deciles::bytes(planner.lengths());
    }
    crate::memory::reserve("computing a plan's stats", bytes)?;
    let csr = (offsets, indices);
    Ok(with_lengths!(planner.lengths(), lengths => {
        let own;
        let deciles = match mixture {
            Some(_) => {
                own = Deciles::new(&crate::lengths::lengths_of(lengths, indices));
                &own
            }
            None => deciles.get_or_init(|| Deciles::of_lengths(planner.lengths())),
        };
        let mut report = report_with(planner.config(), lengths, deciles, csr, window);
        report.sources = mixture.map(|m| sources(csr, lengths, m, (epoch, window)));
        report
    }))
}

fn report_with<L: Length>(
    config: &crate::plan::config::Config,
    lengths: &[L],
    deciles: &Deciles,
    (offsets, indices): (&[u32], &[u32]),
    window: usize,
) -> Report {
    let packed = matches!(config.mode, crate::plan::config::Mode::Packed { .. });
    // What the ranks are balanced by: the figures predict the balance the plan was made for.
    let model = config.balance_cost();
    let length = |r: u32| u64::from(lengths[r as usize].into());
    let cost = |members: &[u32]| {
        if packed {
            // A packed row computes on its samples: Σ a·l + b·l².
            return members.iter().map(|&r| model.row(length(r))).sum();
        }
        let longest = members.iter().map(|&r| length(r)).max().unwrap_or(0);
        // Lengths fit u32.
        #[allow(clippy::cast_possible_truncation)]
        config.batch_cost(members.len() as u64, longest as u32)
    };
    let (costs, world) = (
        batch_costs(offsets, indices, cost),
        config.world_size as usize,
    );
    let accumulation = config.accumulation as usize;
    // What the ranks spend: a padded batch costs what it is balanced by; a packed row of capacity C
    // also runs its linear layers over the C - Σl padding tokens.
    let own = |members: &[u32]| -> f64 { members.iter().map(|&r| model.row(length(r))).sum() };
    let end_to_end = match (packed, config.batching) {
        // A packed row is balanced by its samples' own cost: that is its useful work.
        (true, crate::plan::config::Batching::Tokens(capacity)) => {
            // Capacities fit f64 exactly (below 2^32 for packed rows).
            #[allow(clippy::cast_precision_loss)]
            let linear = model.linear * capacity as f64;
            let multiple = config.piece_multiple();
            let timed = batch_costs(offsets, indices, |members| {
                linear
                    + members
                        .iter()
                        .map(|&r| {
                            // The kernel computes a piece's padding too. Lengths fit u32.
                            #[allow(clippy::cast_possible_truncation)]
                            let l = f64::from(padded_piece(length(r) as u32, multiple));
                            model.quadratic * l * l
                        })
                        .sum::<f64>()
            });
            end_to_end(&timed, &costs, world, accumulation)
        }
        _ => end_to_end(
            &costs,
            &batch_costs(offsets, indices, own),
            world,
            accumulation,
        ),
    };
    Report {
        mixing: mixing(offsets, indices, lengths, deciles, window),
        imbalance: rank_imbalance(&costs, world),
        synchronous: synchronous(&costs, world, accumulation),
        end_to_end,
        sources: None,
        context_parallel: context_parallel(config, (offsets, indices), |e| {
            lengths[e as usize].into()
        }),
        piece_padding: piece_padding(config, indices, |e| lengths[e as usize].into()),
    }
}
