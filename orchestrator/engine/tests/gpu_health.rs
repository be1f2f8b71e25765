//! Issue 21, "health from real layouts": the Redfish health collector against bmc-sim's `hgx-h100`
//! profile, over loopback HTTP. The profile lays health out as a DGX does: the host system `DGX` is
//! listed first with its own SEL and event log, the GPUs are Processors of `Systems/HGX_Baseboard_0`,
//! whose `EventLog` holds the XIDs (each `OriginOfCondition` the GPU's chassis), and every GPU has its
//! own chassis with `HGX_GPU_SXM_<n>_TEMP_0`, a memory temperature and a power sensor, all related to
//! the GPU by `RelatedItem`.
//!
//! - Per-GPU temperatures and XIDs land on the right GPU (`GPU_SXM_1..8`), the GPU count comes from
//!   the inventory, and the host's logs are not read for GPU events.
//! - A BMC whose event log repeats its `nextLink` costs two page requests per poll, and the canary's
//!   verdict names the node and the reason (stored on its health cursor from its first poll on).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bmc_sim::Scenario;
use integration_tests::fixtures::{PolicyYaml, WaveSize, WaveYaml, health_section, redfish_gate};
use integration_tests::{GPU_FROM, GPU_TO, Harness, SKU, ScenarioYaml, sim_endpoint};
use orchestrator_bmc::{Bmc, BmcEndpoint, EventCursor, HttpClients, RedfishBmc, SensorKind};
use orchestrator_db::execution::{StepFilter, StepPurpose, WaveState};
use orchestrator_db::health::{Cohort, SampleScope};
use orchestrator_engine::watch::classify::{classify_event, event_gpu, gpu_count, gpu_levels};
use orchestrator_engine::watch::{DetectorEvidence, DetectorJudge};
use orchestrator_policy::RedfishMetric;
use orchestrator_types::Outcome;

const NODES: usize = 6;

fn scenario(xid_per_gpu_hour: f64) -> Scenario {
    ScenarioYaml::profile("hgx-h100", SKU, NODES)
        .seed(21)
        .gpu_firmware(GPU_TO, "{min: 2m, max: 4m}")
        .gpu_firmware(GPU_FROM, "{min: 2m, max: 4m}")
        .baseline("gpu_temp_c: {mean: 62, sd: 3}")
        .baseline("gpu_power_w: {mean: 550, sd: 40}")
        .baseline(&format!("xid_errors_per_gpu_hour: {xid_per_gpu_hour}"))
        .build()
}

fn endpoint(url: &str) -> BmcEndpoint {
    sim_endpoint(url).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hgx_temperatures_and_xids_land_on_the_right_gpu() {
    // 30 XIDs per GPU-hour: a few simulated minutes give dozens over eight GPUs.
    let h = Harness::start_with(scenario(30.0), false).await.unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let bmc = RedfishBmc::new(&endpoint(&h.fleet.endpoints()[0].bmc_url), &HttpClients::new()).unwrap();

    let gpus = bmc.gpus().await.unwrap();
    let ids: Vec<&str> = gpus.iter().map(|g| g.id.as_str()).collect();
    let expected: Vec<String> = (1..=8).map(|n| format!("GPU_SXM_{n}")).collect();
    assert_eq!(ids, expected, "the baseboard's GPU processors, not the host's CPUs");
    for (g, n) in gpus.iter().zip(1..) {
        assert_eq!(
            g.uri,
            format!("/redfish/v1/Systems/HGX_Baseboard_0/Processors/GPU_SXM_{n}")
        );
        assert_eq!(g.index(), Some(n));
    }

    let sensors = bmc.read_sensors().await.unwrap();
    assert_eq!(gpu_count(&sensors, &gpus), 8);
    let levels = gpu_levels(&sensors, &gpus);
    let reading = |id: String| {
        sensors
            .iter()
            .find(|s| s.id == id)
            .and_then(|s| s.reading)
            .unwrap_or_else(|| panic!("sensor {id}"))
    };
    assert_eq!(levels["gpu_temp_c"].len(), 8, "{levels:?}");
    assert_eq!(levels["gpu_power_w"].len(), 8, "{levels:?}");
    for n in 1..=8 {
        let unit = format!("GPU_SXM_{n}");
        let temp = levels["gpu_temp_c"][&unit];
        assert_eq!(temp, reading(format!("HGX_GPU_SXM_{n}_TEMP_0")), "{unit}");
        assert_ne!(
            temp,
            reading(format!("HGX_GPU_SXM_{n}_DRAM_0_Temp_0")),
            "{unit}: not the memory's"
        );
        assert_eq!(
            levels["gpu_power_w"][&unit],
            reading(format!("HGX_GPU_SXM_{n}_Power_0"))
        );
    }
    // Each GPU's temperature sensor is related to its processor.
    let t1 = sensors.iter().find(|s| s.id == "HGX_GPU_SXM_1_TEMP_0").unwrap();
    assert_eq!(t1.kind, SensorKind::Temperature);
    assert_eq!(t1.related, vec![gpus[0].uri.clone()]);

    let batch = bmc.read_events(&EventCursor::default()).await.unwrap();
    let xids: Vec<_> = batch
        .entries
        .iter()
        .filter(|e| classify_event(e) == Some(RedfishMetric::XidErrorsPerGpuHour))
        .collect();
    assert!(xids.len() >= 10, "{} XIDs", xids.len());
    let mut per_gpu: BTreeMap<String, usize> = BTreeMap::new();
    for e in &xids {
        let origin = e.origin.as_deref().unwrap_or_default();
        assert!(origin.starts_with("/redfish/v1/Chassis/HGX_GPU_SXM_"), "{e:?}");
        // bmc-sim names the GPU it generated the XID for in MessageArgs[0]: the truth to match.
        let gpu = event_gpu(e, &gpus);
        assert_eq!(gpu.as_deref(), e.message_args.first().map(String::as_str), "{e:?}");
        *per_gpu.entry(gpu.unwrap_or_default()).or_default() += 1;
    }
    assert!(per_gpu.len() > 1, "XIDs spread over GPUs: {per_gpu:?}");
    // The HGX event log, not the host's SEL or event log (boot and status entries only).
    assert!(
        batch.entries.iter().all(|e| e.entry_type.as_deref() == Some("Event")
            && e.message_id.as_deref() != Some("ResourceEvent.1.3.ResourceStatusChangedOK")),
        "a host log was read"
    );
    h.shutdown().await;
}

fn policy() -> String {
    PolicyYaml::two_waves("hgx-health")
        .inventory_id("HGX_FW_GPU_SXM_*")
        .waves(vec![
            WaveYaml::new("canary", WaveSize::Count(3))
                .bake("1h")
                .max_in_flight(3)
                .line("gates: [xid_errors, gpu_temp]"),
            WaveYaml::new("rest", WaveSize::Rest)
                .max_in_flight(NODES as u32)
                .line("gates: []"),
        ])
        .concurrency(
            NODES as u32,
            &[&format!("per_rack: {NODES}"), &format!("per_nvlink_domain: {NODES}")],
        )
        .health(&health_section(
            0.05,
            &[
                redfish_gate("xid_errors", "xid_errors_per_gpu_hour", "rate", "1.5", "10m"),
                redfish_gate("gpu_temp", "gpu_temp_c", "level", "3", "10m"),
            ],
        ))
        .max_failed(2)
        .automatic_rollback(false)
        .rollback_scope("wave")
        .render()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_looping_next_link_stops_at_its_first_repeat_and_the_gate_names_the_node() {
    let mut h = Harness::start_with(scenario(2.0), false).await.unwrap();
    let release = h.add_release(GPU_TO, true).await;
    h.add_release(GPU_FROM, true).await;
    let rollout = h.start_rollout(release.id, policy(), 5).await;
    let waves = h.db.rollout_waves(rollout.id).await.unwrap();
    let canary = waves.iter().find(|w| w.name == "canary").unwrap();
    assert!(
        canary.control_nodes.len() >= 2,
        "a control cohort: {:?}",
        canary.control_nodes
    );
    let canary_steps =
        h.db.steps(&StepFilter {
            wave_id: Some(canary.id),
            purpose: Some(StepPurpose::Update),
            ..Default::default()
        })
        .await
        .unwrap();
    // One canary BMC's and one control BMC's event logs loop from the start.
    let looping = h.db.node(canary_steps[0].node_id).await.unwrap();
    let looping_control = h.db.node(canary.control_nodes[0]).await.unwrap();
    for node in [&looping, &looping_control] {
        let resp = reqwest::Client::new()
            .put(format!("{}/sim/nodes/{}/faults", h.fleet.control_url(), node.name))
            .json(&serde_json::json!({ "looping_next_link": true }))
            .send()
            .await
            .unwrap();
        assert!(resp.status().is_success(), "{}", resp.status());
    }

    // One set of drivers for flashing and watching, as `serve` wires it.
    let redfish = h.redfish();
    let judge = Arc::new(DetectorJudge::new(h.db.clone(), redfish.clone()));
    h.start_engine_full(h.config(), redfish, judge);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let canary = loop {
        let waves = h.db.rollout_waves(rollout.id).await.unwrap();
        let canary = waves.into_iter().find(|w| w.name == "canary").unwrap();
        if canary.verdict.is_some() || tokio::time::Instant::now() > deadline {
            break canary;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    h.stop_engine().await;

    // The gate shows the node and the reason; its health was never read, so no Pass.
    let verdict = canary.verdict.as_ref().expect("the canary was judged");
    assert_eq!(canary.state, WaveState::AwaitingApproval, "{verdict:#?}");
    assert_eq!(verdict.outcome, Outcome::Error, "{verdict:#?}");
    assert!(
        verdict.summary.contains(&looping.name) && verdict.summary.contains("nextLink"),
        "{}",
        verdict.summary
    );
    assert!(
        verdict.summary.contains(&format!(
            "left out of the control: health of control node {}",
            looping_control.name
        )),
        "{}",
        verdict.summary
    );
    let evidence: DetectorEvidence = serde_json::from_value(verdict.evidence.clone()).unwrap();
    let errors: Vec<_> = evidence.poll_errors.iter().map(|e| (e.node, e.cohort)).collect();
    assert_eq!(
        errors,
        [(looping.id, Cohort::Canary), (looping_control.id, Cohort::Control)],
        "{evidence:#?}"
    );
    assert!(
        evidence.poll_errors.iter().all(|e| e.error.contains("repeats")),
        "{evidence:#?}"
    );

    // Stored on the node's cursor, which its first failed poll created.
    let cursors = h.db.health_cursors(canary.id).await.unwrap();
    let stored = cursors
        .iter()
        .find(|c| c.node_id == looping.id)
        .expect("a cursor for the looping node");
    assert!(
        stored.last_error.as_deref().unwrap_or_default().contains("repeats"),
        "{stored:?}"
    );
    // Every poll read the first page and the page it links to, then stopped at the repeat.
    let unread = [looping.id, looping_control.id];
    let rounds = cursors
        .iter()
        .filter(|c| !unread.contains(&c.node_id))
        .map(|c| c.polls)
        .max()
        .unwrap();
    let pages = h.fleet.event_log_pages(&looping.name).unwrap();
    assert!(pages >= 2, "{pages}");
    assert!(
        pages <= 2 * u64::try_from(rounds).unwrap() + 2,
        "{pages} event-log pages over {rounds} polls"
    );

    // Everyone else was read on the HGX layout: eight GPUs each, temperatures per GPU_SXM unit,
    // XIDs counted under the GPU their entry's OriginOfCondition names.
    let samples = h.db.health_samples(SampleScope::Wave(canary.id)).await.unwrap();
    let watched: Vec<_> = cursors.iter().filter(|c| !unread.contains(&c.node_id)).collect();
    assert!(watched.iter().any(|c| c.cohort == Cohort::Control));
    let gpu_units: Vec<String> = (1..=8).map(|n| format!("GPU_SXM_{n}")).collect();
    let mut xids = 0;
    for c in &watched {
        assert_eq!(c.gpus, 8, "{c:?}");
        assert_eq!(c.last_error, None, "{c:?}");
        let node = h.db.node(c.node_id).await.unwrap();
        let temps: std::collections::BTreeSet<&String> = samples
            .iter()
            .filter(|s| s.node_id == c.node_id && s.metric == "gpu_temp_c")
            .flat_map(|s| s.units.keys())
            .collect();
        assert_eq!(
            temps.into_iter().cloned().collect::<Vec<_>>(),
            gpu_units,
            "{}",
            node.name
        );
        // The stored per-GPU XID counts against the log itself, over the same span.
        let mut stored: BTreeMap<String, u64> = BTreeMap::new();
        for s in samples
            .iter()
            .filter(|s| s.node_id == c.node_id && s.metric == "xid_errors_per_gpu_hour")
        {
            // Each GPU's unit counts its entries; the window's events count an XID cascade over
            // several GPUs once (one episode), so there are at most as many events as entries.
            let entries = s.units.values().map(|a| a.n).sum::<u64>();
            assert!(s.events <= entries && (entries == 0) == (s.events == 0), "{s:?}");
            for (unit, agg) in &s.units {
                *stored.entry(unit.clone()).or_default() += agg.n;
            }
        }
        let cursor: EventCursor = serde_json::from_value(c.event_cursor.clone().unwrap()).unwrap();
        let bmc = RedfishBmc::new(&endpoint(&node.bmc_url), &HttpClients::new()).unwrap();
        let mut truth: BTreeMap<String, u64> = BTreeMap::new();
        for e in bmc.read_events(&EventCursor::default()).await.unwrap().entries {
            let counted = e.created >= c.exposure_start && !cursor.is_new(&e);
            if counted && classify_event(&e) == Some(RedfishMetric::XidErrorsPerGpuHour) {
                *truth.entry(e.message_args[0].clone()).or_default() += 1;
            }
        }
        assert_eq!(stored, truth, "{}", node.name);
        xids += truth.values().sum::<u64>();
    }
    assert!(xids > 10, "{xids} XIDs over the watched nodes");
    h.shutdown().await;
}
