//! The world a simulated rollout runs against: clock, fleet, database,
//! image server, and the engine's settings for accelerated time.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration as StdDuration;

use bmc_sim::{Fleet, FleetOptions, FleetProcesses, ImageServer, ProcessOptions, Scenario};
use chrono::{DateTime, Duration, Utc};
use orchestrator_bmc::{BmcEndpoint, ConnectionLimit, Credentials, HttpClients, RetryPolicy, Timeouts};
use orchestrator_db::Db;
use orchestrator_db::model::{ComponentReading, NewGateResult, NewNode, NewRelease, NodeLabels, Release};
use orchestrator_engine::{BmcConnector, Engine, EngineConfig, HealthJudge, RedfishConnector, StepDeadlines};
use orchestrator_types::{AcceleratedClock, ComponentKind, FirmwareVersion, QualificationState, TransitionRequest};
use sha2::{Digest, Sha256};

use crate::fleet::{FleetPlacement, SimFleet};

/// Username and password of every simulated BMC (loopback only).
const SIM_BMC_USER: &str = "admin";
const SIM_BMC_PASSWORD: &str = "admin";

/// Who starts simulated rollouts, in the audit log. Approvers must differ
/// from it (two-person rule).
pub const SIM_AUTHOR: &str = "waveguard-simulate";

/// Everything a simulated rollout runs against.
#[derive(Debug)]
pub struct SimWorld {
    /// The shared simulated clock.
    pub clock: Arc<AcceleratedClock>,
    /// bmc-sim, one loopback port per BMC, in this process or in processes of its own.
    pub fleet: SimFleet,
    /// The controller's database.
    pub db: Db,
    /// Serves the releases' images to the BMCs (`{base}/images/{file}`).
    images: ImageServer,
    /// One driver (and session) per simulated BMC, shared by the engine and the health collector.
    redfish: Arc<RedfishConnector>,
    /// Holds the SQLite file until the world is dropped.
    _dir: Option<tempfile::TempDir>,
}

/// What went wrong building the world, for exit status: input or system.
#[derive(Debug, thiserror::Error)]
pub enum WorldError {
    #[error("cannot create a temporary directory for the database")]
    TempDir(#[source] std::io::Error),
    #[error("cannot open the simulation database")]
    Db(#[source] orchestrator_db::DbError),
    #[error("cannot start the simulated fleet")]
    Fleet(#[source] bmc_sim::FleetError),
    #[error("the task starting the simulated fleet failed")]
    FleetTask(#[source] tokio::task::JoinError),
    #[error("cannot run the simulated fleet in processes of its own")]
    FleetProcesses(#[source] bmc_sim::ProcessError),
    #[error("a fleet in processes of its own needs the scenario's YAML")]
    NoScenarioYaml,
    #[error("no bound on BMC connections fits this process's open-file limit")]
    ConnectionLimit(#[source] orchestrator_bmc::LimitError),
    #[error("cannot start the image server")]
    ImageServer(#[source] std::io::Error),
    #[error("cannot record the simulated fleet in the database")]
    Import(#[source] orchestrator_db::DbError),
    #[error("bmc-sim reports version {version:?} on {node}, which does not parse")]
    Version { node: String, version: String },
}

/// How to build a [`SimWorld`].
#[derive(Debug, Clone)]
pub struct WorldOptions {
    /// Simulated seconds per real second.
    pub speedup: f64,
    /// The controller's database; `None`: a temporary SQLite file.
    pub db_url: Option<String>,
    /// Where the BMCs run.
    pub placement: FleetPlacement,
    /// In-process only: the runtime the fleet's servers run on (the benchmarks keep bmc-sim's CPU
    /// apart from the controller's).
    pub fleet_runtime: Option<tokio::runtime::Handle>,
    /// HTTP keep-alive at the BMCs; without it every response closes its connection, so an
    /// in-process fleet of 10,000 holds no idle sockets.
    pub keep_alive: bool,
    /// The scenario as YAML, which fleet processes read.
    pub scenario_yaml: Option<String>,
    /// The bound on the controller's BMC connections; `None`: from the open-file limit.
    pub connection_limit: Option<ConnectionLimit>,
}

impl WorldOptions {
    /// In-process fleet with keep-alive, temporary SQLite, the bound from the open-file limit.
    pub fn new(speedup: f64) -> Self {
        Self {
            speedup,
            db_url: None,
            placement: FleetPlacement::InProcess,
            fleet_runtime: None,
            keep_alive: true,
            scenario_yaml: None,
            connection_limit: None,
        }
    }
}

impl SimWorld {
    /// Starts the fleet of `scenario` on a fresh clock, a database (`db_url`,
    /// or a temporary SQLite file), the image server, and records every node
    /// with its inventory as discovery would.
    pub async fn start(scenario: Scenario, speedup: f64, db_url: Option<&str>) -> Result<SimWorld, WorldError> {
        let mut options = WorldOptions::new(speedup);
        options.db_url = db_url.map(str::to_owned);
        Self::start_with(scenario, options).await
    }

    /// Starts a world as `options` say.
    pub async fn start_with(scenario: Scenario, options: WorldOptions) -> Result<SimWorld, WorldError> {
        let speedup = options.speedup;
        // Fleet processes compute now from the same wall-clock epoch, so they agree with this
        // clock without sharing it; an in-process fleet shares the clock itself.
        let epoch = Utc::now();
        let clock = Arc::new(match options.placement {
            FleetPlacement::InProcess => AcceleratedClock::new(epoch, speedup),
            FleetPlacement::Processes { .. } => AcceleratedClock::from_wall_epoch(epoch, speedup),
        });
        let (dir, url) = match &options.db_url {
            Some(url) => (None, url.clone()),
            None => {
                let dir = tempfile::Builder::new()
                    .prefix("waveguard-sim-")
                    .tempdir()
                    .map_err(WorldError::TempDir)?;
                let url = format!("sqlite://{}", dir.path().join("waveguard.db").display());
                (Some(dir), url)
            }
        };
        let db = Db::connect_and_migrate(&url, clock.clone())
            .await
            .map_err(WorldError::Db)?;
        let nodes = scenario.fleet.nodes;
        let fleet = match &options.placement {
            FleetPlacement::InProcess => {
                SimFleet::InProcess(start_in_process(scenario, &options, clock.clone()).await?)
            }
            FleetPlacement::Processes {
                program,
                leading_args,
                processes,
            } => {
                let yaml = options.scenario_yaml.clone().ok_or(WorldError::NoScenarioYaml)?;
                SimFleet::Processes(
                    FleetProcesses::start(&process_options(
                        program.clone(),
                        leading_args.clone(),
                        yaml,
                        nodes,
                        *processes,
                        epoch,
                        &options,
                    ))
                    .await
                    .map_err(WorldError::FleetProcesses)?,
                )
            }
        };
        let limit = match options.connection_limit {
            Some(limit) => limit,
            None => default_connection_limit(&fleet).map_err(WorldError::ConnectionLimit)?,
        };
        let images = ImageServer::start([]).await.map_err(WorldError::ImageServer)?;
        let world = SimWorld {
            redfish: Arc::new(RedfishConnector::new(
                HttpClients::with_connection_limit(limit),
                sim_resolver(),
            )),
            clock,
            fleet,
            db,
            images,
            _dir: dir,
        };
        world.import_fleet().await?;
        Ok(world)
    }

    /// The bound on the controller's BMC connections, and how much of it is in use.
    pub fn connection_usage(&self) -> orchestrator_bmc::ConnectionUsage {
        self.redfish.connection_usage()
    }

    /// Moves simulated time forward to `at`, here and in the fleet.
    pub async fn skip_to(&self, at: DateTime<Utc>) {
        self.fleet.skip_to(&self.clock, at).await;
    }

    async fn import_fleet(&self) -> Result<(), WorldError> {
        let new_nodes: Vec<NewNode> = self
            .fleet
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
        for chunk in new_nodes.chunks(5_000) {
            self.db
                .import_nodes(chunk, SIM_AUTHOR)
                .await
                .map_err(WorldError::Import)?;
        }
        let nodes = all_nodes(&self.db).await.map_err(WorldError::Import)?;
        let mut fleet_versions = self.fleet.versions().await.map_err(WorldError::FleetProcesses)?;
        for node in nodes {
            let Some(versions) = fleet_versions.remove(&node.name) else {
                continue;
            };
            let mut readings = Vec::with_capacity(versions.len());
            for c in versions {
                let version = FirmwareVersion::parse(&c.active).map_err(|_| WorldError::Version {
                    node: node.name.clone(),
                    version: c.active.clone(),
                })?;
                readings.push(ComponentReading {
                    inventory_id: c.id,
                    kind: c.kind,
                    version,
                    updateable: true,
                    software_id: None,
                    health: Some("OK".into()),
                });
            }
            self.db
                .record_inventory(node.id, &readings)
                .await
                .map_err(WorldError::Import)?;
        }
        Ok(())
    }

    /// Distinct platform SKUs of the fleet.
    pub fn skus(&self) -> Vec<String> {
        let set: BTreeSet<&str> = self.fleet.endpoints().iter().map(|e| e.labels.sku.as_str()).collect();
        set.into_iter().map(str::to_owned).collect()
    }

    /// Distinct active versions of `kind` in the fleet now.
    pub async fn active_versions(&self, kind: ComponentKind) -> Result<BTreeSet<String>, bmc_sim::ProcessError> {
        let versions = self.fleet.versions().await?;
        Ok(versions
            .into_values()
            .flatten()
            .filter(|c| c.kind == kind)
            .map(|c| c.active)
            .collect())
    }

    /// Builds the image of `kind@version` for the fleet's platforms, serves
    /// it, and registers the release. `qualify_with` = the gates to record as
    /// passed before qualifying it; `None` leaves it registered.
    pub async fn register_release(
        &self,
        kind: ComponentKind,
        version: &FirmwareVersion,
        qualify_with: Option<&[String]>,
        notes: &str,
    ) -> Result<Release, orchestrator_db::DbError> {
        let skus = self.skus();
        let sku_refs: Vec<&str> = skus.iter().map(String::as_str).collect();
        let bytes = bmc_sim::image::build(kind, version.as_str(), &sku_refs, version.as_str().as_bytes());
        let file = format!("{}-{}.fw", kind.as_str(), version.as_str());
        let sha256 = hex::encode(Sha256::digest(&bytes));
        let size = bytes.len() as u64;
        let image_uri = self.images.insert(&format!("images/{file}"), bytes);
        let release = self
            .db
            .add_release(
                &NewRelease {
                    component_kind: kind,
                    version: version.clone(),
                    image_uri,
                    sha256,
                    size_bytes: size,
                    platforms: skus,
                    release_notes: notes.to_owned(),
                },
                SIM_AUTHOR,
            )
            .await?;
        if let Some(gates) = qualify_with {
            self.db
                .transition_release(
                    release.id,
                    &TransitionRequest {
                        to: QualificationState::Qualifying,
                        reason: None,
                    },
                    SIM_AUTHOR,
                )
                .await?;
            for gate in gates {
                self.db
                    .record_gate_result(
                        release.id,
                        &NewGateResult {
                            gate: gate.clone(),
                            passed: true,
                            evidence: "simulated: assumed passed".into(),
                        },
                        SIM_AUTHOR,
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
                    SIM_AUTHOR,
                )
                .await?;
        }
        self.db.release(release.id).await
    }

    /// Drivers for the simulated BMCs, with timeouts for loopback.
    pub fn connector(&self) -> Arc<dyn BmcConnector> {
        self.redfish.clone()
    }

    /// The RMA monitor over the simulated BMCs, as `waveguard serve` runs it, with passes every
    /// half real second so that the accelerated clock's failures are found as they happen.
    pub fn rma_monitor(&self) -> orchestrator_engine::rma::RmaMonitor {
        orchestrator_engine::rma::RmaMonitor::new(
            self.db.clone(),
            self.redfish.clone(),
            None,
            orchestrator_engine::rma::RmaConfig {
                pass_interval: StdDuration::from_millis(500),
                ..Default::default()
            },
        )
    }

    /// Engine settings for accelerated time. Durations the engine reads from
    /// the clock are simulated; those that must outlast a real-time event (a
    /// request timeout, a slow pass) are scaled so that they still do.
    pub fn engine_config(&self, holder: &str) -> EngineConfig {
        let real = |secs: u64| self.clock.sim_duration(StdDuration::from_secs(secs));
        let defaults = StepDeadlines::default();
        EngineConfig {
            holder: holder.into(),
            // One controller: the lease must not lapse between passes however
            // far simulated time jumps.
            lease_ttl: Duration::days(3650),
            pass_interval: StdDuration::from_millis(20),
            // The BMCs must be silent for 20 real seconds (10 request
            // timeouts) before they are called bricked.
            brick_timeout: Duration::minutes(30).max(real(20)),
            activation_timeout: Duration::minutes(20).max(real(5)),
            // A step's deadline must also outlast a slow pass in real time
            // (at two simulated hours per real second, one busy pass would
            // otherwise spend a whole deadline).
            deadlines: StepDeadlines {
                push: defaults.push.max(real(60)),
                task: defaults.task.max(real(60)),
                activation: defaults.activation.max(real(60)),
                verification: defaults.verification.max(real(60)),
            },
            ..EngineConfig::default()
        }
    }

    /// Starts the engine on this world.
    pub fn start_engine(&self, holder: &str, judge: Arc<dyn HealthJudge>) -> Engine {
        Engine::start(self.db.clone(), self.engine_config(holder), self.connector(), judge)
    }

    /// Stops the image server and the fleet.
    pub async fn shutdown(self) {
        drop(self.images);
        self.fleet.shutdown().await;
        if let Err(err) = self.db.close().await {
            tracing::warn!(error = %err, "closing the simulation database");
        }
    }
}

async fn start_in_process(
    scenario: Scenario,
    options: &WorldOptions,
    clock: Arc<AcceleratedClock>,
) -> Result<bmc_sim::RunningFleet, WorldError> {
    let mut fleet_options = FleetOptions::new(clock);
    fleet_options.username = SIM_BMC_USER.into();
    fleet_options.password = SIM_BMC_PASSWORD.into();
    fleet_options.hang_for = SIM_HANG_FOR;
    fleet_options.keep_alive = options.keep_alive;
    match &options.fleet_runtime {
        Some(runtime) => runtime
            .spawn(Fleet::start(scenario, fleet_options))
            .await
            .map_err(WorldError::FleetTask)?,
        None => Fleet::start(scenario, fleet_options).await,
    }
    .map_err(WorldError::Fleet)
}

/// A hung request must end well before the engine would call the BMC bricked; the client gives up
/// first anyway.
const SIM_HANG_FOR: StdDuration = StdDuration::from_secs(3);

fn process_options(
    program: std::path::PathBuf,
    leading_args: Vec<String>,
    scenario_yaml: String,
    nodes: usize,
    processes: usize,
    epoch: DateTime<Utc>,
    options: &WorldOptions,
) -> ProcessOptions {
    ProcessOptions {
        program,
        leading_args,
        scenario_yaml,
        nodes,
        processes,
        first_address: std::net::Ipv4Addr::new(127, 0, 0, 2),
        clock_epoch: epoch,
        speedup: options.speedup,
        keep_alive: options.keep_alive,
        hang_for: SIM_HANG_FOR,
        username: SIM_BMC_USER.into(),
        password: SIM_BMC_PASSWORD.into(),
    }
}

/// The controller's bound on BMC connections from its open-file limit. A fleet in this process
/// holds a listener per BMC and the server side of every connection here too, so it gets what the
/// listeners leave, halved; fleet processes count their own descriptors.
fn default_connection_limit(fleet: &SimFleet) -> Result<ConnectionLimit, orchestrator_bmc::LimitError> {
    match fleet {
        SimFleet::Processes(_) => ConnectionLimit::from_open_files(None),
        SimFleet::InProcess(f) => {
            let soft = orchestrator_bmc::soft_open_file_limit()?;
            let listeners = f.endpoints().len() as u64;
            let left = soft.saturating_sub(orchestrator_bmc::default_reserve(soft) + listeners) / 2;
            Ok(ConnectionLimit::new(usize::try_from(left).unwrap_or(usize::MAX)).unwrap_or(ConnectionLimit::MIN))
        }
    }
}

/// Endpoints of the simulated BMCs: their credentials, and timeouts and
/// retries sized for loopback (a hung request must end long before the
/// engine would call its BMC bricked).
fn sim_resolver() -> Arc<orchestrator_engine::EndpointResolver> {
    Arc::new(|url: &str, _profile: &str| {
        let url = url::Url::parse(url).map_err(|e| e.to_string())?;
        Ok(BmcEndpoint::new(url, Credentials::new(SIM_BMC_USER, SIM_BMC_PASSWORD))
            .with_timeouts(Timeouts {
                connect: StdDuration::from_millis(500),
                request: StdDuration::from_secs(2),
                upload: StdDuration::from_secs(5),
                probe: StdDuration::from_millis(500),
            })
            .with_retry(RetryPolicy {
                max_retries: 1,
                base_delay: StdDuration::from_millis(10),
                max_delay: StdDuration::from_millis(50),
                max_retry_after: StdDuration::from_millis(50),
                deadline: StdDuration::from_secs(3),
            }))
    })
}

/// Every node, page by page.
pub async fn all_nodes(db: &Db) -> Result<Vec<orchestrator_db::model::Node>, orchestrator_db::DbError> {
    let mut out = Vec::new();
    loop {
        let page = db
            .list_nodes(&orchestrator_db::model::NodeFilter {
                offset: Some(out.len() as u64),
                limit: Some(10_000),
                ..Default::default()
            })
            .await?;
        let len = page.len();
        out.extend(page);
        if len < 10_000 {
            return Ok(out);
        }
    }
}

/// The health judge in use and whether it watches health during the bake
/// (then the bake is never skipped over).
#[derive(Debug)]
pub struct JudgeChoice {
    /// The judge.
    pub judge: Arc<dyn HealthJudge>,
    /// True for a detector that samples health over the bake.
    pub watches_health: bool,
}

/// The detector: waves are judged against their control cohorts from the
/// simulated BMCs' Redfish health, as `waveguard serve` does.
pub fn judge_for(world: &SimWorld) -> JudgeChoice {
    JudgeChoice {
        judge: Arc::new(orchestrator_engine::watch::DetectorJudge::new(
            world.db.clone(),
            world.redfish.clone(),
        )),
        watches_health: true,
    }
}
