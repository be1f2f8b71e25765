//! Behaviour of the gates and verdicts: what fails, what passes, what stays inconclusive, and why.

use orchestrator_detect::stats::poisson_rate_test;
use orchestrator_detect::{
    Direction, InconclusiveReason, LevelCohorts, LevelGate, Look, Outcome, RateCohorts, RateGate, RateSample,
    SequentialPlan, SpendingFunction, Verdict, combine, evaluate_level, evaluate_rate,
};

fn plan(looks: u32) -> SequentialPlan {
    SequentialPlan::new(0.05, looks, SpendingFunction::OBrienFleming).expect("valid plan")
}

fn final_look() -> Look {
    let p = plan(4);
    p.look(4).expect("look 4 exists")
}

fn xid_gate() -> RateGate {
    RateGate {
        name: "xid_errors_per_gpu_hour".into(),
        min_effect_ratio: 1.5,
        min_canary_events_for_fail: 3,
        min_exposure: 50.0,
    }
}

fn cohorts(canary: (u64, f64), control: (u64, f64)) -> RateCohorts {
    RateCohorts {
        canary: RateSample {
            events: canary.0,
            exposure: canary.1,
        },
        control: RateSample {
            events: control.0,
            exposure: control.1,
        },
    }
}

fn temp_gate() -> LevelGate {
    LevelGate {
        name: "gpu_temp_c".into(),
        direction: Direction::HigherIsWorse,
        min_shift: 1.0,
        min_samples: 8,
    }
}

/// Deterministic pseudo-normal noise (no RNG needed): a fixed table of standard normal quantiles.
fn spread(n: usize, center: f64, sd: f64) -> Vec<f64> {
    (0..n)
        .map(|i| {
            let q = (i as f64 + 0.5) / n as f64;
            // Rational approximation of the normal quantile is enough for a spread of test values.
            let t = (-2.0 * q.min(1.0 - q).ln()).sqrt();
            let z = t
                - (2.515517 + 0.802853 * t + 0.010328 * t * t)
                    / (1.0 + 1.432788 * t + 0.189269 * t * t + 0.001308 * t * t * t);
            center + sd * if q < 0.5 { -z } else { z }
        })
        .collect()
}

#[test]
fn single_canary_event_with_silent_control_does_not_fail() {
    // Small canary (50 GPU-hours) beside a large control (5,000) with no events: one canary event is
    // "significant" by the raw conditional test, which is exactly why a minimum event count exists.
    let look = final_look();
    let c = cohorts((1, 50.0), (0, 5000.0));
    let raw = poisson_rate_test(1, 50.0, 0, 5000.0, 1.5);
    assert!(
        raw < look.nominal_alpha,
        "precondition: the raw test alone would fail ({raw})"
    );
    let v = evaluate_rate(&xid_gate(), &c, &look);
    assert_eq!(v.outcome(), Outcome::Pass, "{v:?}");
    // Two events are not a rate regression either.
    let v = evaluate_rate(&xid_gate(), &cohorts((2, 50.0), (0, 5000.0)), &look);
    assert_ne!(v.outcome(), Outcome::Fail, "{v:?}");
}

#[test]
fn silent_control_does_not_hide_a_real_rise() {
    // Same exposure, 12 canary events, none in control: the ratio estimate is undefined (infinite)
    // but the exact test and the finite lower bound still show a regression beyond 1.5x.
    let look = final_look();
    let v = evaluate_rate(&xid_gate(), &cohorts((12, 100.0), (0, 100.0)), &look);
    let Verdict::Fail { evidence } = &v else {
        panic!("expected Fail, got {v:?}")
    };
    assert_eq!(evidence.effect.estimate, None);
    assert_eq!(evidence.effect.ci95_upper, None);
    let lower = evidence.effect.decision_lower_bound.expect("finite lower bound");
    assert!(lower > 1.5, "{lower}");
}

#[test]
fn tripled_error_rate_fails_and_equal_rates_pass() {
    let look = final_look();
    // Canary 200 GPU-hours at 0.3/h (60 events), control 2,000 at 0.1/h (200).
    let v = evaluate_rate(&xid_gate(), &cohorts((60, 200.0), (200, 2000.0)), &look);
    assert_eq!(v.outcome(), Outcome::Fail, "{v:?}");
    let e = v.evidence().expect("evidence");
    assert!((e.effect.estimate.unwrap() - 3.0).abs() < 1e-12);
    assert!(e.p_value <= e.look.nominal_alpha);
    // Same rate in both: pass at the end of the bake...
    let v = evaluate_rate(&xid_gate(), &cohorts((20, 200.0), (200, 2000.0)), &look);
    assert_eq!(v.outcome(), Outcome::Pass, "{v:?}");
    // ...but only at the end: mid-bake it keeps baking.
    let mid = plan(4).look(2).unwrap();
    let v = evaluate_rate(&xid_gate(), &cohorts((20, 200.0), (200, 2000.0)), &mid);
    assert!(
        matches!(
            v,
            Verdict::Inconclusive {
                reason: InconclusiveReason::BakeInProgress,
                ..
            }
        ),
        "{v:?}"
    );
}

#[test]
fn smallest_effect_that_matters_is_respected() {
    // A real but small rise (1.2x) with lots of data is significant against ratio 1 but not against
    // the policy's 1.5.
    let look = final_look();
    let c = cohorts((2400, 20_000.0), (20_000, 200_000.0));
    let mut any_rise = xid_gate();
    any_rise.min_effect_ratio = 1.0;
    assert_eq!(evaluate_rate(&any_rise, &c, &look).outcome(), Outcome::Fail);
    assert_eq!(evaluate_rate(&xid_gate(), &c, &look).outcome(), Outcome::Pass);
}

#[test]
fn fleet_wide_rate_rise_is_not_the_firmware() {
    // A driver release triples errors everywhere: canary and control rise together.
    let look = final_look();
    let v = evaluate_rate(&xid_gate(), &cohorts((61, 200.0), (598, 2000.0)), &look);
    assert_eq!(v.outcome(), Outcome::Pass, "{v:?}");
}

#[test]
fn early_looks_need_overwhelming_evidence() {
    // p ~ 0.003: enough at the final look of a 10-look O'Brien-Fleming plan, not at the first.
    let p = plan(10);
    let c = cohorts((26, 100.0), (100, 1000.0));
    let first = evaluate_rate(
        &RateGate {
            min_effect_ratio: 1.0,
            ..xid_gate()
        },
        &c,
        &p.look(1).unwrap(),
    );
    let last = evaluate_rate(
        &RateGate {
            min_effect_ratio: 1.0,
            ..xid_gate()
        },
        &c,
        &p.look(10).unwrap(),
    );
    assert_eq!(first.outcome(), Outcome::Inconclusive, "{first:?}");
    assert_eq!(last.outcome(), Outcome::Fail, "{last:?}");
}

#[test]
fn no_or_little_data_is_never_a_pass() {
    let look = final_look();
    let v = evaluate_rate(&xid_gate(), &cohorts((0, 0.0), (10, 1000.0)), &look);
    assert!(
        matches!(
            v,
            Verdict::Inconclusive {
                reason: InconclusiveReason::NoData,
                ..
            }
        ),
        "{v:?}"
    );
    let v = evaluate_rate(&xid_gate(), &cohorts((0, 10.0), (0, 0.0)), &look);
    assert!(
        matches!(
            v,
            Verdict::Inconclusive {
                reason: InconclusiveReason::NoData,
                ..
            }
        ),
        "{v:?}"
    );
    // Exposure below the gate's minimum.
    let v = evaluate_rate(&xid_gate(), &cohorts((0, 10.0), (3, 1000.0)), &look);
    assert!(
        matches!(
            v,
            Verdict::Inconclusive {
                reason: InconclusiveReason::InsufficientData,
                ..
            }
        ),
        "{v:?}"
    );
    // Enough exposure and no events anywhere: a pass (the power lint says whether that means much).
    let v = evaluate_rate(&xid_gate(), &cohorts((0, 100.0), (0, 1000.0)), &look);
    assert_eq!(v.outcome(), Outcome::Pass, "{v:?}");
    // Level: empty cohorts and too few samples.
    let v = evaluate_level(
        &temp_gate(),
        &LevelCohorts {
            canary: &[],
            control: &[60.0],
        },
        &look,
    );
    assert!(
        matches!(
            v,
            Verdict::Inconclusive {
                reason: InconclusiveReason::NoData,
                ..
            }
        ),
        "{v:?}"
    );
    let v = evaluate_level(
        &temp_gate(),
        &LevelCohorts {
            canary: &[60.0, 61.0],
            control: &[60.0; 20],
        },
        &look,
    );
    assert!(
        matches!(
            v,
            Verdict::Inconclusive {
                reason: InconclusiveReason::InsufficientData,
                ..
            }
        ),
        "{v:?}"
    );
}

#[test]
fn hotter_canary_fails_and_fleet_wide_heat_passes() {
    let look = final_look();
    let control = spread(200, 65.0, 2.0);
    // Canary 4 degrees hotter than control: well beyond the 1 degree that matters.
    let hot = spread(24, 69.0, 2.0);
    let v = evaluate_level(
        &temp_gate(),
        &LevelCohorts {
            canary: &hot,
            control: &control,
        },
        &look,
    );
    let Verdict::Fail { evidence } = &v else {
        panic!("expected Fail, got {v:?}")
    };
    assert!((evidence.effect.estimate.unwrap() - 4.0).abs() < 0.3, "{evidence:?}");
    assert!(evidence.effect.decision_lower_bound.unwrap() > 1.0);
    // A hot day: everyone +6 degrees; the canary is like its control.
    let hot_day_control: Vec<f64> = control.iter().map(|t| t + 6.0).collect();
    let hot_day_canary = spread(24, 71.0, 2.0);
    let v = evaluate_level(
        &temp_gate(),
        &LevelCohorts {
            canary: &hot_day_canary,
            control: &hot_day_control,
        },
        &look,
    );
    assert_eq!(v.outcome(), Outcome::Pass, "{v:?}");
    // Half a degree warmer is real but below what matters, even with many samples.
    let warm = spread(400, 65.5, 2.0);
    let v = evaluate_level(
        &temp_gate(),
        &LevelCohorts {
            canary: &warm,
            control: &control,
        },
        &look,
    );
    assert_eq!(v.outcome(), Outcome::Pass, "{v:?}");
}

#[test]
fn lower_is_worse_gates_flip_the_direction() {
    let look = final_look();
    let gate = LevelGate {
        name: "nvlink_gbps".into(),
        direction: Direction::LowerIsWorse,
        min_shift: 5.0,
        min_samples: 8,
    };
    let control = spread(100, 400.0, 4.0);
    let slow = spread(30, 380.0, 4.0);
    let fast = spread(30, 420.0, 4.0);
    let v = evaluate_level(
        &gate,
        &LevelCohorts {
            canary: &slow,
            control: &control,
        },
        &look,
    );
    assert_eq!(v.outcome(), Outcome::Fail, "{v:?}");
    // The shift is reported in the harmful direction: positive 20.
    assert!((v.evidence().unwrap().effect.estimate.unwrap() - 20.0).abs() < 1.0);
    let v = evaluate_level(
        &gate,
        &LevelCohorts {
            canary: &fast,
            control: &control,
        },
        &look,
    );
    assert_eq!(v.outcome(), Outcome::Pass, "{v:?}");
}

#[test]
fn bad_inputs_are_errors_not_panics() {
    let look = final_look();
    let v = evaluate_level(
        &temp_gate(),
        &LevelCohorts {
            canary: &[60.0, f64::NAN],
            control: &[60.0],
        },
        &look,
    );
    assert_eq!(v.outcome(), Outcome::Error, "{v:?}");
    let bad = RateGate {
        min_effect_ratio: 0.5,
        ..xid_gate()
    };
    assert_eq!(
        evaluate_rate(&bad, &cohorts((1, 1.0), (1, 1.0)), &look).outcome(),
        Outcome::Error
    );
    let v = evaluate_rate(&xid_gate(), &cohorts((1, -1.0), (1, 1.0)), &look);
    assert_eq!(v.outcome(), Outcome::Error);
    let v = evaluate_rate(&xid_gate(), &cohorts((u64::MAX, 1.0), (1, 1.0)), &look);
    assert_eq!(v.outcome(), Outcome::Error);
}

#[test]
fn worst_verdict_wins() {
    let look = final_look();
    let pass = evaluate_rate(&xid_gate(), &cohorts((20, 200.0), (200, 2000.0)), &look);
    let fail = evaluate_rate(&xid_gate(), &cohorts((60, 200.0), (200, 2000.0)), &look);
    let inconclusive = evaluate_rate(&xid_gate(), &cohorts((0, 0.0), (200, 2000.0)), &look);
    let error = evaluate_rate(&xid_gate(), &cohorts((1, f64::NAN), (1, 1.0)), &look);
    assert_eq!(combine(vec![pass.clone(), pass.clone()]).outcome, Outcome::Pass);
    assert_eq!(
        combine(vec![pass.clone(), inconclusive.clone()]).outcome,
        Outcome::Inconclusive
    );
    assert_eq!(
        combine(vec![inconclusive.clone(), error.clone(), pass.clone()]).outcome,
        Outcome::Error
    );
    assert_eq!(combine(vec![error, fail, inconclusive, pass]).outcome, Outcome::Fail);
    assert_eq!(
        combine(vec![]).outcome,
        Outcome::Inconclusive,
        "no gates is no data, never a pass"
    );
}

#[test]
fn verdicts_serialise_without_nan_and_round_trip() {
    let look = final_look();
    let v = evaluate_rate(&xid_gate(), &cohorts((12, 100.0), (0, 100.0)), &look);
    let json = serde_json::to_string(&v).expect("serialise");
    assert!(json.contains("\"outcome\":\"fail\""), "{json}");
    // serde_json writes a NaN or infinite f64 as null, which then fails to deserialise into f64, so
    // the round trip also proves the required numbers are finite.
    let back: Verdict = serde_json::from_str(&json).expect("deserialise");
    assert_eq!(back, v);
    let err = evaluate_rate(&xid_gate(), &cohorts((1, -1.0), (1, 1.0)), &look);
    let back: Verdict = serde_json::from_str(&serde_json::to_string(&err).unwrap()).unwrap();
    assert_eq!(back, err);
}
