//! The `hgx-h100` profile's health layout (`redfish_layout`), as a client walking links sees it: the
//! host system first with its own logs, the GPUs and their event log under the baseboard system,
//! per-GPU chassis whose sensors name their GPU by `RelatedItem`, XIDs whose `OriginOfCondition` is the
//! GPU's chassis, `$expand` advertised and honoured; and the looping `nextLink` fault.

mod common;

use chrono::Duration;
use common::{SKU, start};
use serde_json::{Value, json};

fn scenario(extra_faults: &str) -> String {
    format!(
        r#"
seed: 3
platform: hgx-h100
fleet:
  nodes: 2
  racks: 1
  clusters: 1
  region: r
  sku: {SKU}
baseline:
  xid_errors_per_gpu_hour: 30
bmc_faults:
  reset_time: {{min: 30s, max: 60s}}
{extra_faults}
"#
    )
}

fn members(v: &Value) -> Vec<String> {
    v["Members"]
        .as_array()
        .expect("Members")
        .iter()
        .map(|m| m["@odata.id"].as_str().expect("@odata.id").to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hgx_health_layout_is_the_dgx_one() {
    let h = start(&scenario("")).await;
    h.advance(Duration::hours(1));

    let root = h.get_json(0, "/redfish/v1").await;
    assert_eq!(root["ProtocolFeaturesSupported"]["ExpandQuery"]["NoLinks"], json!(true));

    let systems = h.get_json(0, "/redfish/v1/Systems").await;
    assert_eq!(
        members(&systems),
        ["/redfish/v1/Systems/DGX", "/redfish/v1/Systems/HGX_Baseboard_0"],
        "the host first, as a DGX lists it"
    );
    assert_eq!(h.get(0, "/redfish/v1/Systems/1").await.status(), 404);
    let host = h.get_json(0, "/redfish/v1/Systems/DGX").await;
    assert_eq!(
        host["Actions"]["#ComputerSystem.Reset"]["target"],
        json!("/redfish/v1/Systems/DGX/Actions/ComputerSystem.Reset")
    );
    let cpus = h.get_json(0, "/redfish/v1/Systems/DGX/Processors/CPU_0").await;
    assert_eq!(cpus["ProcessorType"], json!("CPU"));
    let host_logs = h.get_json(0, "/redfish/v1/Systems/DGX/LogServices").await;
    assert_eq!(
        members(&host_logs),
        [
            "/redfish/v1/Systems/DGX/LogServices/SEL",
            "/redfish/v1/Systems/DGX/LogServices/EventLog"
        ]
    );
    let sel = h.get_json(0, "/redfish/v1/Systems/DGX/LogServices/SEL/Entries").await;
    assert!(
        sel["Members"]
            .as_array()
            .unwrap()
            .iter()
            .all(|e| e["EntryType"] == json!("SEL"))
    );

    let gpus = h
        .get_json(0, "/redfish/v1/Systems/HGX_Baseboard_0/Processors?$expand=.($levels=1)")
        .await;
    let gpus = gpus["Members"].as_array().unwrap();
    assert_eq!(gpus.len(), 8);
    assert_eq!(gpus[0]["Id"], json!("GPU_SXM_1"), "expanded inline");
    assert_eq!(gpus[0]["ProcessorType"], json!("GPU"));
    assert_eq!(
        gpus[7]["Links"]["Chassis"]["@odata.id"],
        json!("/redfish/v1/Chassis/HGX_GPU_SXM_8")
    );

    let service = h
        .get_json(0, "/redfish/v1/Systems/HGX_Baseboard_0/LogServices/EventLog")
        .await;
    assert!(
        service.get("LogEntryType").is_none(),
        "HGX's log service states no LogEntryType"
    );

    let chassis = h.get_json(0, "/redfish/v1/Chassis").await;
    assert!(members(&chassis).contains(&"/redfish/v1/Chassis/HGX_GPU_SXM_3".to_owned()));
    let plain = h.get_json(0, "/redfish/v1/Chassis/HGX_GPU_SXM_3/Sensors").await;
    assert_eq!(
        members(&plain),
        [
            "/redfish/v1/Chassis/HGX_GPU_SXM_3/Sensors/HGX_GPU_SXM_3_TEMP_0",
            "/redfish/v1/Chassis/HGX_GPU_SXM_3/Sensors/HGX_GPU_SXM_3_DRAM_0_Temp_0",
            "/redfish/v1/Chassis/HGX_GPU_SXM_3/Sensors/HGX_GPU_SXM_3_Power_0"
        ]
    );
    assert!(
        plain["Members"][0].get("Reading").is_none(),
        "links only without $expand"
    );
    let sensors = h
        .get_json(0, "/redfish/v1/Chassis/HGX_GPU_SXM_3/Sensors?$expand=.($levels=1)")
        .await;
    for s in sensors["Members"].as_array().unwrap() {
        assert!(s["Reading"].is_number(), "{s}");
        assert_eq!(
            s["RelatedItem"],
            json!([{ "@odata.id": "/redfish/v1/Systems/HGX_Baseboard_0/Processors/GPU_SXM_3" }])
        );
    }
    assert_eq!(sensors["Members"][0]["PhysicalContext"], json!("GPU"));
    assert_eq!(sensors["Members"][1]["PhysicalContext"], json!("Memory"));

    let log = h
        .get_json(0, "/redfish/v1/Systems/HGX_Baseboard_0/LogServices/EventLog/Entries")
        .await;
    let xids: Vec<&Value> = log["Members"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["MessageArgs"][1].as_str().unwrap_or_default().starts_with("XID"))
        .collect();
    assert!(xids.len() > 20, "{} XIDs", xids.len());
    for e in xids {
        let gpu = e["MessageArgs"][0].as_str().unwrap();
        assert_eq!(
            e["Links"]["OriginOfCondition"]["@odata.id"],
            json!(format!("/redfish/v1/Chassis/HGX_{gpu}")),
            "{e}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_looping_event_log_names_the_same_next_page_forever() {
    const ENTRIES: &str = "/redfish/v1/Systems/HGX_Baseboard_0/LogServices/EventLog/Entries";
    let h = start(&scenario("")).await;
    h.advance(Duration::minutes(10));
    let healthy = h.get_json(0, ENTRIES).await;
    assert!(healthy.get("Members@odata.nextLink").is_none(), "{healthy}");

    let r = h
        .control(
            reqwest::Method::PUT,
            &format!("/sim/nodes/{}/faults", h.name(0)),
            Some(json!({ "looping_next_link": true })),
        )
        .await;
    assert!(r.status().is_success());
    let first = h.get_json(0, ENTRIES).await;
    let next = first["Members@odata.nextLink"].as_str().expect("a nextLink").to_owned();
    let second = h.get_json(0, &next).await;
    assert_eq!(second["Members@odata.nextLink"], json!(next), "the same page again");
    assert_eq!(h.fleet.event_log_pages(&h.name(0)), Some(3));
    assert_eq!(h.fleet.event_log_pages(&h.name(1)), Some(0));

    // The scenario knob: every node of a share of 1.
    let all = start(&scenario("  looping_next_link: 1.0")).await;
    for node in 0..2 {
        let page = all.get_json(node, ENTRIES).await;
        assert!(page.get("Members@odata.nextLink").is_some(), "node {node}");
    }
    let bad = bmc_sim::Scenario::from_yaml_str(&scenario("  looping_next_link: 1.5")).unwrap_err();
    assert!(bad.to_string().contains("bmc_faults.looping_next_link"), "{bad}");
}

/// A scenario's own `redfish_layout` over bmc-sim's plain one: `$expand` advertised and honoured on
/// every collection a controller walks (systems, chassis, log services, firmware inventory), each
/// expanded member the document its own GET gives; without `$expand` they stay links.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scenario_layout_can_advertise_expand_on_the_plain_layout() {
    let h = start(&format!(
        r#"
seed: 3
fleet:
  nodes: 1
  sku: {SKU}
  components:
    - {{id: BMC_Firmware, kind: bmc, version: "24.04.1"}}
    - {{id: "HGX_FW_GPU_{{0..7}}", kind: gpu, version: "96.00.5E.00.01"}}
redfish_layout:
  expand_query: true
"#
    ))
    .await;
    let root = h.get_json(0, "/redfish/v1").await;
    assert_eq!(root["ProtocolFeaturesSupported"]["ExpandQuery"]["NoLinks"], json!(true));
    for (collection, expect_key) in [
        ("/redfish/v1/Systems", "Processors"),
        ("/redfish/v1/Chassis", "Sensors"),
        ("/redfish/v1/Systems/1/LogServices", "Entries"),
        ("/redfish/v1/UpdateService/FirmwareInventory", "Version"),
    ] {
        let plain = h.get_json(0, collection).await;
        assert!(
            plain["Members"][0].get(expect_key).is_none(),
            "{collection}: links only"
        );
        let expanded = h.get_json(0, &format!("{collection}?$expand=.($levels=1)")).await;
        let members = expanded["Members"].as_array().expect("Members");
        assert_eq!(
            members.len(),
            plain["Members"].as_array().unwrap().len(),
            "{collection}"
        );
        for member in members {
            let own = h.get_json(0, member["@odata.id"].as_str().unwrap()).await;
            assert!(member.get(expect_key).is_some(), "{collection}: {member}");
            assert_eq!(member["Id"], own["Id"], "{collection}");
            assert_eq!(member.get(expect_key), own.get(expect_key), "{collection}");
        }
    }
    let bad = bmc_sim::Scenario::from_yaml_str(&format!(
        "fleet: {{nodes: 1, sku: {SKU}, components: [{{id: B, kind: bmc, version: \"1\"}}]}}\nredfish_layout: {{temp_sensor: T}}\n"
    ))
    .unwrap_err();
    assert!(bad.to_string().contains("redfish_layout"), "{bad}");
}
