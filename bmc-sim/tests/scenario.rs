//! Scenario validation: every rejection names the key path and the reason.

use bmc_sim::{Metric, Scenario, ScenarioError};

const ISSUE: &str = include_str!("../scenarios/issue-3.yaml");
const SMALL: &str = include_str!("../scenarios/small.yaml");

#[test]
fn example_scenarios_parse() {
    let s = Scenario::from_yaml_str(ISSUE).expect("issue-3 scenario parses");
    assert_eq!(s.seed, 7);
    assert_eq!(s.fleet.nodes, 1000);
    assert_eq!(s.fleet.components.len(), 9, "{{0..7}} expands to 8 GPU entries");
    assert_eq!(s.fleet.components[8].id, "HGX_FW_GPU_7");
    assert_eq!(s.firmware[0].effects[0].metric, Metric::XidErrorsPerGpuHour);
    assert_eq!(s.firmware[0].effects[0].onset, std::time::Duration::from_secs(1800));
    assert_eq!(s.firmware[0].flash_time.max, std::time::Duration::from_secs(540));
    assert_eq!(s.events[0].at, std::time::Duration::from_secs(7200));
    assert_eq!(s.bmc_faults.reset_time.min, std::time::Duration::from_secs(60));
    Scenario::from_yaml_str(SMALL).expect("small scenario parses");
}

/// Replaces `from` in the issue scenario with `to` and checks the error mentions every `needles`.
fn check(from: &str, to: &str, needles: &[&str]) {
    assert!(ISSUE.contains(from), "test bug: `{from}` not in the scenario");
    let yaml = ISSUE.replacen(from, to, 1);
    let err = Scenario::from_yaml_str(&yaml).expect_err(&format!("`{to}` should be rejected"));
    // The whole chain: serde-saphyr puts the detail (with line/column) in the source.
    let text = orchestrator_types::error_sources(&err)
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(" / ");
    for n in needles {
        assert!(text.contains(n), "error for `{to}` should mention `{n}`: {text}");
    }
}

#[test]
fn rejections_name_key_path_and_reason() {
    let cases: &[(&str, &str, &[&str])] = &[
        // Unknown metric.
        (
            "{metric: xid_errors_per_gpu_hour, multiply",
            "{metric: xid_per_fortnight, multiply",
            &["firmware[0].effects[0].metric", "unknown metric `xid_per_fortnight`"],
        ),
        (
            "- {metric: gpu_temp_c, add: 4.0",
            "- {metric: gpu_tmp, add: 4.0",
            &["events[0].metric", "unknown metric"],
        ),
        // Negative rates.
        (
            "xid_errors_per_gpu_hour: 0.002",
            "xid_errors_per_gpu_hour: -0.5",
            &["baseline.xid_errors_per_gpu_hour", "non-negative"],
        ),
        (
            "pcie_aer_per_node_hour: 0.01",
            "pcie_aer_per_node_hour: -1",
            &["baseline.pcie_aer_per_node_hour"],
        ),
        (
            "unavailable_rate: 0.02",
            "unavailable_rate: -0.02",
            &["bmc_faults.unavailable_rate"],
        ),
        (
            "flash_fail_rate: 0.01",
            "flash_fail_rate: 1.5",
            &["firmware[0].flash_fail_rate", "between 0 and 1"],
        ),
        ("multiply: 3.0", "multiply: -3.0", &["firmware[0].effects[0].multiply"]),
        ("share: 0.2", "share: 2", &["firmware[0].effects[0].share"]),
        (
            "gpu_temp_c: {mean: 62, sd: 3}",
            "gpu_temp_c: {mean: 62, sd: -3}",
            &["baseline.gpu_temp_c.sd"],
        ),
        // Unparsable durations.
        (
            "flash_time: {min: 5m, max: 9m}",
            "flash_time: {min: 5 minutes, max: 9m}",
            &["firmware[0].flash_time.min", "unparsable duration"],
        ),
        (
            "onset: 30m}",
            "onset: 30}",
            &["firmware[0].effects[0].onset", "without a unit"],
        ),
        ("at: 2h,", "at: soon,", &["events[0].at", "unparsable duration"]),
        (
            "reset_time: {min: 60s, max: 120s}",
            "reset_time: {min: 60s, max: 2w}",
            &["bmc_faults.reset_time.max"],
        ),
        (
            "flash_time: {min: 5m, max: 9m}",
            "flash_time: {min: 9m, max: 5m}",
            &["firmware[0].flash_time.max", "below"],
        ),
        // Unknown keys and bad enums.
        (
            "brick_rate: 0.0",
            "brick_rate: 0.0\n    brick_chance: 0.1",
            &["brick_chance"],
        ),
        ("seed: 7", "seed: 7\nsede: 8", &["sede"]),
        (
            "kind: gpu\n    version",
            "kind: toaster\n    version",
            &["firmware[0].kind", "toaster"],
        ),
        ("nodes: 1000", "nodes: 0", &["fleet.nodes", "at least 1"]),
        (
            "\"HGX_FW_GPU_{0..7}\"",
            "\"HGX_FW_GPU_{7..0}\"",
            &["fleet.components[1].id"],
        ),
        ("{id: BMC_Firmware,", "{id: HGX_FW_GPU_3,", &["duplicate component id"]),
        (
            "version: \"96.00.5E.00.01\"}",
            "version: \"96.00.5E.00.01\", lowest_supported_version: \" \"}",
            &["fleet.components[1].lowest_supported_version", "must not be empty"],
        ),
        (
            "version: \"96.00.5E.00.01\"}",
            "version: \"96.00.5E.00.01\", lowest_suported_version: \"96.00.61.00.00\"}",
            &["lowest_suported_version"],
        ),
        (
            "{metric: gpu_temp_c, add: 2.5, share: 1.0, onset: 0s}",
            "{metric: gpu_temp_c, share: 1.0}",
            &["firmware[0].effects[1]", "multiply` or `add"],
        ),
    ];
    for (from, to, needles) in cases {
        check(from, to, needles);
    }
}

#[test]
fn syntax_errors_are_reported_not_panicked() {
    for bad in ["", "seed: [", "fleet: 3", "- just\n- a list"] {
        let err = Scenario::from_yaml_str(bad).expect_err(bad);
        assert!(
            matches!(err, ScenarioError::Syntax(_) | ScenarioError::Invalid { .. }),
            "{bad}: {err}"
        );
    }
}
