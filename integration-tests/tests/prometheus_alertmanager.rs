//! End to end with a REAL Prometheus and a REAL Alertmanager (issue 6):
//!
//! - given a simulated fleet (bmc-sim, in-process) where GPU firmware
//!   96.00.99.00.01 raises the XID error rate twentyfold, the controller
//!   (database, rollout engine, web API on a loopback port), a `prometheus`
//!   process scraping bmc-sim's `/metrics` every second with a rule on the
//!   XID rate of nodes running the new firmware, and an `alertmanager`
//!   process whose webhook receiver calls the controller with a bearer token;
//! - when a rollout of the bad firmware flashes its canary;
//! - then the rule fires, Alertmanager delivers the alert, the policy's alert
//!   rule rolls the rollout back, and the canary runs the old firmware again.
//!
//! Skipped with a loud message when the binaries are missing (install them
//! with `integration-tests/ci-setup.sh`); a failure when
//! `WAVEGUARD_REQUIRE_ALL=1`. Everything listens on 127.0.0.1 only; the
//! child processes are killed when the test ends, pass or fail, and their
//! logs are printed when it fails.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use bmc_sim::Scenario;
use integration_tests::fixtures::{GPU_FROM, PolicyYaml, SKU, WaveSize, WaveYaml};
use integration_tests::process::ChildProcess;
use integration_tests::{Harness, REQUIRE_ALL_ENV, ScenarioYaml, find_program, free_port};
use orchestrator_db::execution::{RolloutState, StepFilter, StepPurpose};
use orchestrator_engine::prometheus::{NodeIndex, NodeSeries, PrometheusClient, PrometheusConfig};
use orchestrator_engine::{GatelessJudge, StartRollout, start_rollout};
use web::{AlertReceiverConfig, AppState};

const GPU_BAD: &str = "96.00.99.00.01";
/// Simulated seconds per real second: a 2-4 minute flash takes about a
/// second, and the 24 h canary bake six minutes, far longer than the alert
/// needs to arrive.
const SPEEDUP: f64 = 240.0;
const TOKEN: &str = "e2e-alertmanager-token-5f2b9c0d";
/// Whole-test budget for the alert to arrive and the rollback to finish.
const LIMIT: Duration = Duration::from_secs(100);

fn scenario() -> Scenario {
    ScenarioYaml::hgx(6)
        .seed(11)
        .layout(3, 1)
        .nodes_per_nvlink_domain(2)
        .baseline("xid_errors_per_gpu_hour: 0.6")
        .firmware(&format!(
            "  - kind: gpu\n    version: \"{GPU_BAD}\"\n    flash_time: {{min: 2m, max: 4m}}\n    effects:\n      \
             - {{metric: xid_errors_per_gpu_hour, multiply: 20.0, share: 1.0, onset: 0s}}"
        ))
        .gpu_firmware(GPU_FROM, "{min: 2m, max: 4m}")
        .build()
}

/// A two-node canary baking for a day, and the rule that an alert named
/// `CanaryXidStorm` rolls the whole rollout back.
fn policy() -> String {
    PolicyYaml::two_waves("e2e-gpu")
        .waves(vec![
            WaveYaml::new("canary", WaveSize::Count(2))
                .stratify_by(&["rack"])
                .bake("24h")
                .max_in_flight(2),
            WaveYaml::new("rest", WaveSize::Rest).bake("1h").max_in_flight(4),
        ])
        .concurrency(4, &["per_rack: 2"])
        .health(
            "health:\n  alerts:\n    - matchers: ['alertname=\"CanaryXidStorm\"', 'severity=\"critical\"']\n      \
             action: rollback\n    - matchers: ['severity=\"critical\"']\n      action: pause",
        )
        .render()
}

/// The Prometheus rule: the XID rate of nodes whose GPUs run the new
/// firmware. Control nodes run at 0.6/GPU-hour (about 0.3 errors per real
/// second at this speed-up), updated ones at twenty times that.
fn rules() -> String {
    format!(
        r#"
groups:
  - name: waveguard-canary
    interval: 1s
    rules:
      - alert: CanaryXidStorm
        expr: |
          sum by (node) (rate(bmcsim_gpu_xid_errors_total[15s])) > 2
          and on (node)
          max by (node) (bmcsim_firmware_info{{kind="gpu",version="{GPU_BAD}"}})
        labels:
          severity: critical
        annotations:
          summary: "XID storm on {{{{ $labels.node }}}} after a GPU firmware update"
"#
    )
}

/// A child process killed (and reaped) on drop, with its log file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_alert_from_prometheus_via_alertmanager_rolls_the_canary_back() {
    let prometheus = find_program(&["prometheus"]);
    let alertmanager = find_program(&["prometheus-alertmanager", "alertmanager"]);
    let (Some(prometheus), Some(alertmanager)) = (prometheus, alertmanager) else {
        let require_all = std::env::var(REQUIRE_ALL_ENV).is_ok_and(|v| v == "1");
        assert!(
            !require_all,
            "{REQUIRE_ALL_ENV}=1 but `prometheus` and/or `prometheus-alertmanager` are not on PATH; \
             run integration-tests/ci-setup.sh"
        );
        eprintln!(
            "\n\n*** SKIPPED prometheus_alertmanager end-to-end test: `prometheus` and/or \
             `prometheus-alertmanager` not on PATH (run integration-tests/ci-setup.sh) ***\n\n"
        );
        return;
    };
    if let Err(err) = run(&prometheus, &alertmanager).await {
        panic!("{err:?}");
    }
}

async fn run(prometheus_bin: &Path, alertmanager_bin: &Path) -> anyhow::Result<()> {
    // The fleet and the controller.
    let sim = Harness::builder(scenario())
        .speedup(SPEEDUP)
        .sku(SKU)
        .start()
        .await
        .context("harness")?;
    let (dir, db, fleet) = (&sim.dir, &sim.db, &sim.fleet);
    sim.add_qualified_release(GPU_FROM, "alice", &[]).await?;
    let bad = sim.add_qualified_release(GPU_BAD, "alice", &[]).await?;
    let engine = sim.spawn_engine(Arc::new(GatelessJudge));
    let state = AppState::new(db.clone())
        .with_engine_nudge(engine.nudge())
        .with_alert_receiver(AlertReceiverConfig::new(TOKEN)?);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let controller = listener.local_addr()?;
    let (stop_web, web_stopped) = tokio::sync::oneshot::channel::<()>();
    let web_task = tokio::spawn(web::serve(listener, state, async move {
        let _ = web_stopped.await;
    }));

    // Alertmanager, then Prometheus pointing at it.
    let am_port = free_port()?;
    let prom_port = free_port()?;
    let control = fleet.control_url().trim_start_matches("http://").to_owned();
    std::fs::write(
        dir.path().join("alertmanager.yml"),
        format!(
            r#"
route:
  receiver: waveguard
  group_by: [alertname, node]
  group_wait: 1s
  group_interval: 1s
  repeat_interval: 1h
receivers:
  - name: waveguard
    webhook_configs:
      - url: "http://{controller}/api/v1/alerts/alertmanager"
        send_resolved: true
        http_config:
          authorization:
            type: Bearer
            credentials_file: "{token_file}"
"#,
            token_file = dir.path().join("token").display()
        ),
    )?;
    std::fs::write(dir.path().join("token"), TOKEN)?;
    std::fs::write(dir.path().join("rules.yml"), rules())?;
    std::fs::write(
        dir.path().join("prometheus.yml"),
        format!(
            r#"
global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files: [rules.yml]
alerting:
  alertmanagers:
    - static_configs:
        - targets: ["127.0.0.1:{am_port}"]
scrape_configs:
  - job_name: bmc-sim
    static_configs:
      - targets: ["{control}"]
"#
        ),
    )?;
    let mut am = ChildProcess::spawn(
        "alertmanager",
        alertmanager_bin,
        &[
            format!("--config.file={}", dir.path().join("alertmanager.yml").display()),
            format!("--storage.path={}", dir.path().join("am-data").display()),
            format!("--web.listen-address=127.0.0.1:{am_port}"),
            // No gossip: a lone instance must not listen on 0.0.0.0:9094.
            "--cluster.listen-address=".into(),
        ],
        dir.path(),
    )?;
    let mut prom = ChildProcess::spawn(
        "prometheus",
        prometheus_bin,
        &[
            format!("--config.file={}", dir.path().join("prometheus.yml").display()),
            format!("--storage.tsdb.path={}", dir.path().join("prom-data").display()),
            format!("--web.listen-address=127.0.0.1:{prom_port}"),
        ],
        dir.path(),
    )?;
    let http = reqwest::Client::builder().timeout(Duration::from_secs(5)).build()?;
    let outcome = async {
        am.wait_ready(&http, &format!("http://127.0.0.1:{am_port}/-/ready"))
            .await?;
        prom.wait_ready(&http, &format!("http://127.0.0.1:{prom_port}/-/ready"))
            .await?;

        // When: a rollout of the bad firmware starts.
        let rollout = start_rollout(
            db,
            &StartRollout {
                release_id: bad,
                policy_source: policy(),
                policy_commit: Some("e2e".into()),
                policy_blob: Some("e2e".into()),
                seed: 5,
            },
            "alice",
        )
        .await?;
        engine.nudge().nudge();

        // Then: the alert arrives and the rollout rolls back.
        let started = Instant::now();
        let done = loop {
            let current = db.exec_rollout(rollout.id).await?;
            if current.state == RolloutState::RolledBack {
                break current;
            }
            if matches!(current.state, RolloutState::Completed | RolloutState::Halted) || started.elapsed() > LIMIT {
                let alerts = db.alerts(&Default::default()).await?;
                bail!(
                    "rollout is {} ({:?}) after {:?}; alerts received: {alerts:#?}",
                    current.state,
                    current.state_reason,
                    started.elapsed()
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        eprintln!("rolled back after {:?} ({:?})", started.elapsed(), done.state_reason);

        // The action is audited with the alert as its evidence.
        let actions = db
            .audit_entries(&orchestrator_db::AuditFilter {
                action: Some("alert.action".into()),
                ..Default::default()
            })
            .await?;
        let rollback = actions
            .iter()
            .find(|e| e.details["result"] == "rollback_started")
            .context("an alert.action audit entry starting the rollback")?;
        ensure!(rollback.actor == "alertmanager", "{rollback:?}");
        ensure!(rollback.subject_id == rollout.id.to_string(), "{rollback:?}");
        let alert_id = rollback.details["alert_id"]
            .as_i64()
            .context("alert id in the evidence")?;
        let fired = db.alert(alert_id).await?;
        ensure!(fired.alertname == "CanaryXidStorm", "{fired:?}");
        ensure!(
            fired.labels.get("severity").map(String::as_str) == Some("critical"),
            "{fired:?}"
        );
        ensure!(
            fired.generator_url.is_some(),
            "Prometheus links its expression: {fired:?}"
        );
        ensure!(fired.processed_at.is_some(), "{fired:?}");
        let alerted_node = fired.labels.get("node").context("alert has a node label")?;
        ensure!(
            rollback.details["alert"]["fingerprint"] == fired.fingerprint.as_str(),
            "{rollback:?}"
        );
        ensure!(
            rollback.details["alert"]["annotations"]["summary"]
                .as_str()
                .unwrap_or_default()
                .contains(alerted_node.as_str()),
            "{}",
            rollback.details
        );

        // The alerting node is one the canary flashed with the bad firmware.
        let updates = db
            .steps(&StepFilter {
                rollout_id: Some(rollout.id),
                purpose: Some(StepPurpose::Update),
                ..Default::default()
            })
            .await?;
        let flashed: Vec<String> = {
            let mut names = Vec::new();
            for step in updates.iter().filter(|s| s.previous_version.is_some()) {
                names.push(db.node(step.node_id).await?.name);
            }
            names
        };
        ensure!(
            flashed.contains(alerted_node),
            "alert on {alerted_node}, flashed {flashed:?}"
        );
        ensure!(flashed.len() <= 2, "only the canary was flashed: {flashed:?}");

        let rolled = db
            .audit_entries(&orchestrator_db::AuditFilter {
                action: Some("rollout.rolling_back".into()),
                ..Default::default()
            })
            .await?;
        ensure!(rolled.len() == 1 && rolled[0].actor == "alertmanager", "{rolled:?}");

        // The collector reads the same fleet from the real Prometheus: every
        // node's eight GPU counters, and one rate series per node.
        let mut config = PrometheusConfig::new(url::Url::parse(&format!("http://127.0.0.1:{prom_port}"))?);
        config.timeout = Duration::from_secs(5);
        let collector = PrometheusClient::new(config)?;
        let index: NodeIndex = db
            .list_nodes(&Default::default())
            .await?
            .into_iter()
            .map(|n| (n.id, n.name))
            .collect();
        let now = chrono::Utc::now();
        let counters = collector
            .node_samples("bmcsim_gpu_xid_errors_total", now, &index)
            .await?;
        ensure!(
            counters.matched.len() == index.len() * 8 && counters.unmatched.is_empty(),
            "{} matched, unmatched {:?}",
            counters.matched.len(),
            counters.unmatched
        );
        let rates = collector
            .node_series(
                "sum by (node) (rate(bmcsim_gpu_xid_errors_total[15s]))",
                now - chrono::Duration::seconds(30),
                now,
                Duration::from_secs(1),
                &index,
            )
            .await?;
        ensure!(rates.matched.len() == index.len(), "{rates:?}");
        let flashed_id = db.node_by_name(alerted_node).await?.id;
        let peak = |series: &NodeSeries| series.points.iter().map(|(_, v)| *v).fold(0.0, f64::max);
        let alerted_peak = rates
            .matched
            .iter()
            .filter(|s| s.node == flashed_id)
            .map(peak)
            .fold(0.0, f64::max);
        ensure!(
            alerted_peak > 2.0,
            "the alerting node's XID rate peaked at {alerted_peak}: {rates:?}"
        );

        // Every flashed node runs the old firmware again.
        for name in &flashed {
            let versions = fleet.versions(name).context("sim node")?;
            let gpus: Vec<&str> = versions
                .iter()
                .filter(|c| c.id.starts_with("HGX_FW_GPU_"))
                .map(|c| c.active.as_str())
                .collect();
            ensure!(gpus.iter().all(|v| *v == GPU_FROM), "{name}: {gpus:?}");
        }
        anyhow::Ok(())
    }
    .await;

    let logs = format!(
        "--- alertmanager log ---\n{}\n--- prometheus log ---\n{}",
        am.log_tail(),
        prom.log_tail()
    );
    drop(prom);
    drop(am);
    engine.shutdown().await;
    let _ = stop_web.send(());
    let _ = web_task.await;
    sim.shutdown().await;
    outcome.map_err(|err| err.context(logs))
}
