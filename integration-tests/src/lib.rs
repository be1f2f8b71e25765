//! Shared harness for the end-to-end tests: a simulated fleet (bmc-sim, in
//! process, real Redfish over loopback) imported into a fresh controller
//! database with the inventory its BMCs report, an HTTP server for the
//! firmware images, releases registered with their image's sha256, and the
//! rollout engine driving the fleet through the Redfish connector.
//!
//! Everything listens on 127.0.0.1 only, and the whole controller runs on
//! the fleet's simulated clock, so bakes and flashes take seconds.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use axum::Router;
use axum::routing::get;
use bmc_sim::{Fleet, FleetOptions, RunningFleet, Scenario, SimClock};
use orchestrator_bmc::{BmcEndpoint, Credentials, HttpClients, RetryPolicy, Timeouts};
use orchestrator_db::Db;
use orchestrator_db::model::{ComponentReading, NewGateResult, NewNode, NewRelease, NodeLabels};
use orchestrator_engine::{Engine, EngineConfig, HealthJudge, RedfishConnector};
use orchestrator_types::{ComponentKind, FirmwareVersion, QualificationState, ReleaseId, TransitionRequest};
use sha2::{Digest, Sha256};

pub mod process;

/// Set to `1` to turn a missing external program from a loud skip into a failure (CI).
pub const REQUIRE_ALL_ENV: &str = "WAVEGUARD_REQUIRE_ALL";

/// True when missing external programs must fail the test rather than skip it.
pub fn require_all() -> bool {
    std::env::var(REQUIRE_ALL_ENV).is_ok_and(|v| v == "1")
}

/// The first of `names` found on `PATH`, directory by directory.
pub fn find_program(names: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .flat_map(|dir| names.iter().map(move |name| dir.join(name)))
        .find(|candidate| candidate.is_file())
}

/// A port that was free a moment ago. The programs take an address, not a
/// listening socket, so there is a small window in which another process
/// could take it; a clash fails start-up loudly rather than silently.
pub fn free_port() -> anyhow::Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").context("bind a probe port")?;
    Ok(listener.local_addr()?.port())
}

/// A gate result recorded before a release is qualified: gate name and evidence.
pub type GateEvidence<'a> = (&'a str, &'a str);

/// A simulated fleet and the controller's datastore around it.
///
/// Dropping it stops the fleet and the image server too (bmc-sim aborts its
/// servers on drop), so a failing test leaves nothing listening; call
/// [`SimController::shutdown`] for a graceful stop.
pub struct SimController {
    /// Holds the SQLite file; tests put their other files (configs, logs) here too.
    pub dir: tempfile::TempDir,
    /// The simulated clock shared by the fleet and the controller.
    pub clock: Arc<SimClock>,
    /// The simulated BMCs.
    pub fleet: RunningFleet,
    /// The controller's datastore, with every simulated node imported.
    pub db: Db,
    /// Base URL of the image server; `{image_base}/gpu-{version}.fw` serves an image.
    pub image_base: String,
    sku: String,
    image_task: tokio::task::JoinHandle<()>,
}

// By hand: the fleet's servers have no useful Debug; where things live does.
impl std::fmt::Debug for SimController {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimController")
            .field("dir", &self.dir.path())
            .field("bmcs", &self.fleet.endpoints().len())
            .field("control_url", &self.fleet.control_url())
            .field("image_base", &self.image_base)
            .field("sku", &self.sku)
            .finish_non_exhaustive()
    }
}

impl SimController {
    /// Starts `scenario` at `speedup` simulated seconds per real second,
    /// imports its nodes with the inventory their BMCs report into a fresh
    /// SQLite database, and serves a GPU image for `sku` for each of
    /// `gpu_versions`.
    pub async fn start(scenario: Scenario, speedup: f64, sku: &str, gpu_versions: &[&str]) -> anyhow::Result<Self> {
        let dir = tempfile::tempdir()?;
        let clock = Arc::new(SimClock::starting_now(speedup));
        let fleet = Fleet::start(scenario, FleetOptions::new(clock.clone())).await?;
        let db_url = format!("sqlite://{}", dir.path().join("waveguard.db").display());
        let db = Db::connect_and_migrate(&db_url, clock.clone()).await?;
        import_fleet(&db, &fleet).await?;
        let images = gpu_versions
            .iter()
            .map(|v| (format!("gpu-{v}.fw"), gpu_image(sku, v)))
            .collect();
        let (image_base, image_task) = image_server(images).await?;
        Ok(Self {
            dir,
            clock,
            fleet,
            db,
            image_base,
            sku: sku.to_owned(),
            image_task,
        })
    }

    /// Registers the GPU release `version` (its image served here, with the
    /// image's real sha256), records `gates` as passed and qualifies it, all
    /// as `actor`.
    pub async fn add_qualified_release(
        &self,
        version: &str,
        actor: &str,
        gates: &[GateEvidence<'_>],
    ) -> anyhow::Result<ReleaseId> {
        let bytes = gpu_image(&self.sku, version);
        let release = self
            .db
            .add_release(
                &NewRelease {
                    component_kind: ComponentKind::Gpu,
                    version: FirmwareVersion::parse(version)?,
                    image_uri: format!("{}/gpu-{version}.fw", self.image_base),
                    sha256: hex::encode(Sha256::digest(&bytes)),
                    size_bytes: u64::try_from(bytes.len())?,
                    platforms: vec![self.sku.clone()],
                    release_notes: String::new(),
                },
                actor,
            )
            .await?;
        self.db
            .transition_release(
                release.id,
                &TransitionRequest {
                    to: QualificationState::Qualifying,
                    reason: None,
                },
                actor,
            )
            .await?;
        for (gate, evidence) in gates {
            self.db
                .record_gate_result(
                    release.id,
                    &NewGateResult {
                        gate: (*gate).into(),
                        passed: true,
                        evidence: (*evidence).into(),
                    },
                    actor,
                )
                .await?;
        }
        self.db
            .transition_release(
                release.id,
                &TransitionRequest {
                    to: QualificationState::Qualified,
                    reason: None,
                },
                actor,
            )
            .await?;
        Ok(release.id)
    }

    /// Starts the rollout engine on this datastore, flashing the fleet
    /// through the Redfish connector and judging waves with `judge`.
    pub fn start_engine(&self, judge: Arc<dyn HealthJudge>) -> Engine {
        Engine::start(self.db.clone(), engine_config(), connector(), judge)
    }

    /// Reads every node's inventory over Redfish and records it, as
    /// `waveguard fleet discover` does: the engine verifies a flash by
    /// reading the version back but leaves the stored inventory to discovery.
    pub async fn discover(&self) -> anyhow::Result<()> {
        let nodes = self.db.list_nodes(&Default::default()).await?;
        let endpoints = nodes
            .iter()
            .map(|n| Ok((n.id, sim_endpoint(&n.bmc_url)?)))
            .collect::<anyhow::Result<Vec<_>>>()?;
        for outcome in orchestrator_bmc::discover_inventory(&HttpClients::new(), endpoints, 16).await {
            let inventory = outcome
                .result
                .with_context(|| format!("inventory of {}", outcome.endpoint))?;
            let readings = inventory
                .into_iter()
                .map(|c| {
                    let version = c.version.as_deref().context("a component without a version")?;
                    Ok(ComponentReading {
                        kind: c.kind(),
                        version: FirmwareVersion::parse(version)?,
                        inventory_id: c.id,
                        updateable: c.updateable,
                        software_id: c.software_id,
                        health: c.health,
                    })
                })
                .collect::<anyhow::Result<Vec<_>>>()?;
            self.db.record_inventory(outcome.node, &readings).await?;
        }
        Ok(())
    }

    /// Stops the image server and the fleet, waiting for in-flight requests.
    pub async fn shutdown(self) {
        self.image_task.abort();
        self.fleet.shutdown().await;
    }
}

/// The GPU image bmc-sim accepts for `version` on `sku` (its header names both).
pub fn gpu_image(sku: &str, version: &str) -> Vec<u8> {
    bmc_sim::image::build(ComponentKind::Gpu, version, &[sku], version.as_bytes())
}

async fn image_server(images: BTreeMap<String, Vec<u8>>) -> anyhow::Result<(String, tokio::task::JoinHandle<()>)> {
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
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok((format!("http://{addr}/images"), task))
}

/// Imports the fleet with the inventory the BMCs report.
async fn import_fleet(db: &Db, fleet: &RunningFleet) -> anyhow::Result<()> {
    let nodes: Vec<NewNode> = fleet
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
    db.import_nodes(&nodes, "test").await?;
    for node in db.list_nodes(&Default::default()).await? {
        let versions = fleet.versions(&node.name).context("sim node")?;
        let readings = versions
            .iter()
            .map(|c| {
                Ok(ComponentReading {
                    inventory_id: c.id.clone(),
                    kind: c.kind,
                    version: FirmwareVersion::parse(&c.active)?,
                    updateable: true,
                    software_id: None,
                    health: Some("OK".into()),
                })
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        db.record_inventory(node.id, &readings).await?;
    }
    Ok(())
}

/// A fast engine: passes every 50 ms (and at once when nudged), with
/// timeouts in simulated time far above the scenario's flash times.
pub fn engine_config() -> EngineConfig {
    EngineConfig {
        holder: "e2e-engine".into(),
        lease_ttl: chrono::Duration::hours(2),
        pass_interval: Duration::from_millis(50),
        bmc_concurrency: 16,
        brick_timeout: chrono::Duration::minutes(20),
        activation_timeout: chrono::Duration::minutes(15),
        ..EngineConfig::default()
    }
}

/// Redfish to the simulated BMCs (user `admin`, password `admin`: bmc-sim's
/// defaults), with short timeouts and one quick retry: loopback answers fast.
pub fn connector() -> Arc<RedfishConnector> {
    let resolve = Arc::new(|url: &str, _profile: &str| Ok(sim_endpoint(url).map_err(|e| e.to_string())?));
    Arc::new(RedfishConnector::new(HttpClients::new(), resolve))
}

/// A simulated BMC at `url`, as [`connector`] reaches it.
pub fn sim_endpoint(url: &str) -> anyhow::Result<BmcEndpoint> {
    let url = url::Url::parse(url).with_context(|| format!("BMC URL {url:?}"))?;
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
}
