//! DMTF's redfish-protocol-validator against one simulated BMC over HTTPS on loopback must report no
//! FAIL, for the platforms named in `BMC_SIM_PROTOCOL_VALIDATOR_PLATFORMS` (comma-separated; CI's
//! default is `default,hgx-h100`; `bmc-sim/validate-profiles.sh` runs every profile).
//!
//! The validator's SSDP discovery tests multicast an M-SEARCH off the machine and it has no switch to
//! turn them off, so it runs through `tests/tools/protocol_validator_no_ssdp.py`, a small wrapper
//! that records the `SERV_SSDP_*` assertions as NOT_TESTED (bmc-sim implements no SSDP) and makes
//! any other attempt to multicast raise; every other assertion is the validator's own code.
//!
//! HTTPS because a Redfish service must refuse or redirect basic auth and session logins over plain
//! HTTP (the validator checks it, and real BMCs do it); bmc-sim's generated CA is handed to the
//! validator. Install it with `bmc-sim/ci-setup.sh`; without it this test skips loudly, unless
//! WAVEGUARD_REQUIRE_ALL=1.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{PASS, USER, one_node_on, python_with, start_with};
use serde::Deserialize;

const WRAPPER: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/tools/protocol_validator_no_ssdp.py");

/// Results bmc-sim is allowed to FAIL, with the reason. Empty: none is inapplicable today. An entry
/// names the assertion and a fragment of the validator's message, so it cannot hide a new failure.
const ALLOWED_FAILURES: &[(&str, &str, &str)] = &[];

/// One logged result, as the wrapper's `--results-json` writes it.
#[derive(Debug, Deserialize)]
struct Row {
    result: String,
    assertion: String,
    method: String,
    status: String,
    uri: String,
    msg: String,
}

#[derive(Debug, Default)]
struct Counts {
    pass: usize,
    warn: usize,
    fail: usize,
    not_tested: usize,
}

fn count(rows: &[Row]) -> Counts {
    let mut c = Counts::default();
    for r in rows {
        match r.result.as_str() {
            "PASS" => c.pass += 1,
            "WARN" => c.warn += 1,
            "FAIL" => c.fail += 1,
            _ => c.not_tested += 1,
        }
    }
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redfish_protocol_validator_reports_no_failures() {
    let Some(python) = python_with("redfish_protocol_validator", "redfish-protocol-validator") else {
        return;
    };
    let platforms =
        std::env::var("BMC_SIM_PROTOCOL_VALIDATOR_PLATFORMS").unwrap_or_else(|_| "default,hgx-h100".to_string());
    for platform in platforms.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        validate(&python, platform).await;
    }
}

async fn validate(python: &str, platform: &str) {
    let h = start_with(&one_node_on(platform), |o| o.tls = true).await;
    let work = tempfile::tempdir().expect("tempdir");
    let ca = work.path().join("ca.pem");
    std::fs::write(&ca, h.fleet.ca_pem().expect("TLS fleet has a CA")).expect("write CA");
    let results = work.path().join("results.json");

    let run = tokio::process::Command::new(python)
        .arg(WRAPPER)
        .arg("--rhost")
        .arg(h.url(0, ""))
        .args(["-u", USER, "-p", PASS, "--report-type", "tsv"])
        .arg("--ca-bundle")
        .arg(&ca)
        .arg("--report-dir")
        .arg(work.path().join("reports"))
        .arg("--results-json")
        .arg(&results)
        // requests lets REQUESTS_CA_BUNDLE / CURL_CA_BUNDLE override a session's own `verify`, and
        // many machines set them to the system store: point them at bmc-sim's CA too.
        .env("REQUESTS_CA_BUNDLE", &ca)
        .env("CURL_CA_BUNDLE", &ca)
        .current_dir(work.path())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(300), run)
        .await
        .expect("protocol validator finished within 5 minutes")
        .expect("protocol validator runs");
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let rows = read_rows(&results).unwrap_or_else(|e| panic!("{platform}: no results ({e})\n{text}"));
    let counts = count(&rows);
    let ssdp = rows
        .iter()
        .filter(|r| r.assertion.starts_with("SERV_SSDP_"))
        .collect::<Vec<_>>();
    assert!(
        !ssdp.is_empty() && ssdp.iter().all(|r| r.result == "NOT_TESTED"),
        "{platform}: the wrapper must mark every SSDP assertion NOT_TESTED: {ssdp:?}"
    );
    assert!(
        counts.pass > 100,
        "{platform}: suspiciously few results {counts:?}\n{text}"
    );
    let failures: Vec<&Row> = rows
        .iter()
        .filter(|r| r.result == "FAIL")
        .filter(|r| {
            !ALLOWED_FAILURES
                .iter()
                .any(|(a, fragment, _why)| r.assertion == *a && r.msg.contains(fragment))
        })
        .collect();
    let listed = failures
        .iter()
        .map(|r| format!("  {} {} {} {}: {}", r.assertion, r.method, r.status, r.uri, r.msg))
        .collect::<Vec<_>>()
        .join("\n");
    assert!(
        failures.is_empty(),
        "redfish-protocol-validator ({platform}): {} FAIL ({counts:?}):\n{listed}\n--- output ---\n{text}",
        failures.len()
    );
    // The exit status is 1 exactly when some assertion failed (allowed ones included).
    assert_eq!(
        out.status.success(),
        counts.fail == 0,
        "{platform}: exit status {:?} with {counts:?}\n{text}",
        out.status
    );
    eprintln!(
        "redfish-protocol-validator ({platform}): PASS {}, WARN {}, FAIL {}, NOT_TESTED {} ({} of them SSDP)",
        counts.pass,
        counts.warn,
        counts.fail,
        counts.not_tested,
        ssdp.len()
    );
    h.fleet.shutdown().await;
}

fn read_rows(path: &Path) -> Result<Vec<Row>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    serde_json::from_str(&text).map_err(|e| e.to_string())
}
