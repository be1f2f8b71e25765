//! Property tests: nothing panics, no p-value is NaN or outside [0, 1], and every verdict serialises,
//! whatever the inputs (zero exposure, empty samples, all ties, huge counts, non-finite values).

use orchestrator_detect::stats::{binom_sf_ge, hodges_lehmann, hodges_lehmann_interval, mann_whitney_greater};
use orchestrator_detect::{
    Direction, LevelCohorts, LevelGate, Outcome, RateCohorts, RateGate, RateSample, SequentialPlan, SpendingFunction,
    Verdict, evaluate_level, evaluate_rate,
};
use proptest::prelude::*;
use std::sync::OnceLock;

fn exposure() -> impl Strategy<Value = f64> {
    prop_oneof![
        Just(0.0),
        Just(-1.0),
        Just(f64::NAN),
        Just(f64::INFINITY),
        Just(f64::MIN_POSITIVE),
        Just(1e300),
        0.0..1e6_f64,
    ]
}

fn count() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(0_u64),
        Just(1),
        Just(u64::MAX),
        Just(u64::MAX / 2),
        0..50_u64,
        0..1_000_000_000_000_u64
    ]
}

fn level() -> impl Strategy<Value = f64> {
    prop_oneof![
        Just(70.0),
        Just(f64::NAN),
        Just(1e12),
        Just(-1e12),
        Just(1e13),
        (0..5_i32).prop_map(f64::from),
        -1e3..1e3_f64,
    ]
}

fn any_look() -> impl Strategy<Value = (u32, u32, bool)> {
    (1..=20_u32, any::<bool>()).prop_flat_map(|(k, pocock)| (Just(k), 1..=k, Just(pocock)))
}

/// Plans for 1..=20 looks of both spending functions, built once: boundaries cost tens of ms each in
/// a debug build and do not depend on the data.
fn plan(k: u32, pocock: bool) -> &'static SequentialPlan {
    static PLANS: OnceLock<Vec<(SequentialPlan, SequentialPlan)>> = OnceLock::new();
    let plans = PLANS.get_or_init(|| {
        (1..=20)
            .map(|k| {
                let make = |s| SequentialPlan::new(0.01, k, s).expect("valid plan");
                (make(SpendingFunction::OBrienFleming), make(SpendingFunction::Pocock))
            })
            .collect()
    });
    let pair = &plans[(k - 1) as usize];
    if pocock { &pair.1 } else { &pair.0 }
}

fn sound(v: &Verdict) {
    if let Some(e) = v.evidence() {
        assert!(
            (0.0..=1.0).contains(&e.p_value),
            "p-value {} out of range: {v:?}",
            e.p_value
        );
        for x in [
            e.effect.estimate,
            e.effect.ci95_lower,
            e.effect.ci95_upper,
            e.effect.decision_lower_bound,
        ] {
            assert!(x.is_none_or(f64::is_finite), "non-finite effect in {v:?}");
        }
    }
    let json = serde_json::to_string(v).expect("serialises");
    let back: Verdict = serde_json::from_str(&json).expect("round-trips (so no NaN became null)");
    assert_eq!(back.outcome(), v.outcome());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn rate_gate_never_panics(
        x1 in count(), e1 in exposure(), x0 in count(), e0 in exposure(),
        ratio in prop_oneof![Just(1.0), Just(0.0), Just(f64::NAN), 1.0..10.0_f64],
        (k, n, pocock) in any_look(),
    ) {
        let gate = RateGate { name: "g".into(), min_effect_ratio: ratio, min_canary_events_for_fail: 3, min_exposure: 1.0 };
        let cohorts = RateCohorts {
            canary: RateSample { events: x1, exposure: e1 },
            control: RateSample { events: x0, exposure: e0 },
        };
        let look = plan(k, pocock).look(n).expect("look in plan");
        let v = evaluate_rate(&gate, &cohorts, &look);
        sound(&v);
        if e1 == 0.0 || e0 == 0.0 {
            prop_assert_ne!(v.outcome(), Outcome::Pass);
        }
    }

    #[test]
    fn level_gate_never_panics(
        canary in prop::collection::vec(level(), 0..40),
        control in prop::collection::vec(level(), 0..60),
        min_shift in prop_oneof![Just(0.0), Just(f64::NAN), Just(-1.0), 0.0..10.0_f64],
        lower_worse in any::<bool>(),
        (k, n, pocock) in any_look(),
    ) {
        let direction = if lower_worse { Direction::LowerIsWorse } else { Direction::HigherIsWorse };
        let gate = LevelGate { name: "g".into(), direction, min_shift, min_samples: 3 };
        let look = plan(k, pocock).look(n).expect("look in plan");
        let v = evaluate_level(&gate, &LevelCohorts { canary: &canary, control: &control }, &look);
        sound(&v);
        if canary.is_empty() || control.is_empty() {
            prop_assert_ne!(v.outcome(), Outcome::Pass);
        }
    }

    #[test]
    fn all_ties_give_no_evidence(value in -1e6..1e6_f64, n1 in 1..30_usize, n2 in 1..30_usize) {
        let x = vec![value; n1];
        let y = vec![value; n2];
        let t = mann_whitney_greater(&x, &y).expect("nonempty");
        prop_assert!(t.p_value >= 0.5, "{t:?}");
        prop_assert_eq!(hodges_lehmann(&x, &y), Some(0.0));
        let ci = hodges_lehmann_interval(&x, &y, 0.025, 0.025);
        prop_assert!(ci.lower.is_none_or(|l| l == 0.0) && ci.upper.is_none_or(|u| u == 0.0));
    }

    #[test]
    fn binomial_tail_is_a_probability_and_monotone(k in 0..2000_u64, n in 0..2000_u64, p in 0.0..=1.0_f64) {
        let a = binom_sf_ge(k, n, p);
        let b = binom_sf_ge(k + 1, n, p);
        prop_assert!((0.0..=1.0).contains(&a));
        prop_assert!(b <= a + 1e-12, "P(X >= k+1) = {b} > P(X >= k) = {a}");
    }

    #[test]
    fn binomial_tail_handles_huge_counts(k in any::<u64>(), n in any::<u64>(), p in 0.0..=1.0_f64) {
        let v = binom_sf_ge(k, n, p);
        prop_assert!((0.0..=1.0).contains(&v));
    }
}
