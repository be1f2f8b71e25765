//! The health-source seam against a REAL Prometheus scraping bmc-sim's simulated dcgm-exporters (issue 20),
//! on wall time (Prometheus stamps samples with the time it scrapes):
//!
//! - given four simulated nodes whose exporters Prometheus scrapes every second, PCIe replays and XIDs at a
//!   high rate, a 10-second XID count window, and `policies/hgx-dcgm.yaml`'s `pcie_replay` and `xid_rate`
//!   gates;
//! - when one canary node's exporter restarts (its counters drop to zero) and, later, another canary node's
//!   exporter stops;
//! - then one look of the Prometheus source counts the restarted node's replays as its event log has them
//!   (the reset is no false event), counts the XIDs of the windowed count once each (per GPU; a node's
//!   events are its XID episodes), and names the stopped node as vanished, while a control node without
//!   data is only excluded.
//!
//! Skipped loudly when `prometheus` is missing (install it with `integration-tests/ci-setup.sh`); a failure
//! when `WAVEGUARD_REQUIRE_ALL=1`. Prometheus listens on 127.0.0.1 only and is killed when the test ends.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use bmc_sim::{Fleet, FleetOptions, Scenario, SimClock};
use chrono::{DateTime, TimeDelta, Utc};
use integration_tests::process::start_prometheus;
use integration_tests::{REQUIRE_ALL_ENV, find_program};
use orchestrator_db::health::Cohort;
use orchestrator_engine::metric_source::{MetricSource, PrometheusSource, WatchedNode};
use orchestrator_engine::prometheus::{PrometheusClient, PrometheusConfig};
use orchestrator_types::NodeId;
use serde_json::Value;

const POLICY: &str = include_str!("../../policies/hgx-dcgm.yaml");

fn scenario() -> Scenario {
    // Rates are per hour: about one PCIe AER entry (a replay) per node every 2 s and one XID per GPU every
    // 4 s, so a minute of wall time has plenty of both.
    let yaml = r#"
seed: 20
fleet:
  nodes: 4
  racks: 2
  clusters: 1
  sku: hgx-h100-8gpu
  components:
    - {id: "HGX_FW_GPU_{0..7}", kind: gpu, version: "96.00.5E.00.01"}
baseline:
  xid_errors_per_gpu_hour: 900
  pcie_aer_per_node_hour: 1800
dcgm:
  xid_count_window: 10s
"#;
    Scenario::from_yaml_str(yaml).unwrap_or_else(|e| panic!("scenario: {e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_source_counts_dcgm_counters_and_windows_and_names_vanished_nodes() {
    let Some(prometheus) = find_program(&["prometheus"]) else {
        let require_all = std::env::var(REQUIRE_ALL_ENV).is_ok_and(|v| v == "1");
        assert!(
            !require_all,
            "{REQUIRE_ALL_ENV}=1 but `prometheus` is not on PATH; run integration-tests/ci-setup.sh"
        );
        eprintln!(
            "\n\n*** SKIPPED prometheus_dcgm test: `prometheus` not on PATH (run integration-tests/ci-setup.sh) ***\n\n"
        );
        return;
    };
    if let Err(err) = run(&prometheus).await {
        panic!("{err:?}");
    }
}

/// Event-log entries of one node created in `(from, to]`, filtered by their second message argument.
async fn log_count(
    http: &reqwest::Client,
    bmc_url: &str,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
    keep: impl Fn(&str) -> bool,
) -> anyhow::Result<usize> {
    let mut count = 0;
    let mut skip = 0;
    loop {
        let log: Value = http
            .get(format!(
                "{bmc_url}/redfish/v1/Systems/1/LogServices/EventLog/Entries?$skip={skip}"
            ))
            .basic_auth("admin", Some("admin"))
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?;
        let members = log["Members"].as_array().context("log members")?;
        skip += members.len();
        count += members
            .iter()
            .filter(|m| {
                let created = m["Created"]
                    .as_str()
                    .and_then(|c| DateTime::parse_from_rfc3339(c).ok())
                    .map(|c| c.with_timezone(&Utc));
                created.is_some_and(|c| c > from && c <= to) && keep(m["MessageArgs"][1].as_str().unwrap_or_default())
            })
            .count();
        if members.is_empty() || log.get("Members@odata.nextLink").is_none() {
            return Ok(count);
        }
    }
}

async fn run(prometheus_bin: &Path) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let clock = Arc::new(SimClock::starting_now(1.0));
    let mut options = FleetOptions::new(clock);
    options.username = "admin".into();
    options.password = "admin".into();
    let fleet = Fleet::start(scenario(), options).await?;
    let control = fleet.control_url().trim_start_matches("http://").to_owned();
    let config = format!(
        r#"
global:
  scrape_interval: 1s
scrape_configs:
  - job_name: dcgm
    metrics_path: /sim/dcgm/metrics
    static_configs:
      - targets: ["{control}"]
"#
    );
    let (prometheus, port) = start_prometheus(prometheus_bin, dir.path(), &config).await?;
    let outcome = scenario_steps(port, &fleet).await;
    if outcome.is_err() {
        eprintln!("prometheus log:\n{}", prometheus.log_tail());
    }
    fleet.shutdown().await;
    outcome
}

async fn scenario_steps(port: u16, fleet: &bmc_sim::RunningFleet) -> anyhow::Result<()> {
    let http = reqwest::Client::builder().timeout(Duration::from_secs(5)).build()?;
    let base = format!("http://127.0.0.1:{port}");
    let mut config = PrometheusConfig::new(url::Url::parse(&base)?);
    config.node_label = "Hostname".into();
    let client = PrometheusClient::new(config)?;
    let endpoints = fleet.endpoints().to_vec();

    // Given: Prometheus has scraped every node's exporter for a few seconds.
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        let data = client.query("count(DCGM_FI_DEV_PCIE_REPLAY_COUNTER)", Utc::now()).await;
        if let Ok(orchestrator_engine::prometheus::QueryData::Vector(v)) = &data
            && v.first().is_some_and(|s| s.value >= 32.0)
        {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "Prometheus never scraped the exporters: {data:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let from = Utc::now();
    let nodes: Vec<WatchedNode> = endpoints
        .iter()
        .enumerate()
        .map(|(i, e)| WatchedNode {
            node: NodeId(i as i64 + 1),
            name: e.name.clone(),
            cohort: if i < 2 { Cohort::Canary } else { Cohort::Control },
            from,
        })
        // The fourth node is a control node Prometheus knows nothing of.
        .chain(std::iter::once(WatchedNode {
            node: NodeId(99),
            name: "not-scraped".into(),
            cohort: Cohort::Control,
            from,
        }))
        .collect();

    // When: node 0's exporter restarts mid-way; later node 1's exporter stops.
    tokio::time::sleep(Duration::from_secs(20)).await;
    let post = |node: &str, action: &str| {
        let url = format!("{}/sim/nodes/{node}/dcgm", fleet.control_url());
        let body = serde_json::json!({ "action": action });
        let http = http.clone();
        async move { http.post(url).json(&body).send().await?.error_for_status() }
    };
    post(&endpoints[0].name, "restart").await?;
    tokio::time::sleep(Duration::from_secs(20)).await;
    post(&endpoints[1].name, "stop").await?;
    tokio::time::sleep(Duration::from_secs(8)).await;
    let until = Utc::now() - TimeDelta::seconds(1);

    // Then: one look per gate.
    let policy = orchestrator_engine::parse_policy(POLICY)?;
    let source = PrometheusSource::new(client).with_staleness(TimeDelta::seconds(4));
    let replay_gate = policy.health.gate("pcie_replay").context("pcie_replay gate")?;
    let look = source.look(replay_gate, &nodes, until).await?;
    ensure!(
        look.vanished == vec![endpoints[1].name.clone()],
        "replay gate vanished: {:?}; present {:?}; bins {:?}; until {until}",
        look.vanished,
        look.present,
        look.bins
    );
    ensure!(
        look.control_gaps == vec!["not-scraped".to_owned()],
        "control gaps: {:?}",
        look.control_gaps
    );
    ensure!(look.resets >= 1, "the restart must show as a counter reset: {look:?}");
    let counted: u64 = look.bins[&NodeId(1)].values().map(|b| b.events).sum();
    let truth = log_count(&http, &endpoints[0].bmc_url, from, until, |a| a.starts_with("PCIe AER")).await?;
    // The counter only moves at scrapes: the events of the first and last second may fall either side.
    ensure!(
        (counted as f64 - truth as f64).abs() <= 3.0 + 0.1 * truth as f64,
        "PCIe replays of the restarted node: counted {counted}, event log {truth}"
    );
    ensure!(truth > 5, "too few replays to compare ({truth})");
    let exposure: f64 = look.bins[&NodeId(1)].values().map(|b| b.exposure_hours).sum();
    // 8 GPUs over about 48 s.
    ensure!((0.08..0.14).contains(&exposure), "exposure {exposure} GPU-hours");
    let err = look
        .clone()
        .require_watched()
        .expect_err("a vanished canary is an error");
    ensure!(err.to_string().contains(&endpoints[1].name), "{err}");

    let xid_gate = policy.health.gate("xid_rate").context("xid_rate gate")?;
    let look = source.look(xid_gate, &nodes, until).await?;
    ensure!(
        look.vanished == vec![endpoints[1].name.clone()],
        "xid gate vanished: {:?}; present {:?}; bins {:?}; until {until}",
        look.vanished,
        look.present,
        look.bins
    );
    // The restarted exporter forgot the XIDs of its window, as a real one does; the stopped one reports
    // nothing: compare the two control nodes.
    for (i, e) in endpoints.iter().enumerate().filter(|(i, _)| *i >= 2) {
        let bins = look.bins.get(&NodeId(i as i64 + 1));
        // Each GPU's XIDs (its unit); the node's events are its XID episodes, a read's largest GPU
        // count (metric_source::windowed_look), so never more than its XIDs and at least one per read
        // with any.
        let counted = bins
            .map(|b| b.values().flat_map(|b| b.units.values()).sum::<f64>())
            .unwrap_or(0.0)
            .round() as u64;
        let episodes: u64 = bins.map(|b| b.values().map(|b| b.events).sum()).unwrap_or(0);
        ensure!(
            episodes > 0 && episodes <= counted,
            "XID episodes of {}: {episodes}, XIDs {counted}",
            e.name
        );
        let excluded = ["XID 13", "XID 31", "XID 43", "XID 45"];
        let truth = log_count(&http, &e.bmc_url, from, until, |a| {
            a.starts_with("XID") && !excluded.contains(&a)
        })
        .await?;
        ensure!(truth > 50, "too few XIDs on {} ({truth})", e.name);
        // Each XID once, up to the prorated first window and the jitter of
        // scrape latency at each window boundary (this machine is loaded).
        let tolerance = 0.10 * truth as f64 + 5.0;
        ensure!(
            (counted as f64 - truth as f64).abs() <= tolerance,
            "XIDs of {}: windowed count read {counted}, event log {truth}",
            e.name
        );
        println!("{}: XIDs counted {counted}, event log {truth}", e.name);
    }
    Ok(())
}
