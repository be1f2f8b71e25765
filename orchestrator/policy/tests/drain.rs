//! The workload-drain keys: optional, with defaults, read per wave; the
//! capacity cap beside the other concurrency caps.

use chrono::TimeDelta;
use orchestrator_policy::{DEFAULT_DRAIN_TIMEOUT_HOURS, DrainRules, OnDrainTimeout, parse_policy};

const POLICY: &str = r#"name: t
target:
  component: gpu
  platforms: [hgx]
waves:
  - name: canary
    count: 2
    bake: 1h
    drain_timeout: 90m
    on_drain_timeout: hold
  - name: rest
    rest: true
    bake: 1h
concurrency:
  max_in_flight: 4
  max_out_of_service_percent: 12.5
failure_budget:
  max_failed: 1
rollback:
  automatic: true
  scope: wave
"#;

#[test]
fn drain_keys_per_wave_with_defaults() {
    let policy = parse_policy(POLICY).expect("valid policy");
    assert_eq!(
        policy.waves[0].drain,
        DrainRules {
            timeout: TimeDelta::minutes(90),
            on_timeout: OnDrainTimeout::Hold,
        }
    );
    assert_eq!(policy.waves[1].drain, DrainRules::default());
    assert_eq!(
        DrainRules::default(),
        DrainRules {
            timeout: TimeDelta::hours(DEFAULT_DRAIN_TIMEOUT_HOURS),
            on_timeout: OnDrainTimeout::Skip,
        }
    );
    assert_eq!(policy.concurrency.max_out_of_service_percent, Some(12.5));

    let without = POLICY.replace("  max_out_of_service_percent: 12.5\n", "");
    assert_eq!(
        parse_policy(&without).unwrap().concurrency.max_out_of_service_percent,
        None
    );
}
