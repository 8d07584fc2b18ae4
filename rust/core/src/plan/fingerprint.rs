//! A 64-bit fingerprint of everything that determines a plan except the epoch: lengths and
//! configuration. Two processes that agree on it plan identical epochs, so checkpoints and ranks can
//! compare fingerprints instead of data. Stable across platforms and releases (pinned by a test).
//!
//! Built from the SplitMix64 finaliser over 64-bit words (two lengths each) folded in order, which is
//! fast (a multiply per two lengths) and sensitive to order and value; it is not cryptographic.

use crate::lengths::Length;
use crate::plan::config::{Batching, Boundaries, Config, Oversize};
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
    let (kind, size) = match config.batching {
        Batching::Rows(n) => (1, u64::from(n)),
        Batching::Tokens(t) => (2, t),
    };
    h = fold(
        h,
        [
            kind,
            size,
            config.seed,
            u64::from(config.shuffle),
            u64::from(config.world_size),
        ],
    );
    h = fold(
        h,
        [
            u64::from(config.drop_last),
            u64::from(config.oversize == Oversize::Skip),
        ],
    );
    h = fold(
        h,
        [
            u64::from(config.pad_to_multiple_of),
            u64::from(config.order == crate::plan::config::Order::Random),
        ],
    );
    h = fold(
        h,
        [
            u64::from(config.accumulation),
            config.cost.linear.to_bits(),
            config.cost.quadratic.to_bits(),
            config.balance_tolerance_ppm.map_or(0, |t| u64::from(t) + 1),
            match config.mode {
                crate::plan::config::Mode::Padded => 0,
                crate::plan::config::Mode::Packed { bucketed } => 1 + u64::from(bucketed),
            },
        ],
    );
    // Folded only when set, so every fingerprint from before the option existed still matches.
    if config.trim_steps {
        h = fold(h, [6]);
    }
    match &config.boundaries {
        Boundaries::Auto => fold(h, [3, u64::from(config.target_efficiency_ppm)]),
        Boundaries::Count(k) => fold(h, [4, *k as u64]),
        Boundaries::Edges(e) => fold(
            fold(h, [5, e.len() as u64]),
            e.iter().map(|&x| u64::from(x)),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pinned_and_sensitive_to_every_input() {
        let cfg = Config::new(Batching::Tokens(4096));
        let base = fingerprint(&[3u32, 1, 4], &cfg);
        assert_eq!(base, GOLDEN);
        assert_eq!(base, fingerprint(&[3u16, 1, 4], &cfg));
        assert_ne!(base, fingerprint(&[1u32, 3, 4], &cfg));
        assert_ne!(base, fingerprint(&[3u32, 1, 4, 0], &cfg));
        assert_ne!(
            base,
            fingerprint(
                &[3u32, 1, 4],
                &Config {
                    seed: 1,
                    ..cfg.clone()
                }
            )
        );
        assert_ne!(
            base,
            fingerprint(
                &[3u32, 1, 4],
                &Config {
                    world_size: 2,
                    ..cfg.clone()
                }
            )
        );
        let random = Config {
            order: crate::plan::config::Order::Random,
            ..cfg.clone()
        };
        assert_ne!(base, fingerprint(&[3u32, 1, 4], &random));
        let stricter = Config {
            target_efficiency_ppm: 990_000,
            ..cfg.clone()
        };
        assert_ne!(base, fingerprint(&[3u32, 1, 4], &stricter));
        for changed in [
            Config {
                accumulation: 4,
                ..cfg.clone()
            },
            Config {
                cost: crate::plan::config::CostModel {
                    linear: 1.0,
                    quadratic: 1e-4,
                },
                ..cfg.clone()
            },
            Config {
                balance_tolerance_ppm: Some(100_000),
                ..cfg.clone()
            },
            Config {
                mode: crate::plan::config::Mode::Packed { bucketed: false },
                ..cfg.clone()
            },
            Config {
                mode: crate::plan::config::Mode::Packed { bucketed: true },
                ..cfg.clone()
            },
        ] {
            assert_ne!(base, fingerprint(&[3u32, 1, 4], &changed), "{changed:?}");
        }
        let rows = Config::new(Batching::Rows(4096));
        assert_ne!(base, fingerprint(&[3u32, 1, 4], &rows));
        let edges = Config {
            boundaries: Boundaries::Edges(vec![0, 4]),
            ..cfg
        };
        assert_ne!(base, fingerprint(&[3u32, 1, 4], &edges));
    }

    /// Pinned: a change means every saved checkpoint is refused on resume, so it changes only when
    /// something that shapes the plan joins the fingerprint (`Auto`'s efficiency target, the batch
    /// order, accumulation, the cost model, the balance tolerance, the batch mode).
    const GOLDEN: u64 = 5_487_147_339_188_138_162;
}
