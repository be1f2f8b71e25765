//! `waveguard simulate`: one whole rollout, headless, against a simulated
//! fleet, with a JSON report of what happened.
//!
//! Everything is real except the fleet and the clock: a temporary SQLite
//! database, bmc-sim serving Redfish over loopback HTTP, the release image
//! served over loopback HTTP for the BMCs to pull, the planner and the engine
//! (and its health judge). Simulated time runs `--speedup` times faster than
//! real time and jumps over stretches where nothing can happen (waiting for a
//! maintenance window; waiting for a bake to end when no detector watches it),
//! so days of policy finish in seconds.
//!
//! The pieces (the world: clock, fleet, database, image server; the engine's
//! settings for accelerated time) are shared with `waveguard demo` and the
//! benchmarks.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, RwLock};
use std::time::{Duration as StdDuration, Instant};

use anyhow::Context as _;
use axum::Router;
use axum::extract::{Path as UrlPath, State};
use axum::http::StatusCode;
use axum::routing::get;
use bmc_sim::{Fleet, FleetOptions, RunningFleet, Scenario};
use chrono::{DateTime, Duration, Utc};
use orchestrator_bmc::{BmcEndpoint, Credentials, HttpClients, RetryPolicy, Timeouts};
use orchestrator_db::Db;
use orchestrator_db::execution::{
    Blocker, ExecRollout, ExecWave, RolloutState, StepFilter, StepPurpose, StepState, WaveState,
};
use orchestrator_db::model::{ComponentReading, NewGateResult, NewNode, NewRelease, NodeLabels, Release};
use orchestrator_engine::{
    BmcConnector, Engine, EngineConfig, HealthJudge, RedfishConnector, StartRollout, StepDeadlines,
};
use orchestrator_policy::Policy;
use orchestrator_types::{
    AcceleratedClock, Clock, ComponentKind, FirmwareVersion, QualificationState, TransitionRequest,
};
use serde::Serialize;
use sha2::{Digest, Sha256};
use tokio::task::JoinHandle;

use super::BadInput;
use crate::Context;

/// Default speedup: two simulated hours per real second, so a policy with a
/// couple of days of bake runs in well under a minute even before idle time
/// is skipped.
pub const DEFAULT_SPEEDUP: f64 = 7200.0;

/// Username and password of every simulated BMC (loopback only).
const SIM_BMC_USER: &str = "admin";
const SIM_BMC_PASSWORD: &str = "admin";

/// Who starts simulated rollouts, in the audit log. Approvers must differ
/// from it (two-person rule).
pub const SIM_AUTHOR: &str = "waveguard-simulate";

/// Synthetic approvers used by `--approve auto`; distinct people as far as the
/// two-person rule is concerned.
pub const SIM_APPROVERS: [&str; 3] = ["sim-approver-1", "sim-approver-2", "sim-approver-3"];

/// Real time between the simulation's looks at the database.
const WATCH_INTERVAL: StdDuration = StdDuration::from_millis(25);

/// Options of `waveguard simulate`.
#[derive(Debug, clap::Args)]
pub struct SimulateArgs {
    /// bmc-sim scenario YAML: the fleet, its firmware behaviour and faults.
    #[arg(long, value_name = "FILE")]
    scenario: PathBuf,
    /// Rollout policy YAML.
    #[arg(long, value_name = "FILE")]
    policy: PathBuf,
    /// The release to roll out, as KIND@VERSION (e.g. gpu@96.00.61.00.01).
    /// Its image is generated for the scenario's platforms.
    #[arg(long, value_name = "KIND@VERSION")]
    release: String,
    /// Where to write the JSON report.
    #[arg(long, value_name = "FILE")]
    report: PathBuf,
    /// Simulated seconds per real second.
    #[arg(long, default_value_t = DEFAULT_SPEEDUP, value_name = "N")]
    speedup: f64,
    /// `auto`: give every manual approval at once, as two synthetic approvers.
    /// Without it a wave waiting for a human ends the simulation (outcome
    /// `halted`).
    #[arg(long, value_enum, value_name = "MODE")]
    approve: Option<ApproveMode>,
    /// Seed of the planner's stratified choices.
    #[arg(long, default_value_t = 1, value_name = "N")]
    seed: i64,
    /// Register the release without qualifying it (by default it is qualified
    /// with every gate the policy requires recorded as passed).
    #[arg(long)]
    unqualified: bool,
    /// Give up after this many real seconds (outcome `halted`).
    #[arg(long, default_value_t = 600, value_name = "SECONDS")]
    timeout: u64,
}

/// How manual approvals are given.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ApproveMode {
    /// Approve every wave that waits for approval, at once.
    Auto,
}

// ---------------------------------------------------------------------------
// The report (a contract: keep these keys).

/// The JSON report. Keys are a contract (issue 8); extra keys may be added.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// completed | rolled_back | halted | aborted.
    pub outcome: String,
    /// The release's qualification state at the end.
    pub release_state: String,
    /// Waves in plan order (the rollback wave last, when there is one).
    pub waves: Vec<WaveReport>,
    /// The first failing health verdict.
    pub detection: Detection,
    /// How many nodes ran the release.
    pub exposure: Exposure,
    /// Nodes by the target component's active version at the end.
    pub final_versions: BTreeMap<String, u64>,
    /// Update and rollback step outcomes.
    pub updates: Updates,
    /// Simulated seconds from the start of the rollout to the end.
    pub sim_seconds: i64,
    /// Real seconds the rollout took.
    pub wall_seconds: f64,
    /// Added: why the simulation ended where it did (rollout state reason,
    /// a wave waiting for a human, a timeout).
    pub reason: Option<String>,
    /// Added: whether a health detector judged the waves; false means every
    /// `verdicts` list is empty because no detector is wired in.
    pub verdicts_available: bool,
    /// Added: the release rolled out.
    pub release: String,
    /// Added: nodes in the fleet.
    pub fleet_nodes: usize,
    /// Added: the speedup in force (simulated seconds per real second,
    /// before idle stretches are skipped).
    pub speedup: f64,
    /// Added: approvals given by `--approve auto`.
    pub approvals_given: u32,
}

/// One wave.
#[derive(Debug, Clone, Serialize)]
pub struct WaveReport {
    /// Wave name from the policy (`rollback` for the rollback wave).
    pub name: String,
    /// Nodes planned into the wave.
    pub nodes: i64,
    /// Simulated seconds from the rollout start; null if it never started.
    pub started_at_s: Option<i64>,
    /// Null if it never ended.
    pub ended_at_s: Option<i64>,
    /// promote | rollback | hold | halt, or null while undecided.
    pub decision: Option<String>,
    /// Per-gate verdicts of the wave's last judgement.
    pub verdicts: Vec<GateVerdict>,
}

/// One gate's verdict.
#[derive(Debug, Clone, Serialize)]
pub struct GateVerdict {
    /// The gate's metric (or query, for Prometheus gates).
    pub metric: String,
    /// pass | fail | inconclusive | error.
    pub verdict: String,
    pub p_value: Option<f64>,
    /// The effect estimate (rate ratio or level shift).
    pub effect: Option<f64>,
}

/// When a regression was detected.
#[derive(Debug, Clone, Serialize)]
pub struct Detection {
    pub detected: bool,
    pub at_s: Option<i64>,
    pub metric: Option<String>,
}

/// Blast radius.
#[derive(Debug, Clone, Serialize)]
pub struct Exposure {
    pub max_nodes_on_release: u64,
    pub nodes_on_release_at_detection: Option<u64>,
}

/// Step outcomes.
#[derive(Debug, Clone, Serialize)]
pub struct Updates {
    /// Update steps that started (neither pending nor skipped).
    pub attempted: u64,
    pub succeeded: u64,
    pub failed: u64,
    /// BMCs that stopped answering for good (bmc-sim's own record).
    pub bricked: u64,
    /// Rollback steps that succeeded.
    pub rolled_back: u64,
    /// Most flashes bmc-sim saw on one node for one version (1 = never twice).
    pub max_flashes_per_node_step: u32,
}

// ---------------------------------------------------------------------------
// The world: clock, fleet, database, image server.

/// Images served to the BMCs, by file name; the demo adds releases later.
type ImageStore = Arc<RwLock<BTreeMap<String, Vec<u8>>>>;

/// Everything a simulated rollout runs against.
#[derive(Debug)]
pub struct SimWorld {
    /// The shared simulated clock.
    pub clock: Arc<AcceleratedClock>,
    /// bmc-sim, in-process, one loopback port per BMC.
    pub fleet: RunningFleet,
    /// The controller's database.
    pub db: Db,
    /// Base URL of the image server (`{base}/{file}`).
    pub image_base: String,
    images: ImageStore,
    image_server: JoinHandle<()>,
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
    #[error("cannot start the image server")]
    ImageServer(#[source] std::io::Error),
    #[error("cannot record the simulated fleet in the database")]
    Import(#[source] orchestrator_db::DbError),
    #[error("bmc-sim reports version {version:?} on {node}, which does not parse")]
    Version { node: String, version: String },
}

impl SimWorld {
    /// Starts the fleet of `scenario` on a fresh clock, a database (`db_url`,
    /// or a temporary SQLite file), the image server, and records every node
    /// with its inventory as discovery would.
    pub async fn start(scenario: Scenario, speedup: f64, db_url: Option<&str>) -> Result<SimWorld, WorldError> {
        Self::start_on(scenario, speedup, db_url, None, true).await
    }

    /// As [`SimWorld::start`], with the fleet's servers on `fleet_runtime`
    /// (the benchmarks keep bmc-sim's CPU apart from the controller's) and,
    /// unless `keep_alive`, BMCs that close every connection after one
    /// response (so a fleet of 10,000 in this process holds no idle sockets).
    pub async fn start_on(
        scenario: Scenario,
        speedup: f64,
        db_url: Option<&str>,
        fleet_runtime: Option<tokio::runtime::Handle>,
        keep_alive: bool,
    ) -> Result<SimWorld, WorldError> {
        let clock = Arc::new(AcceleratedClock::new(Utc::now(), speedup));
        let (dir, url) = match db_url {
            Some(url) => (None, url.to_owned()),
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
        let mut options = FleetOptions::new(clock.clone());
        options.username = SIM_BMC_USER.into();
        options.password = SIM_BMC_PASSWORD.into();
        // A hung request must end well before the engine would call the BMC
        // bricked; the client gives up first anyway.
        options.hang_for = StdDuration::from_secs(3);
        options.keep_alive = keep_alive;
        let fleet = match fleet_runtime {
            Some(runtime) => runtime
                .spawn(Fleet::start(scenario, options))
                .await
                .map_err(WorldError::FleetTask)?,
            None => Fleet::start(scenario, options).await,
        }
        .map_err(WorldError::Fleet)?;
        let images: ImageStore = Arc::default();
        let (image_base, image_server) = serve_images(images.clone()).await.map_err(WorldError::ImageServer)?;
        let world = SimWorld {
            redfish: Arc::new(RedfishConnector::new(HttpClients::new(), sim_resolver())),
            clock,
            fleet,
            db,
            image_base,
            images,
            image_server,
            _dir: dir,
        };
        world.import_fleet().await?;
        Ok(world)
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
        for node in nodes {
            let Some(versions) = self.fleet.versions(&node.name) else {
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
    pub fn active_versions(&self, kind: ComponentKind) -> BTreeSet<String> {
        let mut set = BTreeSet::new();
        for e in self.fleet.endpoints() {
            for c in self.fleet.versions(&e.name).unwrap_or_default() {
                if c.kind == kind {
                    set.insert(c.active);
                }
            }
        }
        set
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
        self.images
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(file.clone(), bytes);
        let release = self
            .db
            .add_release(
                &NewRelease {
                    component_kind: kind,
                    version: version.clone(),
                    image_uri: format!("{}/{file}", self.image_base),
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
        self.image_server.abort();
        self.fleet.shutdown().await;
        if let Err(err) = self.db.close().await {
            tracing::warn!(error = %err, "closing the simulation database");
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

async fn serve_images(images: ImageStore) -> std::io::Result<(String, JoinHandle<()>)> {
    async fn image(State(images): State<ImageStore>, UrlPath(name): UrlPath<String>) -> (StatusCode, Vec<u8>) {
        let found = images.read().unwrap_or_else(|p| p.into_inner()).get(&name).cloned();
        match found {
            Some(bytes) => (StatusCode::OK, bytes),
            None => (StatusCode::NOT_FOUND, Vec::new()),
        }
    }
    let app = Router::new().route("/images/{name}", get(image)).with_state(images);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let task = tokio::spawn(async move {
        if let Err(err) = axum::serve(listener, app).await {
            tracing::error!(error = %err, "image server stopped");
        }
    });
    Ok((format!("http://{addr}/images"), task))
}

// ---------------------------------------------------------------------------
// The command.

/// Parses `KIND@VERSION`.
pub fn parse_release(text: &str) -> Result<(ComponentKind, FirmwareVersion), BadInput> {
    let (kind, version) = text.split_once('@').ok_or_else(|| {
        BadInput(format!(
            "--release {text:?}: expected KIND@VERSION, e.g. gpu@96.00.61.00.01"
        ))
    })?;
    let kind: ComponentKind = kind.trim().parse().map_err(|_| {
        BadInput(format!(
            "--release {text:?}: unknown component kind {kind:?} (bmc, gpu, nic, bios, cpld, other)"
        ))
    })?;
    let version = FirmwareVersion::parse(version.trim())
        .map_err(|e| BadInput(format!("--release {text:?}: version {version:?} does not parse: {e}")))?;
    Ok((kind, version))
}

fn read_input(path: &Path, what: &str) -> Result<String, BadInput> {
    std::fs::read_to_string(path).map_err(|e| BadInput(format!("cannot read the {what} {}: {e}", path.display())))
}

/// Everything validated before anything starts.
struct Inputs {
    scenario: Scenario,
    policy_source: String,
    policy: Policy,
    kind: ComponentKind,
    version: FirmwareVersion,
}

fn validate(args: &SimulateArgs) -> Result<Inputs, BadInput> {
    if !(args.speedup.is_finite() && args.speedup >= 1.0) {
        return Err(BadInput(format!("--speedup {}: must be a number >= 1", args.speedup)));
    }
    let (kind, version) = parse_release(&args.release)?;
    let scenario_text = read_input(&args.scenario, "scenario")?;
    let scenario = Scenario::from_yaml_str(&scenario_text)
        .map_err(|e| BadInput(format!("scenario {}: {e}", args.scenario.display())))?;
    let policy_source = read_input(&args.policy, "policy")?;
    let policy = orchestrator_engine::parse_policy(&policy_source)
        .map_err(|e| BadInput(format!("policy {}: {e}", args.policy.display())))?;
    if policy.target.component != kind {
        return Err(BadInput(format!(
            "--release {}: the policy {:?} updates {} firmware, not {}",
            args.release,
            policy.name,
            policy.target.component.as_str(),
            kind.as_str()
        )));
    }
    if let Some(parent) = args.report.parent().filter(|p| !p.as_os_str().is_empty())
        && !parent.is_dir()
    {
        return Err(BadInput(format!(
            "--report {}: directory {} does not exist",
            args.report.display(),
            parent.display()
        )));
    }
    Ok(Inputs {
        scenario,
        policy_source,
        policy,
        kind,
        version,
    })
}

/// `waveguard simulate`.
pub async fn run(args: SimulateArgs, _context: &Context) -> anyhow::Result<ExitCode> {
    let inputs = validate(&args)?;
    let nodes = inputs.scenario.fleet.nodes;
    eprintln!(
        "simulating {} {} on {nodes} node(s) with policy {:?} at {}x",
        inputs.kind.as_str(),
        inputs.version.as_str(),
        inputs.policy.name,
        args.speedup
    );
    let world = SimWorld::start(inputs.scenario.clone(), args.speedup, None).await?;
    let outcome = simulate(&world, &inputs, &args).await;
    world.shutdown().await;
    let report = outcome?;
    let json = serde_json::to_string_pretty(&report).context("serialising the report")?;
    std::fs::write(&args.report, format!("{json}\n"))
        .with_context(|| format!("cannot write the report {}", args.report.display()))?;
    eprintln!(
        "{}: {} node(s) updated, {} failed, {} rolled back; detection: {}; {} simulated s in {:.1} s; report in {}",
        report.outcome,
        report.updates.succeeded,
        report.updates.failed,
        report.updates.rolled_back,
        match (&report.detection.metric, report.detection.at_s) {
            (Some(metric), Some(at)) => format!("{metric} at {at} s"),
            _ => "none".into(),
        },
        report.sim_seconds,
        report.wall_seconds,
        args.report.display()
    );
    Ok(ExitCode::SUCCESS)
}

async fn simulate(world: &SimWorld, inputs: &Inputs, args: &SimulateArgs) -> anyhow::Result<Report> {
    let gates = inputs.policy.qualification.required_gates.clone();
    let release = world
        .register_release(
            inputs.kind,
            &inputs.version,
            (!args.unqualified).then_some(gates.as_slice()),
            "generated by waveguard simulate",
        )
        .await
        .map_err(|e| bad_if_caller(e, "cannot register the release"))?;
    // Rollback needs an image of every version the fleet runs now.
    for current in world.active_versions(inputs.kind) {
        let Ok(version) = FirmwareVersion::parse(&current) else {
            continue;
        };
        if version.as_str() != inputs.version.as_str() {
            world
                .register_release(
                    inputs.kind,
                    &version,
                    None,
                    "the fleet's current version (rollback target)",
                )
                .await
                .context("cannot register the fleet's current version")?;
        }
    }
    let rollout = orchestrator_engine::start_rollout(
        &world.db,
        &StartRollout {
            release_id: release.id,
            policy_source: inputs.policy_source.clone(),
            policy_commit: None,
            policy_blob: None,
            seed: args.seed,
        },
        SIM_AUTHOR,
    )
    .await
    .map_err(|e| {
        if e.is_caller_error() {
            anyhow::Error::new(BadInput(format!("the rollout cannot start: {}", error_chain(&e))))
        } else {
            anyhow::Error::new(e).context("cannot start the rollout")
        }
    })?;
    let planned: i64 = world
        .db
        .rollout_waves(rollout.id)
        .await?
        .iter()
        .map(|w| i64::from(w.node_count))
        .sum();
    if planned == 0 {
        return Err(BadInput(format!(
            "the policy {:?} selects no node of the scenario's fleet for {}@{} (check target platforms, selector, \
             versions.from against the scenario)",
            inputs.policy.name,
            inputs.kind.as_str(),
            inputs.version.as_str()
        ))
        .into());
    }
    let judge = judge_for(world);
    let detector = judge.watches_health;
    let engine = world.start_engine("waveguard-simulate", judge.judge);
    let watched = watch(
        world,
        &rollout,
        WatchOptions {
            approve: args.approve == Some(ApproveMode::Auto),
            skip_bake: !detector,
            timeout: StdDuration::from_secs(args.timeout),
        },
    )
    .await;
    engine.shutdown().await;
    let watched = watched?;
    build_report(world, &inputs.policy, &rollout, &release, watched, detector).await
}

fn bad_if_caller(err: orchestrator_db::DbError, what: &'static str) -> anyhow::Error {
    if err.is_caller_error() {
        anyhow::Error::new(BadInput(format!("{what}: {}", error_chain(&err))))
    } else {
        anyhow::Error::new(err).context(what)
    }
}

/// The error and its sources on one line.
pub fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(inner) = source {
        text.push_str(": ");
        text.push_str(&inner.to_string());
        source = inner.source();
    }
    text
}

/// The health judge in use and whether it watches health during the bake
/// (then the bake is never skipped over).
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

/// What the watch loop saw.
#[derive(Debug, Clone)]
pub struct Watched {
    /// The rollout at the end.
    pub rollout: ExecRollout,
    /// Why the watch stopped, when not the rollout's own end.
    pub stopped_because: Option<String>,
    /// Simulated instant the simulation ended.
    pub ended_at: DateTime<Utc>,
    /// Real time the rollout took.
    pub wall: StdDuration,
    /// Approvals given by `--approve auto`.
    pub approvals: u32,
    /// When the watch first saw a failed verdict (the engine overwrites the
    /// wave's end when its rollback finishes).
    pub first_fail_seen: Option<DateTime<Utc>>,
}

/// How to watch.
#[derive(Debug, Clone, Copy)]
pub struct WatchOptions {
    /// Give manual approvals automatically.
    pub approve: bool,
    /// Jump over bakes (nothing samples health during them).
    pub skip_bake: bool,
    /// Real-time limit.
    pub timeout: StdDuration,
}

/// Drives a rollout to its end: approves when asked to, jumps over idle
/// time, and returns when the rollout is finished (or halted with nothing in
/// flight, or waits for a human who will not come, or the time is up).
pub async fn watch(world: &SimWorld, rollout: &ExecRollout, options: WatchOptions) -> anyhow::Result<Watched> {
    let db = &world.db;
    let wall_start = Instant::now();
    let mut approvals = 0u32;
    let mut quiet_since: Option<Instant> = None;
    let mut first_fail_seen: Option<DateTime<Utc>> = None;
    loop {
        let current = db.exec_rollout(rollout.id).await?;
        let waves = db.rollout_waves(rollout.id).await?;
        let counts = db.step_counts(rollout.id, None).await?;
        if first_fail_seen.is_none() && waves.iter().any(verdict_failed) {
            first_fail_seen = Some(world.clock.now());
        }
        let in_flight: u64 = counts.iter().filter(|(s, _)| s.is_in_flight()).map(|(_, n)| *n).sum();
        let done = |stopped_because: Option<String>, approvals: u32| Watched {
            rollout: current.clone(),
            stopped_because,
            ended_at: world.clock.now(),
            wall: wall_start.elapsed(),
            approvals,
            first_fail_seen,
        };
        match current.state {
            RolloutState::Completed | RolloutState::RolledBack | RolloutState::Aborted => {
                return Ok(done(None, approvals));
            }
            RolloutState::Halted if in_flight == 0 => {
                // A halted rollout waits for a human; let the engine write
                // its last pass first, then stop.
                if quiet_since.is_some_and(|t| t.elapsed() > StdDuration::from_millis(300)) {
                    return Ok(done(None, approvals));
                }
                quiet_since.get_or_insert_with(Instant::now);
            }
            _ => quiet_since = None,
        }
        for wave in waves.iter().filter(|w| w.state == WaveState::AwaitingApproval) {
            if !options.approve {
                return Ok(done(
                    Some(format!(
                        "wave {:?} waits for manual approval (pass --approve auto to give it)",
                        wave.name
                    )),
                    approvals,
                ));
            }
            let have = db.wave_approvals(wave.id).await?;
            let need = usize::try_from(wave.approvals_required.max(1)).unwrap_or(1);
            let given: BTreeSet<&str> = have.iter().map(|a| a.approver.as_str()).collect();
            for approver in SIM_APPROVERS
                .iter()
                .filter(|a| !given.contains(**a))
                .take(need.saturating_sub(have.len()))
            {
                db.approve_wave(wave.id, approver, Some("approved by waveguard simulate --approve auto"))
                    .await
                    .with_context(|| format!("approving wave {:?}", wave.name))?;
                approvals += 1;
            }
        }
        if current.state == RolloutState::Running && in_flight == 0 {
            skip_idle(world, &waves, options.skip_bake);
        }
        if wall_start.elapsed() > options.timeout {
            return Ok(done(
                Some(format!(
                    "gave up after {} real seconds (rollout {})",
                    options.timeout.as_secs(),
                    current.state
                )),
                approvals,
            ));
        }
        tokio::time::sleep(WATCH_INTERVAL).await;
    }
}

/// With nothing in flight, a wave held only by time (a window that opens
/// later; a bake that ends later, when `skip_bake`) is idle until then.
/// `None`: something other than time holds it, or nothing does.
pub fn idle_until(waves: &[ExecWave], skip_bake: bool) -> Option<DateTime<Utc>> {
    let wave = waves
        .iter()
        .find(|w| matches!(w.state, WaveState::Running | WaveState::Baking))?;
    let mut until: Option<DateTime<Utc>> = None;
    for blocker in &wave.blockers {
        let at = match blocker {
            Blocker::WindowOpensAt { at: Some(at) } => *at,
            Blocker::BakeEndsAt { at } if skip_bake && wave.state == WaveState::Baking => *at,
            _ => return None,
        };
        until = Some(until.map_or(at, |u| u.max(at)));
    }
    until
}

fn skip_idle(world: &SimWorld, waves: &[ExecWave], skip_bake: bool) {
    if let Some(at) = idle_until(waves, skip_bake) {
        tracing::debug!(to = %at, "skipping idle simulated time");
        world.clock.skip_to(at);
    }
}

fn verdict_failed(wave: &ExecWave) -> bool {
    wave.verdict
        .as_ref()
        .is_some_and(|v| v.outcome == orchestrator_types::Outcome::Fail)
}

fn seconds_since(start: DateTime<Utc>, at: Option<DateTime<Utc>>) -> Option<i64> {
    at.map(|t| (t - start).num_seconds().max(0))
}

fn decision_name(wave: &ExecWave) -> Option<String> {
    match wave.decision.as_deref() {
        // The report's contract predates "promote anyway" (a hold promoted
        // by people): both are promotions to its readers.
        Some("promote" | "promote_anyway") => Some("promote".into()),
        Some(d) if d.starts_with("rollback") => Some("rollback".into()),
        Some("halt") => Some("halt".into()),
        Some(other) => Some(other.to_owned()),
        None => match wave.state {
            WaveState::AwaitingApproval => Some("hold".into()),
            WaveState::Halted => Some("halt".into()),
            _ => None,
        },
    }
}

/// The metric a gate watches, from the policy (the gate name when unknown).
fn gate_metric(policy: &Policy, gate: &str) -> String {
    policy.health.gates.iter().find(|g| g.name == gate).map_or_else(
        || gate.to_owned(),
        |g| match &g.source {
            orchestrator_policy::GateSource::Redfish { metric } => metric.as_str().to_owned(),
            orchestrator_policy::GateSource::Prometheus { query } => query.clone(),
        },
    )
}

/// Per-gate verdicts from a stored wave verdict, read through the
/// detector's evidence type; a judge without gates gives none.
fn gate_verdicts(policy: &Policy, verdict: Option<&orchestrator_types::WaveVerdict>) -> Vec<GateVerdict> {
    let Some(evidence) = verdict
        .and_then(|v| serde_json::from_value::<orchestrator_engine::watch::DetectorEvidence>(v.evidence.clone()).ok())
    else {
        return Vec::new();
    };
    evidence
        .gates
        .iter()
        .map(|look| {
            // The look's statistics, when it was evaluated.
            let detected = serde_json::from_value::<orchestrator_detect::Verdict>(look.verdict.clone()).ok();
            let stats = detected.as_ref().and_then(orchestrator_detect::Verdict::evidence);
            GateVerdict {
                metric: gate_metric(policy, &look.gate),
                verdict: look.outcome.as_str().to_owned(),
                p_value: stats.map(|e| e.p_value),
                effect: stats.and_then(|e| e.effect.estimate),
            }
        })
        .collect()
}

async fn build_report(
    world: &SimWorld,
    policy: &Policy,
    rollout: &ExecRollout,
    release: &Release,
    watched: Watched,
    detector: bool,
) -> anyhow::Result<Report> {
    let db = &world.db;
    let start = rollout.created_at;
    let waves = db.rollout_waves(rollout.id).await?;
    let wave_reports: Vec<WaveReport> = waves
        .iter()
        .map(|w| WaveReport {
            name: w.name.clone(),
            nodes: i64::from(w.node_count),
            started_at_s: seconds_since(start, w.started_at),
            ended_at_s: seconds_since(start, w.ended_at),
            decision: decision_name(w),
            verdicts: gate_verdicts(policy, w.verdict.as_ref()),
        })
        .collect();
    // The first wave whose verdict failed is the detection.
    let failed_wave = waves.iter().find(|w| verdict_failed(w));
    // The verdict's instant: the rollback it started, or when the watch saw
    // it, whichever is earlier (the wave's own end moves when the rollback
    // finishes).
    let rollback_started = waves
        .iter()
        .filter(|w| w.kind == orchestrator_db::execution::WaveKind::Rollback)
        .filter_map(|w| w.started_at)
        .min();
    let detection_at = failed_wave.map(|w| {
        [watched.first_fail_seen, rollback_started, w.ended_at]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(watched.ended_at)
    });
    let detection = Detection {
        detected: failed_wave.is_some(),
        at_s: seconds_since(start, detection_at),
        metric: failed_wave.and_then(|w| {
            let verdicts = gate_verdicts(policy, w.verdict.as_ref());
            verdicts
                .iter()
                .find(|v| v.verdict == "fail")
                .map(|v| v.metric.clone())
                .or_else(|| w.gates.first().map(|g| gate_metric(policy, g)))
        }),
    };
    let steps = db
        .steps(&StepFilter {
            rollout_id: Some(rollout.id),
            ..Default::default()
        })
        .await?;
    // Nodes on the release over time: +1 when an update succeeds (it is read
    // back active then), -1 when its rollback succeeds.
    let mut changes: Vec<(DateTime<Utc>, i64)> = Vec::new();
    let mut updates = Updates {
        attempted: 0,
        succeeded: 0,
        failed: 0,
        bricked: 0,
        rolled_back: 0,
        max_flashes_per_node_step: 0,
    };
    for step in &steps {
        match (step.purpose, step.state) {
            (StepPurpose::Update, StepState::Pending | StepState::Skipped) => {}
            (StepPurpose::Update, state) => {
                updates.attempted += 1;
                match state {
                    StepState::Succeeded => {
                        updates.succeeded += 1;
                        changes.push((step.finished_at.unwrap_or(step.updated_at), 1));
                    }
                    StepState::Failed => updates.failed += 1,
                    _ => {}
                }
            }
            (StepPurpose::Rollback, StepState::Succeeded) => {
                updates.rolled_back += 1;
                changes.push((step.finished_at.unwrap_or(step.updated_at), -1));
            }
            (StepPurpose::Rollback, _) => {}
        }
    }
    changes.sort();
    let (mut on, mut max_on, mut at_detection) = (0i64, 0i64, None);
    for (at, delta) in &changes {
        if let Some(d) = detection_at
            && *at > d
            && at_detection.is_none()
        {
            at_detection = Some(on);
        }
        on += delta;
        max_on = max_on.max(on);
    }
    if detection_at.is_some() && at_detection.is_none() {
        at_detection = Some(on);
    }
    let kind = release.component_kind;
    let mut final_versions: BTreeMap<String, u64> = BTreeMap::new();
    for endpoint in world.fleet.endpoints() {
        let versions: BTreeSet<String> = world
            .fleet
            .versions(&endpoint.name)
            .unwrap_or_default()
            .into_iter()
            .filter(|c| c.kind == kind && policy.target.inventory_id.as_ref().is_none_or(|p| p.matches(&c.id)))
            .map(|c| c.active)
            .collect();
        if versions.is_empty() {
            continue;
        }
        let key = versions.into_iter().collect::<Vec<_>>().join("+");
        *final_versions.entry(key).or_default() += 1;
        let flashes = world.fleet.flash_counts(&endpoint.name).unwrap_or_default();
        updates.max_flashes_per_node_step = updates
            .max_flashes_per_node_step
            .max(flashes.values().copied().max().unwrap_or(0));
    }
    updates.bricked = bricked_count(world).await;
    let release_now = db.release(release.id).await?;
    let outcome = match watched.rollout.state {
        RolloutState::Completed => "completed",
        RolloutState::RolledBack => "rolled_back",
        RolloutState::Aborted => "aborted",
        _ => "halted",
    };
    let reason = watched.stopped_because.clone().or(watched.rollout.state_reason.clone());
    Ok(Report {
        outcome: outcome.into(),
        release_state: release_now.qualification_state.as_str().to_owned(),
        waves: wave_reports,
        detection,
        exposure: Exposure {
            max_nodes_on_release: u64::try_from(max_on).unwrap_or(0),
            nodes_on_release_at_detection: at_detection.map(|n| u64::try_from(n).unwrap_or(0)),
        },
        final_versions,
        updates,
        sim_seconds: (watched.ended_at - start).num_seconds().max(0),
        wall_seconds: (watched.wall.as_secs_f64() * 10.0).round() / 10.0,
        reason,
        verdicts_available: detector,
        release: format!("{}@{}", kind.as_str(), release.version.as_str()),
        fleet_nodes: world.fleet.endpoints().len(),
        speedup: world.clock.speedup(),
        approvals_given: watched.approvals,
    })
}

/// BMCs bmc-sim has bricked, from its control API.
async fn bricked_count(world: &SimWorld) -> u64 {
    let url = format!("{}/sim/nodes", world.fleet.control_url());
    let body: Result<serde_json::Value, String> = async {
        let response = reqwest::get(&url).await.map_err(|e| e.to_string())?;
        response.json().await.map_err(|e| e.to_string())
    }
    .await;
    match body {
        Ok(value) => {
            let nodes = value
                .as_array()
                .cloned()
                .or_else(|| value.get("nodes").and_then(|n| n.as_array()).cloned())
                .unwrap_or_default();
            nodes
                .iter()
                .filter(|n| n.get("bricked").and_then(serde_json::Value::as_bool) == Some(true))
                .count() as u64
        }
        Err(err) => {
            tracing::warn!(error = %err, "cannot read bmc-sim's node list; bricked count is 0");
            0
        }
    }
}
