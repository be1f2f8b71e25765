//! Shared helpers: start a fleet on port 0 with a manual clock, talk to it with reqwest.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::get;
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

/// Serves `files` (path -> bytes) over HTTP on an ephemeral port; returns the base URL.
pub async fn serve_images(files: Vec<(&'static str, Vec<u8>)>) -> String {
    let mut app = Router::new();
    for (path, bytes) in files {
        app = app.route(path, get(move || async move { bytes.clone() }));
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind image server");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    format!("http://{addr}")
}
