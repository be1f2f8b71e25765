//! `waveguard bench --only rma`: one pass of RMA candidate detection (pure `orchestrator-rma`)
//! over a synthetic fleet, timed, with the process's memory; then the RMA monitor's own passes
//! (`engine::rma::RmaMonitor`) over the same fleet stored in SQLite: its controller-side cost per
//! pass (reading parts and samples, judging, opening and refreshing cases, the cluster scan), with
//! BMC reads refused at once so that only the controller is measured.
//!
//! Each GPU carries a day of observations as the collector would hand them over: a DCGM scrape every
//! 30 minutes (series present or not), a row-remap flag reading every 3 hours, scattered XID 79s;
//! 0.5% of GPUs fail (three XID 79s within hours and a failed field diagnostic, a set row-remap flag
//! and a failed diagnostic, or a vanished series). The pass runs node by node, as the collector
//! streams them, so memory stays at one node's observations plus the candidates found.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{TimeDelta, TimeZone, Utc};
use orchestrator_rma::synthetic::day_of_observations;
use orchestrator_rma::{PartRecord, find_candidates, parse_criteria};
use rand::SeedableRng;

const CRITERIA: &str = include_str!("../../../policies/rma/nvidia-gpu.yaml");
const GPUS_PER_NODE: usize = 8;

fn rss_kib(key: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(key))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}

/// Runs the benchmark over `gpus` GPUs and prints the figures.
pub fn run(gpus: usize) {
    println!("\n== rma: candidate detection, one pass over {gpus} GPUs (a day of observations each) ==");
    let criteria = match parse_criteria(CRITERIA) {
        Ok(c) => vec![c],
        Err(err) => {
            println!("cannot parse policies/rma/nvidia-gpu.yaml: {err}");
            return;
        }
    };
    let Some(start) = Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).single() else {
        return;
    };
    let now = start + TimeDelta::days(1);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
    let rss_before = rss_kib("VmRSS:");
    let (mut judging, mut observed, mut candidates) = (Duration::ZERO, 0usize, Vec::new());
    let started = Instant::now();
    for node in 0..gpus.div_ceil(GPUS_PER_NODE) {
        for slot in 0..GPUS_PER_NODE.min(gpus - node * GPUS_PER_NODE) {
            let serial = format!("16549{node:06}{slot}");
            let obs = day_of_observations(&mut rng, start, &serial);
            observed += obs.len();
            let part = PartRecord {
                serial,
                vendor: "nvidia".into(),
                part_kind: "gpu".into(),
                part_number: "699-2G520-0200-000".into(),
                node: format!("node-{node:06}"),
                slot: format!("GPU_{slot}"),
            };
            let t = Instant::now();
            candidates.extend(find_candidates(&criteria, &part, &obs, &[], now));
            judging += t.elapsed();
        }
    }
    let total = started.elapsed();
    let met = candidates
        .iter()
        .filter(|c| c.status == orchestrator_rma::CandidateStatus::Met)
        .count();
    println!(
        "{} observations, {} candidates ({met} met); rule evaluation {:.2} s per pass ({:.1} µs per GPU); with generating the observations {:.2} s",
        observed,
        candidates.len(),
        judging.as_secs_f64(),
        judging.as_secs_f64() * 1e6 / gpus.max(1) as f64,
        total.as_secs_f64()
    );
    println!(
        "memory: RSS {:.1} MiB before, {:.1} MiB after, peak {:.1} MiB (node by node: one node's observations at a time)",
        rss_before as f64 / 1024.0,
        rss_kib("VmRSS:") as f64 / 1024.0,
        rss_kib("VmHWM:") as f64 / 1024.0
    );
}

/// The monitor's passes over `gpus` GPUs stored in a throw-away SQLite database: the samples the
/// monitor would have stored for the synthetic day (faults only: absences, set flags, XIDs,
/// diagnostic verdicts), the nodes' BMCs refused by the credential profiles (no profile is
/// configured), so a pass costs what the controller spends around the BMC reads.
pub async fn run_monitor(gpus: usize) -> anyhow::Result<()> {
    use orchestrator_db::model::{NewNode, NodeLabels};
    use orchestrator_db::parts::DiscoveredPart;
    use orchestrator_db::rma::CriteriaFile;
    use orchestrator_db::rma_evidence::is_fault_sample;

    println!("\n== rma: the monitor's passes over {gpus} GPUs stored in SQLite (BMC reads refused) ==");
    let Some(start) = Utc.with_ymd_and_hms(2026, 1, 5, 0, 0, 0).single() else {
        return Ok(());
    };
    let clock = Arc::new(orchestrator_types::ManualClock::new(start));
    let dir = tempfile::tempdir()?;
    let url = format!("sqlite://{}", dir.path().join("rma.db").display());
    let db = orchestrator_db::Db::connect_and_migrate(&url, clock.clone()).await?;
    let nodes = gpus.div_ceil(GPUS_PER_NODE);
    let new_nodes: Vec<NewNode> = (0..nodes)
        .map(|i| NewNode {
            name: format!("node-{i:06}"),
            bmc_url: format!("https://10.{}.{}.{}", i / 65536 % 256, i / 256 % 256, i % 256),
            credential_ref: "lab".into(),
            platform_sku: "hgx-h100-8gpu".into(),
            labels: NodeLabels {
                region: "r1".into(),
                cluster: format!("c{}", i % 40),
                rack: format!("rack-{}", i / 20),
                nvlink_domain: format!("nvl-{}", i / 4),
            },
        })
        .collect();
    let t = Instant::now();
    db.import_nodes(&new_nodes, "bench").await?;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
    let mut stored = 0u64;
    for node in 0..nodes {
        let name = format!("node-{node:06}");
        let mut found = Vec::new();
        let mut samples = Vec::new();
        for slot in 0..GPUS_PER_NODE.min(gpus - node * GPUS_PER_NODE) {
            let serial = format!("16549{node:06}{slot}");
            samples.extend(
                day_of_observations(&mut rng, start, &serial)
                    .into_iter()
                    .filter(is_fault_sample)
                    .map(|o| (serial.clone(), o)),
            );
            found.push(DiscoveredPart {
                serial,
                vendor: "nvidia".into(),
                part_kind: "gpu".into(),
                part_number: "699-2G520-0200-000".into(),
                model: Some("H100 SXM5".into()),
                slot: format!("GPU_{slot}"),
                production_date: None,
                firmware_version: Some("96.00.5E.00.01".into()),
                health: Some("OK".into()),
            });
        }
        db.record_node_parts(&name, &found).await?;
        stored += db.record_part_observations(&samples).await?;
    }
    db.replace_rma_criteria(
        &[CriteriaFile {
            path: "rma/nvidia-gpu.yaml".into(),
            commit_id: "bench".into(),
            blob_id: orchestrator_rma::evidence::sha256_hex(CRITERIA.as_bytes()),
            source: CRITERIA.into(),
        }],
        "bench",
    )
    .await?;
    println!(
        "setup: {nodes} nodes, {gpus} parts, {stored} stored samples in {:.1} s",
        t.elapsed().as_secs_f64()
    );

    let profiles = BTreeMap::new();
    let resolve = Arc::new(move |bmc_url: &str, credential_ref: &str| {
        orchestrator_engine::bmc_access::ProfileResolver::new(&profiles)
            .endpoint_for(bmc_url, credential_ref)
            .map_err(orchestrator_engine::ResolveError::from)
    });
    let connector = Arc::new(orchestrator_engine::RedfishConnector::new(
        orchestrator_bmc::HttpClients::new(),
        resolve,
    ));
    let monitor = orchestrator_engine::rma::RmaMonitor::new(
        db.clone(),
        connector,
        None,
        orchestrator_engine::rma::RmaConfig {
            concurrency: 64,
            ..Default::default()
        },
    );
    clock.advance(TimeDelta::days(1));
    for label in ["first pass (opens the cases)", "second pass (steady state)"] {
        let t = Instant::now();
        let report = monitor.pass().await?;
        println!(
            "{label}: {:.2} s; {} candidates, {} cases opened, {} nodes refused; RSS peak {:.1} MiB",
            t.elapsed().as_secs_f64(),
            report.candidates,
            report.cases_opened.len(),
            report.node_errors.len(),
            rss_kib("VmHWM:") as f64 / 1024.0
        );
        clock.advance(TimeDelta::minutes(1));
    }
    db.close().await?;
    Ok(())
}
