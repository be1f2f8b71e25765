//! Rollouts gated on DCGM telemetry through a REAL Prometheus (issue 20), on wall time: Prometheus stamps
//! samples with the time it scrapes, so the controller's clock, bmc-sim's and Prometheus' agree, and the
//! bakes last minutes.
//!
//! - given four simulated HGX fleets whose dcgm-exporters one Prometheus scrapes every second, and
//!   `policies/hgx-dcgm.yaml` with its gates unchanged but its waves, look intervals and cluster cap scaled
//!   to minutes (its maintenance window dropped, since the test cannot wait for Tuesday 01:00);
//! - when a release that raises the canary's XID rate (seen through the exporter's windowed XID count), one
//!   that raises PCIe replays (a counter), a healthy one whose canary exporter restarts mid-bake (a counter
//!   reset), and a healthy one whose canary exporter stops mid-bake are rolled out;
//! - then the first two are caught in the canary by the right gate, rolled back and their releases blocked;
//!   the restart costs no false event and the canary passes; the stopped exporter makes its gates an error
//!   naming the node, and the wave is never promoted.
//!
//! Skipped loudly when `prometheus` is missing (install it with `integration-tests/ci-setup.sh`); a failure
//! when `WAVEGUARD_REQUIRE_ALL=1`. Everything listens on 127.0.0.1; Prometheus is killed when the test ends.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use bmc_sim::Scenario;
use integration_tests::Harness;
use integration_tests::process::{required_program, start_prometheus};
use orchestrator_bmc::HttpClients;
use orchestrator_db::execution::{ExecWave, RolloutState, WaveState};
use orchestrator_db::health::SampleScope;
use orchestrator_engine::RedfishConnector;
use orchestrator_engine::prometheus::{PrometheusClient, PrometheusConfig};
use orchestrator_engine::watch::DetectorJudge;
use orchestrator_engine::{EngineError, StartChecks, StartRollout, start_rollout_checked};
use orchestrator_types::{Outcome, QualificationState, RolloutId};

const POLICY: &str = include_str!("../../policies/hgx-dcgm.yaml");
const SKU: &str = "hgx-h100-8gpu";
const GPU_FROM: &str = "96.00.5E.00.01";
const GPU_GOOD: &str = "96.00.61.00.01";
const GPU_XID: &str = "96.00.66.00.01";
const GPU_PCIE: &str = "96.00.67.00.01";
/// Canary nodes, in a fleet of [`NODES`]: the other 16 are the control.
const CANARY: usize = 8;
const NODES: usize = 24;
/// Wall-time budget for one world, from the rollout's start to its end state.
const LIMIT: Duration = Duration::from_secs(300);

/// The example policy with its gates untouched and its timing scaled to a test: two-minute bakes with a
/// look every 20 s, an 8-node canary, no maintenance window, a cluster cap that lets 4 nodes flash at once.
fn policy() -> anyhow::Result<String> {
    let replace = |text: String, from: &str, to: &str| -> anyhow::Result<String> {
        ensure!(
            text.contains(from),
            "policies/hgx-dcgm.yaml no longer contains {from:?}"
        );
        Ok(text.replacen(from, to, 1))
    };
    let waves_at = POLICY.find("\nwaves:\n").context("waves")?;
    let concurrency_at = POLICY.find("\nconcurrency:\n").context("concurrency")?;
    let windows_at = POLICY.find("\nmaintenance_windows:\n").context("maintenance_windows")?;
    let health_at = POLICY.find("\nhealth:\n").context("health")?;
    ensure!(waves_at < concurrency_at && concurrency_at < windows_at && windows_at < health_at);
    let waves = format!(
        "
waves:
  - name: canary
    count: {CANARY}
    stratify_by: [rack, nvlink_domain]
    bake: 2m
    approval: auto
    max_in_flight: 4
  - name: rest
    rest: true
    bake: 2m
    approval: auto
    max_in_flight: 8
"
    );
    let mut text = format!(
        "{}{waves}{}{}",
        &POLICY[..waves_at],
        &POLICY[concurrency_at..windows_at],
        &POLICY[health_at..]
    );
    text = replace(text, "per_cluster_percent: 5", "per_cluster_percent: 50")?;
    for interval in ["interval: 30m", "interval: 1h", "interval: 15m"] {
        ensure!(
            text.contains(interval),
            "policies/hgx-dcgm.yaml no longer contains {interval:?}"
        );
        text = text.replace(interval, "interval: 20s");
    }
    Ok(text)
}

/// One fleet: names prefixed with `prefix` (Prometheus sees all four fleets, so node names must not
/// collide), high enough base rates that every rate gate has events in a two-minute bake, events drawn
/// in 5-second buckets so a firmware effect starts within seconds of activation, and the releases.
fn scenario(prefix: &str, seed: u64) -> Scenario {
    let yaml = format!(
        r#"
seed: {seed}
fleet:
  nodes: {NODES}
  racks: 6
  clusters: 1
  sku: {SKU}
  name_prefix: {prefix}
  nodes_per_nvlink_domain: 2
  components:
    - {{id: "HGX_FW_GPU_{{0..7}}", kind: gpu, version: "{GPU_FROM}"}}
baseline:
  xid_errors_per_gpu_hour: 60
  pcie_aer_per_node_hour: 300
  event_bucket: 5s
dcgm:
  xid_count_window: 10s
  ecc_dbe_per_gpu_hour: 6
  nvlink_crc_per_gpu_hour: 30
  remapped_rows_per_gpu_hour: 3
  row_remap_spares: 10000
firmware:
  - {{kind: gpu, version: "{GPU_FROM}", flash_time: {{min: 1s, max: 2s}}}}
  - {{kind: gpu, version: "{GPU_GOOD}", flash_time: {{min: 1s, max: 2s}}}}
  - kind: gpu
    version: "{GPU_XID}"
    flash_time: {{min: 1s, max: 2s}}
    effects:
      - {{metric: xid_errors_per_gpu_hour, multiply: 6.0, share: 1.0, onset: 0s}}
  - kind: gpu
    version: "{GPU_PCIE}"
    flash_time: {{min: 1s, max: 2s}}
    effects:
      - {{metric: pcie_aer_per_node_hour, multiply: 8.0, share: 1.0, onset: 0s}}
bmc_faults:
  reset_time: {{min: 1s, max: 2s}}
  reboot_time: {{min: 1s, max: 2s}}
"#
    );
    Scenario::from_yaml_str(&yaml).unwrap_or_else(|e| panic!("scenario: {e}"))
}

/// What happens to a world's canary during its bake.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Disturbance {
    /// One canary node's exporter restarts (with a driver reload): its counters drop to zero.
    ExporterRestart,
    /// One canary node's exporter stops for good: its series go stale.
    ExporterStop,
}

struct World {
    prefix: &'static str,
    sim: Harness,
    release: orchestrator_types::ReleaseId,
    rollout: RolloutId,
    engine: orchestrator_engine::Engine,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rollouts_gated_on_dcgm_through_prometheus_catch_regressions_and_survive_restarts() {
    let Some(prometheus) = required_program(
        &["prometheus"],
        "the DCGM-through-Prometheus rollout test",
        "integration-tests/ci-setup.sh",
    ) else {
        return;
    };
    if let Err(err) = run(&prometheus).await {
        panic!("{err:?}");
    }
}

async fn run(prometheus_bin: &std::path::Path) -> anyhow::Result<()> {
    let worlds_spec = [
        ("xid", 31, GPU_XID),
        ("pcie", 32, GPU_PCIE),
        ("restart", 33, GPU_GOOD),
        ("gone", 34, GPU_GOOD),
    ];
    let mut sims = Vec::new();
    for (prefix, seed, version) in worlds_spec {
        let sim = Harness::builder(scenario(prefix, seed))
            .speedup(1.0)
            .sku(SKU)
            .start()
            .await
            .context("harness")?;
        sims.push((prefix, version, sim));
    }
    let dir = tempfile::tempdir()?;
    let jobs: String = sims
        .iter()
        .map(|(prefix, _, sim)| {
            format!(
                "  - job_name: dcgm-{prefix}\n    metrics_path: /sim/dcgm/metrics\n    static_configs:\n      - targets: [\"{}\"]\n",
                sim.fleet.control_url().trim_start_matches("http://")
            )
        })
        .collect();
    let config = format!("global:\n  scrape_interval: 1s\nscrape_configs:\n{jobs}");
    let (prometheus, port) = start_prometheus(prometheus_bin, dir.path(), &config).await?;

    let mut prometheus_config = PrometheusConfig::new(url::Url::parse(&format!("http://127.0.0.1:{port}"))?);
    prometheus_config.node_label = "Hostname".into();
    // Five scrape intervals: a stopped exporter is gone within seconds, a slow scrape is not.
    prometheus_config.staleness = chrono::TimeDelta::seconds(5);
    let client = PrometheusClient::new(prometheus_config)?;
    wait_for_scrapes(&client, sims.len() * NODES * 8).await?;

    let policy = policy()?;
    let mut worlds = Vec::new();
    for (prefix, version, sim) in sims {
        sim.add_qualified_release(GPU_FROM, "alice", &[]).await?;
        let release = sim.add_qualified_release(version, "alice", &[]).await?;
        let request = StartRollout {
            release_id: release,
            policy_source: policy.clone(),
            policy_commit: None,
            policy_blob: None,
            seed: 7,
        };
        let checks = StartChecks {
            prometheus: Some(client.clone()),
            ..Default::default()
        };
        if prefix == "xid" {
            // A gate on a field this fleet's exporters do not export is refused before any flash, naming
            // the gate and the canary's nodes.
            let unexported = policy.replacen(
                "query: DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
                "query: DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
                1,
            );
            let refused = start_rollout_checked(
                &sim.db,
                &StartRollout {
                    policy_source: unexported,
                    ..request.clone()
                },
                "alice",
                &checks,
            )
            .await
            .expect_err("a gate without series must not start");
            let message = refused.to_string();
            ensure!(
                matches!(&refused, EngineError::MissingSeries { missing } if missing.len() == 1
                    && missing[0].gate == "ecc_dbe" && missing[0].nodes.len() == CANARY),
                "{message}"
            );
            ensure!(
                message.contains(&format!("{prefix}-")),
                "the nodes are named: {message}"
            );
            ensure!(
                sim.db.exec_rollouts().await?.is_empty(),
                "a refused start stores nothing"
            );
        }
        let rollout = start_rollout_checked(&sim.db, &request, "alice", &checks)
            .await
            .with_context(|| format!("{prefix}: start the rollout"))?
            .0
            .id;
        let judge = DetectorJudge::new(sim.db.clone(), health_bmcs()).with_prometheus(client.clone());
        let engine = sim.spawn_engine(Arc::new(judge));
        worlds.push(World {
            prefix,
            sim,
            release,
            rollout,
            engine,
        });
    }

    let outcomes = match &worlds[..] {
        [xid, pcie, restart, gone] => {
            let (a, b, c, d) = tokio::join!(
                caught(xid, "xid_rate"),
                caught(pcie, "pcie_replay"),
                passes_despite(restart, Disturbance::ExporterRestart),
                passes_despite(gone, Disturbance::ExporterStop),
            );
            [a, b, c, d]
        }
        _ => bail!("four worlds expected"),
    };
    let failures: Vec<String> = worlds
        .iter()
        .zip(&outcomes)
        .filter_map(|(world, outcome)| outcome.as_ref().err().map(|err| format!("{}: {err:?}", world.prefix)))
        .collect();
    for world in worlds {
        world.engine.shutdown().await;
        world.sim.shutdown().await;
    }
    if !failures.is_empty() {
        eprintln!("prometheus log:\n{}", prometheus.log_tail());
        bail!("{}", failures.join("\n\n"));
    }
    Ok(())
}

/// Prometheus has scraped at least `series` GPU temperature series.
async fn wait_for_scrapes(client: &PrometheusClient, series: usize) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let data = client.query("count(DCGM_FI_DEV_GPU_TEMP)", chrono::Utc::now()).await;
        if let Ok(orchestrator_engine::prometheus::QueryData::Vector(v)) = &data
            && v.first().is_some_and(|s| s.value >= series as f64)
        {
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "Prometheus never scraped the exporters: {data:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn health_bmcs() -> Arc<RedfishConnector> {
    // The policy has no Redfish gate; the judge still needs a way to BMCs for the ones it could have.
    let resolve =
        Arc::new(|url: &str, _profile: &str| Ok(integration_tests::sim_endpoint(url).map_err(|e| e.to_string())?));
    Arc::new(RedfishConnector::new(HttpClients::new(), resolve))
}

async fn canary(world: &World) -> anyhow::Result<ExecWave> {
    let waves = world.sim.db.rollout_waves(world.rollout).await?;
    waves
        .into_iter()
        .find(|w| w.name == "canary")
        .context("the canary wave")
}

/// Polls until `done` says the world reached its end, or fails after [`LIMIT`] with the state.
async fn wait_until<F, Fut>(world: &World, what: &str, mut done: F) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<bool>>,
{
    let deadline = Instant::now() + LIMIT;
    loop {
        if done().await? {
            return Ok(());
        }
        if Instant::now() > deadline {
            let rollout = world.sim.db.exec_rollout(world.rollout).await?;
            let waves = world.sim.db.rollout_waves(world.rollout).await?;
            bail!(
                "not {what} after {LIMIT:?}: rollout {:?} ({:?}); waves {:?}",
                rollout.state,
                rollout.state_reason,
                waves
                    .iter()
                    .map(|w| format!("{}={} {:?} {:?}", w.name, w.state, w.blockers, w.verdict))
                    .collect::<Vec<_>>()
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The bad release is caught in the canary by `gate` before the bake ends, rolled back, and blocked.
async fn caught(world: &World, gate: &str) -> anyhow::Result<()> {
    wait_until(world, "rolled back", || async {
        let state = world.sim.db.exec_rollout(world.rollout).await?.state;
        ensure!(
            !matches!(state, RolloutState::Completed | RolloutState::Halted),
            "the rollout ended {state:?} instead of rolling back"
        );
        Ok(state == RolloutState::RolledBack)
    })
    .await?;
    let canary = canary(world).await?;
    ensure!(canary.state == WaveState::RolledBack, "canary {:?}", canary.state);
    let verdict = canary.verdict.as_ref().context("the canary's verdict")?;
    ensure!(verdict.outcome == Outcome::Fail, "{verdict:?}");
    ensure!(
        verdict.summary.starts_with(&format!("{gate}:")),
        "caught by the wrong gate: {}",
        verdict.summary
    );
    let looks = world.sim.db.health_looks(SampleScope::Wave(canary.id)).await?;
    let failed: Vec<_> = looks.iter().filter(|l| l.look.outcome == Outcome::Fail).collect();
    ensure!(
        failed.iter().all(|l| l.look.gate == gate),
        "only {gate} may fail: {:?}",
        failed.iter().map(|l| &l.look.gate).collect::<Vec<_>>()
    );
    let first = failed
        .iter()
        .map(|l| l.look.look_number)
        .min()
        .context("a failing look")?;
    let planned = failed[0].look.planned_looks;
    ensure!(
        first < planned,
        "caught only at the bake's end (look {first} of {planned})"
    );
    let release = world.sim.db.release(world.release).await?;
    ensure!(
        release.qualification_state == QualificationState::Blocked,
        "release is {:?}",
        release.qualification_state
    );
    // Every node runs the old firmware again, and nothing outside the canary was touched.
    for e in world.sim.fleet.endpoints() {
        let versions = world.sim.fleet.versions(&e.name).context("sim node")?;
        ensure!(
            versions.iter().all(|c| c.active == GPU_FROM),
            "{} runs {:?} after the rollback",
            e.name,
            versions.iter().map(|c| &c.active).collect::<Vec<_>>()
        );
    }
    println!("{}: caught by {gate} at look {first} of {planned}", world.prefix);
    Ok(())
}

/// A healthy release under a disturbance of one canary node's exporter: a restart must cost no false
/// event (the canary passes and is promoted); a stop must make the gates an error naming the node, never
/// a pass.
async fn passes_despite(world: &World, disturbance: Disturbance) -> anyhow::Result<()> {
    wait_until(world, "baking", || async {
        Ok(canary(world).await?.state == WaveState::Baking)
    })
    .await?;
    let canary_wave = canary(world).await?;
    let steps = world
        .sim
        .db
        .steps(&orchestrator_db::execution::StepFilter {
            rollout_id: Some(world.rollout),
            wave_id: Some(canary_wave.id),
            ..Default::default()
        })
        .await?;
    let node = world
        .sim
        .db
        .node(steps.first().context("a canary step")?.node_id)
        .await?;
    // Forty seconds into the two-minute bake: looks before and after see it.
    tokio::time::sleep(Duration::from_secs(40)).await;
    let action = match disturbance {
        Disturbance::ExporterRestart => "restart",
        Disturbance::ExporterStop => "stop",
    };
    reqwest::Client::new()
        .post(format!(
            "{}/sim/nodes/{}/dcgm",
            world.sim.fleet.control_url(),
            node.name
        ))
        .json(&serde_json::json!({ "action": action }))
        .send()
        .await?
        .error_for_status()?;

    wait_until(world, "judged", || async {
        let wave = canary(world).await?;
        Ok(wave.verdict.is_some() && wave.state != WaveState::Baking)
    })
    .await?;
    let wave = canary(world).await?;
    let verdict = wave.verdict.as_ref().context("verdict")?;
    let looks = world.sim.db.health_looks(SampleScope::Wave(wave.id)).await?;
    ensure!(
        looks.iter().all(|l| l.look.outcome != Outcome::Fail),
        "a healthy release failed a look: {:?}",
        looks
            .iter()
            .filter(|l| l.look.outcome == Outcome::Fail)
            .map(|l| (&l.look.gate, &l.look.verdict))
            .collect::<Vec<_>>()
    );
    match disturbance {
        Disturbance::ExporterRestart => {
            ensure!(
                verdict.outcome == Outcome::Pass && wave.state == WaveState::Promoted,
                "the canary should pass: {:?} {verdict:?}",
                wave.state
            );
            let release = world.sim.db.release(world.release).await?;
            ensure!(release.qualification_state != QualificationState::Blocked);
        }
        Disturbance::ExporterStop => {
            ensure!(
                verdict.outcome == Outcome::Error,
                "a vanished canary node must be an error: {verdict:?}"
            );
            ensure!(
                verdict.summary.contains(&node.name),
                "the error must name {}: {}",
                node.name,
                verdict.summary
            );
            ensure!(wave.state != WaveState::Promoted, "promoted without the node's data");
            // A source error spends no look (a later pass asks again); the verdict's per-gate evidence
            // names the node for every rate gate, the counters and the windowed XID count alike.
            let gates = verdict.evidence["gates"].as_array().context("per-gate evidence")?;
            for rate_gate in ["xid_rate", "pcie_replay", "ecc_dbe"] {
                let entry = gates
                    .iter()
                    .find(|g| g["gate"] == rate_gate)
                    .with_context(|| format!("{rate_gate} in {gates:?}"))?;
                ensure!(
                    entry.to_string().contains(&node.name),
                    "{rate_gate} does not name {}: {entry}",
                    node.name
                );
            }
        }
    }
    println!(
        "{}: canary {} after {} looks; {}",
        world.prefix,
        wave.state,
        looks.len(),
        verdict.summary
    );
    Ok(())
}
