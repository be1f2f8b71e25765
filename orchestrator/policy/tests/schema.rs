//! The JSON Schema in `policies/` accepts exactly the keys the Rust model
//! accepts, so editors and the lint agree. The model's key set is read from
//! its own "unknown field ... expected one of" message.

use std::collections::BTreeSet;

use orchestrator_policy::check_source;

const POLICY: &str = include_str!("../../../policies/hgx-gpu-firmware.yaml");
const SCHEMA: &str = include_str!("../../../policies/policy.schema.json");

/// Keys the model accepts at the mapping where `anchor` (a line of the
/// example policy) is, by adding an unknown key beside it.
fn model_keys(anchor: &str) -> BTreeSet<String> {
    // The key's column: past the indentation and any `- ` of a list item.
    let column = anchor.find(|c: char| c != ' ' && c != '-').unwrap_or(0);
    let indent = " ".repeat(column);
    // Whole lines only: `  max_in_flight` is also inside `    max_in_flight`.
    let text = POLICY.replacen(
        &format!("\n{anchor}\n"),
        &format!("\n{anchor}\n{indent}zz_unknown: 1\n"),
        1,
    );
    let checked = check_source(&text);
    let message = &checked.diagnostics[0].message;
    let list = message
        .split("expected one of ")
        .nth(1)
        .unwrap_or_else(|| panic!("{anchor:?}: unexpected message: {message}"));
    list.split(", ").map(|s| s.trim().to_owned()).collect()
}

fn schema_keys(path: &[&str]) -> BTreeSet<String> {
    let schema: serde_json::Value = serde_json::from_str(SCHEMA).expect("schema is JSON");
    let mut node = &schema;
    for step in path {
        node = &node[*step];
    }
    node["properties"]
        .as_object()
        .unwrap_or_else(|| panic!("no properties at {path:?}"))
        .keys()
        .cloned()
        .collect()
}

#[test]
fn schema_and_model_accept_the_same_keys() {
    let cases: &[(&str, &[&str])] = &[
        ("name: hgx-gpu-firmware", &[]),
        ("  component: gpu", &["properties", "target"]),
        (
            "  from: \">= 96.00.50.00.00, < 96.00.61.00.01\"",
            &["properties", "versions"],
        ),
        ("  allow_unqualified_canary: true", &["properties", "qualification"]),
        ("  - name: canary", &["properties", "waves", "items"]),
        ("  max_in_flight: 128", &["properties", "concurrency"]),
        ("    duration: 4h", &["properties", "maintenance_windows", "items"]),
        ("  alpha: 0.05", &["properties", "health"]),
        (
            "      interval: 1h",
            &["properties", "health", "properties", "gates", "items"],
        ),
        (
            "      action: pause",
            &["properties", "health", "properties", "alerts", "items"],
        ),
        ("  reset_exclusion: 1h", &["properties", "detection"]),
        (
            "    holdback_percent: 5",
            &["properties", "detection", "properties", "soak"],
        ),
        ("  max_failed: 1", &["properties", "failure_budget"]),
        ("  scope: wave", &["properties", "rollback"]),
    ];
    for (anchor, path) in cases {
        assert!(
            POLICY.contains(&format!("\n{anchor}\n")),
            "anchor {anchor:?} not in the example"
        );
        assert_eq!(model_keys(anchor), schema_keys(path), "keys differ at {path:?}");
    }
}
