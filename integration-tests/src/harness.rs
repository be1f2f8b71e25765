//! The one controller world of the tests: a simulated fleet (bmc-sim in process, real Redfish over
//! loopback), a fresh database (SQLite, or PostgreSQL when configured) with every node imported with
//! the inventory its BMC reports, an image server from which the BMCs pull each registered release,
//! and the rollout engine driving the fleet through the Redfish connector, all on one accelerated
//! [`SimClock`], so bakes and flashes take seconds. Everything listens on 127.0.0.1 only.
//!
//! Engine, web and end-to-end tests use it in process; the process tests of the binary use it for
//! everything but the controller, which they spawn.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use bmc_sim::{Fleet, FleetOptions, ImageServer, RunningFleet, Scenario, SimClock};
use orchestrator_bmc::{BmcEndpoint, Credentials, HttpClients, RetryPolicy, Timeouts};
use orchestrator_db::Db;
use orchestrator_db::execution::{ExecRollout, RolloutState};
use orchestrator_db::model::{
    ComponentReading, DiscoveredComponent, NewGateResult, NewNode, NewRelease, NodeLabels, Release, ReleaseRollback,
};
use orchestrator_db::testing::TestDb;
use orchestrator_db::testing::fixtures::{self, GPU_FROM, GPU_TO, SKU};
use orchestrator_engine::{
    BmcConnector, Engine, EngineConfig, GatelessJudge, HealthJudge, RedfishConnector, ResolveError, StartRollout,
};
use orchestrator_types::{Clock, ComponentKind, FirmwareVersion, ReleaseId, RolloutId};
use sha2::{Digest, Sha256};

use crate::scenario::ScenarioYaml;

/// Simulated seconds per real second by default: a 2-4 minute flash takes about a second.
pub const SPEEDUP: f64 = 240.0;

/// A gate result recorded before a release is qualified: gate name and evidence.
pub type GateEvidence<'a> = (&'a str, &'a str);

/// The HGX scenario most engine tests run: `nodes` nodes on [`GPU_FROM`] that know [`GPU_TO`] and
/// [`GPU_FROM`] (2-4 minute flashes, so a rollback can flash back), plus `extra_firmware` entries.
pub fn scenario(nodes: usize, extra_firmware: &str) -> Scenario {
    scenario_with(nodes, extra_firmware, "")
}

/// [`scenario`] with extra keys on the GPU components' entry, e.g.
/// `, lowest_supported_version: "96.00.61.00.00"`.
pub fn scenario_with(nodes: usize, extra_firmware: &str, gpu_keys: &str) -> Scenario {
    ScenarioYaml::hgx(nodes)
        .gpu_keys(gpu_keys)
        .gpu_firmware(GPU_TO, "{min: 2m, max: 4m}")
        .gpu_firmware(GPU_FROM, "{min: 2m, max: 4m}")
        .firmware(extra_firmware)
        .build()
}

/// Routes `tracing` to the test's output, at `RUST_LOG` or `warn`.
pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()))
        .with_test_writer()
        .try_init();
}

/// How to start a [`Harness`]; see [`Harness::builder`].
#[derive(Debug)]
pub struct HarnessBuilder {
    scenario: Scenario,
    clock: Option<Arc<SimClock>>,
    speedup: f64,
    postgres: bool,
    sku: String,
}

impl HarnessBuilder {
    /// Simulated seconds per real second (default [`SPEEDUP`]), for a clock starting now.
    pub fn speedup(mut self, speedup: f64) -> HarnessBuilder {
        self.speedup = speedup;
        self
    }

    /// Runs on `clock` (e.g. one anchored to an epoch a spawned controller shares).
    pub fn clock(mut self, clock: Arc<SimClock>) -> HarnessBuilder {
        self.clock = Some(clock);
        self
    }

    /// PostgreSQL instead of SQLite: then [`HarnessBuilder::start`] answers `None` (after a loud
    /// message) when no server is configured.
    pub fn postgres(mut self, postgres: bool) -> HarnessBuilder {
        self.postgres = postgres;
        self
    }

    /// The platform SKU releases are built for by default (default [`SKU`]).
    pub fn sku(mut self, sku: &str) -> HarnessBuilder {
        sku.clone_into(&mut self.sku);
        self
    }

    /// Starts the fleet, the database and the image server and imports the fleet; panics on a
    /// failure to start (the test cannot run), `None` when PostgreSQL was asked for and is absent.
    pub async fn start(self) -> Option<Harness> {
        init_tracing();
        let clock = self
            .clock
            .unwrap_or_else(|| Arc::new(SimClock::starting_now(self.speedup)));
        let test_db = if self.postgres {
            TestDb::postgres(clock.clone()).await?
        } else {
            TestDb::sqlite(clock.clone()).await
        };
        let db = test_db.db.clone();
        let fleet = Fleet::start(self.scenario, FleetOptions::new(clock.clone()))
            .await
            .expect("fleet starts");
        let images = ImageServer::start([]).await.expect("image server starts");
        import_fleet(&db, &fleet).await.expect("fleet imported");
        Some(Harness {
            clock,
            fleet,
            test_db,
            db,
            images,
            engine: None,
            sku: self.sku,
            dir: tempfile::tempdir().expect("temporary directory"),
        })
    }
}

/// The world; see the [module docs](self). Dropping it stops the fleet and the image server too
/// (bmc-sim aborts its servers on drop), so a failing test leaves nothing listening; call
/// [`Harness::shutdown`] for a graceful stop.
pub struct Harness {
    /// The simulated clock shared by the fleet, the database and the engine.
    pub clock: Arc<SimClock>,
    /// The simulated BMCs.
    pub fleet: RunningFleet,
    /// The database (and its URL, for a second process).
    pub test_db: TestDb,
    /// The controller's datastore, with every simulated node imported.
    pub db: Db,
    /// Serves `images/gpu-{version}.fw` for every release registered through the harness.
    pub images: ImageServer,
    /// The engine started by one of the `start_engine` methods.
    pub engine: Option<Engine>,
    sku: String,
    /// A directory for the test's other files (configs, logs), removed with the harness.
    pub dir: tempfile::TempDir,
}

// By hand: the fleet's servers have no useful Debug; where things live does.
impl std::fmt::Debug for Harness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Harness")
            .field("dir", &self.dir.path())
            .field("db", &self.test_db.url)
            .field("bmcs", &self.fleet.endpoints().len())
            .field("control_url", &self.fleet.control_url())
            .field("images", &self.images.base_url())
            .field("sku", &self.sku)
            .finish_non_exhaustive()
    }
}

impl Harness {
    /// A harness on `scenario`, SQLite, [`SPEEDUP`], releases for [`SKU`]; change what differs.
    pub fn builder(scenario: Scenario) -> HarnessBuilder {
        HarnessBuilder {
            scenario,
            clock: None,
            speedup: SPEEDUP,
            postgres: false,
            sku: SKU.into(),
        }
    }

    /// [`scenario`]`(nodes, extra_firmware)` on SQLite, or PostgreSQL when `postgres`.
    pub async fn start(nodes: usize, extra_firmware: &str, postgres: bool) -> Option<Harness> {
        Self::start_with(scenario(nodes, extra_firmware), postgres).await
    }

    /// [`Harness::start`] on a given scenario.
    pub async fn start_with(scenario: Scenario, postgres: bool) -> Option<Harness> {
        Self::builder(scenario).postgres(postgres).start().await
    }

    /// Registers GPU release `version` for the harness's SKU as `alice` (its image served here,
    /// with the image's real sha256) and, when `qualified`, qualifies it without gates.
    pub async fn add_release(&self, version: &str, qualified: bool) -> Release {
        self.add_release_with(version, qualified, &ReleaseRollback::default())
            .await
    }

    /// [`Harness::add_release`] with rollback metadata.
    pub async fn add_release_with(&self, version: &str, qualified: bool, rollback: &ReleaseRollback) -> Release {
        self.add_release_on(&self.sku, version, qualified, rollback).await
    }

    /// [`Harness::add_release_with`] for another platform SKU.
    pub async fn add_release_on(
        &self,
        sku: &str,
        version: &str,
        qualified: bool,
        rollback: &ReleaseRollback,
    ) -> Release {
        let release = self
            .db
            .add_release_with(&self.serve_gpu_release(sku, version), rollback, "alice")
            .await
            .expect("release");
        if qualified {
            fixtures::qualify(&self.db, release.id, "alice").await.expect("qualify");
        }
        self.db.release(release.id).await.expect("release")
    }

    /// Registers GPU release `version`, records `gates` as passed and qualifies it, all as `actor`.
    pub async fn add_qualified_release(
        &self,
        version: &str,
        actor: &str,
        gates: &[GateEvidence<'_>],
    ) -> anyhow::Result<ReleaseId> {
        let release = self
            .db
            .add_release(&self.serve_gpu_release(&self.sku, version), actor)
            .await?;
        self.db
            .transition_release(
                release.id,
                &orchestrator_types::TransitionRequest {
                    to: orchestrator_types::QualificationState::Qualifying,
                    reason: None,
                },
                actor,
            )
            .await?;
        for (gate, evidence) in gates {
            let result = NewGateResult {
                gate: (*gate).into(),
                passed: true,
                evidence: (*evidence).into(),
            };
            self.db.record_gate_result(release.id, &result, actor).await?;
        }
        self.db
            .transition_release(
                release.id,
                &orchestrator_types::TransitionRequest {
                    to: orchestrator_types::QualificationState::Qualified,
                    reason: None,
                },
                actor,
            )
            .await?;
        Ok(release.id)
    }

    /// Serves the GPU image bmc-sim accepts for `version` on `sku` at `images/gpu-{version}.fw` and
    /// returns the release record pointing at it.
    pub fn serve_gpu_release(&self, sku: &str, version: &str) -> NewRelease {
        let bytes = gpu_image(sku, version);
        let size_bytes = bytes.len() as u64;
        let sha256 = hex::encode(Sha256::digest(&bytes));
        let image_uri = self.images.insert(&format!("images/gpu-{version}.fw"), bytes);
        NewRelease {
            image_uri,
            sha256,
            size_bytes,
            platforms: vec![sku.into()],
            ..fixtures::release(version)
        }
    }

    /// Plans and stores a rollout of `release` under the inline policy `policy_source` with `seed`,
    /// as `alice` (as the API would); panics when the start is refused.
    pub async fn start_rollout(&self, release: ReleaseId, policy_source: String, seed: i64) -> ExecRollout {
        let request = StartRollout {
            release_id: release,
            policy_source,
            policy_commit: None,
            policy_blob: None,
            seed,
        };
        orchestrator_engine::start_rollout(&self.db, &request, "alice")
            .await
            .expect("rollout starts")
    }

    /// A fast engine: passes every 40 ms (and at once when nudged), with timeouts in simulated time
    /// far above the scenarios' flash times.
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

    /// Redfish to the simulated BMCs.
    pub fn connector(&self) -> Arc<dyn BmcConnector> {
        self.connector_with(HttpClients::new())
    }

    /// [`Harness::connector`] over given clients (e.g. with injected connect faults).
    pub fn connector_with(&self, clients: HttpClients) -> Arc<dyn BmcConnector> {
        redfish_connector(clients)
    }

    /// The Redfish drivers as a concrete type, to share one set between the engine and a detector.
    pub fn redfish(&self) -> Arc<RedfishConnector> {
        redfish_connector(HttpClients::new())
    }

    /// Starts the engine with [`Harness::config`] and the gateless judge.
    pub fn start_engine(&mut self) {
        self.start_engine_with(self.config(), Arc::new(GatelessJudge));
    }

    /// Starts the engine with `config` and `judge`.
    pub fn start_engine_with(&mut self, config: EngineConfig, judge: Arc<dyn HealthJudge>) {
        self.start_engine_full(config, self.connector(), judge);
    }

    /// Starts the engine with `config` over `connector`, gateless.
    pub fn start_engine_on(&mut self, config: EngineConfig, connector: Arc<dyn BmcConnector>) {
        self.start_engine_full(config, connector, Arc::new(GatelessJudge));
    }

    /// Starts the engine with everything given.
    pub fn start_engine_full(
        &mut self,
        config: EngineConfig,
        connector: Arc<dyn BmcConnector>,
        judge: Arc<dyn HealthJudge>,
    ) {
        self.engine = Some(Engine::start(self.db.clone(), config, connector, judge));
    }

    /// An engine the caller owns (and shuts down), with [`Harness::config`] and `judge`.
    pub fn spawn_engine(&self, judge: Arc<dyn HealthJudge>) -> Engine {
        Engine::start(self.db.clone(), self.config(), self.connector(), judge)
    }

    /// Stops the engine started by a `start_engine` method, if any.
    pub async fn stop_engine(&mut self) {
        if let Some(engine) = self.engine.take() {
            engine.shutdown().await;
        }
    }

    /// Reads every node's inventory over Redfish and records it with each component's
    /// `LowestSupportedVersion`, as `waveguard fleet discover` does: the engine verifies a flash by
    /// reading the version back but leaves the stored inventory to discovery.
    pub async fn discover(&self) -> anyhow::Result<()> {
        let nodes = self.db.all_nodes().await?;
        let endpoints = nodes
            .iter()
            .map(|n| Ok((n.id, sim_endpoint(&n.bmc_url)?)))
            .collect::<anyhow::Result<Vec<_>>>()?;
        for outcome in orchestrator_bmc::discover_inventory(&HttpClients::new(), endpoints, 16).await {
            let inventory = outcome
                .result
                .with_context(|| format!("inventory of {}", outcome.endpoint))?;
            let components = inventory
                .into_iter()
                .map(|c| {
                    let version = c.version.as_deref().context("a component without a version")?;
                    Ok(DiscoveredComponent {
                        reading: ComponentReading {
                            kind: c.kind(),
                            version: FirmwareVersion::parse(version)?,
                            inventory_id: c.id,
                            updateable: c.updateable,
                            software_id: c.software_id,
                            health: c.health,
                        },
                        lowest_supported_version: c.lowest_supported_version,
                    })
                })
                .collect::<anyhow::Result<Vec<_>>>()?;
            self.db.record_discovered_inventory(outcome.node, &components).await?;
        }
        Ok(())
    }

    /// Waits (real time) until the rollout is in one of `states`; panics with the waves and step
    /// counts when it is not within `limit`.
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

    /// Simulated now.
    pub fn now(&self) -> chrono::DateTime<chrono::Utc> {
        self.clock.now()
    }

    /// Stops the engine, the image server and the fleet, waiting for in-flight requests.
    pub async fn shutdown(mut self) {
        self.stop_engine().await;
        let Harness { images, fleet, .. } = self;
        drop(images);
        fleet.shutdown().await;
    }
}

/// The GPU image bmc-sim accepts for `version` on `sku` (its header names both).
pub fn gpu_image(sku: &str, version: &str) -> Vec<u8> {
    bmc_sim::image::build(ComponentKind::Gpu, version, &[sku], version.as_bytes())
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
    for node in db.all_nodes().await? {
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

fn redfish_connector(clients: HttpClients) -> Arc<RedfishConnector> {
    let resolve =
        Arc::new(|url: &str, _profile: &str| sim_endpoint(url).map_err(|e| ResolveError::Other(e.to_string())));
    Arc::new(RedfishConnector::new(clients, resolve))
}

/// A simulated BMC at `url` (user `admin`, password `admin`: bmc-sim's defaults), with short
/// timeouts and one quick retry: loopback answers fast.
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
