//! DMTF's redfish-service-validator against one simulated BMC must report no failures, for the
//! default layout and for the platform profiles named in `BMC_SIM_VALIDATOR_PLATFORMS`
//! (comma-separated; CI's default is `default,hgx-h100`; `bmc-sim/validate-profiles.sh` runs all).
//!
//! The validator normally downloads the DMTF schema bundle from dmtf.org; offline, it reads the CSDL files
//! shipped in the `nv-redfish-schema` crate (`--schema_directory ... --skipschema`). Install the validator
//! with `bmc-sim/ci-setup.sh`. Without it this test skips loudly, unless WAVEGUARD_REQUIRE_ALL=1.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use bmc_sim::image;
use chrono::Duration as SimDuration;
use common::{PASS, SKU, USER, find_on_path, one_node_on, skip_or_fail, start};
use orchestrator_types::ComponentKind;

const VALIDATOR: &str = "rf_service_validator";

fn copy_dir(from: &Path, to: &Path) -> std::io::Result<usize> {
    std::fs::create_dir_all(to)?;
    let mut n = 0;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        if entry.file_type()?.is_file() {
            std::fs::copy(entry.path(), to.join(entry.file_name()))?;
            n += 1;
        }
    }
    Ok(n)
}

/// The FAIL count from the validator's summary table (the row after the PASS/WARN/FAIL header).
fn fail_count(output: &str) -> Option<u64> {
    let lines: Vec<&str> = output.lines().collect();
    let header = lines
        .iter()
        .position(|l| l.contains("FAIL") && l.contains("PASS") && l.contains('|'))?;
    let cells: Vec<u64> = lines
        .get(header + 2)?
        .split('|')
        .filter_map(|c| c.trim().parse::<u64>().ok())
        .collect();
    // Columns: PASS, WARN, FAIL, NOT TESTED.
    cells
        .get(2)
        .copied()
        .filter(|_| cells.first().is_some_and(|&pass| pass > 0))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redfish_service_validator_reports_no_failures() {
    let platforms = std::env::var("BMC_SIM_VALIDATOR_PLATFORMS").unwrap_or_else(|_| "default,hgx-h100".to_string());
    for platform in platforms.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        validate(platform).await;
    }
}

async fn validate(platform: &str) {
    let Some(validator) = find_on_path(VALIDATOR) else {
        skip_or_fail(VALIDATOR);
        return;
    };
    let schemas = tempfile::tempdir().expect("tempdir");
    let copied = copy_dir(Path::new(nv_redfish_schema::REDFISH_CSDL_DIR), schemas.path()).expect("copy CSDL");
    assert!(copied > 100, "expected the DMTF CSDL bundle, found {copied} files");
    let logs = tempfile::tempdir().expect("tempdir");

    let h = start(&one_node_on(platform)).await;
    // Give the validator more to look at: a finished and a failed update task, and hours of event log.
    let img = image::build(ComponentKind::Gpu, "96.00.61.00.01", &[SKU], b"payload");
    let corrupt = b"not an image".to_vec();
    for bytes in [img, corrupt] {
        let form = reqwest::multipart::Form::new()
            .text("UpdateParameters", "{}")
            .part("UpdateFile", reqwest::multipart::Part::bytes(bytes).file_name("fw.bin"));
        let r = h
            .http
            .post(h.url(0, "/redfish/v1/UpdateService/update-multipart"))
            .basic_auth(USER, Some(PASS))
            .multipart(form)
            .send()
            .await
            .expect("push");
        assert_eq!(r.status(), 202, "{platform}");
        // Let it finish: a second update of the same components while one runs is refused (409).
        h.advance(SimDuration::hours(1));
    }
    h.advance(SimDuration::hours(6));

    for authtype in ["Session", "Basic"] {
        let run = tokio::process::Command::new(&validator)
            .arg("--rhost")
            .arg(h.url(0, ""))
            .args([
                "-u",
                USER,
                "-p",
                PASS,
                "--authtype",
                authtype,
                "--skipschema",
                "--timeout",
                "10",
            ])
            .arg("--schema_directory")
            .arg(schemas.path())
            .arg("--logdir")
            .arg(logs.path())
            .current_dir(logs.path())
            .kill_on_drop(true)
            .output();
        let out = tokio::time::timeout(Duration::from_secs(300), run)
            .await
            .expect("validator finished within 5 minutes")
            .expect("validator runs");
        let text = format!(
            "{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let fails = fail_count(&text);
        if !out.status.success() || fails != Some(0) {
            // Show the failing checks from the debug log, not just the summary.
            let mut detail = String::new();
            for entry in walk(logs.path()) {
                if entry.extension().is_some_and(|e| e == "log")
                    && let Ok(log) = std::fs::read_to_string(&entry)
                {
                    detail.extend(
                        log.lines()
                            .filter(|l| l.contains("FAIL") || l.contains("ERROR"))
                            .map(|l| format!("{l}\n")),
                    );
                }
            }
            panic!(
                "validator ({platform}, {authtype}) status {:?}, FAIL count {fails:?}\n{text}\n--- failures ---\n{detail}",
                out.status
            );
        }
        eprintln!("redfish-service-validator ({platform}, {authtype}): no failures");
    }
    h.fleet.shutdown().await;
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                out.extend(walk(&p));
            } else {
                out.push(p);
            }
        }
    }
    out
}

#[test]
fn every_platform_scenario_parses_with_the_profile_layout() {
    for platform in bmc_sim::platform::built_in_names() {
        let yaml = one_node_on(platform);
        let scenario = bmc_sim::Scenario::from_yaml_str(&yaml).unwrap_or_else(|e| panic!("{platform}: {e}\n{yaml}"));
        assert_eq!(scenario.platform.as_deref(), Some(platform));
        assert!(
            !scenario
                .fleet
                .components
                .iter()
                .any(|c| c.id == "HGX_FW_GPU_0" && platform == "hgx-h100")
        );
    }
}
