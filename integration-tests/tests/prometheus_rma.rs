//! The RMA monitor reading DCGM through a REAL Prometheus (issue 25), on wall time: bmc-sim's
//! exporters are scraped every second; one GPU's row remapping fails and another falls off the bus.
//! One pass finds the row-remap failure flag on the right serial (a candidate of NVIDIA's
//! `row_remap_failure` rule, awaiting the field diagnostic) and records the vanished GPU's absent
//! series (the `series_vanished` signal) while its node keeps reporting.
//!
//! Skipped loudly when `prometheus` is missing; a failure when `WAVEGUARD_REQUIRE_ALL=1`.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use chrono::TimeDelta;
use integration_tests::process::start_prometheus;
use integration_tests::{Harness, REQUIRE_ALL_ENV, ScenarioYaml, find_program};
use orchestrator_db::rma::RmaFilter;
use orchestrator_db::testing::fixtures::put_example_rma_criteria;
use orchestrator_engine::prometheus::{PrometheusClient, PrometheusConfig};
use orchestrator_engine::rma::{RmaConfig, RmaMonitor};
use orchestrator_rma::{CandidateStatus, HealthFlag, ObservationKind};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dcgm_row_remap_failure_and_a_vanished_gpu_through_prometheus() {
    let Some(prometheus) = find_program(&["prometheus"]) else {
        let require_all = std::env::var(REQUIRE_ALL_ENV).is_ok_and(|v| v == "1");
        assert!(
            !require_all,
            "{REQUIRE_ALL_ENV}=1 but `prometheus` is not on PATH; run integration-tests/ci-setup.sh"
        );
        eprintln!("\n\n*** SKIPPED prometheus_rma test: `prometheus` not on PATH ***\n\n");
        return;
    };
    if let Err(err) = run(&prometheus).await {
        panic!("{err:?}");
    }
}

async fn run(prometheus_bin: &Path) -> anyhow::Result<()> {
    let scenario = ScenarioYaml::hgx(4)
        .baseline("xid_errors_per_gpu_hour: 0")
        .section(
            "hardware:\n  failures:\n    \
             - {node: node-00001, gpu: 3, mode: row_remap_failure, at: 2s}\n    \
             - {node: node-00002, gpu: 6, mode: fallen_off_bus, at: 2s}",
        )
        .build();
    let h = Harness::builder(scenario)
        .speedup(1.0)
        .start()
        .await
        .context("harness")?;
    let control = h.fleet.control_url().trim_start_matches("http://").to_owned();
    let config = format!(
        "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: dcgm\n    metrics_path: /sim/dcgm/metrics\n    \
         static_configs:\n      - targets: [\"{control}\"]\n"
    );
    let (prometheus, port) = start_prometheus(prometheus_bin, h.dir.path(), &config).await?;
    let outcome = steps(&h, port).await;
    if outcome.is_err() {
        eprintln!("prometheus log:\n{}", prometheus.log_tail());
    }
    h.shutdown().await;
    outcome
}

async fn steps(h: &Harness, port: u16) -> anyhow::Result<()> {
    put_example_rma_criteria(&h.db).await?;
    let mut config = PrometheusConfig::new(url::Url::parse(&format!("http://127.0.0.1:{port}"))?);
    config.node_label = "Hostname".into();
    let client = PrometheusClient::new(config)?;
    let monitor = RmaMonitor::new(
        h.db.clone(),
        h.redfish(),
        Some(client.clone()),
        RmaConfig {
            collect_diagnostics: false,
            ..Default::default()
        },
    );
    // Discovery first (the serials), then wait until Prometheus has scraped the failure.
    let first = monitor.pass().await?;
    ensure!(first.node_errors.is_empty(), "{:?}", first.node_errors);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let data = client.query("count(DCGM_FI_DEV_ROW_REMAP_FAILURE > 0)", h.now()).await;
        if let Ok(orchestrator_engine::prometheus::QueryData::Vector(v)) = &data
            && v.first().is_some_and(|s| s.value >= 1.0)
        {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "Prometheus never saw the row-remap failure: {data:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let report = monitor.pass().await?;
    ensure!(report.prometheus_error.is_none(), "{:?}", report.prometheus_error);

    let failures = h.fleet.hardware_failures();
    let serial_of = |node: &str| {
        failures
            .iter()
            .find(|f| f.node == node)
            .map(|f| f.serial.clone())
            .context("ground truth")
    };
    let remapped = serial_of("node-00001")?;
    let vanished = serial_of("node-00002")?;

    let cases = h.db.rma_cases(&RmaFilter::default()).await?;
    let case = cases
        .iter()
        .find(|c| c.case.serial == remapped)
        .with_context(|| format!("a case for {remapped}: {cases:?}"))?;
    ensure!(case.case.rule == "row_remap_failure", "{:?}", case.case);
    ensure!(case.candidate.status == CandidateStatus::AwaitingConfirmation);
    ensure!(
        case.candidate.samples.iter().any(|s| s.kind
            == ObservationKind::Flag {
                flag: HealthFlag::RowRemapFailure,
                set: true
            }),
        "{:?}",
        case.candidate.samples
    );
    ensure!(
        cases
            .iter()
            .all(|c| c.case.serial == remapped || c.case.serial == vanished),
        "no other GPU is a candidate: {cases:?}"
    );

    let observed =
        h.db.part_observations(std::slice::from_ref(&vanished), h.now() - TimeDelta::hours(1))
            .await?;
    ensure!(
        observed.get(&vanished).is_some_and(|o| o
            .iter()
            .any(|s| s.kind == ObservationKind::SeriesScrape { present: false })),
        "the vanished GPU's absent series is a sample: {observed:?}"
    );
    Ok(())
}
