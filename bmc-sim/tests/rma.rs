//! The RMA pipeline's simulated world (issue 25): GPUs as parts (serial, part number, lot, production
//! date), hardware failures and what each shows over Redfish and DCGM, replacement, the parts manifest,
//! and `LogService.CollectDiagnosticData` end to end — over real HTTP on loopback.

mod common;

use std::collections::{BTreeMap, BTreeSet};

use bmc_sim::{HardwareFailureMode, PARTS_MANIFEST_COLUMNS, Scenario};
use chrono::Duration;
use common::{Harness, SMALL, one_node_on, start};
use serde_json::{Value, json};

const RMA: &str = include_str!("../scenarios/rma-defective-lot.yaml");

/// One node of the small fleet with one scripted failure of each mode at 1h (GPUs 0, 1, 2).
fn one_of_each(platform: &str) -> String {
    format!(
        "{}hardware:\n  failures:\n    - {{node: node-00000, gpu: 0, mode: fallen_off_bus, at: 1h}}\n    \
         - {{node: node-00000, gpu: 1, mode: row_remap_failure, at: 1h}}\n    \
         - {{node: node-00000, gpu: 2, mode: uncorrectable_ecc, at: 1h}}\n",
        one_node_on(platform).replace("xid_errors_per_gpu_hour: 0.5", "xid_errors_per_gpu_hour: 0")
    )
}

fn error_text(yaml: &str) -> String {
    let err = Scenario::from_yaml_str(yaml).expect_err("rejected");
    orchestrator_types::error_sources(&err)
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(" / ")
}

#[test]
fn scenario_keys_parse_with_defaults_and_refuse_with_a_place() {
    let s = Scenario::from_yaml_str(RMA).expect("rma scenario parses");
    assert_eq!(s.parts.lots.len(), 4);
    assert!(
        (s.parts.lots[3].share - 0.30).abs() < 1e-9,
        "the open lot takes the rest"
    );
    assert_eq!(s.parts.lots[0].date_code, "2311");
    assert_eq!(s.hardware.lot_multiplier("LOT-2311"), 5.0);
    assert_eq!(s.hardware.failures.len(), 6);

    let plain = Scenario::from_yaml_str(SMALL).expect("small parses");
    assert_eq!(plain.hardware.failures_per_gpu_hour, 0.0);
    assert!(!plain.parts.lots.is_empty(), "every GPU gets a lot without `parts:`");

    // Shapes serde refuses carry the file's line and column.
    let bad_mode = format!("{SMALL}hardware:\n  failures:\n    - {{node: node-00000, gpu: 0, mode: melted, at: 1h}}\n");
    let text = error_text(&bad_mode);
    assert!(text.contains("melted") && text.contains("line"), "{text}");
    // Values name their key path.
    for (extra, needle) in [
        (
            "hardware:\n  failures:\n    - {node: node-00009, gpu: 0, mode: fallen_off_bus, at: 1h}\n",
            "hardware.failures[0].node",
        ),
        (
            "hardware:\n  failures:\n    - {node: node-00000, gpu: 8, mode: fallen_off_bus, at: 1h}\n",
            "hardware.failures[0].gpu",
        ),
        (
            "hardware:\n  defective_lots: [{lot: NOPE, multiply: 5}]\n",
            "hardware.defective_lots[0].lot",
        ),
        ("parts:\n  lots: [{id: A, share: 0.5}]\n", "parts.lots"),
        (
            "parts:\n  lots: [{id: A, production_date: \"2024-13-01\"}]\n",
            "parts.lots[0].production_date",
        ),
        (
            "hardware:\n  failures_per_gpu_hour: -1\n",
            "hardware.failures_per_gpu_hour",
        ),
    ] {
        let text = error_text(&format!("{SMALL}{extra}"));
        assert!(text.contains(needle), "{extra}: {text}");
    }
}

async fn failures(h: &Harness, all: bool) -> Vec<Value> {
    let path = if all {
        "/sim/hardware-failures?all=true"
    } else {
        "/sim/hardware-failures"
    };
    let resp = h.control(reqwest::Method::GET, path, None).await;
    assert_eq!(resp.status(), 200);
    resp.json::<Vec<Value>>().await.expect("json")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_gpu_has_a_serial_part_number_and_assembly_on_both_layouts() {
    for (platform, gpu_system, first_gpu) in [("default", "1", "GPU_0"), ("hgx-h100", "HGX_Baseboard_0", "GPU_SXM_1")] {
        let h = start(&one_node_on(platform)).await;
        let parts = h.fleet.gpu_parts();
        assert_eq!(parts.len(), 8, "{platform}");
        let processor = h
            .get_json(0, &format!("/redfish/v1/Systems/{gpu_system}/Processors/{first_gpu}"))
            .await;
        assert_eq!(processor["SerialNumber"], json!(parts[0].serial), "{platform}");
        assert_eq!(processor["PartNumber"], json!(parts[0].part_number));
        assert_eq!(processor["Manufacturer"], json!("NVIDIA"));
        let assembly_uri = processor["Assembly"]["@odata.id"].as_str().expect("Assembly link");
        let assembly = h.get_json(0, assembly_uri).await;
        assert_eq!(assembly["@odata.type"], json!("#Assembly.v1_5_1.Assembly"));
        let a = &assembly["Assemblies"][0];
        assert_eq!(a["SerialNumber"], processor["SerialNumber"]);
        assert_eq!(a["PartNumber"], processor["PartNumber"]);
        assert_eq!(
            a["ProductionDate"],
            json!(format!("{}T00:00:00Z", parts[0].production_date))
        );
        assert_eq!(a["MemberId"], json!("0"));
        assert!(
            a["@odata.id"].as_str().unwrap().starts_with(assembly_uri),
            "{platform}: {a}"
        );
        // Redfish has no lot property: the lot stays in the manifest.
        assert!(!assembly.to_string().contains(&parts[0].lot), "{platform}");
        h.fleet.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serials_are_unique_and_the_manifest_matches_the_controllers_columns() {
    let h = start(RMA).await;
    let parts = h.fleet.gpu_parts();
    assert_eq!(parts.len(), 64 * 8);
    let serials: BTreeSet<&str> = parts.iter().map(|p| p.serial.as_str()).collect();
    assert_eq!(serials.len(), parts.len(), "serials are unique");
    assert!(
        parts
            .iter()
            .all(|p| p.serial.len() == 13 && p.serial.starts_with("1654"))
    );
    let mut per_lot: BTreeMap<&str, usize> = BTreeMap::new();
    for p in &parts {
        *per_lot.entry(p.lot.as_str()).or_default() += 1;
    }
    assert_eq!(per_lot["LOT-2311"], 15, "3% of 512, exactly: {per_lot:?}");
    assert_eq!(per_lot.values().sum::<usize>(), 512);

    let resp = h.control(reqwest::Method::GET, "/sim/parts-manifest", None).await;
    assert_eq!(resp.status(), 200);
    assert!(resp.headers()["content-type"].to_str().unwrap().starts_with("text/csv"));
    let csv = resp.text().await.unwrap();
    assert_eq!(csv, h.fleet.parts_manifest_csv());
    let mut lines = csv.lines();
    // The contract with `orchestrator_db::parts::MANIFEST_COLUMNS` (bmc-sim does not depend on the db
    // crate, so the header is pinned here).
    assert_eq!(lines.next(), Some("serial,part_number,lot,date_code,production_date"));
    assert_eq!(
        PARTS_MANIFEST_COLUMNS.join(","),
        "serial,part_number,lot,date_code,production_date"
    );
    let first: Vec<&str> = lines.next().unwrap().split(',').collect();
    assert_eq!(first[0], parts[0].serial);
    assert_eq!(first[2], parts[0].lot);
    assert_eq!(csv.lines().count(), 513);
    h.fleet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_seed_gives_the_same_parts_and_failures_and_another_seed_does_not() {
    let a = start(RMA).await;
    let b = start(RMA).await;
    let c = start(&RMA.replace("seed: 2501", "seed: 2502")).await;
    assert_eq!(a.fleet.parts_manifest_csv(), b.fleet.parts_manifest_csv());
    let (fa, fb) = (
        a.fleet.scheduled_hardware_failures(),
        b.fleet.scheduled_hardware_failures(),
    );
    assert_eq!(fa, fb);
    assert!(fa.len() > 40, "scattered random failures: {}", fa.len());
    assert_ne!(a.fleet.parts_manifest_csv(), c.fleet.parts_manifest_csv());
    assert_ne!(fa, c.fleet.scheduled_hardware_failures());
    // Over HTTP too, and `all` is the schedule.
    let all = failures(&a, true).await;
    assert_eq!(all.len(), fa.len());
    for h in [a, b, c] {
        h.fleet.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_defective_lot_fails_at_a_raised_rate() {
    let h = start(RMA).await;
    let failed = h.fleet.scheduled_hardware_failures();
    let parts = h.fleet.gpu_parts();
    let size = |lot: &str| parts.iter().filter(|p| (p.lot == lot) == (lot == "LOT-2311")).count();
    let rate = |defective: bool| {
        let n = failed
            .iter()
            .filter(|f| !f.explicit && (f.lot == "LOT-2311") == defective)
            .count();
        n as f64 / size(if defective { "LOT-2311" } else { "other" }) as f64
    };
    let (lot, rest) = (rate(true), rate(false));
    // 5x the hazard over 60 days: 1 - e^-0.72 = 0.51 of the lot against 1 - e^-0.144 = 0.13.
    assert!(lot > 2.0 * rest, "lot {lot:.3} vs rest {rest:.3}");
    assert!((0.08..0.2).contains(&rest), "rest {rest:.3}");
    // Every mode appears among the random ones.
    let modes: BTreeSet<HardwareFailureMode> = failed.iter().map(|f| f.mode).collect();
    assert_eq!(modes.len(), 3);
    // Failures are ground truth only once begun.
    assert!(h.fleet.hardware_failures().len() < failed.len());
    h.advance(Duration::days(61));
    assert_eq!(h.fleet.hardware_failures(), failed);
    h.fleet.shutdown().await;
}

fn xids(log: &Value) -> Vec<(String, String)> {
    log["Members"]
        .as_array()
        .expect("Members")
        .iter()
        .map(|e| {
            (
                e["Message"].as_str().unwrap_or_default().to_owned(),
                e["Created"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

async fn dcgm(h: &Harness) -> String {
    let resp = h
        .control(reqwest::Method::GET, &format!("/sim/dcgm/{}/metrics", h.name(0)), None)
        .await;
    assert_eq!(resp.status(), 200);
    resp.text().await.unwrap()
}

fn series<'a>(text: &'a str, name: &str, gpu: usize) -> Vec<&'a str> {
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{gpu=\"{gpu}\"")))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_failure_mode_shows_in_the_log_dcgm_and_the_processor() {
    let h = start(&one_of_each("default")).await;
    let log_uri = "/redfish/v1/Systems/1/LogServices/EventLog/Entries";
    h.advance(Duration::minutes(59));
    assert!(
        !xids(&h.get_json(0, log_uri).await)
            .iter()
            .any(|(m, _)| m.contains("XID")),
        "nothing before the onset"
    );
    assert!(h.fleet.hardware_failures().is_empty());
    let before = dcgm(&h).await;
    assert_eq!(series(&before, "DCGM_FI_DEV_GPU_TEMP", 0).len(), 1);

    h.advance(Duration::minutes(31));
    let log = xids(&h.get_json(0, log_uri).await);
    let t = |m: i64| (common::start_time() + Duration::minutes(m)).to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let expect = |gpu: usize, code: u16, minutes: &[i64]| -> Vec<(String, String)> {
        minutes
            .iter()
            .map(|&m| (format!("GPU_{gpu} reported XID {code}."), t(60 + m)))
            .collect()
    };
    let of = |code: &str| -> Vec<(String, String)> { log.iter().filter(|(m, _)| m.contains(code)).cloned().collect() };
    assert_eq!(of("XID 79"), expect(0, 79, &[0, 10, 25]), "{log:?}");
    assert_eq!(of("XID 64"), expect(1, 64, &[0]));
    assert_eq!(of("XID 48"), expect(2, 48, &[0, 4, 9]));

    let text = dcgm(&h).await;
    assert!(
        !text.lines().any(|l| l.contains("gpu=\"0\"")),
        "the lost GPU has no series"
    );
    assert_eq!(series(&text, "DCGM_FI_DEV_GPU_TEMP", 1).len(), 1);
    assert!(series(&text, "DCGM_FI_DEV_ROW_REMAP_FAILURE", 1)[0].ends_with(" 1"));
    assert!(series(&text, "DCGM_FI_DEV_ROW_REMAP_FAILURE", 2)[0].ends_with(" 0"));
    assert!(series(&text, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", 2)[0].ends_with(" 3"));

    let gpu = |g: usize| format!("/redfish/v1/Systems/1/Processors/GPU_{g}");
    let lost = h.get_json(0, &gpu(0)).await;
    assert_eq!(
        lost["Status"],
        json!({"State": "UnavailableOffline", "Health": "Critical"})
    );
    assert_eq!(h.get_json(0, &gpu(3)).await["Status"]["State"], json!("Enabled"));

    let begun = failures(&h, false).await;
    assert_eq!(begun.len(), 3);
    assert_eq!(begun[0]["mode"], json!("fallen_off_bus"));
    assert_eq!(begun[0]["serial"], lost["SerialNumber"]);
    assert_eq!(begun[0]["explicit"], json!(true));

    // Replacement: a new serial from the spare lot, the failure ends, the log keeps what was written.
    let old = lost["SerialNumber"].as_str().unwrap().to_owned();
    let resp = h
        .control(
            reqwest::Method::POST,
            &format!("/sim/nodes/{}/gpus/0/replace", h.name(0)),
            None,
        )
        .await;
    assert_eq!(resp.status(), 200);
    let part: Value = resp.json().await.unwrap();
    assert_ne!(part["serial"].as_str(), Some(old.as_str()));
    assert_eq!(part["lot"], json!("LOT-SPARE"));
    let fixed = h.get_json(0, &gpu(0)).await;
    assert_eq!(fixed["SerialNumber"], part["serial"]);
    assert_eq!(fixed["Status"]["State"], json!("Enabled"));
    assert_eq!(
        series(&dcgm(&h).await, "DCGM_FI_DEV_GPU_TEMP", 0).len(),
        1,
        "telemetry is back"
    );
    h.advance(Duration::hours(1));
    assert_eq!(
        xids(&h.get_json(0, log_uri).await)
            .iter()
            .filter(|(m, _)| m.contains("XID 79"))
            .count(),
        3
    );
    let after = h.fleet.hardware_failures();
    assert!(after[0].replaced_at.is_some() && after[0].serial == old);
    let manifest = h.fleet.parts_manifest_csv();
    assert!(manifest.contains(&old) && manifest.contains(part["serial"].as_str().unwrap()));
    assert_eq!(manifest.lines().count(), 1 + 9);
    // Replacing through the library too; unknown GPUs are refused.
    assert!(h.fleet.replace_gpu(&h.name(0), 1).is_ok());
    assert!(h.fleet.replace_gpu(&h.name(0), 8).is_err());
    let resp = h
        .control(reqwest::Method::POST, "/sim/nodes/nope/gpus/0/replace", None)
        .await;
    assert_eq!(resp.status(), 404);
    h.fleet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_on_the_hgx_layout_name_the_hgx_gpu() {
    let h = start(&one_of_each("hgx-h100")).await;
    h.advance(Duration::hours(2));
    let log = xids(
        &h.get_json(0, "/redfish/v1/Systems/HGX_Baseboard_0/LogServices/EventLog/Entries")
            .await,
    );
    assert_eq!(log.iter().filter(|(m, _)| m == "GPU_SXM_1 reported XID 79.").count(), 3);
    let lost = h
        .get_json(0, "/redfish/v1/Systems/HGX_Baseboard_0/Processors/GPU_SXM_1")
        .await;
    assert_eq!(lost["Status"]["State"], json!("UnavailableOffline"));
    h.fleet.shutdown().await;
}

/// Runs a diagnostic collection on node 0 and returns (entry, archive bytes).
async fn collect(h: &Harness, gpu_system: &str) -> (Value, Vec<u8>) {
    let services = h
        .get_json(0, &format!("/redfish/v1/Systems/{gpu_system}/LogServices"))
        .await;
    let dump = services["Members"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["@odata.id"].as_str())
        .find(|u| u.ends_with("/Dump"))
        .expect("a Dump log service")
        .to_owned();
    let service = h.get_json(0, &dump).await;
    let action = &service["Actions"]["#LogService.CollectDiagnosticData"];
    assert_eq!(
        action["DiagnosticDataType@Redfish.AllowableValues"],
        json!(["Manager", "OEM"])
    );
    let target = action["target"].as_str().unwrap();
    let secret = "pw-never-echoed-4711";
    let resp = h
        .post_json(
            0,
            target,
            json!({"DiagnosticDataType": "OEM", "UserName": "collector", "Password": secret}),
        )
        .await;
    assert_eq!(resp.status(), 202);
    let monitor = resp.headers()["location"].to_str().unwrap().to_owned();
    let accepted: Value = resp.json().await.unwrap();
    assert!(!accepted.to_string().contains(secret));
    let task_uri = accepted["@odata.id"].as_str().unwrap().to_owned();

    let running = h.get(0, &monitor).await;
    assert_eq!(running.status(), 202);
    h.advance(Duration::minutes(2));
    let done = h.get(0, &monitor).await;
    assert!(matches!(done.status().as_u16(), 200 | 201));
    let location = done.headers()["location"].to_str().unwrap().to_owned();
    let task = h.get_json(0, &task_uri).await;
    assert_eq!(task["TaskState"], json!("Completed"));
    assert_eq!(task["Links"]["CreatedResources"], json!([{"@odata.id": location}]));
    assert_eq!(task["Payload"]["HttpHeaders"], json!([format!("Location: {location}")]));
    assert!(!task.to_string().contains(secret) && !task.to_string().contains("collector"));

    let entry = h.get_json(0, &location).await;
    assert_eq!(entry["DiagnosticDataType"], json!("OEM"));
    let entries = h.get_json(0, &format!("{dump}/Entries")).await;
    assert_eq!(entries["Members"][0], entry);
    let data_uri = entry["AdditionalDataURI"].as_str().unwrap();
    let resp = h.get(0, data_uri).await;
    assert_eq!(resp.status(), 200);
    let bytes = resp.bytes().await.unwrap().to_vec();
    assert_eq!(entry["AdditionalDataSizeBytes"], json!(bytes.len()));
    let again = h.get(0, data_uri).await.bytes().await.unwrap().to_vec();
    assert_eq!(bytes, again, "every download is the same archive");
    assert!(!String::from_utf8_lossy(&bytes).contains(secret));
    (entry, bytes)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn collect_diagnostic_data_end_to_end() {
    let h = start(&one_of_each("default")).await;
    h.advance(Duration::hours(2));
    let (entry, bytes) = collect(&h, "1").await;
    assert_eq!(&bytes[257..262], b"ustar", "a tar archive");
    let text = String::from_utf8_lossy(&bytes);
    let serial = h.fleet.gpu_parts()[0].serial.clone();
    assert!(text.contains(&serial), "inventory names the serials");
    assert!(text.contains("GPU_0 reported XID 79."), "the recent log is in");
    assert!(text.contains("failed:fallen_off_bus"));
    assert_eq!(entry["OEMDiagnosticDataType"], json!("nvidia-bug-report"));

    // The same requests at the same simulated times on another fleet of the seed: the same bytes.
    let other = start(&one_of_each("default")).await;
    other.advance(Duration::hours(2));
    assert_eq!(collect(&other, "1").await.1, bytes);

    // Refusals name the parameter, never a credential.
    let target = "/redfish/v1/Systems/1/LogServices/Dump/Actions/LogService.CollectDiagnosticData";
    for body in [
        json!({"DiagnosticDataType": "OS", "Password": "pw-never-echoed-4711"}),
        json!({"DiagnosticDataType": "Manager", "TargetURI": "ftp://x/", "Password": "pw-never-echoed-4711"}),
        json!({"Password": "pw-never-echoed-4711"}),
    ] {
        let resp = h.post_json(0, target, body).await;
        assert_eq!(resp.status(), 400);
        assert!(!resp.text().await.unwrap().contains("pw-never-echoed-4711"));
    }
    h.fleet.shutdown().await;
    other.fleet.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn collect_diagnostic_data_on_the_hgx_layout() {
    let h = start(&one_node_on("hgx-h100")).await;
    let (entry, _) = collect(&h, "HGX_Baseboard_0").await;
    assert!(
        entry["@odata.id"]
            .as_str()
            .unwrap()
            .starts_with("/redfish/v1/Systems/HGX_Baseboard_0/LogServices/Dump/Entries/")
    );
    h.fleet.shutdown().await;
}
