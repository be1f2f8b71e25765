//! `waveguard policy power` and the underpowered-canary warning of
//! `waveguard policy lint`, as a user runs them: the real binary on the
//! example policies and generated fleet files. No database.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_waveguard");

fn policies() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../policies")
}

fn fast_canary() -> String {
    std::fs::read_to_string(policies().join("gpu-fast-canary.yaml")).unwrap()
}

/// A fleet CSV of `nodes` HGX nodes over two clusters, 16 nodes a rack.
fn fleet(dir: &Path, nodes: usize) -> PathBuf {
    let mut text = String::from("name,bmc_url,credential_ref,platform_sku,region,cluster,rack,nvlink_domain\n");
    for i in 0..nodes {
        text.push_str(&format!(
            "gpu-{i:04},https://10.1.{}.{}:443,lab,hgx-h100-8gpu,us-east,c{},r{:02},r{:02}-nvl{}\n",
            i / 250,
            i % 250 + 1,
            i % 2,
            i / 16,
            i / 16,
            (i % 16) / 4
        ));
    }
    let file = dir.join(format!("fleet-{nodes}.csv"));
    std::fs::write(&file, text).unwrap();
    file
}

fn waveguard(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(["--database-url", "sqlite::memory:"])
        .args(args)
        .output()
        .expect("run waveguard")
}

fn text(out: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// `policy power` as a person reads it: the table on stdout, after a successful exit.
fn power_table(policy: &Path, fleet: &Path) -> String {
    let out = waveguard(&[
        "policy",
        "power",
        policy.to_str().unwrap(),
        "--fleet",
        fleet.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn power_json(policy: &Path, fleet: &Path, extra: &[&str]) -> Value {
    let mut args = vec![
        "policy",
        "power",
        policy.to_str().unwrap(),
        "--fleet",
        fleet.to_str().unwrap(),
        "--json",
    ];
    args.extend_from_slice(extra);
    let out = waveguard(&args);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&out)))
}

fn gate<'a>(doc: &'a Value, wave: &str, gate: &str) -> &'a Value {
    doc["waves"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["wave"] == wave)
        .and_then(|w| w["gates"].as_array().unwrap().iter().find(|g| g["gate"] == gate))
        .unwrap_or_else(|| panic!("no {wave}/{gate} in {doc:#}"))
}

#[test]
fn power_json_has_every_key_and_sane_numbers() {
    let dir = tempfile::tempdir().unwrap();
    let fleet = fleet(dir.path(), 400);
    let policy = policies().join("gpu-fast-canary.yaml");
    let doc = power_json(&policy, &fleet, &["--release", "gpu@96.00.61.00.01"]);
    for key in [
        "policy",
        "fleet",
        "fleet_nodes",
        "release",
        "alpha",
        "correction",
        "spending",
        "target_power",
        "gpus_per_node",
        "ignored_selector_labels",
        "waves",
        "fleet_timing",
        "fleet_detection",
    ] {
        assert!(doc.get(key).is_some(), "missing {key}: {doc:#}");
    }
    // The fleet-scale method's time to decide: one row per wave and judged rate gate, with a
    // median below its p95.
    let timing = doc["fleet_timing"].as_array().unwrap();
    let first = timing
        .iter()
        .find(|t| t["wave"] == "canary" && t["gate"] == "xid_errors")
        .unwrap();
    let (median, p95) = (
        first["pass_hours"][0].as_f64().unwrap(),
        first["pass_hours"][1].as_f64().unwrap(),
    );
    assert!(median > 0.0 && median < p95, "{first:#}");
    // Each row's chance of a catch by its wave's end, for effects on all nodes and for the same ratios
    // as a fleet average on a quarter of the nodes. This policy has no soak and its last wave leaves no
    // control: that wave says nothing judges it, and the waves before it still get their figures.
    for row in timing {
        assert_eq!(row["concentrated_share"], 0.25, "{row:#}");
        let all = row["catch_by_end"].as_array().unwrap();
        let some = row["catch_by_end_concentrated"].as_array().unwrap();
        assert_eq!(all.len(), some.len(), "{row:#}");
        if row["wave"] == "rest" {
            assert!(all.is_empty(), "{row:#}");
            let why = row["unjudged"].as_str().unwrap_or_else(|| panic!("{row:#}"));
            assert!(
                why.contains("nothing judges this wave") && why.contains("no soak"),
                "{row:#}"
            );
            continue;
        }
        assert!(row["unjudged"].is_null(), "{row:#}");
        assert_eq!(all.len(), row["catch_hours"].as_array().unwrap().len(), "{row:#}");
        for (a, s) in all.iter().zip(some) {
            assert_eq!(a[0], s[0], "{row:#}");
            assert!((0.0..=1.0).contains(&a[1].as_f64().unwrap()), "{row:#}");
            assert!((0.0..=1.0).contains(&s[1].as_f64().unwrap()), "{row:#}");
        }
        // A 6x rise is caught more often than a 2x one.
        let at = |r: f64| all.iter().find(|a| a[0] == r).and_then(|a| a[1].as_f64()).unwrap();
        assert!(at(6.0) > at(2.0), "{row:#}");
    }
    assert!(
        timing.iter().any(|t| t["wave"] == "rest" && t["gate"] == "xid_errors"),
        "{timing:#?}"
    );
    assert_eq!(doc["policy"], "gpu-fast-canary");
    assert_eq!(doc["fleet_nodes"], 400);
    assert_eq!(doc["target_power"], 0.8);
    let waves: Vec<&str> = doc["waves"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["wave"].as_str().unwrap())
        .collect();
    assert_eq!(waves, ["canary", "early", "rest"]);
    assert_eq!(doc["waves"][0]["canary_nodes"], 16);
    assert_eq!(doc["waves"][0]["control_nodes"], 16);

    let xid = gate(&doc, "canary", "xid_errors");
    for key in [
        "gate",
        "kind",
        "metric",
        "status",
        "note",
        "unit",
        "canary_units",
        "control_units",
        "exposure_unit",
        "canary_exposure",
        "control_exposure",
        "planned_looks",
        "gate_alpha",
        "per_look_alpha",
        "baseline",
        "min_effect",
        "must_detect",
        "mde",
        "detects_must_detect",
    ] {
        assert!(xid.get(key).is_some(), "missing {key}: {xid:#}");
    }
    assert_eq!(xid["status"], "ok");
    assert_eq!(xid["canary_units"], 128, "16 nodes x 8 GPUs");
    assert_eq!(xid["canary_exposure"], 128.0 * 6.0, "GPU-hours over the 6h bake");
    assert_eq!(xid["planned_looks"], 12, "6h at 30m");
    assert_eq!(xid["gate_alpha"], 0.025, "alpha 0.05 over two gates");
    let per_look = xid["per_look_alpha"].as_array().unwrap();
    assert_eq!(per_look.len(), 12);
    let last = per_look[11].as_f64().unwrap();
    assert!(last > 0.0 && last < 0.025 && per_look[0].as_f64().unwrap() < last);
    assert_eq!(xid["baseline"]["source"], "default");
    let ratio = xid["mde"]["ratio"].as_f64().unwrap();
    assert!(ratio > 1.5 && ratio < 20.0, "{ratio}");
    let events = xid["mde"]["expected_canary_events"].as_f64().unwrap();
    let expected = ratio * xid["baseline"]["value"].as_f64().unwrap() * 768.0;
    assert!((events - expected).abs() < 1e-6 * expected, "{events} vs {expected}");

    let temp = gate(&doc, "canary", "gpu_temp");
    let shift = temp["mde"]["shift"].as_f64().unwrap();
    assert!(shift > 3.0 && shift < 10.0, "{shift}");
    assert_eq!(temp["baseline"]["measure"], "sd");

    // The early wave is bigger: it detects smaller effects.
    let early = gate(&doc, "early", "xid_errors")["mde"]["ratio"].as_f64().unwrap();
    assert!(early < ratio, "{early} !< {ratio}");
    // The last wave has no control cohort: nothing to quote.
    let rest = gate(&doc, "rest", "xid_errors");
    assert_eq!(rest["status"], "no_control");
    assert!(rest["mde"].is_null() && rest["note"].as_str().is_some());

    // A given baseline wins and is labelled; more events, smaller ratio.
    let given = power_json(
        &policy,
        &fleet,
        &["--baseline", "xid_errors_per_gpu_hour=0.5", "--sd", "gpu_temp=1"],
    );
    let xid_given = gate(&given, "canary", "xid_errors");
    assert_eq!(xid_given["baseline"]["source"], "given");
    assert_eq!(xid_given["baseline"]["value"], 0.5);
    assert!(xid_given["mde"]["ratio"].as_f64().unwrap() < ratio);
    let temp_given = gate(&given, "canary", "gpu_temp");
    assert!(temp_given["mde"]["shift"].as_f64().unwrap() < shift);
}

#[test]
fn power_table_is_readable() {
    let dir = tempfile::tempdir().unwrap();
    let fleet = fleet(dir.path(), 200);
    let policy = policies().join("gpu-fast-canary.yaml");
    let stdout = power_table(&policy, &fleet);
    assert!(stdout.contains("WAVE") && stdout.contains("MDE (80%)"), "{stdout}");
    let canary = stdout
        .lines()
        .find(|l| l.starts_with("canary") && l.contains("xid_errors"))
        .unwrap_or_else(|| panic!("{stdout}"));
    assert!(
        canary.contains("0.01/gpu-hour (default)") && canary.contains(" x"),
        "{canary}"
    );
}

/// `policy power --history` reads the database's control totals; with none recorded it says so and
/// keeps the defaults (the measured case: `cmd::policy`'s unit test and the engine's soak test).
#[test]
fn history_without_recorded_controls_says_so_and_keeps_the_defaults() {
    let dir = tempfile::tempdir().unwrap();
    let fleet = fleet(dir.path(), 200);
    let policy = policies().join("gpu-fast-canary.yaml");
    let args = |json: bool| {
        let mut a = vec![
            "policy",
            "power",
            policy.to_str().unwrap(),
            "--fleet",
            fleet.to_str().unwrap(),
            "--history",
        ];
        if json {
            a.push("--json");
        }
        waveguard(&a)
    };
    let out = args(false);
    assert!(out.status.success(), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("base rates from the database's control cohorts over the last 30 days")
            && stdout.contains("none recorded, defaults used"),
        "{stdout}"
    );
    assert!(stdout.contains("0.01/gpu-hour (default)"), "{stdout}");
    let out = args(true);
    assert!(out.status.success(), "{}", text(&out));
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["history"]["days"], 30, "{doc}");
    assert_eq!(doc["history"]["control_totals"], serde_json::json!([]), "{doc}");
    assert_eq!(doc["history"]["rates"], serde_json::json!({}), "{doc}");
    // Without the flag the database is not read and the key is null.
    assert!(power_json(&policy, &fleet, &[])["history"].is_null());
}

/// `policy power` quotes each rate gate's chance of a catch by each wave's end for an effect on all
/// nodes and for the same fleet-average ratio on a quarter of them (the node-level look's case), in
/// the JSON and the table; the example GPU policy keeps a holdback, so every judged wave has a control.
#[test]
fn concentrated_effects_are_quoted() {
    let dir = tempfile::tempdir().unwrap();
    let fleet = fleet(dir.path(), 1000);
    let policy = policies().join("hgx-gpu-firmware.yaml");
    let doc = power_json(&policy, &fleet, &[]);
    let canary = doc["fleet_timing"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["wave"] == "canary" && t["gate"] == "xid_errors")
        .unwrap_or_else(|| panic!("{doc:#}"));
    let all = canary["catch_by_end"].as_array().unwrap();
    let some = canary["catch_by_end_concentrated"].as_array().unwrap();
    assert!(!some.is_empty() && some.len() == all.len(), "{canary:#}");
    for (a, s) in all.iter().zip(some) {
        assert_eq!(a[0], s[0], "{canary:#}");
        assert!((0.0..=1.0).contains(&s[1].as_f64().unwrap()), "{canary:#}");
    }
    assert_ne!(all, some, "a concentrated effect is its own forecast: {canary:#}");
    let stdout = power_table(&policy, &fleet);
    let line = stdout
        .lines()
        .find(|l| l.starts_with("canary") && l.contains("caught by the wave's end"))
        .unwrap_or_else(|| panic!("{stdout}"));
    assert!(line.contains("the same average on 25% of nodes 2x "), "{line}");
}

#[test]
fn bad_input_exits_2_with_a_clear_message() {
    let dir = tempfile::tempdir().unwrap();
    let fleet = fleet(dir.path(), 50);
    let policy = policies().join("gpu-fast-canary.yaml");
    let broken_fleet = dir.path().join("broken.csv");
    std::fs::write(&broken_fleet, "name,bmc_url\ngpu-1,https://x\n").unwrap();
    let broken_policy = dir.path().join("broken.yaml");
    std::fs::write(&broken_policy, fast_canary().replace("bake: 6h", "bake: soon")).unwrap();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["--baseline", "nope=0.1"], "has no gate or metric \"nope\""),
        (vec!["--baseline", "xid_errors=lots"], "is not a positive number"),
        (vec!["--baseline", "xid_errors=-1"], "is not a positive number"),
        (vec!["--baseline", "xid_errors"], "expected GATE_OR_METRIC=NUMBER"),
        (vec!["--sd", "xid_errors=2"], "is a rate gate; use --baseline"),
        (vec!["--release", "bmc@1.2.3"], "updates gpu firmware, not bmc"),
        (vec!["--release", "gpu"], "expected KIND@VERSION"),
    ];
    for (extra, expected) in cases {
        let mut args = vec![
            "policy",
            "power",
            policy.to_str().unwrap(),
            "--fleet",
            fleet.to_str().unwrap(),
        ];
        args.extend_from_slice(&extra);
        let out = waveguard(&args);
        assert_eq!(out.status.code(), Some(2), "{extra:?}: {}", text(&out));
        assert!(
            String::from_utf8_lossy(&out.stderr).contains(expected),
            "{extra:?}: {}",
            text(&out)
        );
    }
    let out = waveguard(&[
        "policy",
        "power",
        policy.to_str().unwrap(),
        "--fleet",
        broken_fleet.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("broken.csv"),
        "{}",
        text(&out)
    );
    let out = waveguard(&[
        "policy",
        "power",
        broken_policy.to_str().unwrap(),
        "--fleet",
        fleet.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("broken.yaml:") && stderr.contains("bake: invalid duration"),
        "{}",
        text(&out)
    );
    // A fleet of another platform plans nothing.
    let other = dir.path().join("other.csv");
    std::fs::write(
        &other,
        std::fs::read_to_string(&fleet)
            .unwrap()
            .replace("hgx-h100-8gpu", "dgx-b200"),
    )
    .unwrap();
    let out = waveguard(&[
        "policy",
        "power",
        policy.to_str().unwrap(),
        "--fleet",
        other.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no node of the fleet is planned"),
        "{}",
        text(&out)
    );
}

/// Line and column (1-based) of the value of `- name: {gate}`.
fn gate_position(source: &str, gate: &str) -> (usize, usize) {
    let needle = format!("- name: {gate}");
    source
        .lines()
        .enumerate()
        .find_map(|(i, l)| l.find(&needle).map(|c| (i + 1, c + "- name: ".len() + 1)))
        .unwrap()
}

fn lint(file: &Path, extra: &[&str]) -> (i32, String) {
    let mut args = vec!["policy", "lint", file.to_str().unwrap()];
    args.extend_from_slice(extra);
    let out = waveguard(&args);
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// The fast-canary example with its `must_detect` relaxation removed (so the
/// default, 2 x min_effect, applies) and the canary resized.
fn canary_of(size: &str) -> String {
    let source = fast_canary();
    let start = source.find("      # A fast canary trades").unwrap();
    let end = source.find("      must_detect: 5\n").unwrap() + "      must_detect: 5\n".len();
    let mut out = format!("{}{}", &source[..start], &source[end..]);
    out = out.replace("    count: 16\n", &format!("    {size}\n"));
    out
}

#[test]
fn underpowered_canary_is_warned_at_the_gate() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("gpu-fast-canary.yaml");
    let source = canary_of("count: 2");
    std::fs::write(&file, &source).unwrap();
    let (code, out) = lint(&file, &[]);
    assert_eq!(code, 0, "warnings only: {out}");
    let (line, col) = gate_position(&source, "xid_errors");
    let prefix = format!(
        "{}:{line}:{col}: warning: gate \"xid_errors\": canary \"canary\" of 2 node(s) detects x",
        file.display()
    );
    let warning = out
        .lines()
        .find(|l| l.starts_with(&prefix))
        .unwrap_or_else(|| panic!("no {prefix:?} in:\n{out}"));
    assert!(
        warning.contains("over the 6h bake") && warning.contains("must catch x3 (must_detect)"),
        "{warning}"
    );
}

#[test]
fn big_enough_canary_is_not_warned() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("gpu-fast-canary.yaml");
    std::fs::write(&file, canary_of("count: 64")).unwrap();
    let (code, out) = lint(&file, &[]);
    assert_eq!(code, 0, "{out}");
    assert!(out.ends_with("1 file(s) checked: 0 error(s), 0 warning(s)\n"), "{out}");
    // Lint says which method judges the policy: without a detection block, the per-wave one.
    assert!(
        out.contains("gpu-fast-canary.yaml: detection: per-wave (no detection block"),
        "{out}"
    );
}

#[test]
fn percent_canary_is_checked_only_with_a_fleet() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("gpu-fast-canary.yaml");
    // `early` at 10% must stay at least as big as the canary.
    std::fs::write(&file, canary_of("percent: 1").replace("percent: 10", "percent: 2")).unwrap();
    let (code, out) = lint(&file, &[]);
    assert_eq!(code, 0, "{out}");
    assert!(out.ends_with("0 error(s), 0 warning(s)\n"), "{out}");
    // 1% of 200 nodes is a 2-node canary: underpowered.
    let fleet = fleet(dir.path(), 200);
    let (code, out) = lint(&file, &["--fleet", fleet.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("canary \"canary\" of 2 node(s) detects"), "{out}");
}

#[test]
fn must_detect_below_min_effect_is_an_error_at_the_value() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("gpu-fast-canary.yaml");
    let source = fast_canary().replace("must_detect: 5", "must_detect: 1.2");
    std::fs::write(&file, &source).unwrap();
    let (code, out) = lint(&file, &[]);
    assert_eq!(code, 1, "{out}");
    let line = source.lines().position(|l| l.contains("must_detect: 1.2")).unwrap() + 1;
    assert!(
        out.contains(&format!(
            "{}:{line}:20: gate \"xid_errors\": must_detect 1.2 is invalid",
            file.display()
        )),
        "{out}"
    );
}
