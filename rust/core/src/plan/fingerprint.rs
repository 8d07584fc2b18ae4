//! A 64-bit fingerprint of everything that determines a plan except the epoch: lengths and
//! configuration. Two processes that agree on it plan identical epochs, so checkpoints and ranks can
//! compare fingerprints instead of data. Stable across platforms and releases (pinned by a test).
//!
//! Built from the SplitMix64 finaliser over 64-bit words (two lengths each) folded in order, which is
//! fast (a multiply per two lengths) and sensitive to order and value; it is not cryptographic.

use crate::lengths::with_lengths;
use crate::lengths::Length;
use crate::plan::config::{Batching, Boundaries, Config, Mode, Order, Oversize};
use crate::plan::mixture::{Interpolation, Mixture, Point, Schedule, Source, Unit};
use crate::plan::planner::Planner;
use crate::rng::mix64;

/// Folds `words` into `state`, order-sensitively.
fn fold(state: u64, words: impl IntoIterator<Item = u64>) -> u64 {
    words.into_iter().fold(state, |h, w| mix64(h ^ mix64(w)))
}

/// The fingerprint of `(lengths, config)`.
pub fn fingerprint<L: Length>(lengths: &[L], config: &Config) -> u64 {
    let mut h = fold(0x6466_6c61_7368_5f62, [lengths.len() as u64]);
    // Values, not storage: a u16 and a u32 copy of the same lengths share one fingerprint.
    let wide = |l: &L| u64::from(Into::<u32>::into(*l));
    let pairs = lengths
        .chunks(2)
        .map(|p| wide(&p[0]) | (p.get(1).map_or(0, wide) << 32));
    h = fold(h, pairs);
    // Every field named, none left to `..`: a new setting does not compile until it is folded here
    // (or said not to shape the plan).
    // The target aimed at, given or default: a default that moved with the step shape plans
    // differently, and folds differently.
    let target = config.target_efficiency();
    let Config {
        batching,
        boundaries,
        seed,
        shuffle,
        world_size,
        drop_last,
        oversize,
        pad_to_multiple_of,
        context_parallel,
        target_efficiency_ppm: _,
        order,
        accumulation,
        cost,
        rank_cost,
        mode,
        balance_tolerance_ppm,
        trim_steps,
        whole_steps,
        max_docs_per_row,
    } = config;
    let (kind, size) = match *batching {
        Batching::Rows(n) => (1, u64::from(n)),
        Batching::Tokens(t) => (2, t),
    };
    h = fold(
        h,
        [
            kind,
            size,
            *seed,
            u64::from(*shuffle),
            u64::from(*world_size),
        ],
    );
    h = fold(
        h,
        [
            u64::from(*drop_last),
            // Truncate folds as Error did before it joined the core: pieces make the lengths
            // differ, and fingerprints written since must still match.
            u64::from(*oversize == Oversize::Skip),
        ],
    );
    h = fold(
        h,
        [
            u64::from(*pad_to_multiple_of),
            u64::from(*order == Order::Random),
        ],
    );
    h = fold(
        h,
        [
            u64::from(*accumulation),
            cost.linear.to_bits(),
            cost.quadratic.to_bits(),
            balance_tolerance_ppm.map_or(0, |t| u64::from(t) + 1),
            match mode {
                Mode::Padded => 0,
                Mode::Packed { bucketed } => 1 + u64::from(*bucketed),
            },
        ],
    );
    // Folded only when set, so every fingerprint from before the option existed still matches.
    if *trim_steps {
        h = fold(h, [6]);
    }
    if let Some(rank) = rank_cost {
        h = fold(h, [7, rank.linear.to_bits(), rank.quadratic.to_bits()]);
    }
    if *context_parallel != 1 {
        h = fold(h, [8, u64::from(*context_parallel)]);
    }
    if *whole_steps {
        h = fold(h, [9]);
    }
    if let Some(cap) = max_docs_per_row {
        h = fold(h, [10, u64::from(*cap)]);
    }
    match boundaries {
        Boundaries::Auto => fold(h, [3, u64::from(target)]),
        Boundaries::Count(k) => fold(h, [4, *k as u64]),
        Boundaries::Edges(e) => fold(
            fold(h, [5, e.len() as u64]),
            e.iter().map(|&x| u64::from(x)),
        ),
    }
}

/// A planner's fingerprints: its own, on one rank, and on other ranks.
impl Planner {
    /// Fingerprint of the lengths and configuration (and mixture), hashed on first use.
    pub fn fingerprint(&self) -> u64 {
        *self
            .fingerprint
            .get_or_init(|| self.fingerprint_of(self.config()))
    }

    /// Fingerprint of the lengths and configuration as if for one rank: the same for any
    /// `world_size`, so a checkpoint can be resumed on another number of ranks — as long as the
    /// target aimed at is: a default that differs with the step shape folds the value it took here,
    /// so an epoch is never re-planned for other ranks with the edges of another target.
    pub fn fingerprint_any_ranks(&self) -> u64 {
        self.fingerprint_of(&Config {
            world_size: 1,
            target_efficiency_ppm: Some(self.config().target_efficiency()),
            ..self.config().clone()
        })
    }

    /// Fingerprint of the lengths and configuration on `world_size` ranks: what a checkpoint taken
    /// there recorded, when its settings were these. An elastic resume checks the state against it,
    /// so a default that depends on the step shape (`Config::target_efficiency`) is compared as it
    /// resolved on the old ranks, and the old plan re-made here is the one trained.
    pub fn fingerprint_on(&self, world_size: u32) -> u64 {
        self.fingerprint_of(&Config {
            world_size,
            ..self.config().clone()
        })
    }

    fn fingerprint_of(&self, config: &Config) -> u64 {
        let plain = with_lengths!(self.lengths(), v => fingerprint(v, config));
        self.mixture()
            .map_or(plain, |mixture| fingerprint_mixture(plain, mixture))
    }
}

/// `fingerprint` with a mixture folded in: its sources (names, rows, weights) in order, its unit,
/// cap and epoch size, every field named.
pub fn fingerprint_mixture(fingerprint: u64, mixture: &Mixture) -> u64 {
    let Mixture {
        sources,
        unit,
        max_repeat,
        epoch_size,
        schedule,
    } = mixture;
    let mut h = fold(fingerprint, [7, sources.len() as u64]);
    for Source { name, rows, weight } in sources {
        let bytes = name.as_bytes();
        let words = bytes.chunks(8).map(|c| {
            let mut word = [0u8; 8];
            word[..c.len()].copy_from_slice(c);
            u64::from_le_bytes(word)
        });
        h = fold(h, [bytes.len() as u64]);
        h = fold(h, words);
        h = fold(h, [u64::from(*rows), weight.to_bits()]);
    }
    let unit = match unit {
        Unit::Samples => 1,
        Unit::Tokens => 2,
    };
    let h = fold(
        h,
        [
            unit,
            max_repeat.to_bits(),
            epoch_size.map_or(0, |e| e.wrapping_add(1)),
        ],
    );
    // Folded only when given, so every fingerprint of fixed weights stands.
    schedule
        .as_ref()
        .map_or(h, |schedule| fold_schedule(h, schedule))
}

/// A schedule's points (epochs and weights) and interpolation.
fn fold_schedule(h: u64, schedule: &Schedule) -> u64 {
    let Schedule {
        points,
        interpolation,
    } = schedule;
    let interpolation = match interpolation {
        Interpolation::Constant => 1,
        Interpolation::Linear => 2,
    };
    let h = fold(h, [8, interpolation, points.len() as u64]);
    points.iter().fold(h, |h, Point { epoch, weights }| {
        let h = fold(h, [*epoch, weights.len() as u64]);
        fold(h, weights.iter().map(|w| w.to_bits()))
    })
}

#[cfg(test)]
mod tests;
