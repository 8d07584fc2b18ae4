//! A 64-bit fingerprint of everything that determines a plan except the epoch: lengths and
//! configuration. Two processes that agree on it plan identical epochs, so checkpoints and ranks can
//! compare fingerprints instead of data. Stable across platforms and releases (pinned by a test).
//!
//! Built from the SplitMix64 finaliser over 64-bit words (two lengths each) folded in order, which is
//! fast (a multiply per two lengths) and sensitive to order and value; it is not cryptographic.

use crate::lengths::Length;
use crate::plan::config::{Batching, Boundaries, Config, Mode, Order, Oversize};
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
    let Config {
        batching,
        boundaries,
        seed,
        shuffle,
        world_size,
        drop_last,
        oversize,
        pad_to_multiple_of,
        target_efficiency_ppm,
        order,
        accumulation,
        cost,
        mode,
        balance_tolerance_ppm,
        trim_steps,
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
    match boundaries {
        Boundaries::Auto => fold(h, [3, u64::from(*target_efficiency_ppm)]),
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

    /// Every setting away from the defaults, one at a time and all together.
    fn variants() -> Vec<(&'static str, Config)> {
        use crate::plan::config::{CostModel, Mode, Order};
        let base = Config::new(Batching::Tokens(4096));
        vec![
            ("default", base.clone()),
            ("rows", Config::new(Batching::Rows(16))),
            (
                "seed",
                Config {
                    seed: 7,
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
                "ranks",
                Config {
                    world_size: 8,
                    ..base.clone()
                },
            ),
            (
                "drop_last",
                Config {
                    drop_last: true,
                    ..base.clone()
                },
            ),
            (
                "skip",
                Config {
                    oversize: Oversize::Skip,
                    ..base.clone()
                },
            ),
            (
                "pad",
                Config {
                    pad_to_multiple_of: 8,
                    ..base.clone()
                },
            ),
            (
                "efficiency",
                Config {
                    target_efficiency_ppm: 990_000,
                    ..base.clone()
                },
            ),
            (
                "random",
                Config {
                    order: Order::Random,
                    ..base.clone()
                },
            ),
            (
                "accumulation",
                Config {
                    accumulation: 4,
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
                    ..base.clone()
                },
            ),
            (
                "packed",
                Config {
                    mode: Mode::Packed { bucketed: false },
                    ..base.clone()
                },
            ),
            (
                "bucketed",
                Config {
                    mode: Mode::Packed { bucketed: true },
                    ..base.clone()
                },
            ),
            (
                "tolerance",
                Config {
                    balance_tolerance_ppm: Some(100_000),
                    ..base.clone()
                },
            ),
            (
                "trim",
                Config {
                    trim_steps: true,
                    ..base.clone()
                },
            ),
            (
                "count",
                Config {
                    boundaries: Boundaries::Count(6),
                    ..base.clone()
                },
            ),
            (
                "edges",
                Config {
                    boundaries: Boundaries::Edges(vec![0, 4, 4096]),
                    ..base.clone()
                },
            ),
            (
                "everything",
                Config {
                    batching: Batching::Tokens(16_384),
                    boundaries: Boundaries::Edges(vec![0, 2, 4, 16_384]),
                    seed: 3,
                    shuffle: true,
                    world_size: 4,
                    drop_last: true,
                    oversize: Oversize::Skip,
                    pad_to_multiple_of: 4,
                    target_efficiency_ppm: 970_000,
                    order: Order::Random,
                    accumulation: 2,
                    cost: CostModel {
                        linear: 2.0,
                        quadratic: 1e-3,
                    },
                    mode: Mode::Packed { bucketed: true },
                    balance_tolerance_ppm: Some(5),
                    trim_steps: true,
                },
            ),
        ]
    }

    /// Fingerprints of every variant as this code computed them before `fingerprint` destructured
    /// the configuration: checkpoints written then must still be accepted.
    #[test]
    fn every_stored_fingerprint_still_matches() {
        let stored: [(&str, u64); 19] = [
            ("default", 17006243726596172758),
            ("rows", 12743090375431498487),
            ("seed", 13791511467730541533),
            ("sorted", 2270299002581012858),
            ("ranks", 8111952000169134526),
            ("drop_last", 9626535418525812157),
            ("skip", 9808855054773409529),
            ("pad", 4328011587323867937),
            ("efficiency", 11614110184860249495),
            ("random", 6879792420302997950),
            ("accumulation", 10149193447538682657),
            ("cost", 16513912589726402402),
            ("packed", 6752631178882650539),
            ("bucketed", 9065317876248894040),
            ("tolerance", 13493586639614264113),
            ("trim", 1507595859471144964),
            ("count", 16802899029634013447),
            ("edges", 4315851343782065092),
            ("everything", 6587937152557447243),
        ];
        let variants = variants();
        assert_eq!(variants.len(), stored.len());
        for ((name, config), (stored_name, expected)) in variants.iter().zip(stored) {
            assert_eq!(*name, stored_name);
            assert_eq!(fingerprint(&[3u32, 1, 4, 1, 5], config), expected, "{name}");
        }
    }

    /// Pinned: a change means every saved checkpoint is refused on resume, so it changes only when
    /// something that shapes the plan joins the fingerprint (`Auto`'s efficiency target, the batch
    /// order, accumulation, the cost model, the balance tolerance, the batch mode).
    const GOLDEN: u64 = 5_487_147_339_188_138_162;
}
