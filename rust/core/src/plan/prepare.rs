//! The admit stage, once per planner: lengths and configuration checked, which samples are admitted
//! (`oversize`), the bucket edges chosen (`optimize.rs`) and the per-length rules derived.

use crate::error::{ErrorKind, Result};
use crate::lengths::Length;
use crate::plan::buckets::Buckets;
use crate::plan::config::{Batching, Boundaries, Config, CostModel, Mode, Oversize};
use crate::plan::form::ARRANGE_MAX_SAMPLES;
use crate::plan::optimize::{auto_edges, optimal_edges, predicted_efficiency, Histogram};
use crate::plan::rules::Rules;

/// The epoch-independent state [`Planner::new`] derives from the lengths.
#[derive(Debug)]
pub(crate) struct Prepared {
    pub(crate) buckets: Buckets,
    pub(crate) predicted_efficiency: f64,
    pub(crate) rules: Rules,
    pub(crate) bucket_capacity: Vec<u32>,
    pub(crate) admitted: u64,
    pub(crate) admitted_tokens: u64,
    pub(crate) shortest: u32,
    /// The most batches a forming pass over the admitted rows can close (see [`batch_bound`]).
    pub(crate) batch_bound: u64,
}

pub(crate) fn prepare<L: Length>(lengths: &[L], config: &Config) -> Result<Prepared> {
    prepare_with(lengths, config, None)
}

/// [`prepare`], with the edges optimized for `epoch` — the lengths one epoch trains, when they are not
/// the dataset's once each (a mixture's: sources up- and down-sampled). They cover every admitted
/// length of `lengths` either way.
pub(crate) fn prepare_with<L: Length>(
    lengths: &[L],
    config: &Config,
    epoch: Option<&[u32]>,
) -> Result<Prepared> {
    check_lengths(lengths)?;
    check_cost_range(lengths, config)?;
    let admit_max = admission(lengths, config)?;
    let (buckets, predicted_efficiency) = match epoch {
        None => choose_buckets(lengths, lengths, config, admit_max)?,
        Some(epoch) => {
            // The admitted extremes once more, so the optimized edges reach every length.
            let admitted = lengths
                .iter()
                .map(|&l| l.into())
                .filter(|&l| l <= admit_max);
            let (lo, hi) = admitted.fold((u32::MAX, 0), |(lo, hi), l| (lo.min(l), hi.max(l)));
            let sample: Vec<u32> = epoch.iter().copied().chain([lo, hi]).collect();
            choose_buckets(lengths, &sample, config, admit_max)?
        }
    };
    let longest = lengths.iter().copied().max().map_or(0, Into::into);
    let rules = Rules::new(&buckets, config, admit_max, longest);
    let mut bucket_capacity = vec![0u32; buckets.count()];
    let mut bucket_least = vec![u32::MAX; buckets.count()];
    let mut bucket_rows = vec![0u64; buckets.count()];
    let quarter_row = match config.batching {
        // A padded piece is at most `multiple - 1` tokens longer: count every sample that may
        // pass a quarter row once padded.
        Batching::Tokens(t) => (t / 4).saturating_sub(config.piece_multiple() - 1),
        Batching::Rows(_) => u64::MAX,
    };
    let (mut admitted, mut admitted_tokens, mut shortest, mut long) = (0, 0, u32::MAX, 0);
    for &l in lengths {
        if let Some((b, capacity)) = rules.get(l.into()) {
            bucket_capacity[b] = bucket_capacity[b].max(capacity);
            bucket_least[b] = bucket_least[b].min(capacity);
            bucket_rows[b] += 1;
            admitted += 1;
            admitted_tokens += u64::from(l.into());
            shortest = shortest.min(l.into());
            long += u64::from(u64::from(l.into()) > quarter_row);
        }
    }
    let batch_bound = batch_bound(
        config,
        (&bucket_rows, &bucket_least),
        (lengths.len(), (admitted, admitted_tokens, long)),
    );
    Ok(Prepared {
        buckets,
        predicted_efficiency,
        rules,
        bucket_capacity,
        admitted,
        admitted_tokens,
        shortest,
        batch_bound,
    })
}

/// The most batches one forming pass can close over the admitted rows — what the first plan's
/// working memory is reserved for, before any epoch has set the batch count (at 1B samples one
/// batch a sample would reserve tens of gigabytes and refuse a plan that fits).
///
/// Padded: every batch the rule closes holds at least its bucket's least `fits` rows (it closes
/// only when its rows reach the smaller of its members' and the next sample's `fits`), and each
/// stream's end flushes at most one partial batch a bucket. Packed (best fit over a window): a row
/// closed to make room had less room than the sample that found none (to within a room class, a
/// few tokens), and a row closed full less than the shortest; so a row at most a quarter full was
/// closed by, or holds, a sample longer than a quarter of a row: rows ≤ 4 · tokens / max_tokens +
/// 2 · (samples over a quarter row) + what the ends flush (+ the rows `max_docs_per_row` closes
/// by count: at most one per `max_docs_per_row` samples). Rows composed (`compose.rs`): one a
/// sample. (A mixture's epochs repeat rows: its planner does not use this.)
fn batch_bound(
    config: &Config,
    (rows, least): (&[u64], &[u32]),
    (samples, counts): (usize, (u64, u64, u64)),
) -> u64 {
    let (admitted, tokens, long) = counts;
    // Every stream's end: the groups' (`form/mod.rs`), the packed epoch's last, a bucket's own.
    let streams = crate::plan::form::MAX_GROUPS as u64 + 2;
    let buckets = rows.len() as u64;
    let bound = match (config.mode, config.batching) {
        // Arranged unless a test lowered the limit, and then the bound is only larger.
        (Mode::Packed { .. }, _) if config.composes_rows(samples <= ARRANGE_MAX_SAMPLES) => {
            admitted
        }
        (Mode::Packed { bucketed }, Batching::Tokens(t)) => {
            let window = crate::plan::form::WINDOW as u64;
            let open = if bucketed { window * buckets } else { window };
            // Rows hold pieces padded to the multiple: at most `multiple - 1` tokens more each.
            let tokens = tokens + admitted * (config.piece_multiple() - 1);
            // Rows closed at `max_docs_per_row` samples, whatever their room.
            let capped = admitted / u64::from(config.docs_per_row());
            4 * tokens / t.max(1) + 2 * long + streams * open + capped
        }
        _ => {
            let closed: u64 = rows
                .iter()
                .zip(least)
                .map(|(&n, &fits)| n.div_ceil(u64::from(fits.max(1))))
                .sum();
            closed + streams * buckets
        }
    };
    bound.min(admitted)
}

/// The longest admitted length, once the lengths and the cost model are checked (what a mixture needs
/// to select only samples that fit, before its edges are chosen).
pub(crate) fn admitted_max<L: Length>(lengths: &[L], config: &Config) -> Result<u32> {
    check_lengths(lengths)?;
    check_cost_range(lengths, config)?;
    admission(lengths, config)
}

/// No lengths, more than `u32` rows address, or a zero length: refused (the planner's and `split_step`'s).
pub(crate) fn check_lengths<L: Length>(lengths: &[L]) -> Result<()> {
    if lengths.is_empty() {
        return Err(ErrorKind::EmptyLengths.into());
    }
    if u32::try_from(lengths.len()).is_err() {
        return Err(ErrorKind::TooManySamples {
            count: lengths.len(),
        }
        .into());
    }
    match lengths.iter().position(|&l| l.into() == 0) {
        Some(row) => Err(ErrorKind::NonPositiveLength { row, value: 0 }.into()),
        None => Ok(()),
    }
}

/// Batch costs are matched as `f32` (`balance.rs`): a cost model that prices the shortest row, or a
/// fixed-row batch of the longest, past its range would make every cost infinite (the cost-class loop
/// then never ended).
fn check_cost_range<L: Length>(lengths: &[L], config: &Config) -> Result<()> {
    if config.cost.is_tokens() {
        return Ok(());
    }
    let (shortest, longest) = lengths.iter().fold((u32::MAX, 0), |(lo, hi), &l| {
        let l: u32 = l.into();
        (lo.min(l), hi.max(l))
    });
    let (length, rows) = match config.batching {
        Batching::Rows(n) => (config.padded(longest), u64::from(n)),
        Batching::Tokens(_) => (config.padded(shortest), 1),
    };
    // Row counts stay far below 2^53.
    #[allow(clippy::cast_precision_loss)]
    let cost = config.cost.row(length) * rows as f64;
    if cost.is_finite() && cost <= f64::from(f32::MAX) {
        return Ok(());
    }
    let CostModel { linear, quadratic } = config.cost;
    let given = format!("({linear:?}, {quadratic:?})");
    Err(ErrorKind::CostOverflow {
        given,
        length,
        rows,
    }
    .into())
}

/// The longest length that enters the plan: every length, or under `max_tokens` those that fit a
/// batch on their own (`round_up(l, pad) ≤ max_tokens ⇔ l ≤ ⌊max_tokens / pad⌋ · pad`).
fn admission<L: Length>(lengths: &[L], config: &Config) -> Result<u32> {
    let budget = match config.batching {
        Batching::Tokens(t) => t,
        Batching::Rows(_) => u64::MAX,
    };
    let admit_max = largest_admitted(config, budget);
    let fits = |l: u32| l <= admit_max;
    if let Some((row, &shortest)) = lengths.iter().enumerate().min_by_key(|(_, &l)| l) {
        if !fits(shortest.into()) {
            let length: u32 = shortest.into();
            let shortest = config.padded(length);
            let packed = matches!(config.mode, Mode::Packed { .. });
            let priced = (!config.cost.is_tokens() && !packed).then(|| {
                let CostModel { linear, quadratic } = config.cost;
                let price = config.cost.row(shortest);
                (format!("({linear:?}, {quadratic:?})"), format!("{price:e}"))
            });
            return Err(ErrorKind::MaxTokensBelowShortest {
                max_tokens: budget,
                shortest,
                length,
                row,
                priced,
            }
            .into());
        }
    }
    // Truncated pieces fit by construction; what does not fit otherwise is an error.
    if config.oversize != Oversize::Skip {
        if let Some(row) = lengths.iter().position(|&l| !fits(l.into())) {
            let length = config.padded(lengths[row].into());
            return Err(ErrorKind::Oversize {
                row,
                length,
                max_tokens: budget,
                longest: admit_max,
            }
            .into());
        }
    }
    Ok(admit_max)
}

/// The longest padded length whose single row fits `budget`: `⌊budget / pad⌋ · pad` for tokens;
/// under a cost model the largest multiple of `pad` whose row cost fits (found by bisection, since
/// the cost grows with length).
fn largest_admitted(config: &Config, budget: u64) -> u32 {
    let pad = u64::from(config.pad_to_multiple_of);
    // A packed row holds any sample up to its capacity; the cost model only prices rows.
    let packed = matches!(config.mode, Mode::Packed { .. });
    if budget == u64::MAX || config.cost.is_tokens() || packed {
        return u32::try_from(budget / pad * pad).unwrap_or(u32::MAX);
    }
    // Budgets stay far below 2^53.
    #[allow(clippy::cast_precision_loss)]
    let fits = |multiple: u64| config.cost.row(multiple * pad) <= budget as f64;
    let (mut lo, mut hi) = (0u64, u64::from(u32::MAX) / pad + 1);
    if fits(hi) {
        return u32::MAX;
    }
    // Invariant: fits(lo) (a zero-length row costs 0), !fits(hi).
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if fits(mid) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    u32::try_from(lo * pad).unwrap_or(u32::MAX)
}

/// Buckets of `bucketed` packing with `boundaries="auto"`: wide enough that a row mixes lengths and
/// fills (narrow buckets leave long samples two to a row), narrow enough to bound `max_seqlen`. Seed
/// workload, C = 16,384 (measured): utilization 0.956 with 2 buckets, 0.941 with 3, 0.937 with 4
/// (0.991 unbucketed).
const PACKED_BUCKETS: usize = 2;

/// The buckets for `lengths` (every admitted one covered), their edges optimized for the lengths of
/// `sample` (the lengths themselves, or an epoch's).
fn choose_buckets<L: Length, M: Length>(
    lengths: &[L],
    sample: &[M],
    config: &Config,
    admit_max: u32,
) -> Result<(Buckets, f64)> {
    let keep = |l: u32| l <= admit_max;
    let histogram = Histogram::new(sample, keep);
    let boundaries = match (config.mode, &config.boundaries) {
        (Mode::Padded, boundaries) => boundaries,
        (Mode::Packed { bucketed: false }, Boundaries::Auto) => {
            // One bucket: every admitted length shares the packing window.
            let top = lengths
                .iter()
                .map(|&l| l.into())
                .filter(|&l| keep(l))
                .max()
                .unwrap_or(1);
            return Ok((Buckets::from_edges(vec![0, top.max(1)])?, f64::NAN));
        }
        (Mode::Packed { bucketed: false }, _) => {
            return Err(ErrorKind::PackedSetting {
                problem: "packs every length together; boundaries apply with bucketed=True",
            }
            .into());
        }
        (Mode::Packed { bucketed: true }, Boundaries::Auto) => &Boundaries::Count(PACKED_BUCKETS),
        (Mode::Packed { bucketed: true }, boundaries) => boundaries,
    };
    let optimized = match boundaries {
        Boundaries::Edges(edges) => {
            let buckets = Buckets::from_edges(edges.clone())?;
            buckets.check_covers(lengths, keep)?;
            let predicted = predicted_efficiency(&histogram, buckets.edges(), config);
            return Ok((buckets, predicted));
        }
        Boundaries::Count(k) => {
            Boundaries::count(*k as i128)?;
            optimal_edges(&histogram, *k, config)
        }
        Boundaries::Auto => {
            let target = f64::from(config.target_efficiency()) / 1e6;
            auto_edges(&histogram, target, config)
        }
    };
    Ok((
        Buckets::from_edges(optimized.edges)?,
        optimized.predicted_efficiency,
    ))
}
