//! The driver against `bmc-sim` over real loopback HTTP: both update flows end to end (the version
//! changes only after the reset), every fault the scenario and the control API can produce, and
//! discovery over a few hundred simulated BMCs.
//!
//! Time is a `ManualClock` shared with the simulator, so flashes and reboots take no real time and
//! "the version has not changed yet" is checked at a known simulated instant.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bmc_sim::{Fleet, FleetOptions, ImageServer, RunningFleet, Scenario};
use chrono::Utc;
use orchestrator_bmc::{
    ApplyTime, Bmc, BmcEndpoint, BmcError, Credentials, HttpClients, RedfishBmc, ResetKind, ResetTarget, RetryPolicy,
    TaskHandle, TaskState, TaskStatus, Timeouts, UpdateMethod, UpdateRequest,
};
use orchestrator_types::{ComponentKind, ManualClock};

const SMALL: &str = include_str!("../../../bmc-sim/scenarios/small.yaml");
const SKU: &str = "hgx-h100-8gpu";
const PASSWORD: &str = "sim-Passw0rd";
const GPU0: &str = "/redfish/v1/UpdateService/FirmwareInventory/HGX_FW_GPU_0";
const BMC_FW: &str = "/redfish/v1/UpdateService/FirmwareInventory/BMC_Firmware";

struct Harness {
    fleet: RunningFleet,
    clock: Arc<ManualClock>,
    clients: HttpClients,
    images: ImageServer,
}

impl Harness {
    async fn start(yaml: &str, nodes: Option<usize>, hang_for: Duration) -> Self {
        let scenario = Scenario::from_yaml_str(yaml).expect("scenario");
        let clock = Arc::new(ManualClock::new(Utc::now()));
        let mut options = FleetOptions::new(clock.clone());
        options.username = "root".into();
        options.password = PASSWORD.into();
        options.nodes = nodes;
        options.hang_for = hang_for;
        let fleet = Fleet::start(scenario, options).await.expect("fleet starts");
        Self {
            fleet,
            clock,
            clients: HttpClients::new(),
            images: ImageServer::start([]).await.expect("image server"),
        }
    }

    fn endpoint(&self, node: usize) -> BmcEndpoint {
        BmcEndpoint::new(
            self.fleet.endpoints()[node].bmc_url.parse().expect("url"),
            Credentials::new("root", PASSWORD),
        )
        .with_timeouts(Timeouts {
            connect: Duration::from_secs(2),
            request: Duration::from_secs(2),
            upload: Duration::from_secs(10),
            probe: Duration::from_secs(1),
        })
        .with_retry(RetryPolicy {
            max_retries: 2,
            base_delay: Duration::from_millis(10),
            max_delay: Duration::from_millis(50),
            max_retry_after: Duration::from_millis(50),
            deadline: Duration::from_secs(10),
        })
    }

    fn bmc(&self, node: usize) -> RedfishBmc {
        RedfishBmc::new(&self.endpoint(node), &self.clients).expect("driver")
    }

    fn name(&self, node: usize) -> &str {
        &self.fleet.endpoints()[node].name
    }

    /// Serves `/img/{kind}/{version}` (see [`image_bytes`]) and returns its URL.
    fn image_uri(&self, kind: &str, version: &str) -> String {
        self.images
            .insert(&format!("img/{kind}/{version}"), image_bytes(kind, version))
    }

    fn advance(&self, minutes: i64) {
        self.clock.advance(chrono::Duration::minutes(minutes));
    }

    /// Polls the task, moving simulated time a minute per poll, until it ends (or 60 polls pass).
    async fn run_task(&self, bmc: &dyn Bmc, task: &TaskHandle) -> Result<TaskStatus, BmcError> {
        for _ in 0..60 {
            let status = bmc.poll_task(task).await?;
            if status.is_completed() {
                return Ok(status);
            }
            self.advance(1);
            // A SimpleUpdate download runs in real time inside the simulator.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("task {task:?} did not finish in 60 simulated minutes");
    }

    async fn set_faults(&self, node: usize, faults: serde_json::Value) {
        let url = format!("{}/sim/nodes/{}/faults", self.fleet.control_url(), self.name(node));
        let resp = reqwest::Client::new()
            .put(url)
            .json(&faults)
            .send()
            .await
            .expect("control API");
        assert!(resp.status().is_success(), "setting faults: {}", resp.status());
    }
}

async fn version_of(bmc: &dyn Bmc, uri: &str) -> String {
    let inv = bmc.firmware_inventory().await.expect("inventory");
    inv.into_iter()
        .find(|c| c.uri == uri)
        .and_then(|c| c.version)
        .unwrap_or_else(|| panic!("{uri} missing from inventory"))
}

/// The image `/img/{kind}/{version}` of the image server serves: a valid image of `kind`, or with
/// `kind` `corrupt` (a payload byte flipped, so the header's checksum no longer matches) or
/// `wrong-sku` (built for another platform) a GPU image the BMC must refuse.
fn image_bytes(kind: &str, version: &str) -> Vec<u8> {
    let (kind, skus, corrupt) = match kind {
        "corrupt" => (ComponentKind::Gpu, vec![SKU], true),
        "wrong-sku" => (ComponentKind::Gpu, vec!["some-other-sku"], false),
        other => (
            other.parse::<ComponentKind>().expect("a component kind"),
            vec![SKU],
            false,
        ),
    };
    let mut bytes = bmc_sim::image::build(kind, version, &skus, b"firmware payload bytes");
    if corrupt && let Some(last) = bytes.last_mut() {
        *last ^= 0xff;
    }
    bytes
}

fn simple_update(uri: String, targets: &[&str]) -> UpdateRequest {
    UpdateRequest {
        method: UpdateMethod::SimpleUpdate {
            image_uri: uri,
            transfer_protocol: None,
        },
        targets: targets.iter().map(|t| t.to_string()).collect(),
        apply_time: Some(ApplyTime::OnReset),
        force_update: None,
    }
}

#[tokio::test]
async fn simple_update_activates_gpu_firmware_only_after_system_reset() {
    let h = Harness::start(SMALL, None, Duration::from_secs(5)).await;
    let bmc = h.bmc(0);
    assert_eq!(bmc.probe().await.unwrap().redfish_version.split('.').count(), 3);
    assert_eq!(version_of(&bmc, GPU0).await, "96.00.5E.00.01");

    let task = bmc
        .start_update(&simple_update(
            h.image_uri(ComponentKind::Gpu.as_str(), "96.00.61.00.01"),
            &[GPU0],
        ))
        .await
        .unwrap();
    let done = h.run_task(&bmc, &task).await.unwrap();
    assert_eq!(done.state, TaskState::Completed);
    assert_eq!(
        version_of(&bmc, GPU0).await,
        "96.00.5E.00.01",
        "staged, not active before the reset"
    );

    assert_eq!(
        bmc.reset(&ResetTarget::System(None), ResetKind::ForceRestart)
            .await
            .unwrap(),
        None
    );
    h.advance(10); // longer than the scenario's reboot_time
    assert_eq!(version_of(&bmc, GPU0).await, "96.00.61.00.01");

    let counts = h.fleet.flash_counts(h.name(0)).unwrap();
    assert_eq!(
        counts.get("96.00.61.00.01"),
        Some(&1),
        "flashed exactly once: {counts:?}"
    );
    bmc.logout().await.unwrap();
    h.fleet.shutdown().await;
}

#[tokio::test]
async fn multipart_push_of_bmc_firmware_needs_a_manager_reset_during_which_the_bmc_is_gone() {
    let h = Harness::start(SMALL, None, Duration::from_secs(5)).await;
    let bmc = h.bmc(1);
    assert_eq!(version_of(&bmc, BMC_FW).await, "24.04.1");

    let image = bmc_sim::image::build(ComponentKind::Bmc, "24.04.2", &[SKU], b"bmc payload");
    let task = bmc
        .start_update(&UpdateRequest {
            method: UpdateMethod::MultipartPush {
                image: image.into(),
                filename: "bmc-24.04.2.fw".into(),
            },
            targets: vec![BMC_FW.into()],
            apply_time: Some(ApplyTime::OnReset),
            force_update: None,
        })
        .await
        .unwrap();
    h.run_task(&bmc, &task).await.unwrap();
    assert_eq!(
        version_of(&bmc, BMC_FW).await,
        "24.04.1",
        "not active before the manager reset"
    );

    bmc.reset(&ResetTarget::Manager(None), ResetKind::GracefulRestart)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await; // past the simulator's answer grace
    let err = bmc.probe().await.unwrap_err();
    assert!(
        matches!(err, BmcError::Unreachable { .. }),
        "a resetting BMC does not answer: {err:?}"
    );
    assert!(err.is_transient());

    h.advance(3); // past reset_time (60-120 s)
    bmc.probe().await.unwrap();
    // The reset ended the BMC's sessions; the driver logs in again by itself.
    assert_eq!(version_of(&bmc, BMC_FW).await, "24.04.2");
    h.fleet.shutdown().await;
}

#[tokio::test]
async fn failed_flash_is_task_failed_with_update_messages_and_old_version_stays() {
    let h = Harness::start(SMALL, None, Duration::from_secs(5)).await;
    let bmc = h.bmc(2);
    let task = bmc
        .start_update(&simple_update(
            h.image_uri(ComponentKind::Gpu.as_str(), "96.00.66.00.01"),
            &[GPU0],
        ))
        .await
        .unwrap();
    let err = h.run_task(&bmc, &task).await.unwrap_err();
    match &err {
        BmcError::TaskFailed { state, messages, .. } => {
            assert_eq!(*state, TaskState::Exception);
            assert!(
                messages
                    .iter()
                    .any(|m| m.message_id.as_deref().is_some_and(|id| id.starts_with("Update."))),
                "an Update registry message says why: {messages:?}"
            );
        }
        other => panic!("expected TaskFailed, got {other:?}"),
    }
    assert!(!err.is_transient());
    bmc.reset(&ResetTarget::System(None), ResetKind::ForceRestart)
        .await
        .unwrap();
    h.advance(10);
    assert_eq!(version_of(&bmc, GPU0).await, "96.00.5E.00.01");
    h.fleet.shutdown().await;
}

#[tokio::test]
async fn corrupt_and_wrong_sku_images_end_in_task_failed() {
    let h = Harness::start(SMALL, None, Duration::from_secs(5)).await;
    let bmc = h.bmc(3);
    for kind in ["corrupt", "wrong-sku"] {
        let uri = h.image_uri(kind, "96.00.61.00.01");
        let task = bmc.start_update(&simple_update(uri, &[GPU0])).await.unwrap();
        let err = h.run_task(&bmc, &task).await.unwrap_err();
        assert!(
            matches!(&err, BmcError::TaskFailed { messages, .. } if !messages.is_empty()),
            "{kind}: {err:?}"
        );
    }
    assert_eq!(version_of(&bmc, GPU0).await, "96.00.5E.00.01");
    h.fleet.shutdown().await;
}

#[tokio::test]
async fn bricking_flash_leaves_an_unreachable_bmc() {
    let h = Harness::start(SMALL, None, Duration::from_secs(5)).await;
    let bmc = h.bmc(0);
    let task = bmc
        .start_update(&simple_update(
            h.image_uri(ComponentKind::Gpu.as_str(), "96.00.99.00.01"),
            &[GPU0],
        ))
        .await
        .unwrap();
    // The flash bricks the BMC: at some point polling stops getting answers.
    let mut last = None;
    for _ in 0..60 {
        match bmc.poll_task(&task).await {
            Ok(s) if !s.is_completed() => {
                h.advance(1);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            other => {
                last = Some(other);
                break;
            }
        }
    }
    assert!(
        matches!(last, Some(Err(BmcError::Unreachable { .. })) | Some(Ok(_))),
        "polling a bricking flash: {last:?}"
    );
    h.advance(30);
    let err = bmc.firmware_inventory().await.unwrap_err();
    assert!(matches!(err, BmcError::Unreachable { .. }), "bricked BMC: {err:?}");
    let err = bmc.probe().await.unwrap_err();
    assert!(matches!(err, BmcError::Unreachable { .. }), "bricked BMC: {err:?}");
    h.fleet.shutdown().await;
}

#[tokio::test]
async fn injected_faults_map_to_typed_errors_and_clear() {
    let h = Harness::start(SMALL, None, Duration::from_secs(3)).await;
    let mut ep = h.endpoint(0);
    ep.timeouts.request = Duration::from_millis(300);
    ep.retry.max_retries = 1;
    let bmc = RedfishBmc::new(&ep, &h.clients).unwrap();
    bmc.firmware_inventory().await.unwrap();

    h.set_faults(0, serde_json::json!({"unavailable": true})).await;
    let err = bmc.firmware_inventory().await.unwrap_err();
    assert!(
        matches!(
            err,
            BmcError::Unavailable {
                status: 503,
                retry_after: Some(_),
                attempts: 2,
                ..
            }
        ),
        "{err:?}"
    );

    h.set_faults(0, serde_json::json!({"timeout": true})).await;
    let err = bmc.firmware_inventory().await.unwrap_err();
    assert!(matches!(err, BmcError::Timeout { attempts: 2, .. }), "{err:?}");

    h.set_faults(0, serde_json::json!({"malformed": true})).await;
    let err = bmc.firmware_inventory().await.unwrap_err();
    assert!(matches!(err, BmcError::Protocol { .. }), "{err:?}");
    assert!(!format!("{err:?}").contains(PASSWORD));

    h.set_faults(0, serde_json::json!({"brick": true})).await;
    let err = bmc.firmware_inventory().await.unwrap_err();
    assert!(matches!(err, BmcError::Unreachable { .. }), "{err:?}");

    h.set_faults(0, serde_json::json!({})).await;
    bmc.firmware_inventory().await.unwrap();

    // Session expiry: the driver logs in again without the caller noticing.
    let url = format!("{}/sim/nodes/{}/expire-sessions", h.fleet.control_url(), h.name(0));
    assert!(
        reqwest::Client::new()
            .post(url)
            .send()
            .await
            .unwrap()
            .status()
            .is_success()
    );
    assert_eq!(bmc.firmware_inventory().await.unwrap().len(), 10);
    h.fleet.shutdown().await;
}

#[tokio::test]
async fn scenario_503s_and_timeouts_are_absorbed_by_retries() {
    let yaml = SMALL
        .replace("unavailable_rate: 0.0", "unavailable_rate: 0.2")
        .replace("timeout_rate: 0.0", "timeout_rate: 0.05");
    let h = Harness::start(&yaml, None, Duration::from_secs(2)).await;
    // Without retries the faults show: this proves the scenario really injects them.
    let mut fragile = h.endpoint(0);
    fragile.timeouts.request = Duration::from_millis(250);
    fragile.retry = RetryPolicy::no_retries();
    let fragile = RedfishBmc::new(&fragile, &h.clients).unwrap();
    let mut seen = Vec::new();
    for _ in 0..10 {
        if let Err(e) = fragile.firmware_inventory().await {
            seen.push(e.kind());
        }
    }
    assert!(seen.contains(&"unavailable"), "no 503 seen in 10 reads: {seen:?}");

    for node in 0..4 {
        let mut ep = h.endpoint(node);
        ep.timeouts.request = Duration::from_millis(250);
        ep.retry.max_retries = 8;
        let bmc = RedfishBmc::new(&ep, &h.clients).unwrap();
        for _ in 0..3 {
            let inv = bmc
                .firmware_inventory()
                .await
                .unwrap_or_else(|e| panic!("node {node}: {e:?}"));
            assert_eq!(inv.len(), 10);
        }
    }
    h.fleet.shutdown().await;
}

#[tokio::test]
async fn discovery_over_300_nodes_reports_the_bricked_ones_and_reads_the_rest() {
    let h = Harness::start(SMALL, Some(300), Duration::from_secs(2)).await;
    let bricked: Vec<usize> = (0..300).filter(|i| i % 25 == 7).collect();
    for &i in &bricked {
        h.set_faults(i, serde_json::json!({"brick": true})).await;
    }
    let endpoints: Vec<(usize, BmcEndpoint)> = (0..300).map(|i| (i, h.endpoint(i))).collect();
    let started = std::time::Instant::now();
    let results = orchestrator_bmc::discover_inventory(&h.clients, endpoints, 32).await;
    eprintln!("discovered 300 simulated BMCs in {:?}", started.elapsed());
    assert_eq!(results.len(), 300);

    let mut failed: Vec<usize> = Vec::new();
    let mut versions: HashMap<String, usize> = HashMap::new();
    for r in &results {
        match &r.result {
            Ok(inv) => {
                assert_eq!(inv.len(), 10, "node {}", r.node);
                for c in inv {
                    *versions.entry(c.version.clone().unwrap_or_default()).or_default() += 1;
                }
            }
            Err(e) => {
                assert!(matches!(e, BmcError::Unreachable { .. }), "node {}: {e:?}", r.node);
                failed.push(r.node);
            }
        }
    }
    failed.sort();
    assert_eq!(failed, bricked);
    assert_eq!(versions.get("96.00.5E.00.01"), Some(&(8 * (300 - bricked.len()))));
    h.fleet.shutdown().await;
}

#[tokio::test]
async fn health_reads_gpu_sensors_and_each_event_once() {
    let h = Harness::start(SMALL, None, Duration::from_secs(2)).await;
    let bmc = h.bmc(0);

    let sensors = bmc.read_sensors().await.unwrap();
    let gpu_temps: Vec<_> = sensors
        .iter()
        .filter(|s| s.is_gpu() && s.kind == orchestrator_bmc::SensorKind::Temperature)
        .collect();
    let gpu_power: Vec<_> = sensors
        .iter()
        .filter(|s| s.is_gpu() && s.kind == orchestrator_bmc::SensorKind::Power)
        .collect();
    assert_eq!(gpu_temps.len(), 8, "{sensors:#?}");
    assert_eq!(gpu_power.len(), 8, "{sensors:#?}");
    for t in &gpu_temps {
        let c = t.reading.expect("temperature reading");
        assert!((30.0..100.0).contains(&c), "{t:?}");
    }

    h.advance(6 * 60);
    let first = bmc
        .read_health(&orchestrator_bmc::EventCursor::default())
        .await
        .unwrap();
    assert!(
        !first.events.entries.is_empty(),
        "6 simulated hours at the baseline rates produce events"
    );
    assert_eq!(first.events.skipped_malformed, 0);
    assert!(first.events.entries.windows(2).all(|w| w[0].created <= w[1].created));

    let again = bmc.read_events(&first.events.cursor).await.unwrap();
    assert!(
        again.entries.is_empty(),
        "nothing new without time passing: {:?}",
        again.entries
    );

    h.advance(6 * 60);
    let later = bmc.read_events(&first.events.cursor).await.unwrap();
    let old: std::collections::HashSet<_> = first.events.entries.iter().map(|e| e.id.clone()).collect();
    assert!(
        later.entries.iter().all(|e| !old.contains(&e.id)),
        "no entry returned twice"
    );
    h.fleet.shutdown().await;
}

#[tokio::test]
async fn https_fleet_is_trusted_through_its_ca_bundle_only() {
    let scenario = Scenario::from_yaml_str(SMALL).expect("scenario");
    let mut options = FleetOptions::new(Arc::new(ManualClock::new(Utc::now())));
    options.password = PASSWORD.into();
    options.username = "root".into();
    options.tls = true;
    options.nodes = Some(1);
    let fleet = Fleet::start(scenario, options).await.expect("fleet starts");
    let url = &fleet.endpoints()[0].bmc_url;
    assert!(url.starts_with("https://"), "{url}");
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("sim-ca.pem");
    std::fs::write(&ca, fleet.ca_pem().expect("a TLS fleet exposes its CA")).unwrap();

    let clients = HttpClients::new();
    let endpoint = |tls| {
        BmcEndpoint::new(url.parse().unwrap(), Credentials::new("root", PASSWORD))
            .with_tls(tls)
            .with_retry(RetryPolicy::no_retries())
    };
    let bmc = RedfishBmc::new(&endpoint(orchestrator_bmc::TlsTrust::CaBundle { path: ca }), &clients).unwrap();
    assert_eq!(bmc.firmware_inventory().await.unwrap().len(), 10);

    let untrusted = RedfishBmc::new(&endpoint(orchestrator_bmc::TlsTrust::System), &clients).unwrap();
    let err = untrusted.firmware_inventory().await.unwrap_err();
    assert!(matches!(err, BmcError::CertificateRejected { .. }), "{err:?}");
    fleet.shutdown().await;
}

/// On the HGX layout the GPU event log is the baseboard system's, although the host system (with a
/// log service named `EventLog` too) comes first; a credential profile's `event_log` overrides the
/// choice; the GPUs are the baseboard's GPU processors.
#[tokio::test]
async fn the_gpu_event_log_is_the_gpu_systems_unless_the_site_names_one() {
    let yaml = SMALL.replacen("seed:", "platform: hgx-h100\nseed:", 1);
    let h = Harness::start(&yaml, Some(1), Duration::from_secs(2)).await;
    h.advance(6 * 60);
    let chosen = h.bmc(0);
    let gpus = chosen.gpus().await.unwrap();
    assert_eq!(gpus.len(), 8, "{gpus:?}");
    assert_eq!(gpus[0].chassis.as_deref(), Some("/redfish/v1/Chassis/HGX_GPU_SXM_1"));
    let events = chosen
        .read_events(&orchestrator_bmc::EventCursor::default())
        .await
        .unwrap();
    assert!(!events.entries.is_empty());
    assert!(
        events
            .entries
            .iter()
            .all(|e| e.message_id.as_deref() == Some("ResourceEvent.1.3.ResourceErrorsDetected")),
        "only the HGX log's entries"
    );

    let configured = RedfishBmc::new(
        &h.endpoint(0).with_event_log("/redfish/v1/Systems/DGX/LogServices/SEL"),
        &h.clients,
    )
    .unwrap();
    let sel = configured
        .read_events(&orchestrator_bmc::EventCursor::default())
        .await
        .unwrap();
    assert_eq!(sel.entries.len(), 2, "{:?}", sel.entries);
    assert!(sel.entries.iter().all(|e| e.entry_type.as_deref() == Some("SEL")));
    h.fleet.shutdown().await;
}
