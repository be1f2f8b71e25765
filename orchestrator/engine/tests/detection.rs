//! End-to-end detection against bmc-sim on an accelerated clock (an hour of
//! bake in about 15 s): a firmware that triples XID errors is caught in the
//! canary before its bake ends, rolled back and blocked; a healthy firmware
//! under a fleet-wide heat event (canary and control alike) is promoted.

use std::sync::Arc;
use std::time::Duration;

use integration_tests::fixtures::{PolicyYaml, WaveSize, WaveYaml, health_section, redfish_gate};
use integration_tests::{GPU_FROM, GPU_TO, Harness};
use orchestrator_db::AuditFilter;
use orchestrator_db::execution::{ExecRollout, RolloutState, StepFilter, StepPurpose, StepState, WaveState};
use orchestrator_db::health::{Cohort, SampleScope};
use orchestrator_detect::{InconclusiveReason, Verdict};
use orchestrator_engine::prometheus::{PrometheusClient, PrometheusConfig};
use orchestrator_engine::watch::DetectorJudge;
use orchestrator_engine::{StartRollout, start_rollout};
use orchestrator_types::{Outcome, QualificationState};

/// The bad image: a firmware entry whose effect triples the XID rate.
const GPU_BAD: &str = "96.00.66.00.01";

/// Extra scenario text, spliced after the harness's firmware list: the bad
/// firmware, a baseline XID rate high enough that an hour of 80 canary GPUs
/// sees dozens of errors, and a fleet-wide heat event during the bake.
fn scenario_extra() -> String {
    format!(
        r#"  - kind: gpu
    version: "{GPU_BAD}"
    flash_time: {{min: 2m, max: 4m}}
    effects:
      - {{metric: xid_errors_per_gpu_hour, multiply: 3.0, share: 1.0, onset: 0s}}
baseline:
  gpu_temp_c: {{mean: 62, sd: 3}}
  gpu_power_w: {{mean: 550, sd: 40}}
  xid_errors_per_gpu_hour: 0.6
  pcie_aer_per_node_hour: 0.01
  link_degraded_per_node_day: 0.001
events:
  - {{metric: gpu_temp_c, add: 8.0, share: 1.0, at: 20m, duration: 40m}}"#
    )
}

/// A canary of 10 nodes with XID and temperature gates over a one-hour
/// bake, looked at every 10 minutes; then the rest without gates.
fn policy() -> String {
    policy_with_gates("[xid_errors, gpu_temp]")
}

/// The policy with the canary gated by `canary_gates` (a YAML list).
fn policy_with_gates(canary_gates: &str) -> String {
    PolicyYaml::two_waves("detect-gpu")
        .waves(vec![
            WaveYaml::new("canary", WaveSize::Count(10))
                .stratify_by(&["rack"])
                .bake("1h")
                .max_in_flight(10)
                .line(&format!("gates: {canary_gates}")),
            WaveYaml::new("rest", WaveSize::Rest)
                .max_in_flight(40)
                .line("gates: []"),
        ])
        .concurrency(40, &["per_rack: 10", "per_nvlink_domain: 5"])
        .health(&health_section(
            0.05,
            &[
                redfish_gate("xid_errors", "xid_errors_per_gpu_hour", "rate", "1.5", "10m"),
                redfish_gate("gpu_temp", "gpu_temp_c", "level", "3", "10m"),
                redfish_gate("link_degraded", "link_degraded_per_node_day", "rate", "2.0", "10m"),
            ],
        ))
        .max_failed(2)
        .rollback_scope("wave")
        .render()
}

async fn start(h: &mut Harness, version: &str) -> orchestrator_types::RolloutId {
    start_with(h, version, policy()).await
}

async fn start_with(h: &mut Harness, version: &str, policy_source: String) -> orchestrator_types::RolloutId {
    let release = h.add_release(version, true).await;
    h.add_release(GPU_FROM, true).await;
    let rollout = start_rollout(
        &h.db,
        &StartRollout {
            release_id: release.id,
            policy_source,
            policy_commit: None,
            policy_blob: None,
            seed: 5,
        },
        "alice",
    )
    .await
    .expect("rollout starts");
    // One set of drivers for flashing and watching, as `serve` wires it: one session per BMC.
    let redfish = h.redfish();
    let judge = Arc::new(DetectorJudge::new(h.db.clone(), redfish.clone()));
    h.start_engine_full(h.config(), redfish, judge);
    rollout.id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tripled_xid_rate_is_rolled_back_in_the_canary_and_the_release_blocked_sqlite() {
    tripled_xid_rate_is_rolled_back(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tripled_xid_rate_is_rolled_back_in_the_canary_and_the_release_blocked_postgres() {
    tripled_xid_rate_is_rolled_back(true).await;
}

async fn tripled_xid_rate_is_rolled_back(postgres: bool) {
    let Some(mut h) = Harness::start(40, &scenario_extra(), postgres).await else {
        return;
    };
    let id = start(&mut h, GPU_BAD).await;
    let done = h
        .wait_for(
            id,
            &[RolloutState::RolledBack, RolloutState::Halted, RolloutState::Completed],
            Duration::from_secs(55),
        )
        .await;
    // The canary was flashed, rolled back and watched, the control watched: one session per BMC for
    // all of it, and none left once the engine has shut down.
    let sessions = |h: &Harness| -> Vec<(String, usize)> {
        h.fleet
            .endpoints()
            .iter()
            .map(|e| (e.name.clone(), h.fleet.open_sessions(&e.name).unwrap()))
            .collect()
    };
    let open = sessions(&h);
    assert!(open.iter().all(|(_, n)| *n <= 1), "{open:?}");
    assert!(open.iter().any(|(_, n)| *n == 1), "{open:?}");
    h.stop_engine().await;
    let open = sessions(&h);
    assert!(
        open.iter().all(|(_, n)| *n == 0),
        "sessions left after shutdown: {open:?}"
    );
    assert_eq!(done.state, RolloutState::RolledBack, "{:?}", done.state_reason);

    let waves = h.db.rollout_waves(id).await.unwrap();
    let canary = waves.iter().find(|w| w.name == "canary").unwrap();
    assert_eq!(canary.state, WaveState::RolledBack);
    let verdict = canary.verdict.as_ref().expect("the canary's verdict is stored");
    assert_eq!(verdict.outcome, Outcome::Fail, "{verdict:#?}");
    let summary = &verdict.summary;
    assert!(summary.starts_with("xid_errors:"), "{summary}");

    // Caught before the bake's end: the failing look was not the last one.
    let looks = h.db.health_looks(SampleScope::Wave(canary.id)).await.unwrap();
    let failed: Vec<_> = looks.iter().filter(|l| l.look.outcome == Outcome::Fail).collect();
    assert_eq!(failed.len(), 1, "{looks:#?}");
    assert_eq!(failed[0].look.gate, "xid_errors");
    assert!(
        failed[0].look.look_number < failed[0].look.planned_looks,
        "failed at look {} of {}",
        failed[0].look.look_number,
        failed[0].look.planned_looks
    );
    let verdict: Verdict = serde_json::from_value(failed[0].look.verdict.clone()).unwrap();
    let evidence = verdict.evidence().expect("a failed look has evidence");
    let ratio = evidence.effect.estimate.unwrap();
    assert!((2.0..5.0).contains(&ratio), "rate ratio {ratio}: {evidence:#?}");
    // Each look of each gate was evaluated at most once.
    let mut keys: Vec<_> = looks
        .iter()
        .map(|l| (l.look.gate.clone(), l.look.look_number))
        .collect();
    keys.sort();
    let before = keys.len();
    keys.dedup();
    assert_eq!(before, keys.len());

    // Both cohorts were watched: canary and control samples exist.
    let samples = h.db.health_samples(SampleScope::Wave(canary.id)).await.unwrap();
    for cohort in [Cohort::Canary, Cohort::Control] {
        assert!(
            samples
                .iter()
                .any(|s| s.cohort == cohort && s.metric == "xid_errors_per_gpu_hour" && s.events > 0),
            "{cohort:?} has XID events"
        );
    }

    // The release is blocked with the evidence as its reason.
    let release = h.db.release(done.release_id).await.unwrap();
    assert_eq!(release.qualification_state, QualificationState::Blocked);
    assert!(
        release
            .state_reason
            .as_deref()
            .unwrap_or_default()
            .contains("xid_errors"),
        "{:?}",
        release.state_reason
    );
    let blocks =
        h.db.audit_entries(&AuditFilter {
            action: Some("release.block".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(blocks.len(), 1);
    assert_eq!(blocks[0].actor, "engine");

    // Every canary node is back on the old firmware; nothing else was flashed.
    let steps =
        h.db.steps(&StepFilter {
            rollout_id: Some(id),
            ..Default::default()
        })
        .await
        .unwrap();
    let canary_nodes: Vec<_> = steps
        .iter()
        .filter(|s| s.wave_id == canary.id && s.purpose == StepPurpose::Update)
        .map(|s| s.node_id)
        .collect();
    assert_eq!(canary_nodes.len(), 10);
    assert!(
        steps
            .iter()
            .filter(|s| s.purpose == StepPurpose::Rollback)
            .all(|s| s.state == StepState::Succeeded)
    );
    for node in h.db.list_nodes(&Default::default()).await.unwrap() {
        let versions = h.fleet.versions(&node.name).unwrap();
        for c in versions.iter().filter(|c| c.id.starts_with("HGX_FW_GPU_")) {
            assert_eq!(c.active, GPU_FROM, "{} {}", node.name, c.id);
        }
        let flashes: u32 = h.fleet.flash_counts(&node.name).unwrap().values().sum();
        let expected = if canary_nodes.contains(&node.id) { 2 } else { 0 };
        assert_eq!(flashes, expected, "{}", node.name);
    }
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthy_firmware_under_a_fleet_wide_heat_event_is_promoted() {
    let Some(mut h) = Harness::start(40, &scenario_extra(), false).await else {
        return;
    };
    let id = start(&mut h, GPU_TO).await;
    let done = h
        .wait_for(
            id,
            &[RolloutState::RolledBack, RolloutState::Halted, RolloutState::Completed],
            Duration::from_secs(55),
        )
        .await;
    h.stop_engine().await;
    assert_eq!(done.state, RolloutState::Completed, "{:?}", done.state_reason);

    let waves = h.db.rollout_waves(id).await.unwrap();
    let canary = waves.iter().find(|w| w.name == "canary").unwrap();
    assert_eq!(canary.state, WaveState::Promoted);
    let verdict = canary.verdict.as_ref().expect("the canary's verdict is stored");
    assert_eq!(verdict.outcome, Outcome::Pass, "{verdict:#?}");

    // Every gate reached its final look and passed there; no look failed.
    let looks = h.db.health_looks(SampleScope::Wave(canary.id)).await.unwrap();
    assert!(looks.iter().all(|l| l.look.outcome != Outcome::Fail), "{looks:#?}");
    for gate in ["xid_errors", "gpu_temp"] {
        let last = looks
            .iter()
            .filter(|l| l.look.gate == gate)
            .max_by_key(|l| l.look.look_number)
            .unwrap_or_else(|| panic!("{gate} was looked at"));
        assert_eq!(last.look.look_number, last.look.planned_looks, "{gate}");
        assert_eq!(last.look.outcome, Outcome::Pass, "{gate}: {:#}", last.look.verdict);
    }

    // The heat event did reach the canary: its hottest GPU window is well
    // above the baseline, yet the gate passed because control rose too.
    let samples = h.db.health_samples(SampleScope::Wave(canary.id)).await.unwrap();
    let hottest = |cohort: Cohort| {
        samples
            .iter()
            .filter(|s| s.cohort == cohort && s.metric == "gpu_temp_c")
            .filter_map(|s| s.max)
            .fold(f64::MIN, f64::max)
    };
    assert!(hottest(Cohort::Canary) > 70.0, "canary max {}", hottest(Cohort::Canary));
    assert!(
        hottest(Cohort::Control) > 70.0,
        "control max {}",
        hottest(Cohort::Control)
    );

    let release = h.db.release(done.release_id).await.unwrap();
    assert_eq!(release.qualification_state, QualificationState::Qualified);
    for endpoint in h.fleet.endpoints() {
        let versions = h.fleet.versions(&endpoint.name).unwrap();
        for c in versions.iter().filter(|c| c.id.starts_with("HGX_FW_GPU_")) {
            assert_eq!(c.active, GPU_TO, "{} {}", endpoint.name, c.id);
        }
    }
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_canary_too_short_for_its_gate_holds_for_a_human() {
    let Some(mut h) = Harness::start(40, &scenario_extra(), false).await else {
        return;
    };
    // Ten nodes baking an hour are under half a node-day: too little
    // exposure for a per-node-day rate, so the gate can neither pass nor fail.
    let id = start_with(&mut h, GPU_TO, policy_with_gates("[xid_errors, link_degraded]")).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(50);
    let canary = loop {
        let waves = h.db.rollout_waves(id).await.unwrap();
        let canary = waves.into_iter().find(|w| w.name == "canary").unwrap();
        if canary.state == WaveState::AwaitingApproval || tokio::time::Instant::now() > deadline {
            break canary;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    h.stop_engine().await;
    assert_eq!(canary.state, WaveState::AwaitingApproval, "{:?}", canary.blockers);
    let verdict = canary.verdict.as_ref().unwrap();
    assert_eq!(verdict.outcome, Outcome::Inconclusive, "{verdict:#?}");
    assert_eq!(verdict.summary, "link_degraded inconclusive", "{verdict:#?}");
    let rollout = h.db.exec_rollout(id).await.unwrap();
    assert_eq!(rollout.state, RolloutState::Running);
    let looks = h.db.health_looks(SampleScope::Wave(canary.id)).await.unwrap();
    let final_link = looks
        .iter()
        .find(|l| l.look.gate == "link_degraded" && l.look.look_number == l.look.planned_looks)
        .expect("the final look of link_degraded");
    let verdict: Verdict = serde_json::from_value(final_link.look.verdict.clone()).unwrap();
    assert!(
        matches!(
            verdict,
            Verdict::Inconclusive {
                reason: InconclusiveReason::InsufficientData,
                ..
            }
        ),
        "{verdict:#?}"
    );
    // The next wave has not started: nothing outside the canary was flashed.
    let flashed = h
        .fleet
        .endpoints()
        .iter()
        .filter(|e| h.fleet.flash_counts(&e.name).unwrap().values().sum::<u32>() > 0)
        .count();
    assert_eq!(flashed, 10);
    h.shutdown().await;
}

/// A stand-in for Prometheus' query API: whatever the query, it answers
/// with the GPU temperatures bmc-sim's `/metrics` shows at that moment, as
/// Prometheus would for `bmcsim_gpu_temperature_celsius` (labels node, gpu).
async fn fake_prometheus(metrics_url: String) -> (String, tokio::task::JoinHandle<()>) {
    let handler = move || {
        let metrics_url = metrics_url.clone();
        async move {
            let text = match reqwest::get(&metrics_url).await {
                Ok(response) => response.text().await.unwrap_or_default(),
                Err(_) => String::new(),
            };
            let now = chrono::Utc::now().timestamp_millis() as f64 / 1000.0;
            let result: Vec<serde_json::Value> = text
                .lines()
                .filter_map(|line| line.strip_prefix("bmcsim_gpu_temperature_celsius{"))
                .filter_map(|rest| {
                    let (labels, value) = rest.split_once("} ")?;
                    let mut metric = serde_json::Map::new();
                    for pair in labels.split(',') {
                        let (k, v) = pair.split_once('=')?;
                        metric.insert(k.to_owned(), v.trim_matches('"').into());
                    }
                    Some(serde_json::json!({ "metric": metric, "value": [now, value.trim()] }))
                })
                .collect();
            axum::Json(serde_json::json!({
                "status": "success",
                "data": { "resultType": "vector", "result": result },
            }))
        }
    };
    let app = axum::Router::new().route("/api/v1/query", axum::routing::post(handler));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (format!("http://{addr}"), task)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prometheus_level_gate_is_judged_against_the_control_cohort() {
    let Some(mut h) = Harness::start(40, &scenario_extra(), false).await else {
        return;
    };
    let (prometheus_url, prometheus) = fake_prometheus(format!("{}/metrics", h.fleet.control_url())).await;
    let policy = policy_with_gates("[xid_errors, gpu_temp_prom]").replace(
        "    - name: link_degraded\n",
        "    - name: gpu_temp_prom\n      source: prometheus\n      query: 'avg by (node, gpu) (bmcsim_gpu_temperature_celsius)'\n      kind: level\n      direction: increase_is_bad\n      min_effect: 3\n      interval: 10m\n    - name: link_degraded\n",
    );
    let release = h.add_release(GPU_TO, true).await;
    h.add_release(GPU_FROM, true).await;
    let rollout = h.start_rollout(release.id, policy, 5).await;
    let client = PrometheusClient::new(PrometheusConfig::new(url::Url::parse(&prometheus_url).unwrap())).unwrap();
    let judge = Arc::new(DetectorJudge::new(h.db.clone(), h.redfish()).with_prometheus(client));
    h.start_engine_with(h.config(), judge);
    let done = h
        .wait_for(
            rollout.id,
            &[RolloutState::RolledBack, RolloutState::Halted, RolloutState::Completed],
            Duration::from_secs(55),
        )
        .await;
    h.stop_engine().await;
    prometheus.abort();
    assert_eq!(done.state, RolloutState::Completed, "{:?}", done.state_reason);
    let waves = h.db.rollout_waves(rollout.id).await.unwrap();
    let canary = waves.iter().find(|w| w.name == "canary").unwrap();
    let looks = h.db.health_looks(SampleScope::Wave(canary.id)).await.unwrap();
    let last = looks
        .iter()
        .filter(|l| l.look.gate == "gpu_temp_prom")
        .max_by_key(|l| l.look.look_number)
        .expect("the Prometheus gate was looked at");
    assert_eq!(last.look.look_number, last.look.planned_looks);
    assert_eq!(last.look.outcome, Outcome::Pass, "{:#}", last.look.verdict);
    // One value per GPU and cohort went into the test.
    let verdict: Verdict = serde_json::from_value(last.look.verdict.clone()).unwrap();
    let evidence = verdict.evidence().expect("a passed look has evidence");
    assert_eq!(evidence.canary.samples, Some(80), "{evidence:#?}");
    assert_eq!(
        evidence.control.samples,
        u64::try_from(8 * canary.control_nodes.len()).ok(),
        "{evidence:#?}"
    );
    h.shutdown().await;
}

/// A stand-in for Prometheus that keeps history: it scrapes bmc-sim's
/// simulated dcgm-exporters every 50 ms of real time (12 s simulated),
/// stamps each sample with the simulated clock as Prometheus stamps with its
/// own, and answers an instant query of a range selector `NAME{...}[Ns]` with
/// the raw samples of every series of NAME in that range (matchers are not
/// applied; series of unwatched nodes are the caller's to ignore).
async fn fake_prometheus_tsdb(
    dcgm_url: String,
    clock: Arc<dyn orchestrator_types::Clock>,
) -> (String, tokio::task::JoinHandle<()>, tokio::task::JoinHandle<()>) {
    type Tsdb = std::collections::BTreeMap<String, Vec<(f64, String)>>;
    let tsdb: Arc<std::sync::Mutex<Tsdb>> = Arc::default();
    let scraper = {
        let tsdb = tsdb.clone();
        tokio::spawn(async move {
            loop {
                if let Ok(response) = reqwest::get(&dcgm_url).await {
                    let text = response.text().await.unwrap_or_default();
                    let now = clock.now().timestamp_millis() as f64 / 1000.0;
                    let mut db = tsdb.lock().unwrap();
                    for line in text.lines().filter(|l| !l.starts_with('#')) {
                        if let Some((series, value)) = line.rsplit_once(' ') {
                            db.entry(series.to_owned()).or_default().push((now, value.to_owned()));
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };
    let handler = move |body: String| {
        let tsdb = tsdb.clone();
        async move {
            let form: std::collections::HashMap<String, String> =
                url::form_urlencoded::parse(body.as_bytes()).into_owned().collect();
            let query = form.get("query").cloned().unwrap_or_default();
            let at = chrono::DateTime::parse_from_rfc3339(form.get("time").map_or("", String::as_str))
                .map(|t| t.timestamp_millis() as f64 / 1000.0)
                .unwrap_or(0.0);
            let name: String = query
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            let range: f64 = query
                .rsplit_once('[')
                .and_then(|(_, r)| r.trim_end_matches(']').trim_end_matches('s').parse().ok())
                .unwrap_or(0.0);
            let db = tsdb.lock().unwrap();
            let result: Vec<serde_json::Value> = db
                .iter()
                .filter(|(series, _)| series.starts_with(&format!("{name}{{")))
                .map(|(series, points)| {
                    let labels = &series[name.len() + 1..series.len() - 1];
                    let mut metric = serde_json::Map::new();
                    metric.insert("__name__".into(), name.clone().into());
                    for pair in labels.split(',') {
                        if let Some((k, v)) = pair.split_once('=') {
                            metric.insert(k.to_owned(), v.trim_matches('"').into());
                        }
                    }
                    let values: Vec<serde_json::Value> = points
                        .iter()
                        .filter(|(t, _)| *t > at - range && *t <= at)
                        .map(|(t, v)| serde_json::json!([t, v]))
                        .collect();
                    serde_json::json!({ "metric": metric, "values": values })
                })
                .collect();
            axum::Json(serde_json::json!({
                "status": "success",
                "data": { "resultType": "matrix", "result": result },
            }))
        }
    };
    let app = axum::Router::new().route("/api/v1/query", axum::routing::post(handler));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (format!("http://{addr}"), server, scraper)
}

/// Starts a rollout of `version` gated on DCGM's PCIe replay counter (a rate
/// gate over a counter), read through [`fake_prometheus_tsdb`] scraping the
/// fleet's simulated exporters, with the engine running. Returns the rollout
/// and the stand-in's server and scraper tasks, for the caller to abort.
async fn start_pcie_replay_rollout(
    h: &mut Harness,
    version: &str,
) -> (ExecRollout, tokio::task::JoinHandle<()>, tokio::task::JoinHandle<()>) {
    let (prometheus_url, server, scraper) =
        fake_prometheus_tsdb(format!("{}/sim/dcgm/metrics", h.fleet.control_url()), h.fleet.clock()).await;
    let policy = policy_with_gates("[pcie_replay]").replace(
        "    - name: link_degraded\n",
        "    - name: pcie_replay\n      source: prometheus\n      query: DCGM_FI_DEV_PCIE_REPLAY_COUNTER\n      kind: rate\n      direction: increase_is_bad\n      min_effect: 2.0\n      interval: 10m\n    - name: link_degraded\n",
    );
    let release = h.add_release(version, true).await;
    h.add_release(GPU_FROM, true).await;
    let rollout = h.start_rollout(release.id, policy, 5).await;
    let mut config = PrometheusConfig::new(url::Url::parse(&prometheus_url).unwrap());
    config.node_label = "Hostname".into();
    let client = PrometheusClient::new(config).unwrap();
    let judge = Arc::new(DetectorJudge::new(h.db.clone(), h.redfish()).with_prometheus(client));
    h.start_engine_with(h.config(), judge);
    (rollout, server, scraper)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pcie_replay_regression_in_dcgm_counters_is_rolled_back_through_the_prometheus_source() {
    // The bad firmware multiplies PCIe errors tenfold; DCGM's replay counter
    // carries them (bmc-sim derives it from the same event log).
    let extra = scenario_extra()
        .replace(
            "      - {metric: xid_errors_per_gpu_hour, multiply: 3.0, share: 1.0, onset: 0s}",
            "      - {metric: pcie_aer_per_node_hour, multiply: 10.0, share: 1.0, onset: 0s}",
        )
        .replace("pcie_aer_per_node_hour: 0.01", "pcie_aer_per_node_hour: 6");
    let Some(mut h) = Harness::start(40, &extra, false).await else {
        return;
    };
    let (rollout, server, scraper) = start_pcie_replay_rollout(&mut h, GPU_BAD).await;
    let done = h
        .wait_for(
            rollout.id,
            &[RolloutState::RolledBack, RolloutState::Halted, RolloutState::Completed],
            Duration::from_secs(55),
        )
        .await;
    h.stop_engine().await;
    server.abort();
    scraper.abort();
    assert_eq!(done.state, RolloutState::RolledBack, "{:?}", done.state_reason);
    let waves = h.db.rollout_waves(rollout.id).await.unwrap();
    let canary = waves.iter().find(|w| w.name == "canary").unwrap();
    let verdict = canary.verdict.as_ref().expect("the canary's verdict is stored");
    assert_eq!(verdict.outcome, Outcome::Fail, "{verdict:#?}");
    let summary = &verdict.summary;
    assert!(summary.starts_with("pcie_replay:"), "{summary}");
    let release = h.db.release(done.release_id).await.unwrap();
    assert_eq!(release.qualification_state, QualificationState::Blocked);
    h.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn healthy_firmware_with_dcgm_exporter_restarts_mid_bake_has_no_false_event() {
    // Same fleet and gate as above, a firmware without effects, and every
    // canary exporter restarted twice during the canary's bake: the counters
    // drop to zero, which the source reads as resets, not as events.
    let extra = scenario_extra().replace("pcie_aer_per_node_hour: 0.01", "pcie_aer_per_node_hour: 60");
    let Some(mut h) = Harness::start(40, &extra, false).await else {
        return;
    };
    let (rollout, server, scraper) = start_pcie_replay_rollout(&mut h, GPU_TO).await;
    // Only the updated (canary) nodes' exporters restart, so a reset misread
    // as events would inflate the canary alone and fail the gate.
    let control = h.fleet.control_url().to_owned();
    let restarts = tokio::spawn(async move {
        let http = reqwest::Client::new();
        let mut restarted = 0;
        for _ in 0..3 {
            tokio::time::sleep(Duration::from_secs(3)).await;
            let flashed: serde_json::Value = http
                .get(format!("{control}/sim/flash-counts"))
                .send()
                .await
                .expect("flash counts")
                .json()
                .await
                .expect("flash counts json");
            for name in flashed.as_object().expect("object").keys() {
                let response = http
                    .post(format!("{control}/sim/nodes/{name}/dcgm"))
                    .json(&serde_json::json!({"action": "restart"}))
                    .send()
                    .await
                    .expect("restart request");
                assert!(response.status().is_success());
                restarted += 1;
            }
        }
        restarted
    });
    // The canary's bake ends with a verdict (a pass, or a hold for a human
    // when the evidence is short of proof either way).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(55);
    let canary = loop {
        let waves = h.db.rollout_waves(rollout.id).await.unwrap();
        let canary = waves.into_iter().find(|w| w.name == "canary").unwrap();
        if canary.verdict.is_some() {
            break canary;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no canary verdict: {:?}",
            canary.state
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    h.stop_engine().await;
    let restarted = restarts.await.expect("restarts ran");
    assert_eq!(restarted, 30, "each round restarts the ten canary exporters");
    server.abort();
    scraper.abort();
    let verdict = canary.verdict.as_ref().unwrap();
    assert_ne!(verdict.outcome, Outcome::Fail, "{verdict:#?}");
    assert_ne!(verdict.outcome, Outcome::Error, "{verdict:#?}");
    let looks = h.db.health_looks(SampleScope::Wave(canary.id)).await.unwrap();
    assert!(looks.iter().any(|l| l.look.gate == "pcie_replay"), "{looks:#?}");
    assert!(looks.iter().all(|l| l.look.outcome != Outcome::Fail), "{looks:#?}");
    // The canary's replay rate matches the control's: a restart's drop read
    // as events (the whole pre-restart count again) would raise it by half.
    let last = looks
        .iter()
        .filter(|l| l.look.gate == "pcie_replay")
        .max_by_key(|l| l.look.look_number)
        .unwrap();
    let verdict: Verdict = serde_json::from_value(last.look.verdict.clone()).unwrap();
    let evidence = verdict.evidence().expect("a look of a judged gate has evidence");
    let ratio = evidence.effect.estimate.expect("a rate ratio estimate");
    println!("healthy canary vs control PCIe replay rate ratio {ratio:.3}: {evidence:?}");
    assert!((0.7..1.3).contains(&ratio), "rate ratio {ratio}: {evidence:#?}");
    h.shutdown().await;
}
