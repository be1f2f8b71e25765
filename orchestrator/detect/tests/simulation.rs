//! The sequential procedure by simulation: false-alarm rate under the null and power at the computed
//! minimum detectable effect, with a seeded RNG so the results are reproducible.
//!
//! Monte-Carlo error: with R runs and true rate a, the estimate's sd is sqrt(a (1 - a) / R); each
//! assertion allows three of them on top of the stated rate.

use orchestrator_detect::{
    Direction, LevelCohorts, LevelGate, LevelPowerInput, Outcome, RateCohorts, RateGate, RatePowerInput, RateSample,
    SequentialPlan, SpendingFunction, evaluate_level, evaluate_rate, level_min_detectable_shift,
    rate_min_detectable_ratio,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Knuth's multiplication method; fine for the small per-look means used here.
fn poisson(rng: &mut impl Rng, mean: f64) -> u64 {
    let limit = (-mean).exp();
    let mut k = 0;
    let mut prod: f64 = rng.random();
    while prod > limit {
        k += 1;
        prod *= rng.random::<f64>();
    }
    k
}

fn normal(rng: &mut impl Rng) -> f64 {
    // Box-Muller; 1 - u keeps the logarithm finite.
    let u1: f64 = 1.0 - rng.random::<f64>();
    let u2: f64 = rng.random();
    (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
}

/// Runs a whole bake of a rate gate with per-look Poisson increments; true if it ever fails.
fn rate_bake_fails(
    rng: &mut impl Rng,
    gate: &RateGate,
    plan: &SequentialPlan,
    canary_exposure: f64,
    control_exposure: f64,
    baseline: f64,
    ratio: f64,
) -> bool {
    let looks = plan.looks.len() as f64;
    let (mut x1, mut x0) = (0, 0);
    for look in &plan.looks {
        x1 += poisson(rng, ratio * baseline * canary_exposure / looks);
        x0 += poisson(rng, baseline * control_exposure / looks);
        let cohorts = RateCohorts {
            canary: RateSample {
                events: x1,
                exposure: canary_exposure * look.information_fraction,
            },
            control: RateSample {
                events: x0,
                exposure: control_exposure * look.information_fraction,
            },
        };
        if evaluate_rate(gate, &cohorts, look).outcome() == Outcome::Fail {
            return true;
        }
    }
    false
}

fn three_sigma(rate: f64, runs: f64) -> f64 {
    3.0 * (rate * (1.0 - rate) / runs).sqrt()
}

#[test]
fn rate_gate_false_alarm_rate_stays_within_alpha() {
    // Worst case of H0: the canary's true rate is exactly min_effect_ratio times the control's.
    // The minimum-events rule is off so that the procedure itself is what is measured.
    let alpha = 0.05;
    let plan = SequentialPlan::new(alpha, 10, SpendingFunction::OBrienFleming).unwrap();
    let gate = RateGate {
        name: "xid".into(),
        min_effect_ratio: 1.5,
        min_canary_events_for_fail: 0,
        min_exposure: 0.0,
    };
    let mut rng = ChaCha8Rng::seed_from_u64(0x5EED_0001);
    let runs = 1000;
    let alarms = (0..runs)
        .filter(|_| rate_bake_fails(&mut rng, &gate, &plan, 400.0, 2000.0, 0.05, 1.5))
        .count();
    let rate = alarms as f64 / runs as f64;
    eprintln!("rate gate: false-alarm rate {rate} over {runs} null bakes (alpha {alpha})");
    assert!(
        rate <= alpha + three_sigma(alpha, runs as f64),
        "false-alarm rate {rate} exceeds {alpha}"
    );
    // The exact test is conservative, but a procedure that never fires would pass the bound above
    // trivially: it must use a real share of its alpha.
    assert!(
        rate >= 0.01,
        "false-alarm rate {rate} implausibly low: boundaries too strict?"
    );
}

#[test]
fn rate_gate_power_matches_the_power_analysis() {
    // The computed minimum detectable ratio should be caught about 80% of the time. The power analysis
    // is a normal approximation of a discrete exact test, so allow 0.10 plus Monte-Carlo error.
    let plan = SequentialPlan::new(0.05, 8, SpendingFunction::OBrienFleming).unwrap();
    let gate = RateGate {
        name: "xid".into(),
        min_effect_ratio: 1.2,
        min_canary_events_for_fail: 3,
        min_exposure: 0.0,
    };
    let input = RatePowerInput {
        canary_exposure: 800.0,
        control_exposure: 8000.0,
        baseline_rate: 0.05,
        min_effect_ratio: gate.min_effect_ratio,
        min_canary_events_for_fail: gate.min_canary_events_for_fail,
    };
    let mde = rate_min_detectable_ratio(&input, &plan).unwrap();
    let ratio = mde.min_detectable_ratio.expect("detectable");
    assert!(ratio > 1.2 && ratio < 3.0, "{mde:?}");
    let mut rng = ChaCha8Rng::seed_from_u64(0x5EED_0002);
    let runs = 400;
    let hits = (0..runs)
        .filter(|_| rate_bake_fails(&mut rng, &gate, &plan, 800.0, 8000.0, 0.05, ratio))
        .count();
    let power = hits as f64 / runs as f64;
    eprintln!("rate gate: empirical power {power} at the computed 80%-power ratio {ratio}");
    assert!(
        (power - 0.8).abs() <= 0.10 + three_sigma(0.8, runs as f64),
        "empirical power {power} at ratio {ratio}"
    );
}

/// Runs a whole bake of a level gate: each unit's value is the mean of its readings so far (reading
/// sd 1), the canary's readings shifted by `shift`. True if the gate ever fails.
fn level_bake_fails(
    rng: &mut impl Rng,
    gate: &LevelGate,
    plan: &SequentialPlan,
    n1: usize,
    n2: usize,
    shift: f64,
) -> bool {
    let mut sum1 = vec![0.0; n1];
    let mut sum2 = vec![0.0; n2];
    for (k, look) in plan.looks.iter().enumerate() {
        sum1.iter_mut().for_each(|s| *s += normal(rng));
        sum2.iter_mut().for_each(|s| *s += normal(rng));
        let reads = (k + 1) as f64;
        let canary: Vec<f64> = sum1.iter().map(|s| 65.0 + shift + s / reads).collect();
        let control: Vec<f64> = sum2.iter().map(|s| 65.0 + s / reads).collect();
        if evaluate_level(
            gate,
            &LevelCohorts {
                canary: &canary,
                control: &control,
            },
            look,
        )
        .outcome()
            == Outcome::Fail
        {
            return true;
        }
    }
    false
}

#[test]
fn level_gate_power_matches_the_power_analysis() {
    // At the final look a unit's mean of K readings has sd 1/sqrt(K): that is the power analysis' sd.
    let looks = 4;
    let plan = SequentialPlan::new(0.05, looks, SpendingFunction::OBrienFleming).unwrap();
    let gate = LevelGate {
        name: "temp".into(),
        direction: Direction::HigherIsWorse,
        min_shift: 0.2,
        min_samples: 1,
    };
    let (n1, n2) = (30, 100);
    let input = LevelPowerInput {
        canary_samples: n1 as u64,
        control_samples: n2 as u64,
        sd: 1.0 / f64::from(looks).sqrt(),
        min_shift: gate.min_shift,
    };
    let shift = level_min_detectable_shift(&input, &plan).unwrap().min_detectable_shift;
    let mut rng = ChaCha8Rng::seed_from_u64(0x5EED_0005);
    let runs = 300;
    let hits = (0..runs)
        .filter(|_| level_bake_fails(&mut rng, &gate, &plan, n1, n2, shift))
        .count();
    let power = hits as f64 / runs as f64;
    eprintln!("level gate: empirical power {power} at the computed 80%-power shift {shift}");
    assert!(
        (power - 0.8).abs() <= 0.10 + three_sigma(0.8, runs as f64),
        "empirical power {power} at shift {shift}"
    );
}

#[test]
fn level_gate_false_alarm_rate_stays_within_alpha() {
    // Each unit's value is the mean of its readings so far, so information grows with the bake as the
    // plan assumes. No difference between cohorts and min_shift 0: the boundary of H0.
    let alpha = 0.05;
    let looks = 4;
    let plan = SequentialPlan::new(alpha, looks, SpendingFunction::Pocock).unwrap();
    let gate = LevelGate {
        name: "temp".into(),
        direction: Direction::HigherIsWorse,
        min_shift: 0.0,
        min_samples: 1,
    };
    let (n1, n2) = (30, 100);
    let mut rng = ChaCha8Rng::seed_from_u64(0x5EED_0003);
    let runs = 1000;
    let alarms = (0..runs)
        .filter(|_| level_bake_fails(&mut rng, &gate, &plan, n1, n2, 0.0))
        .count() as u32;
    let rate = f64::from(alarms) / f64::from(runs);
    eprintln!("level gate: false-alarm rate {rate} over {runs} null bakes (alpha {alpha})");
    assert!(
        rate <= alpha + three_sigma(alpha, f64::from(runs)),
        "false-alarm rate {rate} exceeds {alpha}"
    );
    assert!(rate >= 0.01, "false-alarm rate {rate} implausibly low");
}

#[test]
fn repeated_looks_without_correction_would_inflate_false_alarms() {
    // The reason for the plan: testing every look at the full alpha fires far more often than alpha.
    let alpha = 0.05;
    let naive = SequentialPlan::new(alpha, 1, SpendingFunction::Pocock).unwrap();
    let naive_look = naive.look(1).unwrap();
    let plan = SequentialPlan::new(alpha, 10, SpendingFunction::Pocock).unwrap();
    let gate = RateGate {
        name: "xid".into(),
        min_effect_ratio: 1.0,
        min_canary_events_for_fail: 0,
        min_exposure: 0.0,
    };
    let mut rng = ChaCha8Rng::seed_from_u64(0x5EED_0004);
    let runs = 500;
    let mut alarms = 0;
    for _ in 0..runs {
        let (mut x1, mut x0) = (0, 0);
        for look in &plan.looks {
            x1 += poisson(&mut rng, 4.0);
            x0 += poisson(&mut rng, 20.0);
            let t = look.information_fraction;
            let cohorts = RateCohorts {
                canary: RateSample {
                    events: x1,
                    exposure: 400.0 * t,
                },
                control: RateSample {
                    events: x0,
                    exposure: 2000.0 * t,
                },
            };
            // Every look judged as if it were the only one.
            if evaluate_rate(&gate, &cohorts, &naive_look).outcome() == Outcome::Fail {
                alarms += 1;
                break;
            }
        }
    }
    let rate = f64::from(alarms) / f64::from(runs);
    eprintln!("naive repeated testing: false-alarm rate {rate} (alpha {alpha}, 10 looks)");
    let bound = alpha + three_sigma(alpha, f64::from(runs));
    assert!(
        rate > bound,
        "naive repeated testing should inflate false alarms beyond {bound}, got {rate}"
    );
}
