//! The criteria files: the shipped examples parse, and mistakes point at file:line:col.

use chrono::TimeDelta;
use orchestrator_rma::{Condition, EvidenceKind, HealthFlag, Severity, check_source, lint_files, parse_criteria};

const NVIDIA: &str = include_str!("../../../policies/rma/nvidia-gpu.yaml");
const ODM: &str = include_str!("../../../policies/rma/example-odm-baseboard.yaml");

#[test]
fn shipped_examples_parse() {
    let c = parse_criteria(NVIDIA).expect("nvidia-gpu.yaml is valid");
    assert_eq!((c.vendor.as_str(), c.part_kind.as_str()), ("nvidia", "gpu"));
    assert_eq!(c.quota.submissions, 5);
    assert_eq!(c.quota.period, TimeDelta::weeks(1));
    assert_eq!(c.firmware_suspect_window, TimeDelta::hours(72));
    assert!(c.required_evidence.contains(&EvidenceKind::FieldDiagnostic));
    let remap = &c.rules[0];
    assert_eq!(remap.condition, Condition::Flag(HealthFlag::RowRemapFailure));
    assert_eq!(remap.confirm_within, Some(TimeDelta::days(14)));
    assert_eq!(remap.severity, Severity::Critical);
    assert!(c.documents[&remap.document].edition.contains("DA-09826-002"));
    let bus = c.rules.iter().find(|r| r.name == "fallen_off_bus").expect("rule");
    assert_eq!(
        bus.condition,
        Condition::Xid {
            codes: vec![79],
            at_least: 3,
            within: TimeDelta::hours(24)
        }
    );
    let odm = parse_criteria(ODM).expect("example-odm-baseboard.yaml is valid");
    assert!(matches!(odm.rules[0].condition, Condition::BmcSilentAfterFlash { .. }));
    let reports = lint_files([
        ("nvidia-gpu.yaml".to_owned(), NVIDIA.to_owned()),
        ("odm.yaml".to_owned(), ODM.to_owned()),
    ]);
    assert!(
        reports.iter().all(|r| r.rendered().is_empty()),
        "{:?}",
        reports.iter().map(|r| r.rendered()).collect::<Vec<_>>()
    );
}

/// Replaces the first occurrence of `from` in the NVIDIA example and returns the rendered findings.
fn findings(from: &str, to: &str) -> Vec<String> {
    assert!(NVIDIA.contains(from), "{from:?} not in the example");
    let text = NVIDIA.replacen(from, to, 1);
    let checked = check_source(&text);
    assert!(checked.criteria.is_none(), "expected a refusal for {to:?}");
    checked
        .diagnostics
        .iter()
        .map(|d| d.render("nvidia-gpu.yaml"))
        .collect()
}

fn line_of(needle: &str) -> usize {
    NVIDIA.lines().position(|l| l.contains(needle)).expect("line") + 1
}

#[test]
fn mistakes_point_at_their_line_and_column() {
    let l = line_of("severity: critical");
    assert_eq!(
        findings("severity: critical", "severity: urgent"),
        [format!(
            "nvidia-gpu.yaml:{l}:15: unknown severity \"urgent\"; expected low, medium, high or critical"
        )]
    );
    let l = line_of("per: 1w");
    let got = findings("per: 1w", "per: 1 fortnight");
    assert_eq!(got.len(), 1);
    assert!(
        got[0].starts_with(&format!("nvidia-gpu.yaml:{l}:8: quota.per: invalid duration")),
        "{got:?}"
    );
    let l = line_of("when: { flag: row_remap_failure }");
    assert_eq!(
        findings("when: { flag: row_remap_failure }", "when: { flag: row_remap_flag }"),
        [format!(
            "nvidia-gpu.yaml:{l}:19: unknown flag \"row_remap_flag\"; expected row_remap_failure or sram_threshold_exceeded"
        )]
    );
    let l = line_of("document: xid_errors");
    let got = findings("document: xid_errors", "document: xid_catalogue");
    assert_eq!(
        got,
        [format!(
            "nvidia-gpu.yaml:{l}:25: document \"xid_catalogue\" is not listed under documents"
        )]
    );
}

#[test]
fn structural_mistakes_are_refused() {
    // Unknown key: a typo must not be ignored.
    let got = findings("turnaround: 10d", "turnround: 10d");
    assert!(got[0].contains("turnround"), "{got:?}");
    // Two conditions in one rule.
    let got = findings(
        "when: { flag: row_remap_failure }",
        "when: { flag: row_remap_failure, series_vanished: { for: 1h } }",
    );
    assert!(got[0].contains("exactly one of"), "{got:?}");
    // Confirmation without the diagnostic among the required evidence.
    let got = findings("  - field_diagnostic\n", "");
    assert_eq!(got.len(), 4, "one per confirmed rule: {got:?}");
    assert!(
        got.iter()
            .all(|g| g.contains("needs field_diagnostic in required_evidence"))
    );
    // Duplicate rule names and unknown evidence.
    let got = findings("name: sram_threshold_exceeded", "name: row_remap_failure");
    assert!(got[0].contains("used twice"), "{got:?}");
    let got = findings("  - bug_report\n", "  - bug_reprot\n");
    assert!(got[0].contains("unknown evidence \"bug_reprot\""), "{got:?}");
    // XID count out of range.
    let got = findings("at_least: 3", "at_least: 0");
    assert!(got[0].contains("xid.at_least must be"), "{got:?}");
    // Not https.
    let got = findings(
        "url: https://docs.nvidia.com/deploy/rma-process/index.html",
        "url: http://example.com",
    );
    assert!(got[0].contains("https://"), "{got:?}");
}

#[test]
fn one_file_per_vendor_and_part_kind() {
    let reports = lint_files([
        ("a.yaml".to_owned(), NVIDIA.to_owned()),
        ("b.yaml".to_owned(), NVIDIA.to_owned()),
    ]);
    assert!(reports[0].checked.criteria.is_some());
    assert!(reports[1].checked.criteria.is_none());
    assert_eq!(
        reports[1].rendered(),
        ["b.yaml:1:1: vendor \"nvidia\" part kind \"gpu\" is already defined by a.yaml"]
    );
}

#[test]
fn hostile_input_is_refused_without_panicking() {
    for text in ["", "[", "vendor: [1, 2]", "\u{0}", &"a: ".repeat(100_000)] {
        let checked = check_source(text);
        assert!(checked.criteria.is_none());
        assert!(!checked.diagnostics.is_empty());
    }
}
