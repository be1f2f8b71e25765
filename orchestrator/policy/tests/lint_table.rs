//! Data-driven: broken policies and the exact `file:line:col: message` lines
//! the lint must print for them. Each case edits a small valid policy.

use orchestrator_policy::lint_files;

const BASE: &str = r#"name: t
target:
  component: gpu
  platforms: [hgx]
waves:
  - name: canary
    count: 2
    bake: 1h
  - name: rest
    rest: true
    bake: 1h
concurrency:
  max_in_flight: 4
maintenance_windows:
  - cron: "0 0 2 * * *"
    duration: 4h
    timezone: UTC
health:
  gates:
    - name: xid
      source: redfish
      metric: xid_errors_per_gpu_hour
      kind: rate
      direction: increase_is_bad
      min_effect: 1.5
      interval: 30m
failure_budget:
  max_failed: 1
rollback:
  automatic: true
  scope: wave
"#;

/// Lints `BASE` with each `(from, to)` replacement applied (each `from`
/// must occur) and returns every rendered line.
fn lint(edits: &[(&str, &str)]) -> Vec<String> {
    let mut text = BASE.to_owned();
    for (from, to) in edits {
        assert!(text.contains(from), "edit target {from:?} not in the policy");
        text = text.replacen(from, to, 1);
    }
    let reports = lint_files([("t.yaml".to_owned(), text.into_bytes())]);
    reports.iter().flat_map(|r| r.rendered()).collect()
}

type Case = (
    &'static str,
    &'static [(&'static str, &'static str)],
    &'static [&'static str],
);

const CASES: &[Case] = &[
    ("base policy is clean", &[], &[]),
    (
        "typo in a key",
        &[("    bake: 1h\n  - name: rest", "    bake_tme: 1h\n  - name: rest")],
        &[
            "t.yaml:8:5: unknown field `bake_tme`, expected one of name, count, percent, rest, bake, approval, approvers, max_in_flight, stratify_by, gates, max_bake, must_detect, drain_timeout, on_drain_timeout",
        ],
    ),
    (
        "unknown top-level key",
        &[("name: t\n", "name: t\nowner: me\n")],
        &[
            "t.yaml:2:1: unknown field `owner`, expected one of name, description, target, versions, qualification, waves, concurrency, maintenance_windows, health, failure_budget, rollback, detection, update",
        ],
    ),
    (
        "an update path no Redfish service offers",
        &[("name: t\n", "name: t\nupdate:\n  path: ftp_push\n")],
        &["t.yaml:3:9: unknown variant `ftp_push`, expected one of auto, simple_update, multipart_push, http_push"],
    ),
    (
        "yaml syntax error",
        &[("  platforms: [hgx]", "  platforms: [hgx")],
        &["t.yaml:5:6: illegal placement of ':' indicator"],
    ),
    (
        "wrong type",
        &[("max_in_flight: 4", "max_in_flight: four")],
        &["t.yaml:13:18: expected a whole number"],
    ),
    (
        "missing required section",
        &[("rollback:\n  automatic: true\n  scope: wave\n", "")],
        &["t.yaml:27:1: missing field `rollback`"],
    ),
    (
        "non-yaml-1.2 boolean",
        &[("automatic: true", "automatic: yes")],
        &["t.yaml:30:14: invalid boolean (true or false expected)"],
    ),
    (
        "unknown enum value",
        &[("scope: wave", "scope: fleet")],
        &["t.yaml:31:10: unknown variant `fleet`, expected one of wave, rollout"],
    ),
    (
        "duplicate key",
        &[("  max_in_flight: 4\n", "  max_in_flight: 4\n  max_in_flight: 5\n")],
        &["t.yaml:14:3: duplicate mapping key `max_in_flight` is not allowed here"],
    ),
    (
        "decreasing counts",
        &[(
            "    count: 2\n    bake: 1h\n",
            "    count: 8\n    bake: 1h\n  - name: second\n    count: 4\n    bake: 1h\n",
        )],
        &[
            "t.yaml:10:12: wave \"second\" takes 4 nodes, fewer than the 8 of the previous wave \"canary\"; wave sizes must not decrease",
        ],
    ),
    (
        "decreasing percents",
        &[(
            "    count: 2\n    bake: 1h\n",
            "    percent: 10\n    bake: 1h\n  - name: second\n    percent: 5\n    bake: 1h\n",
        )],
        &[
            "t.yaml:10:14: wave \"second\" takes 5%, less than the 10% of the previous wave \"canary\"; wave sizes must not decrease",
        ],
    ),
    (
        "count after percent",
        &[(
            "    count: 2\n    bake: 1h\n",
            "    percent: 10\n    bake: 1h\n  - name: second\n    count: 50\n    bake: 1h\n",
        )],
        &[
            "t.yaml:10:12: wave \"second\" has a fixed count after a percentage wave; it would shrink relative to the waves before it as the fleet grows",
        ],
    ),
    (
        "percentages reach 100",
        &[(
            "    count: 2\n    bake: 1h\n",
            "    percent: 40\n    bake: 1h\n  - name: second\n    percent: 60\n    bake: 1h\n",
        )],
        &[
            "t.yaml:10:14: percentage waves up to \"second\" add up to 100%, leaving nothing for the waves after; the last wave should be `rest: true`",
        ],
    ),
    (
        "last wave not rest",
        &[("    rest: true\n", "    count: 4\n")],
        &["t.yaml:10:12: the last wave \"rest\" must be `rest: true` so that every eligible node is covered"],
    ),
    (
        "rest not last",
        &[
            ("name: rest\n    rest: true", "name: rest\n    count: 4"),
            ("    count: 2\n", "    rest: true\n"),
        ],
        &[
            "t.yaml:7:11: wave \"canary\" takes the rest of the nodes, so it must be the last wave",
            "t.yaml:7:11: warning: the first wave \"canary\" takes every node: there is no canary",
            "t.yaml:10:12: the last wave \"rest\" must be `rest: true` so that every eligible node is covered",
        ],
    ),
    (
        "two sizes",
        &[("    count: 2\n", "    count: 2\n    percent: 5\n")],
        &["t.yaml:8:14: wave \"canary\" must set exactly one of `count`, `percent` or `rest: true`"],
    ),
    (
        "no size",
        &[("    count: 2\n", "")],
        &["t.yaml:6:11: wave \"canary\" must set exactly one of `count`, `percent` or `rest: true`"],
    ),
    (
        "percent out of range",
        &[("    count: 2\n", "    percent: 150\n")],
        &["t.yaml:7:14: wave \"canary\" percent must be a percentage in (0, 100), got 150"],
    ),
    (
        "zero count",
        &[("    count: 2\n", "    count: 0\n")],
        &["t.yaml:7:12: wave \"canary\" count must be between 1 and 10000000, got 0"],
    ),
    (
        "bad cron",
        &[("0 0 2 * * *", "0 0 25 * * *")],
        &[
            "t.yaml:15:11: invalid cron expression \"0 0 25 * * *\" (Hours must be less than 23. ('25' specified.)); expected sec min hour day-of-month month day-of-week [year]",
        ],
    ),
    (
        "five-field cron",
        &[("0 0 2 * * *", "0 2 * * *")],
        &[
            "t.yaml:15:11: cron expression \"0 2 * * *\" has 5 fields; this format has a seconds field first: sec min hour day-of-month month day-of-week [year], e.g. \"0 0 2 * * Tue\"",
        ],
    ),
    (
        "bad duration",
        &[("duration: 4h", "duration: 4 hours")],
        &[
            "t.yaml:16:15: maintenance window duration: invalid duration \"4 hours\"; write a number followed by a unit s, m, h, d or w, e.g. `30m`, `1h30m`",
        ],
    ),
    (
        "zero duration",
        &[("duration: 4h", "duration: 0m")],
        &["t.yaml:16:15: maintenance window duration: duration \"0m\" must be positive"],
    ),
    (
        "bad time zone",
        &[("timezone: UTC", "timezone: Mars/Olympus")],
        &[
            "t.yaml:17:15: unknown time zone \"Mars/Olympus\"; use an IANA name such as \"UTC\" or \"America/Los_Angeles\"",
        ],
    ),
    (
        "bake shorter than interval",
        &[("    count: 2\n    bake: 1h", "    count: 2\n    bake: 10m")],
        &["t.yaml:8:11: wave \"canary\" bake time 10m is shorter than the evaluation interval 30m of gate \"xid\""],
    ),
    (
        "unknown gate",
        &[("    count: 2\n", "    count: 2\n    gates: [xid, temp]\n")],
        &["t.yaml:8:18: wave \"canary\" refers to unknown health gate \"temp\"; defined gates: xid"],
    ),
    (
        "unknown metric",
        &[("metric: xid_errors_per_gpu_hour", "metric: xid_errors")],
        &[
            "t.yaml:22:15: gate \"xid\": unknown redfish metric \"xid_errors\"; known metrics: xid_errors_per_gpu_hour, pcie_aer_per_node_hour, link_degraded_per_node_day, gpu_temp_c, gpu_power_w, flash_failures",
        ],
    ),
    (
        "metric kind mismatch",
        &[("kind: rate", "kind: level")],
        &["t.yaml:23:13: gate \"xid\": metric xid_errors_per_gpu_hour is a rate, not a level"],
    ),
    (
        "rate effect not a ratio",
        &[("min_effect: 1.5", "min_effect: 0.5")],
        &[
            "t.yaml:25:19: gate \"xid\": min_effect 0.5 is invalid: for a rate it is the canary/control rate ratio and must be greater than 1 (1.5 = 50% worse)",
        ],
    ),
    (
        "prometheus without query",
        &[(
            "source: redfish\n      metric: xid_errors_per_gpu_hour\n",
            "source: prometheus\n",
        )],
        &["t.yaml:21:15: gate \"xid\": source prometheus needs a `query`"],
    ),
    (
        "redfish without metric",
        &[("      metric: xid_errors_per_gpu_hour\n", "")],
        &["t.yaml:21:15: gate \"xid\": source redfish needs a `metric`"],
    ),
    (
        "alpha out of range",
        &[("health:\n", "health:\n  alpha: 0.9\n")],
        &["t.yaml:19:10: health.alpha is a false-alarm rate and must be in (0, 0.5], got 0.9"],
    ),
    (
        "bad alert matcher",
        &[(
            "failure_budget:",
            "  alerts:\n    - matchers: ['severity', 'alertname=~\"(\"']\n      action: pause\nfailure_budget:",
        )],
        &[
            "t.yaml:28:18: invalid matcher \"severity\"; expected label=\"value\" with one of =, !=, =~, !~",
            "t.yaml:28:30: invalid regex in matcher \"alertname=~\\\"(\\\"\": error: unclosed group",
        ],
    ),
    (
        "approvers without manual",
        &[("    count: 2\n", "    count: 2\n    approvers: 2\n")],
        &["t.yaml:8:16: wave \"canary\": `approvers` needs `approval: manual`"],
    ),
    (
        "too many approvers",
        &[(
            "    rest: true\n",
            "    rest: true\n    approval: manual\n    approvers: 40\n",
        )],
        &["t.yaml:12:16: wave \"rest\" approvers must be between 1 and 16, got 40"],
    ),
    (
        "manual approval on the first wave",
        &[("    count: 2\n", "    count: 2\n    approval: manual\n")],
        &[
            "t.yaml:8:15: the first wave \"canary\" cannot ask for manual approval: a wave's approval is given at the end of the previous wave's bake, and starting the rollout is the first wave's",
        ],
    ),
    (
        "a prometheus rate gate on a query already wrapped in rate()",
        &[(
            "      source: redfish\n      metric: xid_errors_per_gpu_hour\n",
            "      source: prometheus\n      query: 'sum by (node) (rate(xid_total[5m]))'\n",
        )],
        &[
            "t.yaml:22:14: gate \"xid\": the query is already wrapped in rate(); a rate gate takes the bare counter selector and computes the increase itself over each node's exact exposure window, counter resets included",
        ],
    ),
    (
        "a prometheus rate gate on a counter",
        &[(
            "      source: redfish\n      metric: xid_errors_per_gpu_hour\n",
            "      source: prometheus\n      query: 'DCGM_FI_DEV_PCIE_REPLAY_COUNTER{job=\"dcgm\"}'\n",
        )],
        &[],
    ),
    (
        "a prometheus rate gate on the windowed XID count",
        &[(
            "      source: redfish\n      metric: xid_errors_per_gpu_hour\n",
            "      source: prometheus\n      query: DCGM_EXP_XID_ERRORS_COUNT\n",
        )],
        &[],
    ),
    (
        "a prometheus rate gate on the last-XID gauge",
        &[(
            "      source: redfish\n      metric: xid_errors_per_gpu_hour\n",
            "      source: prometheus\n      query: DCGM_FI_DEV_XID_ERRORS\n",
        )],
        &[
            "t.yaml:22:14: gate \"xid\": DCGM_FI_DEV_XID_ERRORS is a last-value state (dcgm-exporter declares it a gauge), not a count of events; a rate gate needs a counter such as DCGM_FI_DEV_PCIE_REPLAY_COUNTER or the windowed DCGM_EXP_XID_ERRORS_COUNT; gate a level with `kind: level`",
        ],
    ),
    (
        "a prometheus rate gate on GPU temperature",
        &[(
            "      source: redfish\n      metric: xid_errors_per_gpu_hour\n",
            "      source: prometheus\n      query: 'DCGM_FI_DEV_GPU_TEMP{job=\"dcgm\"}'\n",
        )],
        &[
            "t.yaml:22:14: gate \"xid\": DCGM_FI_DEV_GPU_TEMP is a gauge (dcgm-exporter declares it a gauge), not a count of events; a rate gate needs a counter such as DCGM_FI_DEV_PCIE_REPLAY_COUNTER or the windowed DCGM_EXP_XID_ERRORS_COUNT; gate a level with `kind: level`",
        ],
    ),
    (
        "a prometheus rate gate on an unknown metric",
        &[(
            "      source: redfish\n      metric: xid_errors_per_gpu_hour\n",
            "      source: prometheus\n      query: my_errors_total\n",
        )],
        &[
            "t.yaml:22:14: warning: gate \"xid\": my_errors_total is not in the built-in exporter table, so it is read as a counter; check its type with `waveguard policy lint --prometheus URL`",
        ],
    ),
    (
        "a prometheus level gate on a bare counter",
        &[
            (
                "      source: redfish\n      metric: xid_errors_per_gpu_hour\n",
                "      source: prometheus\n      query: DCGM_FI_DEV_PCIE_REPLAY_COUNTER\n",
            ),
            ("kind: rate", "kind: level"),
            ("min_effect: 1.5", "min_effect: 5"),
        ],
        &[
            "t.yaml:22:14: gate \"xid\": DCGM_FI_DEV_PCIE_REPLAY_COUNTER is a counter; as a level it compares totals since each node's last restart, not errors during the bake; use `kind: rate`",
        ],
    ),
    (
        "a flash failures gate",
        &[("metric: xid_errors_per_gpu_hour", "metric: flash_failures")],
        &[
            "t.yaml:22:15: gate \"xid\": flash failures cannot be a health gate: no control node flashes to compare with; the wave's `failure_budget` (max_failed or max_failed_percent) halts a wave whose flashes fail",
        ],
    ),
    (
        "bad component",
        &[("component: gpu", "component: fpga")],
        &[
            "t.yaml:3:14: target.component: unknown component kind \"fpga\"; expected one of: bmc, gpu, nic, bios, cpld, other",
        ],
    ),
    (
        "bad version constraint",
        &[(
            "  platforms: [hgx]\n",
            "  platforms: [hgx]\nversions:\n  from: \">= 2.0, < 1.0\"\n",
        )],
        &[
            "t.yaml:6:9: versions.from: version constraint \">= 2.0, < 1.0\" can never match: its lower bound is not below its upper bound",
        ],
    ),
    (
        "bad version in list",
        &[(
            "  platforms: [hgx]\n",
            "  platforms: [hgx]\nversions:\n  from: [\"1.0\", \"1.0!\"]\n",
        )],
        &[
            "t.yaml:6:9: versions.from: version constraint term \"1.0!\" has an invalid version: firmware version \"1.0!\" contains the character '!', which no vendor scheme uses",
        ],
    ),
    (
        "duplicate wave name",
        &[("  - name: rest", "  - name: canary")],
        &["t.yaml:9:11: duplicate wave name \"canary\""],
    ),
    (
        "bad policy name",
        &[("name: t\n", "name: My Policy\n")],
        &[
            "t.yaml:1:7: policy name \"My Policy\" must start with a lowercase letter or digit and use only lowercase letters, digits, '-', '_' and '.' (at most 64 characters)",
        ],
    ),
    (
        "failure budget both",
        &[("  max_failed: 1\n", "  max_failed: 1\n  max_failed_percent: 5\n")],
        &["t.yaml:29:23: failure_budget: set either `max_failed` or `max_failed_percent`, not both"],
    ),
    (
        "empty platforms",
        &[("platforms: [hgx]", "platforms: []")],
        &["t.yaml:4:14: target.platforms must name at least one platform"],
    ),
    (
        "wave above fleet limit warns",
        &[("    count: 2\n", "    count: 2\n    max_in_flight: 8\n")],
        &[
            "t.yaml:8:20: warning: wave \"canary\" max_in_flight 8 is above concurrency.max_in_flight 4; the lower limit applies",
        ],
    ),
    (
        "no windows warns",
        &[(
            "maintenance_windows:\n  - cron: \"0 0 2 * * *\"\n    duration: 4h\n    timezone: UTC\n",
            "",
        )],
        &["t.yaml:1:1: warning: no maintenance_windows: new flashes may start at any time"],
    ),
    (
        "several semantic errors at once",
        &[
            ("count: 2", "count: -1"),
            ("duration: 4h", "duration: 4"),
            ("timezone: UTC", "timezone: utc/x"),
            ("max_in_flight: 4", "max_in_flight: 0"),
        ],
        &[
            "t.yaml:7:12: wave \"canary\" count must be between 1 and 10000000, got -1",
            "t.yaml:13:18: concurrency.max_in_flight must be between 1 and 10000000, got 0",
            "t.yaml:16:15: maintenance window duration: invalid duration \"4\"; write a number followed by a unit s, m, h, d or w, e.g. `30m`, `1h30m`",
            "t.yaml:17:15: unknown time zone \"utc/x\"; use an IANA name such as \"UTC\" or \"America/Los_Angeles\"",
        ],
    ),
    (
        "drain keys are optional and valid",
        &[
            (
                "    count: 2\n    bake: 1h\n",
                "    count: 2\n    bake: 1h\n    drain_timeout: 2h\n    on_drain_timeout: hold\n",
            ),
            (
                "  max_in_flight: 4\n",
                "  max_in_flight: 4\n  max_out_of_service_percent: 10\n",
            ),
        ],
        &[],
    ),
    (
        "drain timeout longer than a week",
        &[(
            "    count: 2\n    bake: 1h\n",
            "    count: 2\n    bake: 1h\n    drain_timeout: 8d\n",
        )],
        &[
            "t.yaml:9:20: wave \"canary\" drain_timeout 8d is longer than 7 days; drained nodes are capacity out of service",
        ],
    ),
    (
        "drain timeout under a minute",
        &[(
            "    count: 2\n    bake: 1h\n",
            "    count: 2\n    bake: 1h\n    drain_timeout: 30s\n",
        )],
        &[
            "t.yaml:9:20: warning: wave \"canary\" drain_timeout 30s is under a minute: nearly every busy node will time out",
        ],
    ),
    (
        "unknown on_drain_timeout",
        &[(
            "    count: 2\n    bake: 1h\n",
            "    count: 2\n    bake: 1h\n    on_drain_timeout: fail\n",
        )],
        &["t.yaml:9:23: unknown variant `fail`, expected one of skip, hold"],
    ),
    (
        "capacity cap out of range",
        &[(
            "  max_in_flight: 4\n",
            "  max_in_flight: 4\n  max_out_of_service_percent: 0\n",
        )],
        &["t.yaml:14:31: concurrency.max_out_of_service_percent must be a percentage in (0, 100], got 0"],
    ),
    (
        "scale-up domain cap under its new name",
        &[("  max_in_flight: 4\n", "  max_in_flight: 4\n  per_domain: 1\n")],
        &[],
    ),
    (
        "scale-up domain cap under its older name still lints clean",
        &[("  max_in_flight: 4\n", "  max_in_flight: 4\n  per_nvlink_domain: 1\n")],
        &[],
    ),
    (
        "scale-up domain cap out of range",
        &[("  max_in_flight: 4\n", "  max_in_flight: 4\n  per_domain: 0\n")],
        &["t.yaml:14:15: concurrency.per_domain must be between 1 and 10000000, got 0"],
    ),
    (
        "both names of the scale-up domain cap",
        &[(
            "  max_in_flight: 4\n",
            "  max_in_flight: 4\n  per_domain: 1\n  per_nvlink_domain: 1\n",
        )],
        &["t.yaml:15:22: concurrency: give per_domain or its older name per_nvlink_domain, not both"],
    ),
    (
        "a wave's must_detect names a gate the wave does not watch",
        &[(
            "    bake: 1h\n  - name: rest",
            "    bake: 1h\n    must_detect: {aer: 2}\n  - name: rest",
        )],
        &["t.yaml:9:24: wave \"canary\" must_detect names gate \"aer\", which the wave does not watch; its gates: xid"],
    ),
    (
        "a wave's must_detect below the gate's min_effect",
        &[(
            "    bake: 1h\n  - name: rest",
            "    bake: 1h\n    must_detect: {xid: 1.2}\n  - name: rest",
        )],
        &[
            "t.yaml:9:24: wave \"canary\" must_detect 1.2 for gate \"xid\" is invalid: it is a rate ratio this wave must rule out to pass and must be at least the gate's min_effect 1.5",
        ],
    ),
    (
        "a gate states the fleet's base rate",
        &[(
            "      min_effect: 1.5\n",
            "      min_effect: 1.5\n      baseline: 0.002\n",
        )],
        &[],
    ),
    (
        "a gate's stated base rate of zero",
        &[("      min_effect: 1.5\n", "      min_effect: 1.5\n      baseline: 0\n")],
        &[
            "t.yaml:26:17: gate \"xid\": baseline 0 is invalid: it is the fleet's events per unit of the gate's exposure (e.g. 0.002 XIDs per GPU-hour) and must be a number greater than 0",
        ],
    ),
    (
        "a gate's stated base rate that is not a number",
        &[(
            "      min_effect: 1.5\n",
            "      min_effect: 1.5\n      baseline: low\n",
        )],
        &["t.yaml:26:17: invalid floating point"],
    ),
    (
        "a wave's own must_detect for a gate it watches",
        &[(
            "    bake: 1h\n  - name: rest",
            "    bake: 1h\n    must_detect: {xid: 2}\n  - name: rest",
        )],
        &[],
    ),
    (
        "a soak no longer than the longest bake",
        &[
            ("    count: 2\n    bake: 1h", "    count: 2\n    bake: 12h"),
            ("rollback:\n", "detection:\n  soak: {min: 12h, max: 10d}\nrollback:\n"),
        ],
        &[
            "t.yaml:30:15: warning: detection.soak.min 12h is not longer than the plausible onset of a delayed regression (12h, the longest wave bake; state it with detection.soak.onset): the soak may pass before such a regression shows on the last wave's nodes; make soak.min longer",
        ],
    ),
    (
        "a soak longer than the longest bake",
        &[
            ("    count: 2\n    bake: 1h", "    count: 2\n    bake: 12h"),
            ("rollback:\n", "detection:\n  soak: {min: 13h, max: 10d}\nrollback:\n"),
        ],
        &[],
    ),
    (
        "a soak no longer than the stated onset",
        &[(
            "rollback:\n",
            "detection:\n  soak: {min: 1d, max: 10d, onset: 2d}\nrollback:\n",
        )],
        &[
            "t.yaml:30:15: warning: detection.soak.min 1d is not longer than the plausible onset of a delayed regression (2d, detection.soak.onset): the soak may pass before such a regression shows on the last wave's nodes; make soak.min longer",
        ],
    ),
];

#[test]
fn broken_policies_give_the_expected_diagnostics() {
    let mut failures = Vec::new();
    for (what, edits, expected) in CASES {
        let actual = lint(edits);
        if actual != *expected {
            failures.push(format!("{what}:\n  expected {expected:#?}\n  actual   {actual:#?}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{} case(s) differ:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn cross_file_rules_and_raw_bytes() {
    let base = BASE.as_bytes().to_vec();
    let reports = lint_files([
        ("a/t.yaml".to_owned(), base.clone()),
        ("b/t.yaml".to_owned(), base.clone()),
        (
            "other.yaml".to_owned(),
            BASE.replace("name: t\n", "name: u\n").into_bytes(),
        ),
        ("bad.yaml".to_owned(), b"name: t\n  x: \xff\n".to_vec()),
    ]);
    let lines: Vec<String> = reports.iter().flat_map(|r| r.rendered()).collect();
    assert_eq!(
        lines,
        vec![
            "b/t.yaml:1:7: policy name \"t\" is already used by a/t.yaml",
            "other.yaml:1:7: warning: policy name \"u\" differs from the file name \"other\"",
            "bad.yaml:2:6: policy file is not valid UTF-8",
        ]
    );
    assert!(reports[0].checked.policy.is_some());
    assert!(reports[1].checked.policy.is_none(), "a duplicate is refused");
    assert!(reports[2].checked.policy.is_some(), "warnings do not refuse a policy");
}

#[test]
fn oversized_files_are_refused_without_parsing() {
    let mut big = BASE.to_owned();
    big.push_str(&"# padding\n".repeat(orchestrator_policy::MAX_POLICY_BYTES / 10 + 1));
    let checked = orchestrator_policy::check_bytes(big.as_bytes());
    assert!(checked.has_errors());
    assert_eq!(checked.diagnostics[0].position, orchestrator_policy::Position::START);
}
