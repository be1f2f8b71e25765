//! The `bmc-sim` binary writes the endpoint CSV that `waveguard fleet import` reads and serves those BMCs.

use std::process::Stdio;
use std::time::Duration;

#[tokio::test]
async fn binary_writes_endpoint_csv_and_serves_redfish() {
    let dir = tempfile::tempdir().expect("tempdir");
    let csv_path = dir.path().join("fleet.csv");
    let scenario = concat!(env!("CARGO_MANIFEST_DIR"), "/scenarios/small.yaml");
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_bmc-sim"))
        .args([
            "--scenario",
            scenario,
            "--nodes",
            "3",
            "--speedup",
            "100",
            "--username",
            "ops",
        ])
        .args(["--password-env", "BMC_SIM_TEST_PASSWORD"])
        .arg("--endpoints-out")
        .arg(&csv_path)
        .env("BMC_SIM_TEST_PASSWORD", "pw-from-env")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn bmc-sim");
    let mut csv = String::new();
    for _ in 0..200 {
        if let Ok(text) = std::fs::read_to_string(&csv_path)
            && text.lines().count() == 4
        {
            csv = text;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(
        lines.first().copied(),
        Some(bmc_sim::ENDPOINTS_CSV_HEADER),
        "csv: {csv}"
    );
    assert_eq!(lines.len(), 4);
    let fields: Vec<&str> = lines[1].split(',').collect();
    assert_eq!(fields[0], "node-00000");
    assert_eq!(fields[2], "sim");
    assert_eq!(fields[3], "hgx-h100-8gpu");
    let http = reqwest::Client::new();
    let url = format!("{}/redfish/v1/Managers/1", fields[1]);
    let ok = http
        .get(&url)
        .basic_auth("ops", Some("pw-from-env"))
        .send()
        .await
        .expect("request");
    assert_eq!(ok.status(), 200);
    let denied = http
        .get(&url)
        .basic_auth("admin", Some("admin"))
        .send()
        .await
        .expect("request");
    assert_eq!(denied.status(), 401);
    child.kill().await.expect("kill bmc-sim");
}
