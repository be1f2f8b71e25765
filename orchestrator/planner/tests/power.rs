//! Power analysis: the MDE moves the right way with canary size, bake and baselines; the lint's
//! canary; the fleet-scale method's timing.
use orchestrator_planner::power::*;
use orchestrator_policy::{HealthGate, Policy};

#[test]
fn fleet_timing_pools_evidence_and_flags_a_likely_hold() {
    let policy = policy();
    let options = PowerOptions::default();
    let waves = [shape(8, 400, 12), shape(40, 400, 12)];
    let waves = [
        waves[0].clone(),
        WaveShape {
            name: "canary".into(),
            ..waves[1].clone()
        },
    ];
    let timing = fleet_timing(&policy, &waves, &options);
    let xid: Vec<&FleetGateTiming> = timing.iter().filter(|t| t.gate == "xid_errors").collect();
    assert_eq!(xid.len(), 2, "{timing:#?}");
    let (first, second) = (xid[0], xid[1]);
    assert!(first.pass_hours.0.is_finite() && first.pass_hours.1 > first.pass_hours.0);
    // The second wave starts with the first one's evidence and five times the nodes.
    assert!(second.pass_hours.0 < first.pass_hours.0, "{first:?} {second:?}");
    let at_must_detect = first.catch_hours[0];
    assert_eq!(at_must_detect.0, policy.health.gate("xid_errors").unwrap().must_detect);
    assert!(at_must_detect.1.is_finite());
    // Without max_bake the wave cannot extend, so a pass slower than the bake is a likely hold.
    assert_eq!(first.likely_hold, first.pass_hours.1 > first.max_bake_hours);
    // The chance of a catch by each wave's end, for the same ratios, never falls from wave to wave.
    assert_eq!(first.catch_by_end.len(), first.catch_hours.len(), "{first:?}");
    for ((r0, p0), (r1, p1)) in first.catch_by_end.iter().zip(&second.catch_by_end) {
        assert_eq!(r0, r1);
        assert!((0.0..=1.0).contains(p0) && p1 >= p0, "{first:?} {second:?}");
    }
    // The same ratios as a fleet average concentrated on a quarter of the nodes. An 8-node canary
    // draws none of them one time in ten (0.75^8), so by its end at most about 90% are caught however
    // large the effect; on all nodes a 6x rise is caught more often than that.
    assert_eq!(first.concentrated_share, CONCENTRATED_SHARE);
    let ratios = |v: &[(f64, f64)]| v.iter().map(|c| c.0).collect::<Vec<_>>();
    assert_eq!(ratios(&first.catch_by_end_concentrated), ratios(&first.catch_by_end));
    for ((r, p0), (_, p1)) in first
        .catch_by_end_concentrated
        .iter()
        .zip(&second.catch_by_end_concentrated)
    {
        assert!(*p0 <= 0.95 && p1 >= p0, "{r}x: {first:?} {second:?}");
    }
    let all_6x = first.catch_by_end.iter().find(|c| c.0 == 6.0).unwrap().1;
    assert!(all_6x > 0.95, "{first:?}");
    // A moderate average the pooled ratio dilutes is what the node-level look is for: 3x on a quarter
    // of the nodes (9x each) is caught by the canary's end more often than 3x on all of them.
    let at_3x = |v: &[(f64, f64)]| v.iter().find(|c| c.0 == 3.0).unwrap().1;
    assert!(
        at_3x(&first.catch_by_end_concentrated) > at_3x(&first.catch_by_end),
        "{first:?}"
    );
}

const POLICY: &str = include_str!("../../../policies/gpu-fast-canary.yaml");

fn policy() -> Policy {
    orchestrator_policy::parse_policy(POLICY).unwrap()
}

fn shape(canary: usize, control: usize, bake_hours: i64) -> WaveShape {
    WaveShape {
        name: "canary".into(),
        canary_nodes: canary,
        control_nodes: control,
        no_control_reason: None,
        bake_seconds: bake_hours * 3600,
        gates: vec!["xid_errors".into(), "gpu_temp".into()],
    }
}

fn mde(p: &GatePower) -> f64 {
    let m = p.mde.as_ref().unwrap();
    m.ratio.or(m.shift).unwrap()
}

fn gate<'a>(policy: &'a Policy, name: &str) -> &'a HealthGate {
    policy.health.gate(name).unwrap()
}

#[test]
fn bigger_canary_detects_smaller_effects() {
    let policy = policy();
    let options = PowerOptions::default();
    for name in ["xid_errors", "gpu_temp"] {
        let small = gate_power(&policy, &shape(8, 64, 6), gate(&policy, name), &options);
        let big = gate_power(&policy, &shape(32, 64, 6), gate(&policy, name), &options);
        assert_eq!((small.status, big.status), (GateStatus::Ok, GateStatus::Ok));
        assert!(mde(&big) < mde(&small), "{name}: {} !< {}", mde(&big), mde(&small));
        assert!(mde(&big) > gate(&policy, name).min_effect, "{name}");
    }
}

#[test]
fn longer_bake_detects_smaller_rate_ratios() {
    let policy = policy();
    let g = gate(&policy, "xid_errors");
    let options = PowerOptions::default();
    let short = gate_power(&policy, &shape(16, 16, 6), g, &options);
    let long = gate_power(&policy, &shape(16, 16, 24), g, &options);
    assert!(mde(&long) < mde(&short));
    // 6h at 30m intervals, two gates sharing alpha 0.05.
    assert_eq!(short.planned_looks, 12);
    assert!((short.gate_alpha - 0.025).abs() < 1e-12);
    assert_eq!(short.per_look_alpha.len(), 12);
    assert_eq!(short.canary_units, 128);
    assert_eq!(short.canary_exposure, Some(128.0 * 6.0));
}

#[test]
fn given_baseline_overrides_the_default_by_gate_or_metric() {
    let policy = policy();
    let g = gate(&policy, "xid_errors");
    let default = gate_power(&policy, &shape(16, 16, 6), g, &PowerOptions::default());
    assert_eq!(default.baseline.as_ref().unwrap().source, BaselineSource::Default);
    assert_eq!(default.baseline.as_ref().unwrap().value, 0.01);
    let mut options = PowerOptions::default();
    options.baselines.rates.insert("xid_errors_per_gpu_hour".into(), 0.5);
    let by_metric = gate_power(&policy, &shape(16, 16, 6), g, &options);
    assert_eq!(by_metric.baseline.as_ref().unwrap().source, BaselineSource::Given);
    // More baseline events: a smaller ratio is detectable.
    assert!(mde(&by_metric) < mde(&default));
    options.baselines.rates.insert("xid_errors".into(), 0.001);
    let by_gate = gate_power(&policy, &shape(16, 16, 6), g, &options);
    assert_eq!(by_gate.baseline.as_ref().unwrap().value, 0.001);
    assert!(mde(&by_gate) > mde(&default));
}

#[test]
fn a_rate_measured_over_history_replaces_the_default_but_not_a_given_one() {
    let policy = policy();
    let g = gate(&policy, "xid_errors");
    let mut options = PowerOptions {
        history_rates: history_rates(&[("xid_errors_per_gpu_hour".to_owned(), 500.0, 1_000.0)]),
        ..PowerOptions::default()
    };
    let measured = gate_power(&policy, &shape(16, 16, 6), g, &options);
    assert_eq!(measured.baseline.as_ref().unwrap().source, BaselineSource::History);
    assert_eq!(measured.baseline.as_ref().unwrap().value, 0.5);
    let default = gate_power(&policy, &shape(16, 16, 6), g, &PowerOptions::default());
    assert!(mde(&measured) < mde(&default));
    // A level gate has no measured rate: its default sd stays.
    let temp = gate_power(&policy, &shape(16, 16, 6), gate(&policy, "gpu_temp"), &options);
    assert_eq!(temp.baseline.as_ref().unwrap().source, BaselineSource::Default);
    // A given rate wins.
    options.baselines.rates.insert("xid_errors".into(), 0.001);
    let given = gate_power(&policy, &shape(16, 16, 6), g, &options);
    assert_eq!(given.baseline.as_ref().unwrap().source, BaselineSource::Given);
    assert_eq!(given.baseline.as_ref().unwrap().value, 0.001);
}

/// A gate's `baseline` in the policy is what a fleet without history plans with: it replaces the
/// default, measured history outranks it, a given one outranks both; a level gate's is its sd.
#[test]
fn a_baseline_the_policy_states_replaces_the_default_but_not_history_or_a_given_one() {
    let source = POLICY
        .replacen("interval: 30m", "baseline: 0.5\n      interval: 30m", 1)
        .replacen("min_effect: 3", "min_effect: 3\n      baseline: 1.5", 1);
    assert_ne!(source, POLICY);
    let policy = orchestrator_policy::parse_policy(&source).unwrap();
    let g = gate(&policy, "xid_errors");
    assert_eq!(g.baseline, Some(0.5));
    let stated = gate_power(&policy, &shape(16, 16, 6), g, &PowerOptions::default());
    let used = stated.baseline.as_ref().unwrap();
    assert_eq!((used.source, used.value), (BaselineSource::Policy, 0.5));
    let default = gate_power(
        &self::policy(),
        &shape(16, 16, 6),
        gate(&self::policy(), "xid_errors"),
        &PowerOptions::default(),
    );
    assert!(mde(&stated) < mde(&default), "50x the default rate gives more events");

    let temp = gate_power(
        &policy,
        &shape(16, 16, 6),
        gate(&policy, "gpu_temp"),
        &PowerOptions::default(),
    );
    let used = temp.baseline.as_ref().unwrap();
    assert_eq!(
        (used.source, used.value, used.measure),
        (BaselineSource::Policy, 1.5, "sd")
    );

    let mut options = PowerOptions {
        history_rates: history_rates(&[("xid_errors_per_gpu_hour".to_owned(), 40.0, 20_000.0)]),
        ..PowerOptions::default()
    };
    let measured = gate_power(&policy, &shape(16, 16, 6), g, &options);
    let used = measured.baseline.as_ref().unwrap();
    assert_eq!((used.source, used.value), (BaselineSource::History, 0.002));
    options.baselines.rates.insert("xid_errors".into(), 0.001);
    let given = gate_power(&policy, &shape(16, 16, 6), g, &options);
    assert_eq!(given.baseline.as_ref().unwrap().source, BaselineSource::Given);
}

#[test]
fn quiet_small_canary_is_limited_by_the_minimum_events() {
    let policy = policy();
    let mut options = PowerOptions::default();
    options.baselines.rates.insert("xid_errors".into(), 1e-4);
    let p = gate_power(&policy, &shape(2, 16, 1), gate(&policy, "xid_errors"), &options);
    let m = p.mde.unwrap();
    assert_eq!(m.limited_by, "min_events");
    // Expected events at the MDE: what Poisson needs to reach 3 with 80% power (~4.5).
    let events = m.expected_canary_events.unwrap();
    assert!((4.0..5.0).contains(&events), "{events}");
}

#[test]
fn no_control_and_unjudged_gates_are_reported_not_computed() {
    let policy = policy();
    let mut wave = shape(16, 0, 6);
    wave.no_control_reason = Some("no comparable node stays behind".into());
    let p = gate_power(&policy, &wave, gate(&policy, "gpu_temp"), &PowerOptions::default());
    assert_eq!(p.status, GateStatus::NoControl);
    assert_eq!(p.note.as_deref(), Some("no comparable node stays behind"));
    assert!(p.mde.is_none() && p.detects_must_detect.is_none());
}

#[test]
fn lint_canary_uses_the_count_and_the_planners_control_size() {
    let policy = policy();
    let canary = canary_without_fleet(&policy).unwrap();
    assert_eq!((canary.canary_nodes, canary.control_nodes), (16, 16));
    let mut small = canary.clone();
    small.canary_nodes = 1;
    small.control_nodes = 16;
    let findings = canary_findings(&policy, &small, &PowerOptions::default());
    let gates: Vec<&str> = findings.iter().map(|(g, _)| g.as_str()).collect();
    assert!(gates.contains(&"xid_errors"), "{findings:?}");
    assert!(
        findings[0].1.contains("canary \"canary\" of 1 node(s) detects x") && findings[0].1.contains("must catch x5"),
        "{findings:?}"
    );
}
