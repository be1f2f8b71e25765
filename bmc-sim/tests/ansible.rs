//! Ansible's community.general Redfish modules, independent clients, update a simulated BMC over
//! HTTPS on loopback: `redfish_command` SimpleUpdate (GPU) and MultipartHTTPPushUpdate (BMC), polling
//! `redfish_info` GetUpdateStatus on the task monitor, and PerformRequestedOperations, which POSTs the
//! Reset named by each task's `Base.ResetRequired`. The test checks the outcome in bmc-sim's own
//! state: both versions moved, one flash each, nothing else touched.
//!
//! The playbook is `tests/tools/redfish_update.yml`. Install Ansible (the `ansible` PyPI package, which
//! bundles community.general) with `bmc-sim/ci-setup.sh`; without it this test skips loudly, unless
//! WAVEGUARD_REQUIRE_ALL=1.

mod common;

use std::time::Duration;

use bmc_sim::ImageServer;
use bmc_sim::image;
use chrono::Duration as SimDuration;
use common::{PASS, SKU, SMALL, USER, find_on_path, python_with, skip_or_fail, start_with, tick_clock};
use orchestrator_types::ComponentKind;
use serde_json::json;

const PLAYBOOK: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/tools/redfish_update.yml");
const GPU_NEW: &str = "96.00.61.00.01";
const BMC_NEW: &str = "24.04.2";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ansible_simple_update_multipart_push_and_requested_resets() {
    let Some(playbook_bin) = find_on_path("ansible-playbook") else {
        skip_or_fail("ansible-playbook (the `ansible` PyPI package)");
        return;
    };
    if python_with(
        "ansible_collections.community.general",
        "Ansible's community.general collection",
    )
    .is_none()
    {
        return;
    }
    let h = start_with(SMALL, |o| o.tls = true).await;
    let node = h.name(0);
    let before = h.fleet.versions(&node).expect("node");
    let id_of = |kind: ComponentKind| -> Vec<String> {
        before
            .iter()
            .filter(|c| c.kind == kind)
            .map(|c| format!("/redfish/v1/UpdateService/FirmwareInventory/{}", c.id))
            .collect()
    };

    let work = tempfile::tempdir().expect("tempdir");
    let ca = work.path().join("ca.pem");
    std::fs::write(&ca, h.fleet.ca_pem().expect("TLS fleet has a CA")).expect("write CA");
    let gpu_img = image::build(ComponentKind::Gpu, GPU_NEW, &[SKU], b"gpu firmware for ansible");
    let image_server = ImageServer::start([("gpu.bin".to_owned(), gpu_img)])
        .await
        .expect("image server");
    let base = image_server.base_url();
    let bmc_file = work.path().join("bmc.bin");
    std::fs::write(
        &bmc_file,
        image::build(ComponentKind::Bmc, BMC_NEW, &[SKU], b"bmc firmware"),
    )
    .expect("bmc image");
    let vars = work.path().join("vars.json");
    let baseuri = h.url(0, "").trim_start_matches("https://").to_owned();
    std::fs::write(
        &vars,
        json!({
            "baseuri": baseuri,
            "username": USER,
            "password": PASS,
            "ca_path": ca,
            "gpu_image_uri": format!("{base}/gpu.bin"),
            "gpu_targets": id_of(ComponentKind::Gpu),
            "bmc_image_file": bmc_file,
            "bmc_targets": id_of(ComponentKind::Bmc),
        })
        .to_string(),
    )
    .expect("vars file");

    // Flashes take minutes of simulated time; 20 simulated seconds per 50 ms of real time lets the
    // playbook's one-second polling see them end within a few polls.
    let ticker = tick_clock(h.clock.clone(), SimDuration::seconds(20), Duration::from_millis(50));
    let ansible_home = work.path().join("ansible-home");
    let run = tokio::process::Command::new(&playbook_bin)
        .args(["-i", "localhost,", "-e"])
        .arg(format!("@{}", vars.display()))
        .arg(PLAYBOOK)
        // Keep Ansible's state and temporary files inside the test's directory.
        .env("ANSIBLE_HOME", &ansible_home)
        .env("ANSIBLE_LOCAL_TEMP", ansible_home.join("tmp"))
        .env("ANSIBLE_NOCOLOR", "1")
        .env("ANSIBLE_RETRY_FILES_ENABLED", "0")
        .env("ANSIBLE_DEPRECATION_WARNINGS", "0")
        .current_dir(work.path())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(300), run)
        .await
        .expect("ansible-playbook finished within 5 minutes")
        .expect("ansible-playbook runs");
    drop(ticker);
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "playbook failed ({:?}):\n{text}", out.status);
    assert!(text.contains("failed=0"), "{text}");
    let recap = text.lines().rev().find(|l| l.contains("ok=")).unwrap_or_default();
    eprintln!("ansible-playbook: {}", recap.trim());

    // Once the host has rebooted and the BMC has reset, both images are active; nothing else moved.
    h.advance(SimDuration::minutes(10));
    let after = h.fleet.versions(&node).expect("node");
    for (was, now) in before.iter().zip(&after) {
        let want = match now.kind {
            ComponentKind::Gpu => GPU_NEW,
            ComponentKind::Bmc => BMC_NEW,
            _ => was.active.as_str(),
        };
        assert_eq!(now.active, want, "{}", now.id);
        assert_eq!(now.pending, None, "{}: nothing left staged", now.id);
    }
    let flashes = h.fleet.flash_counts(&node).expect("node");
    assert_eq!(flashes.get(GPU_NEW).copied(), Some(1), "{flashes:?}");
    assert_eq!(flashes.get(BMC_NEW).copied(), Some(1), "{flashes:?}");
    assert_eq!(flashes.len(), 2, "{flashes:?}");
    h.fleet.shutdown().await;
}
