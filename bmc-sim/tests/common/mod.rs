//! Shared helpers: start a fleet on port 0 with a manual clock, talk to it with reqwest.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use bmc_sim::{Fleet, FleetOptions, RunningFleet, Scenario};
use chrono::{TimeZone, Utc};
use orchestrator_types::ManualClock;
use serde_json::Value;

pub const SMALL: &str = include_str!("../../scenarios/small.yaml");
pub const USER: &str = "admin";
pub const PASS: &str = "s3cret-pw";
pub const SKU: &str = "hgx-h100-8gpu";

pub struct Harness {
    pub fleet: RunningFleet,
    pub clock: Arc<ManualClock>,
    pub http: reqwest::Client,
}

pub fn start_time() -> chrono::DateTime<Utc> {
    Utc.with_ymd_and_hms(2025, 6, 1, 0, 0, 0).single().expect("valid date")
}

pub async fn start(yaml: &str) -> Harness {
    start_with(yaml, |_| {}).await
}

pub async fn start_with(yaml: &str, tweak: impl FnOnce(&mut FleetOptions)) -> Harness {
    let scenario = Scenario::from_yaml_str(yaml).expect("scenario parses");
    let clock = Arc::new(ManualClock::new(start_time()));
    let mut opts = FleetOptions::new(clock.clone());
    // Session expiry moves with the test's clock too, so a test can step past `SessionTimeout`.
    opts.session_clock = clock.clone();
    opts.username = USER.into();
    opts.password = PASS.into();
    opts.hang_for = Duration::from_secs(3);
    tweak(&mut opts);
    let fleet = Fleet::start(scenario, opts).await.expect("fleet starts");
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .expect("client");
    Harness { fleet, clock, http }
}

impl Harness {
    pub fn url(&self, node: usize, path: &str) -> String {
        format!("{}{}", self.fleet.endpoints()[node].bmc_url, path)
    }

    pub fn name(&self, node: usize) -> String {
        self.fleet.endpoints()[node].name.clone()
    }

    pub async fn get(&self, node: usize, path: &str) -> reqwest::Response {
        self.http
            .get(self.url(node, path))
            .basic_auth(USER, Some(PASS))
            .send()
            .await
            .expect("request")
    }

    pub async fn get_json(&self, node: usize, path: &str) -> Value {
        let resp = self.get(node, path).await;
        assert_eq!(resp.status(), 200, "GET {path}");
        resp.json().await.expect("json body")
    }

    pub async fn post_json(&self, node: usize, path: &str, body: Value) -> reqwest::Response {
        self.http
            .post(self.url(node, path))
            .basic_auth(USER, Some(PASS))
            .json(&body)
            .send()
            .await
            .expect("request")
    }

    pub async fn version(&self, node: usize, id: &str) -> String {
        let v = self
            .get_json(node, &format!("/redfish/v1/UpdateService/FirmwareInventory/{id}"))
            .await;
        v["Version"].as_str().expect("Version").to_owned()
    }

    pub fn advance(&self, d: chrono::Duration) {
        self.clock.advance(d);
    }

    pub async fn task(&self, node: usize, location: &str) -> Value {
        self.get_json(node, location).await
    }

    pub async fn control(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> reqwest::Response {
        let mut req = self
            .http
            .request(method, format!("{}{}", self.fleet.control_url(), path));
        if let Some(b) = body {
            req = req.json(&b);
        }
        req.send().await.expect("control request")
    }
}

/// Whether a test whose external program is missing must fail instead of skipping (CI sets it).
pub fn require_all() -> bool {
    std::env::var("WAVEGUARD_REQUIRE_ALL").as_deref() == Ok("1")
}

/// Reports a missing external program: a loud skip, or a failure under `WAVEGUARD_REQUIRE_ALL=1`.
pub fn skip_or_fail(what: &str) {
    if require_all() {
        panic!("{what} is not installed (run bmc-sim/ci-setup.sh) and WAVEGUARD_REQUIRE_ALL=1");
    }
    eprintln!("\n!!!!!!!! SKIPPED: {what} is not installed; run bmc-sim/ci-setup.sh to enable this test !!!!!!!!\n");
}

/// The Python interpreter (`$PYTHON`, else `python3`) when it can import `module`; otherwise skips
/// loudly (or fails under `WAVEGUARD_REQUIRE_ALL=1`) and returns `None`.
pub fn python_with(module: &str, what: &str) -> Option<String> {
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".to_owned());
    let importable = std::process::Command::new(&python)
        .args(["-c", &format!("import {module}")])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if importable {
        Some(python)
    } else {
        skip_or_fail(what);
        None
    }
}

/// A program on `PATH`.
pub fn find_on_path(program: &str) -> Option<std::path::PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(program))
        .find(|p| p.is_file())
}

/// The small scenario on one node, on `platform` (`default` keeps the scenario's own components; a
/// profile replaces them with the profile's).
pub fn one_node_on(platform: &str) -> String {
    let one = SMALL.replace("nodes: 4", "nodes: 1");
    if platform == "default" {
        return one;
    }
    let mut out = String::new();
    let mut in_components = false;
    for line in one.lines() {
        if line.starts_with("  components:") {
            in_components = true;
            continue;
        }
        if in_components && line.starts_with("    - ") {
            continue;
        }
        in_components = false;
        out.push_str(line);
        out.push('\n');
        if line.starts_with("seed:") {
            out.push_str(&format!("platform: {platform}\n"));
        }
    }
    out
}

/// Advances the fleet's manual clock by `step` every `every` of real time until the returned handle
/// is dropped or aborted, so an external client that polls in real time sees simulated flashes end.
pub fn tick_clock(clock: Arc<ManualClock>, step: chrono::Duration, every: Duration) -> AbortOnDrop {
    AbortOnDrop(tokio::spawn(async move {
        loop {
            tokio::time::sleep(every).await;
            clock.advance(step);
        }
    }))
}

/// Aborts its task when dropped.
pub struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
