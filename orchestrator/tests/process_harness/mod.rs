//! The harness of the process-level crash and failover tests: the test
//! kit's world (a simulated fleet, an image server and the database) lives
//! in the test process on one accelerated clock; every controller is a real `waveguard serve` process
//! on that database, with its clock anchored to the same epoch (so both
//! sides agree on simulated time), that the test kills with SIGKILL.
//!
//! Controller logs go to files in the world's directory; when a test
//! panics, the tail of each is printed.

#![allow(dead_code)] // each test binary uses part of the harness

pub mod cli;

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use bmc_sim::SimClock;
use chrono::{DateTime, Utc};
use integration_tests::fixtures::{PolicyYaml, WaveSize, WaveYaml};
use integration_tests::{GPU_TO, Harness, ScenarioYaml};
use orchestrator_db::execution::{RolloutState, StepFilter, StepState, WaveKind};
use orchestrator_db::{AuditFilter, Db};
use orchestrator_engine::{EXECUTOR_LEASE, StartRollout, start_rollout};
use orchestrator_types::RolloutId;

/// Simulated seconds per real second: a 2-4 minute flash takes 1-2 s.
pub const SPEEDUP: f64 = 120.0;
/// Executor lease TTL in simulated seconds (one real second): how long a
/// dead leader blocks its successor.
pub const LEASE_TTL_SIM_SECS: u32 = 120;
/// Environment variable the controllers read the BMC password from.
const PASSWORD_ENV: &str = "WAVEGUARD_TEST_SIM_BMC_PASSWORD";

/// Three waves, short bake, automatic promotion, tight caps so the rollout
/// spans many controller lives.
pub fn policy(max_in_flight: u32) -> String {
    PolicyYaml::two_waves("crash-gpu")
        .waves(vec![
            WaveYaml::new("canary", WaveSize::Count(10))
                .stratify_by(&["rack"])
                .bake("1m")
                .max_in_flight(max_in_flight),
            WaveYaml::new("early", WaveSize::Percent(30))
                .bake("1m")
                .line("approval: auto")
                .max_in_flight(max_in_flight),
            WaveYaml::new("rest", WaveSize::Rest)
                .bake("1m")
                .max_in_flight(max_in_flight),
        ])
        .concurrency(max_in_flight, &["per_rack: 4"])
        .max_failed(0)
        .automatic_rollback(false)
        .render()
}

/// The kit's harness (fleet, images, database, the release) and the
/// controllers' configuration.
pub struct World {
    // First, so it is dropped (and prints) before the directory goes.
    logs: LogTails,
    pub epoch: DateTime<Utc>,
    pub db: Db,
    pub kit: Harness,
    config_path: PathBuf,
    bin: PathBuf,
}

/// Prints the tail of every controller log when the test panics.
#[derive(Default)]
struct LogTails(Vec<PathBuf>);

impl World {
    /// Starts everything but the controllers; `None` (after a loud message)
    /// when PostgreSQL was asked for and is not configured.
    pub async fn start(nodes: usize, postgres: bool) -> Option<World> {
        let epoch = Utc::now();
        let scenario = ScenarioYaml::hgx(nodes)
            .seed(13)
            .gpu_firmware(GPU_TO, "{min: 2m, max: 4m}")
            .build();
        let kit = Harness::builder(scenario)
            .clock(Arc::new(SimClock::new(epoch, SPEEDUP)))
            .postgres(postgres)
            .start()
            .await?;
        kit.add_release(GPU_TO, true).await;
        // The binary under test is copied away: other builds sharing the
        // target directory must not swap it between two restarts.
        let bin = kit.dir.path().join("waveguard");
        std::fs::copy(env!("CARGO_BIN_EXE_waveguard"), &bin).expect("copy the waveguard binary");
        let config_path = kit.dir.path().join("waveguard.toml");
        std::fs::write(
            &config_path,
            format!(
                // The RMA monitor has its own tests (engine/tests/rma_monitor.rs); here it would only
                // add BMC traffic and sessions to what these tests count.
                "database_url = {url:?}\nlog_level = \"info\"\n\n[rma]\nenabled = false\n\n[credentials.sim]\nusername = \"admin\"\npassword_env = \"{PASSWORD_ENV}\"\n",
                url = kit.test_db.url
            ),
        )
        .expect("write config");
        Some(World {
            epoch,
            db: kit.db.clone(),
            kit,
            config_path,
            bin,
            logs: LogTails::default(),
        })
    }

    /// Plans and stores a rollout of the release from the test process (as
    /// the API would); the controllers pick it up.
    pub async fn start_rollout(&self, policy_source: String) -> RolloutId {
        let release = self.db.list_releases().await.expect("releases")[0].clone();
        start_rollout(
            &self.db,
            &StartRollout {
                release_id: release.id,
                policy_source,
                policy_commit: None,
                policy_blob: None,
                seed: 17,
            },
            "alice",
        )
        .await
        .expect("rollout starts")
        .id
    }

    /// Starts `waveguard serve` named `name` (its lease holder is
    /// `name:pid`).
    pub fn spawn_controller(&mut self, name: &str) -> Controller {
        let log_path = self.kit.dir.path().join(format!("{name}.log"));
        let log = std::fs::File::create(&log_path).expect("log file");
        let mut child = Command::new(&self.bin)
            .arg("--config")
            .arg(&self.config_path)
            .args(["serve", "--listen", "127.0.0.1:0", "--engine-interval-ms", "50"])
            .args(["--lease-ttl", &LEASE_TTL_SIM_SECS.to_string()])
            .args(["--clock-speedup", &SPEEDUP.to_string()])
            .args(["--clock-epoch", &self.epoch.to_rfc3339()])
            .current_dir(self.kit.dir.path())
            .env_remove("WAVEGUARD_DATABASE_URL")
            .env_remove("WAVEGUARD_LISTEN")
            .env("HOSTNAME", name)
            .env(PASSWORD_ENV, "admin")
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            .spawn()
            .expect("waveguard serve starts");
        self.logs.0.push(log_path);
        // The address line comes first; the rest of stdout is drained so
        // the controller never blocks on a full pipe.
        let stdout = child.stdout.take().expect("stdout is piped");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut tx = Some(tx);
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Some(url) = line.strip_prefix("waveguard listening on ")
                    && let Some(tx) = tx.take()
                {
                    let _ = tx.send(url.trim().to_owned());
                }
            }
        });
        let holder = format!("{name}:{}", child.id());
        Controller {
            child,
            holder,
            url: rx,
            base_url: None,
        }
    }

    /// What controller `name` has logged so far.
    pub fn log_of(&self, name: &str) -> String {
        std::fs::read_to_string(self.kit.dir.path().join(format!("{name}.log"))).unwrap_or_default()
    }

    /// Waits (real time) until `controller` holds the executor lease.
    pub async fn wait_leader(&self, controller: &mut Controller, limit: Duration) {
        assert!(
            self.leads_within(controller, limit).await,
            "controller {} did not take the lease within {limit:?}",
            controller.holder
        );
    }

    /// Whether `controller` holds the executor lease within `limit` (real time).
    pub async fn leads_within(&self, controller: &mut Controller, limit: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            if let Some((holder, _, _)) = self.db.lease_holder(EXECUTOR_LEASE).await.expect("lease")
                && holder == controller.holder
            {
                return true;
            }
            if let Some(status) = controller.child.try_wait().expect("wait works") {
                panic!("controller {} exited with {status} before leading", controller.holder);
            }
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub async fn rollout_state(&self, id: RolloutId) -> RolloutState {
        self.db.exec_rollout(id).await.expect("rollout").state
    }

    /// Waits (real time) until the rollout is in one of `states`.
    pub async fn wait_for(&self, id: RolloutId, states: &[RolloutState], limit: Duration) -> RolloutState {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let state = self.rollout_state(id).await;
            if states.contains(&state) {
                return state;
            }
            if tokio::time::Instant::now() > deadline {
                let waves = self.db.rollout_waves(id).await.expect("waves");
                let counts = self.db.step_counts(id, None).await.expect("counts");
                panic!(
                    "rollout {id} still {state:?} after {limit:?}; waves: {:?}; steps: {counts:?}",
                    waves
                        .iter()
                        .map(|w| format!("{}={} {:?}", w.name, w.state, w.blockers))
                        .collect::<Vec<_>>()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Every audit entry, oldest first.
    pub async fn audit_log(&self) -> Vec<orchestrator_db::model::AuditEntry> {
        let mut all = Vec::new();
        let mut before = None;
        loop {
            let page = self
                .db
                .audit_entries(&AuditFilter {
                    limit: Some(1000),
                    before_id: before,
                    ..Default::default()
                })
                .await
                .expect("audit");
            let Some(last) = page.last() else { break };
            before = Some(last.id);
            all.extend(page);
        }
        all.reverse();
        all
    }

    /// The invariants after a rollout that lived through crashes:
    /// completed, every node on the target, exactly one flash per node and
    /// step (from bmc-sim's control API), no step skipped, and an intact
    /// audit log. Returns the audit log for further checks.
    pub async fn check_completed_exactly_once(&self, id: RolloutId) -> Vec<orchestrator_db::model::AuditEntry> {
        assert_eq!(self.rollout_state(id).await, RolloutState::Completed);
        let steps = self
            .db
            .steps(&StepFilter {
                rollout_id: Some(id),
                ..Default::default()
            })
            .await
            .expect("steps");
        let nodes = self.kit.fleet.endpoints().len();
        assert_eq!(steps.len(), nodes, "one step per node");
        for step in &steps {
            assert_eq!(
                step.state,
                StepState::Succeeded,
                "step {} of node {}: {:?}",
                step.id,
                step.node_id,
                step.error
            );
        }

        // bmc-sim's own account, over its control API.
        let http = reqwest::Client::new();
        let control = self.kit.fleet.control_url();
        let counts: BTreeMap<String, BTreeMap<String, u32>> = http
            .get(format!("{control}/sim/flash-counts"))
            .send()
            .await
            .expect("flash counts")
            .json()
            .await
            .expect("flash counts JSON");
        let versions: BTreeMap<String, Vec<serde_json::Value>> = http
            .get(format!("{control}/sim/versions"))
            .send()
            .await
            .expect("versions")
            .json()
            .await
            .expect("versions JSON");
        for endpoint in self.kit.fleet.endpoints() {
            let node = &endpoint.name;
            assert_eq!(
                counts.get(node),
                Some(&BTreeMap::from([(GPU_TO.to_owned(), 1)])),
                "flashes of {node}"
            );
            for c in versions.get(node).expect("versions of node") {
                if c["id"].as_str().is_some_and(|id| id.starts_with("HGX_FW_GPU_")) {
                    assert_eq!(c["active"].as_str(), Some(GPU_TO), "{node}: {c}");
                }
            }
        }

        // The audit log: strictly increasing ids, one start and one
        // completion of the rollout, every step and wave transition present
        // as one unbroken chain, lease takeovers with increasing tokens.
        let audit = self.audit_log().await;
        for pair in audit.windows(2) {
            assert!(
                pair[0].id < pair[1].id,
                "audit ids not increasing: {} then {}",
                pair[0].id,
                pair[1].id
            );
        }
        let rollout_subject = id.to_string();
        let of_rollout: Vec<&str> = audit
            .iter()
            .filter(|e| e.subject_type == "rollout" && e.subject_id == rollout_subject)
            .map(|e| e.action.as_str())
            .collect();
        assert_eq!(of_rollout.first(), Some(&"rollout.start"), "{of_rollout:?}");
        assert_eq!(of_rollout.last(), Some(&"rollout.completed"), "{of_rollout:?}");
        assert_eq!(
            of_rollout.iter().filter(|a| **a == "rollout.completed").count(),
            1,
            "{of_rollout:?}"
        );
        let mut chains: HashMap<String, Vec<(String, String)>> = HashMap::new();
        for e in audit.iter().filter(|e| e.action == "step.transition") {
            let field = |k: &str| e.details.get(k).and_then(|v| v.as_str()).unwrap_or("?").to_owned();
            chains
                .entry(e.subject_id.clone())
                .or_default()
                .push((field("from"), field("to")));
        }
        for step in &steps {
            let chain = chains.get(&step.id.to_string()).cloned().unwrap_or_default();
            assert_eq!(
                chain.first().map(|t| t.0.as_str()),
                Some("pending"),
                "step {}: {chain:?}",
                step.id
            );
            assert_eq!(
                chain.last().map(|t| t.1.as_str()),
                Some("succeeded"),
                "step {}: {chain:?}",
                step.id
            );
            for pair in chain.windows(2) {
                assert_eq!(pair[0].1, pair[1].0, "broken chain for step {}: {chain:?}", step.id);
            }
            let adoptions = chain.iter().filter(|t| t.1 == "flashing").count();
            assert_eq!(adoptions, 1, "step {} adopted one flash task: {chain:?}", step.id);
        }
        let waves = self.db.rollout_waves(id).await.expect("waves");
        for wave in waves.iter().filter(|w| w.kind == WaveKind::Update) {
            let chain: Vec<(String, String)> = audit
                .iter()
                .filter(|e| e.action == "wave.transition" && e.subject_id == wave.id.to_string())
                .map(|e| {
                    let field = |k: &str| e.details.get(k).and_then(|v| v.as_str()).unwrap_or("?").to_owned();
                    (field("from"), field("to"))
                })
                .collect();
            let expected: Vec<(String, String)> =
                [("planned", "running"), ("running", "baking"), ("baking", "promoted")]
                    .iter()
                    .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
                    .collect();
            assert_eq!(chain, expected, "wave {}", wave.name);
        }
        let tokens: Vec<i64> = audit
            .iter()
            .filter(|e| e.action == "lease.takeover")
            .filter_map(|e| e.details.get("token").and_then(|t| t.as_i64()))
            .collect();
        for pair in tokens.windows(2) {
            assert!(pair[0] < pair[1], "lease tokens not increasing: {tokens:?}");
        }
        audit
    }

    pub async fn shutdown(self) {
        self.kit.shutdown().await;
    }
}

impl Drop for LogTails {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        for log in &self.0 {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            let tail = &lines[lines.len().saturating_sub(40)..];
            eprintln!("---- last lines of {} ----\n{}", log.display(), tail.join("\n"));
        }
    }
}

/// A running `waveguard serve`.
pub struct Controller {
    pub child: Child,
    /// Its lease holder identity.
    pub holder: String,
    url: std::sync::mpsc::Receiver<String>,
    base_url: Option<String>,
}

impl Controller {
    /// Its API base URL, once it printed it.
    pub fn url(&mut self) -> String {
        if let Some(url) = &self.base_url {
            return url.clone();
        }
        let url = self
            .url
            .recv_timeout(Duration::from_secs(30))
            .expect("serve prints its address");
        self.base_url = Some(url.clone());
        url
    }

    /// SIGKILL: no shutdown path runs, the lease stays held until it expires.
    pub fn kill(&mut self) {
        self.child.kill().expect("SIGKILL");
        self.child.wait().expect("reaped");
    }

    /// Sends a signal by name (`STOP`, `CONT`) to the process.
    pub fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .args([&format!("-{name}"), &self.child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill -{name}");
    }

    /// SIGTERM and a graceful exit (which gives the lease up).
    pub fn terminate(mut self) {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success());
        for _ in 0..200 {
            if let Some(status) = self.child.try_wait().expect("wait works") {
                assert!(status.success(), "graceful shutdown exits 0, got {status}");
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        panic!("serve did not stop within 10 s of SIGTERM");
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        // A panicking test must not leave controllers running.
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A small seeded generator (splitmix64), so kill moments replay for a seed.
pub struct SplitMix(pub u64);

impl SplitMix {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[lo, hi)` milliseconds.
    pub fn millis(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(lo + self.next_u64() % (hi - lo).max(1))
    }
}
