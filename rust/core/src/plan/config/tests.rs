use super::target::*;
use super::*;

fn check(change: impl FnOnce(&mut Config)) -> Option<ErrorKind> {
    let mut config = Config::new(Batching::Tokens(1024));
    change(&mut config);
    config.validate().err().map(|e| e.kind().clone())
}

#[test]
fn each_setting_error_names_its_setting() {
    let name = |kind: Option<ErrorKind>| match kind {
        Some(ErrorKind::InvalidSetting { name, .. } | ErrorKind::InvalidRatio { name, .. }) => name,
        other => panic!("{other:?}"),
    };
    assert_eq!(name(check(|c| c.accumulation = 0)), "accumulation");
    assert_eq!(
        name(check(|c| c.balance_tolerance_ppm = Some(999))),
        "balance_tolerance"
    );
    assert_eq!(check(|c| c.balance_tolerance_ppm = Some(1000)), None);
    assert_eq!(
        name(check(|c| c.balance_tolerance_ppm = Some(1_000_000_001))),
        "balance_tolerance"
    );
    assert_eq!(
        name(check(|c| c.target_efficiency_ppm = Some(0))),
        "target_efficiency"
    );
    assert_eq!(
        name(check(|c| c.target_efficiency_ppm = Some(1_000_001))),
        "target_efficiency"
    );
    assert_eq!(name(check(|c| c.world_size = 0)), "world_size");
    let packed_over = |c: &mut Config| {
        c.mode = Mode::Packed { bucketed: false };
        c.batching = Batching::Tokens(1 << 32);
    };
    assert_eq!(name(check(packed_over)), "max_tokens");
    let message = crate::error::Error::from(check(packed_over).unwrap()).to_string();
    assert!(
        message.contains("max_tokens=4294967296") && message.contains("packed mode"),
        "{message}"
    );
    let packed_max = |c: &mut Config| {
        c.mode = Mode::Packed { bucketed: false };
        c.batching = Batching::Tokens(u64::from(u32::MAX));
    };
    assert_eq!(check(packed_max), None);
}

#[test]
fn cost_models_must_be_finite_non_negative_and_not_zero() {
    for (linear, quadratic) in [
        (-1.0, 0.0),
        (0.0, 0.0),
        (f64::NAN, 1.0),
        (1.0, f64::INFINITY),
        (5e-324, 0.0), // a subnormal price: every sample in one batch
        (1e-13, 0.0),
        (1.0, 1e13),
    ] {
        let got = check(|c| c.cost = CostModel { linear, quadratic });
        assert!(
            matches!(got, Some(ErrorKind::InvalidCost { .. })),
            "{linear}, {quadratic}: {got:?}"
        );
    }
    assert_eq!(
        check(|c| c.cost = CostModel {
            linear: 0.0,
            quadratic: 1e-3
        }),
        None
    );
    let message = crate::error::Error::from(ErrorKind::InvalidCost {
        setting: "cost",
        given: "(0, 0)".into(),
    })
    .to_string();
    assert!(message.contains("a·L + b·L²"), "{message}");
    // Row cost: 2·10 + 0.5·100.
    let model = CostModel {
        linear: 2.0,
        quadratic: 0.5,
    };
    assert!((model.row(10) - 70.0).abs() < 1e-12);
}

#[test]
fn ratios_become_parts_per_million_or_an_error_naming_the_value() {
    assert_eq!(Config::target_efficiency_ppm(0.98).unwrap(), 980_000);
    assert_eq!(Config::target_efficiency_ppm(1e-9).unwrap(), 1);
    assert_eq!(
        Config::balance_tolerance_ppm(Some(0.1)).unwrap(),
        Some(100_000)
    );
    assert_eq!(Config::balance_tolerance_ppm(None).unwrap(), None);
    for bad in [0.0, -0.5, 1.5, f64::NAN, f64::INFINITY] {
        let message = Config::target_efficiency_ppm(bad).unwrap_err().to_string();
        assert!(
            message.starts_with(&format!("target_efficiency={bad} is invalid")),
            "{message}"
        );
    }
    for bad in [0.0009, 1000.5, f64::NAN, -1.0] {
        let message = Config::balance_tolerance_ppm(Some(bad))
            .unwrap_err()
            .to_string();
        assert!(
            message.starts_with(&format!("balance_tolerance={bad} is invalid")),
            "{message}"
        );
    }
}

#[test]
fn the_default_target_is_higher_only_for_padded_token_budgets_priced_with_attention() {
    let attention = CostModel {
        linear: 1.0,
        quadratic: 1.0 / 30720.0,
    };
    let linear = CostModel {
        linear: 2.0,
        quadratic: 0.0,
    };
    let tokens = Batching::Tokens(16384);
    let default =
        |mode, batching, cost| Config::default_target_efficiency_ppm(mode, batching, cost, 1);
    assert_eq!(default(Mode::Padded, tokens, attention), 982_000);
    assert_eq!(default(Mode::Padded, tokens, CostModel::TOKENS), 970_000);
    assert_eq!(default(Mode::Padded, tokens, linear), 970_000);
    assert_eq!(default(Mode::Padded, Batching::Rows(8), attention), 970_000);
    for bucketed in [false, true] {
        assert_eq!(
            default(Mode::Packed { bucketed }, tokens, attention),
            980_000
        );
    }
    assert_eq!(
        Config::new(tokens).target_efficiency(),
        PADDED_TARGET_EFFICIENCY_PPM
    );
}

#[test]
fn the_padded_default_target_is_wider_for_steps_of_2_to_7_micro_batches() {
    let tokens = Batching::Tokens(16384);
    let attention = CostModel {
        linear: 1.0,
        quadratic: 1.0 / 30720.0,
    };
    let padded = |window| {
        Config::default_target_efficiency_ppm(Mode::Padded, tokens, CostModel::TOKENS, window)
    };
    assert_eq!(padded(1), PADDED_TARGET_EFFICIENCY_PPM);
    for window in [2, 4, 7] {
        assert_eq!(padded(window), SMALL_STEP_TARGET_EFFICIENCY_PPM, "{window}");
    }
    for window in [8, 16, 32, usize::MAX] {
        assert_eq!(padded(window), PADDED_TARGET_EFFICIENCY_PPM, "{window}");
    }
    let rows = Config::default_target_efficiency_ppm(
        Mode::Padded,
        Batching::Rows(8),
        CostModel::TOKENS,
        4,
    );
    assert_eq!(rows, SMALL_STEP_TARGET_EFFICIENCY_PPM);
    // An attention price and packed rows keep theirs at every step shape.
    for window in [1, 4, 32] {
        assert_eq!(
            Config::default_target_efficiency_ppm(Mode::Padded, tokens, attention, window),
            PRICED_TARGET_EFFICIENCY_PPM
        );
        assert_eq!(
            Config::default_target_efficiency_ppm(
                Mode::Packed { bucketed: true },
                tokens,
                CostModel::TOKENS,
                window
            ),
            DEFAULT_TARGET_EFFICIENCY_PPM
        );
    }
    // The window is all ranks × accumulation, and an explicit target wins.
    let config = |world_size, accumulation, target| Config {
        world_size,
        accumulation,
        target_efficiency_ppm: target,
        ..Config::new(tokens)
    };
    let cases = [
        ((2, 2), SMALL_STEP_TARGET_EFFICIENCY_PPM),
        ((4, 4), PADDED_TARGET_EFFICIENCY_PPM),
        ((8, 1), PADDED_TARGET_EFFICIENCY_PPM),
        ((4, 1), SMALL_STEP_TARGET_EFFICIENCY_PPM),
    ];
    for ((world_size, accumulation), expected) in cases {
        let got = config(world_size, accumulation, None).target_efficiency();
        assert_eq!(got, expected, "{world_size}×{accumulation}");
    }
    assert_eq!(config(1, 4, Some(970_000)).target_efficiency(), 970_000);
}
