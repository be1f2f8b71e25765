//! `waveguard bench --only rma`: one pass of RMA candidate detection (pure `orchestrator-rma`)
//! over a synthetic fleet, timed, with the process's memory.
//!
//! Each GPU carries a day of observations as the collector would hand them over: a DCGM scrape every
//! 30 minutes (series present or not), a row-remap flag reading every 3 hours, scattered XID 79s;
//! 0.5% of GPUs fail (three XID 79s within hours and a failed field diagnostic, a set row-remap flag
//! and a failed diagnostic, or a vanished series). The pass runs node by node, as the collector
//! streams them, so memory stays at one node's observations plus the candidates found.

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
