//! The simulated dcgm-exporter: dcgm-exporter's names, types and labels, values that agree with the Redfish
//! view, counter resets on an exporter restart, and series that vanish when it stops.

mod common;

use chrono::Duration as SimDuration;
use common::*;
use reqwest::Method;
use serde_json::json;

/// Sums the values of every line of `family` whose labels contain `needle`.
fn sum(text: &str, family: &str, needle: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(&format!("{family}{{")) && l.contains(needle))
        .filter_map(|l| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()))
        .sum()
}

async fn dcgm(h: &Harness) -> String {
    let r = h.control(Method::GET, "/sim/dcgm/metrics", None).await;
    assert_eq!(r.status(), 200);
    r.text().await.expect("text")
}

const DCGM_SCENARIO_EXTRA: &str =
    "dcgm:\n  ecc_dbe_per_gpu_hour: 0.2\n  nvlink_crc_per_gpu_hour: 3\n  xid_count_window: 5m\n";

#[tokio::test]
async fn exposition_has_dcgm_exporter_names_types_and_labels() {
    let h = start(&format!("{SMALL}{DCGM_SCENARIO_EXTRA}")).await;
    h.advance(SimDuration::hours(10));
    let text = dcgm(&h).await;
    for (family, kind) in [
        ("DCGM_FI_DEV_GPU_TEMP", "gauge"),
        ("DCGM_FI_DEV_POWER_USAGE", "gauge"),
        ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter"),
        ("DCGM_FI_DEV_XID_ERRORS", "gauge"),
        ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "counter"),
        ("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "counter"),
        ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "counter"),
        ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge"),
        ("DCGM_EXP_XID_ERRORS_COUNT", "gauge"),
    ] {
        assert!(
            text.contains(&format!("# TYPE {family} {kind}\n")),
            "missing {family} {kind}"
        );
    }
    let node = h.name(1);
    let temp = text
        .lines()
        .find(|l| l.starts_with("DCGM_FI_DEV_GPU_TEMP{") && l.contains(&format!("Hostname=\"{node}\"")))
        .expect("a temperature line for the node");
    for label in [
        "gpu=\"0\"",
        "UUID=\"GPU-",
        "pci_bus_id=\"00000000:18:00.0\"",
        "device=\"nvidia0\"",
        "modelName=\"",
    ] {
        assert!(temp.contains(label), "{label} missing in {temp}");
    }
    // 8 GPUs per node, 4 nodes.
    assert_eq!(
        text.lines().filter(|l| l.starts_with("DCGM_FI_DEV_GPU_TEMP{")).count(),
        32
    );
    // PCIe replays are the node's AER log entries.
    let log = h
        .get_json(1, "/redfish/v1/Systems/1/LogServices/EventLog/Entries")
        .await;
    let members = log["Members"].as_array().expect("members");
    let aer = members
        .iter()
        .filter(|m| m["MessageArgs"][1].as_str().unwrap_or_default().starts_with("PCIe AER"))
        .count();
    let replays = sum(
        &text,
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
        &format!("Hostname=\"{node}\""),
    );
    assert!(replays > 0.0);
    assert!(
        (replays - aer as f64).abs() < 0.5,
        "replays {replays} vs AER log entries {aer}"
    );
    // The windowed XID count holds at most the XIDs of the last 5 minutes and carries its window.
    assert!(text.contains("window_size_in_ms=\"300000\""));
    let xids_in_log = members
        .iter()
        .filter(|m| m["MessageArgs"][1].as_str().unwrap_or_default().starts_with("XID"))
        .count() as f64;
    let windowed = sum(&text, "DCGM_EXP_XID_ERRORS_COUNT", &format!("Hostname=\"{node}\""));
    assert!(windowed <= xids_in_log, "{windowed} > {xids_in_log}");
    assert!(sum(&text, "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "") > 0.0);
    h.fleet.shutdown().await;
}

#[tokio::test]
async fn windowed_xid_count_rises_and_falls_with_the_window() {
    // A high XID rate so that a 5-minute window holds some.
    let yaml = SMALL.replace("xid_errors_per_gpu_hour: 0.5", "xid_errors_per_gpu_hour: 30");
    let h = start(&yaml).await;
    let mut seen_nonzero = false;
    let mut seen_fall = false;
    let mut prev = 0.0;
    for _ in 0..60 {
        h.advance(SimDuration::minutes(1));
        let text = dcgm(&h).await;
        let v = sum(
            &text,
            "DCGM_EXP_XID_ERRORS_COUNT",
            &format!("Hostname=\"{}\"", h.name(0)),
        );
        seen_nonzero |= v > 0.0;
        seen_fall |= v < prev;
        prev = v;
        // The last-XID gauge holds a code, never a count.
        for line in text.lines().filter(|l| l.starts_with("DCGM_FI_DEV_XID_ERRORS{")) {
            let code: u16 = line.rsplit(' ').next().and_then(|v| v.parse().ok()).expect("code");
            assert!(code == 0 || bmc_sim::BASELINE_XID_CODES.contains(&code), "{line}");
        }
    }
    assert!(seen_nonzero && seen_fall, "the windowed count must rise and fall");
    h.fleet.shutdown().await;
}

#[tokio::test]
async fn exporter_restart_resets_counters_and_stop_removes_the_node() {
    let h = start(&format!("{SMALL}{DCGM_SCENARIO_EXTRA}")).await;
    h.advance(SimDuration::hours(10));
    let node = h.name(2);
    let me = format!("Hostname=\"{node}\"");
    let before = sum(&dcgm(&h).await, "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", &me);
    assert!(before > 0.0);
    let r = h
        .control(
            Method::POST,
            &format!("/sim/nodes/{node}/dcgm"),
            Some(json!({"action": "restart"})),
        )
        .await;
    assert_eq!(r.status(), 200);
    let text = dcgm(&h).await;
    // Still reporting, from zero.
    assert_eq!(
        text.lines()
            .filter(|l| l.starts_with("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL{") && l.contains(&me))
            .count(),
        8,
        "{text}"
    );
    assert_eq!(sum(&text, "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", &me), 0.0);
    assert_eq!(sum(&text, "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", &me), 0.0);
    // Other nodes keep counting.
    let other = format!("Hostname=\"{}\"", h.name(1));
    assert!(sum(&text, "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", &other) > 0.0);
    h.advance(SimDuration::hours(5));
    assert!(sum(&dcgm(&h).await, "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", &me) > 0.0);

    let r = h
        .control(
            Method::POST,
            &format!("/sim/nodes/{node}/dcgm"),
            Some(json!({"action": "stop"})),
        )
        .await;
    assert_eq!(r.status(), 200);
    assert!(!dcgm(&h).await.contains(&me));
    let one = h.control(Method::GET, &format!("/sim/dcgm/{node}/metrics"), None).await;
    assert_eq!(one.status(), 503);
    h.control(
        Method::POST,
        &format!("/sim/nodes/{node}/dcgm"),
        Some(json!({"action": "start"})),
    )
    .await;
    let one = h.control(Method::GET, &format!("/sim/dcgm/{node}/metrics"), None).await;
    assert_eq!(one.status(), 200);
    assert!(one.text().await.expect("text").contains(&me));
    let bad = h
        .control(
            Method::POST,
            &format!("/sim/nodes/{node}/dcgm"),
            Some(json!({"action": "explode"})),
        )
        .await;
    assert_eq!(bad.status(), 400);
    h.fleet.shutdown().await;
}

#[test]
fn dcgm_scenario_keys_parse_and_firmware_effects_may_name_dcgm_signals() {
    let yaml = format!(
        "{}{DCGM_SCENARIO_EXTRA}",
        SMALL.replace(
            "      - {metric: gpu_temp_c, add: 2.5, onset: 0s}",
            "      - {metric: gpu_temp_c, add: 2.5, onset: 0s}\n      - {metric: ecc_dbe_per_gpu_hour, multiply: 20, onset: 0s}",
        )
    );
    bmc_sim::Scenario::from_yaml_str(&yaml).expect("the new metric names are scenario metrics");
    let bad = format!("{SMALL}dcgm:\n  ecc_dbe_per_gpu_hour: -1\n");
    assert!(bmc_sim::Scenario::from_yaml_str(&bad).is_err());
}
