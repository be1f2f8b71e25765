//! The harness: a simulated fleet over loopback HTTP, an image server, a
//! migrated database, the fleet imported with its inventory, a release, and
//! the engine, all on one accelerated `SimClock`.

#![allow(dead_code)] // each test binary uses part of the harness

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use bmc_sim::{Fleet, FleetOptions, RunningFleet, Scenario, SimClock};
use orchestrator_bmc::{BmcEndpoint, Credentials, HttpClients, RetryPolicy, Timeouts};
use orchestrator_db::Db;
use orchestrator_db::execution::{ExecRollout, RolloutState};
use orchestrator_db::model::{ComponentReading, NewNode, NewRelease, NodeLabels, Release, ReleaseRollback};
use orchestrator_db::testing::TestDb;
use orchestrator_engine::{BmcConnector, Engine, EngineConfig, GatelessJudge, HealthJudge, RedfishConnector};
use orchestrator_types::{Clock, ComponentKind, FirmwareVersion, QualificationState, RolloutId, TransitionRequest};
use sha2::{Digest, Sha256};

pub const SKU: &str = "hgx-h100-8gpu";
pub const GPU_FROM: &str = "96.00.5E.00.01";
pub const GPU_TO: &str = "96.00.61.00.01";
/// The trn2 platform profile's SKU label and its accelerator firmware pair.
pub const TRN2_SKU: &str = "trn2-48xl";
pub const TRN2_FROM: &str = "2.20.0.0";
pub const TRN2_TO: &str = "2.21.0.0";
/// Simulated seconds per real second: a 2-4 minute flash takes about a second.
pub const SPEEDUP: f64 = 240.0;

pub fn scenario(nodes: usize, extra_firmware: &str) -> Scenario {
    scenario_with(nodes, extra_firmware, "")
}

/// [`scenario`] with extra keys on the GPU components' entry, e.g.
/// `, lowest_supported_version: "96.00.61.00.00"`.
pub fn scenario_with(nodes: usize, extra_firmware: &str, gpu_keys: &str) -> Scenario {
    let yaml = format!(
        r#"
seed: 7
fleet:
  nodes: {nodes}
  racks: {racks}
  clusters: 3
  region: sim-1
  sku: {SKU}
  nodes_per_nvlink_domain: 5
  components:
    - {{id: BMC_Firmware, kind: bmc, version: "24.04.1"}}
    - {{id: "HGX_FW_GPU_{{0..7}}", kind: gpu, version: "{GPU_FROM}"{gpu_keys}}}
firmware:
  - kind: gpu
    version: "{GPU_TO}"
    flash_time: {{min: 2m, max: 4m}}
  - kind: gpu
    version: "{GPU_FROM}"
    flash_time: {{min: 2m, max: 4m}}
{extra_firmware}
bmc_faults:
  reset_time: {{min: 30s, max: 60s}}
  reboot_time: {{min: 1m, max: 2m}}
"#,
        racks = nodes.div_ceil(10).max(3),
    );
    Scenario::from_yaml_str(&yaml).unwrap_or_else(|e| panic!("scenario: {e}"))
}

/// A policy with three waves and no gates (the default judge passes them).
pub fn policy(bake: &str, middle_approval: &str) -> String {
    format!(
        r#"
name: test-gpu
target:
  component: gpu
  inventory_id: "HGX_FW_GPU_*"
  platforms: [{SKU}]
versions:
  allow_downgrade: false
qualification:
  required_gates: []
waves:
  - name: canary
    count: 10
    stratify_by: [rack]
    bake: {bake}
    max_in_flight: 10
  - name: early
    percent: 30
    bake: {bake}
    {middle_approval}
    max_in_flight: 60
  - name: rest
    rest: true
    bake: {bake}
    max_in_flight: 120
concurrency:
  max_in_flight: 120
  per_rack: 6
  per_nvlink_domain: 3
failure_budget:
  max_failed: 2
rollback:
  automatic: true
  scope: rollout
"#
    )
}

pub struct Harness {
    pub clock: Arc<SimClock>,
    pub fleet: RunningFleet,
    pub test_db: TestDb,
    pub db: Db,
    pub image_base: String,
    image_server: tokio::task::JoinHandle<()>,
    pub engine: Option<Engine>,
}

pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()))
        .with_test_writer()
        .try_init();
}

async fn image_server(images: BTreeMap<String, Vec<u8>>) -> (String, tokio::task::JoinHandle<()>) {
    let images = Arc::new(images);
    let app = Router::new().route(
        "/images/{name}",
        get(move |axum::extract::Path(name): axum::extract::Path<String>| {
            let images = images.clone();
            async move {
                match images.get(&name) {
                    Some(bytes) => (axum::http::StatusCode::OK, bytes.clone()),
                    None => (axum::http::StatusCode::NOT_FOUND, Vec::new()),
                }
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind image server");
    let addr = listener.local_addr().expect("image server address");
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (format!("http://{addr}/images"), task)
}

impl Harness {
    /// Starts the fleet and the database (PostgreSQL when `postgres`), imports
    /// the nodes with their inventory, registers the two GPU releases.
    pub async fn start(nodes: usize, extra_firmware: &str, postgres: bool) -> Option<Harness> {
        Self::start_with(scenario(nodes, extra_firmware), postgres).await
    }

    /// [`Harness::start`] on a given scenario.
    pub async fn start_with(scenario: Scenario, postgres: bool) -> Option<Harness> {
        init_tracing();
        let clock = Arc::new(SimClock::starting_now(SPEEDUP));
        let test_db = if postgres {
            TestDb::postgres(clock.clone()).await?
        } else {
            TestDb::sqlite(clock.clone()).await
        };
        let db = test_db.db.clone();
        let fleet = Fleet::start(scenario, FleetOptions::new(clock.clone()))
            .await
            .expect("fleet starts");
        let mut images = BTreeMap::new();
        // The 97.x pair is the GB200 platform profile's GPU firmware.
        for version in [
            GPU_FROM,
            GPU_TO,
            "96.00.66.00.01",
            "96.00.99.00.01",
            "97.00.52.00.01",
            "97.00.61.00.01",
        ] {
            images.insert(
                format!("gpu-{version}.fw"),
                bmc_sim::image::build(ComponentKind::Gpu, version, &[SKU], version.as_bytes()),
            );
        }
        // The Trainium profile's accelerator firmware (`trainium.rs`), built for its own SKU.
        for version in [TRN2_FROM, TRN2_TO] {
            images.insert(
                format!("gpu-{version}.fw"),
                bmc_sim::image::build(ComponentKind::Gpu, version, &[TRN2_SKU], version.as_bytes()),
            );
        }
        let (image_base, image_server) = image_server(images).await;
        let new_nodes: Vec<NewNode> = fleet
            .endpoints()
            .iter()
            .map(|e| NewNode {
                name: e.name.clone(),
                bmc_url: e.bmc_url.clone(),
                credential_ref: "sim".into(),
                platform_sku: e.labels.sku.clone(),
                labels: NodeLabels {
                    region: e.labels.region.clone(),
                    cluster: e.labels.cluster.clone(),
                    rack: e.labels.rack.clone(),
                    nvlink_domain: e.labels.nvlink_domain.clone(),
                },
            })
            .collect();
        db.import_nodes(&new_nodes, "test").await.expect("import");
        for node in db.list_nodes(&Default::default()).await.expect("nodes") {
            let versions = fleet.versions(&node.name).expect("sim node");
            let readings: Vec<ComponentReading> = versions
                .iter()
                .map(|c| ComponentReading {
                    inventory_id: c.id.clone(),
                    kind: c.kind,
                    version: FirmwareVersion::parse(&c.active).expect("version"),
                    updateable: true,
                    software_id: None,
                    health: Some("OK".into()),
                })
                .collect();
            db.record_inventory(node.id, &readings).await.expect("inventory");
        }
        let harness = Harness {
            clock,
            fleet,
            test_db,
            db,
            image_base,
            image_server,
            engine: None,
        };
        Some(harness)
    }

    pub async fn add_release(&self, version: &str, qualified: bool) -> Release {
        self.add_release_with(version, qualified, &ReleaseRollback::default())
            .await
    }

    /// [`Harness::add_release`] with rollback metadata.
    pub async fn add_release_with(&self, version: &str, qualified: bool, rollback: &ReleaseRollback) -> Release {
        self.add_release_on(SKU, version, qualified, rollback).await
    }

    /// [`Harness::add_release_with`] for another platform SKU.
    pub async fn add_release_on(
        &self,
        sku: &str,
        version: &str,
        qualified: bool,
        rollback: &ReleaseRollback,
    ) -> Release {
        let name = format!("gpu-{version}.fw");
        let bytes = bmc_sim::image::build(ComponentKind::Gpu, version, &[sku], version.as_bytes());
        let release = self
            .db
            .add_release_with(
                &NewRelease {
                    component_kind: ComponentKind::Gpu,
                    version: FirmwareVersion::parse(version).expect("version"),
                    image_uri: format!("{}/{name}", self.image_base),
                    sha256: hex::encode(Sha256::digest(&bytes)),
                    size_bytes: bytes.len() as u64,
                    platforms: vec![sku.into()],
                    release_notes: String::new(),
                },
                rollback,
                "alice",
            )
            .await
            .expect("release");
        if qualified {
            for to in [QualificationState::Qualifying, QualificationState::Qualified] {
                self.db
                    .transition_release(release.id, &TransitionRequest { to, reason: None }, "alice")
                    .await
                    .expect("qualify");
            }
        }
        self.db.release(release.id).await.expect("release")
    }

    pub fn config(&self) -> EngineConfig {
        EngineConfig {
            holder: "test-engine".into(),
            lease_ttl: chrono::Duration::hours(2),
            pass_interval: Duration::from_millis(40),
            bmc_concurrency: 64,
            brick_timeout: chrono::Duration::minutes(20),
            activation_timeout: chrono::Duration::minutes(15),
            ..EngineConfig::default()
        }
    }

    pub fn connector(&self) -> Arc<dyn BmcConnector> {
        self.connector_with(HttpClients::new())
    }

    /// [`Harness::connector`] over given clients (e.g. with injected connect faults).
    pub fn connector_with(&self, clients: HttpClients) -> Arc<dyn BmcConnector> {
        self.redfish_with(clients)
    }

    /// The Redfish drivers as a concrete type, to share one set between the engine and a detector.
    pub fn redfish(&self) -> Arc<RedfishConnector> {
        self.redfish_with(HttpClients::new())
    }

    fn redfish_with(&self, clients: HttpClients) -> Arc<RedfishConnector> {
        let resolve = Arc::new(|url: &str, _profile: &str| {
            let url = url::Url::parse(url).map_err(|e| e.to_string())?;
            Ok(BmcEndpoint::new(url, Credentials::new("admin", "admin"))
                .with_timeouts(Timeouts {
                    connect: Duration::from_millis(500),
                    request: Duration::from_secs(2),
                    upload: Duration::from_secs(5),
                    probe: Duration::from_millis(500),
                })
                .with_retry(RetryPolicy {
                    max_retries: 1,
                    base_delay: Duration::from_millis(20),
                    max_delay: Duration::from_millis(50),
                    max_retry_after: Duration::from_millis(50),
                    deadline: Duration::from_secs(3),
                }))
        });
        Arc::new(RedfishConnector::new(clients, resolve))
    }

    pub fn start_engine(&mut self) {
        self.start_engine_with(self.config(), Arc::new(GatelessJudge));
    }

    pub fn start_engine_with(&mut self, config: EngineConfig, judge: Arc<dyn HealthJudge>) {
        self.engine = Some(Engine::start(self.db.clone(), config, self.connector(), judge));
    }

    pub fn start_engine_on(&mut self, config: EngineConfig, connector: Arc<dyn BmcConnector>) {
        self.start_engine_full(config, connector, Arc::new(GatelessJudge));
    }

    pub fn start_engine_full(
        &mut self,
        config: EngineConfig,
        connector: Arc<dyn BmcConnector>,
        judge: Arc<dyn HealthJudge>,
    ) {
        self.engine = Some(Engine::start(self.db.clone(), config, connector, judge));
    }

    pub async fn stop_engine(&mut self) {
        if let Some(engine) = self.engine.take() {
            engine.shutdown().await;
        }
    }

    /// Waits (real time) until the rollout is in one of `states`.
    pub async fn wait_for(&self, id: RolloutId, states: &[RolloutState], limit: Duration) -> ExecRollout {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let rollout = self.db.exec_rollout(id).await.expect("rollout");
            if states.contains(&rollout.state) {
                return rollout;
            }
            if tokio::time::Instant::now() > deadline {
                let waves = self.db.rollout_waves(id).await.expect("waves");
                let counts = self.db.step_counts(id, None).await.expect("counts");
                panic!(
                    "rollout {id} still {:?} ({:?}) after {limit:?}; waves: {:?}; steps: {counts:?}",
                    rollout.state,
                    rollout.state_reason,
                    waves
                        .iter()
                        .map(|w| format!("{}={} {:?}", w.name, w.state, w.blockers))
                        .collect::<Vec<_>>()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub fn now(&self) -> chrono::DateTime<chrono::Utc> {
        self.clock.now()
    }

    pub async fn shutdown(mut self) {
        self.stop_engine().await;
        self.image_server.abort();
        self.fleet.shutdown().await;
    }
}
