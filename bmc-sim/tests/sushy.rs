//! OpenStack's sushy, an independent Redfish client, updates a simulated BMC's GPU firmware over
//! loopback: SimpleUpdate, waiting on the DMTF task monitor built from the 202's `Location`
//! (`Sushy.get_task_monitor`), then the system reset that `Base.ResetRequired` asks for. The test
//! checks the outcome in bmc-sim's own state: versions moved, one flash.
//!
//! The client side is `tests/tools/sushy_simple_update.py`. Install sushy with `bmc-sim/ci-setup.sh`;
//! without it this test skips loudly, unless WAVEGUARD_REQUIRE_ALL=1.

mod common;

use std::time::Duration;

use bmc_sim::ImageServer;
use bmc_sim::image;
use chrono::Duration as SimDuration;
use common::{PASS, SKU, SMALL, USER, python_with, start, tick_clock};
use orchestrator_types::ComponentKind;
use serde_json::Value;

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/tools/sushy_simple_update.py");
const GPU_NEW: &str = "96.00.61.00.01";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sushy_waits_on_the_task_monitor_and_resets_as_asked() {
    let Some(python) = python_with("sushy", "sushy (Python)") else {
        return;
    };
    let h = start(SMALL).await;
    let node = h.name(0);
    let img = image::build(ComponentKind::Gpu, GPU_NEW, &[SKU], b"gpu firmware for sushy");
    let image_server = ImageServer::start([("gpu.bin".to_owned(), img)])
        .await
        .expect("image server");
    let base = image_server.base_url();
    let gpus: Vec<String> = h
        .fleet
        .versions(&node)
        .expect("node")
        .into_iter()
        .filter(|c| c.kind == ComponentKind::Gpu)
        .map(|c| c.id)
        .collect();
    assert_eq!(gpus.len(), 8);
    let targets: Vec<String> = gpus
        .iter()
        .map(|id| format!("/redfish/v1/UpdateService/FirmwareInventory/{id}"))
        .collect();

    // The flash takes 5-9 simulated minutes; 20 simulated seconds per 50 ms lets sushy's real-time
    // polling see the monitor answer 202 a few times, then 200.
    let ticker = tick_clock(h.clock.clone(), SimDuration::seconds(20), Duration::from_millis(50));
    let run = tokio::process::Command::new(&python)
        .arg(SCRIPT)
        .arg(h.url(0, ""))
        .arg(USER)
        .arg(format!("{base}/gpu.bin"))
        .args(&targets)
        .env("SUSHY_PASSWORD", PASS)
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(180), run)
        .await
        .expect("sushy finished within 3 minutes")
        .expect("python runs");
    drop(ticker);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "sushy script failed: {:?}\n{stderr}", out.status);
    let report: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "report is not JSON ({e}): {}\n{stderr}",
            String::from_utf8_lossy(&out.stdout)
        )
    });
    eprintln!("sushy: {report}");

    let location = report["location"].as_str().expect("location");
    assert!(location.contains("/TaskMonitors/"), "{report}");
    assert!(
        report["polls_202"].as_u64().unwrap_or(0) >= 1,
        "the monitor answered 202 while running: {report}"
    );
    assert_eq!(report["final_status"], 200, "{report}");
    assert_eq!(report["task_state"], "Completed", "{report}");
    let ids: Vec<&str> = report["message_ids"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    assert!(
        ids.iter()
            .any(|m| m.starts_with("Update.") && m.ends_with(".AwaitToActivate")),
        "{report}"
    );
    assert_eq!(
        report["resets_performed"],
        serde_json::json!(["/redfish/v1/Systems/1/Actions/ComputerSystem.Reset"]),
        "{report}"
    );

    // The staged firmware is active once the host is back from the reset sushy asked for.
    h.advance(SimDuration::minutes(10));
    for c in h.fleet.versions(&node).expect("node") {
        if c.kind == ComponentKind::Gpu {
            assert_eq!(c.active, GPU_NEW, "{}", c.id);
        } else {
            assert_ne!(c.active, GPU_NEW, "{} was not a target", c.id);
        }
    }
    let flashes = h.fleet.flash_counts(&node).expect("node");
    assert_eq!(flashes.get(GPU_NEW).copied(), Some(1), "one flash: {flashes:?}");
    h.fleet.shutdown().await;
}
