//! `waveguard bench`: the figures in BENCHMARKS.md, printed, never asserted.
//!
//! - throughput: a simulated fleet with zero flash time rolled canary → fleet
//!   by the real engine over loopback Redfish, on SQLite and PostgreSQL;
//!   controller CPU is counted per thread, without bmc-sim's threads (the
//!   fleet runs on a runtime of its own); then Ansible's `redfish_command`
//!   SimpleUpdate on a small fleet of the same kind, for comparison
//!   (`bench_ansible`);
//! - scale: process RSS and latency of the main API list endpoints with a
//!   large fleet in the database (in-process router, no network);
//! - detection: whole rollouts of a 1,000-node fleet simulated without I/O
//!   (`detection_sim`), judged by the fleet-scale method and by the current
//!   per-wave method in the same run: detection rate, nodes exposed and time
//!   at detection against the information bound, false rollbacks, holds,
//!   time for each wave to pass, fleet-proven;
//! - latency: pages and API lists over TCP at 100,000 nodes with a rollout
//!   stored (idle and while steps move) and in the demo's world at two
//!   moments of its story (`bench_latency`).

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::Context as _;
use orchestrator_db::model::{NewNode, NodeLabels};
use orchestrator_detect::fleet::ErrorBudget;
use orchestrator_detect::fleet::sim as detection_sim;
use orchestrator_planner::power;
use orchestrator_policy::{Direction, GateSource, HealthGate, RedfishMetric, WaveSize};
use orchestrator_sim::bench::{FreshPostgres, fitting_nodes, machine, proc_status_kib};

use crate::Context;

/// Which benchmark.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Which {
    /// Rollout throughput on SQLite and PostgreSQL.
    Throughput,
    /// API latency and RSS with a large fleet in the database.
    Scale,
    /// Detection power, time to detect and false alarms.
    Detection,
    /// RMA candidate detection over a large fleet (time per pass, memory).
    Rma,
    /// Page and API latency over TCP: a large fleet with a rollout stored
    /// (idle and while steps move), and the demo's world at two moments.
    Latency,
}

/// Options of `waveguard bench`.
#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    /// Benchmarks to run (repeatable; default all).
    #[arg(long, value_enum)]
    only: Vec<Which>,
    /// Simulated BMCs for the throughput run.
    #[arg(long, default_value_t = 10_000, value_name = "N")]
    nodes: usize,
    /// Run the throughput run's BMCs in N processes of their own (this
    /// executable as bmc-sim, on 127.0.0.2, 127.0.0.3, ..., with HTTP
    /// keep-alive), as a controller meets its BMCs; 0 (the default): enough
    /// that each fits half the open-file limit it inherits (at most 10,000
    /// nodes each).
    #[arg(long, default_value_t = 0, value_name = "N", conflicts_with = "fleet_in_process")]
    fleet_processes: usize,
    /// Run the throughput run's BMCs in this process instead, on their own
    /// threads, answering `Connection: close` (every BMC's listener and a
    /// kept-alive connection to each would not fit one process's open
    /// files): each Redfish request then also pays a TCP connect.
    #[arg(long)]
    fleet_in_process: bool,
    /// Simulated BMCs that Ansible's `redfish_command` SimpleUpdate updates
    /// after the throughput runs, on a fleet of its own, for comparison
    /// (needs `ansible-playbook` with community.general); 0 skips it.
    #[arg(long, default_value_t = 200, value_name = "N")]
    ansible_hosts: usize,
    /// `forks` values of the Ansible comparison, each run on a fresh fleet.
    #[arg(long, default_value = "10,50", value_delimiter = ',', value_name = "N,...")]
    ansible_forks: Vec<usize>,
    /// Nodes in the database for the scale run.
    #[arg(long, default_value_t = 100_000, value_name = "N")]
    scale_nodes: usize,
    /// PostgreSQL server (a fresh database is created on it and dropped
    /// after); empty to skip PostgreSQL.
    #[arg(long, default_value = "postgres://postgres@127.0.0.1:5432/test", value_name = "URL")]
    postgres_url: String,
    /// Seeds (simulated rollouts) per harmful, confounder and hot-node detection cell.
    #[arg(long, default_value_t = 200, value_name = "N")]
    seeds: u32,
    /// Seeds for the healthy detection cell.
    #[arg(long, default_value_t = 1000, value_name = "N")]
    healthy_seeds: u32,
    /// GPUs in the RMA candidate-detection run.
    #[arg(long, default_value_t = 100_000, value_name = "N")]
    rma_gpus: usize,
    /// Nodes (each with nine inventory rows and a step of the stored
    /// rollout) in the latency run's large world; 0 skips it.
    #[arg(long, default_value_t = 100_000, value_name = "N")]
    latency_nodes: usize,
    /// Sequential requests per endpoint and moment in the latency run.
    #[arg(long, default_value_t = 100, value_name = "N")]
    latency_requests: usize,
    /// Node-updates per second the latency run's step writer makes while
    /// "a rollout runs" in the large world.
    #[arg(long, default_value_t = 150.0, value_name = "N")]
    latency_write_rate: f64,
    /// Nodes of the demo's world in the latency run; 0 skips it.
    #[arg(long, default_value_t = 5_000, value_name = "N")]
    latency_demo_nodes: usize,
    /// Simulated seconds per real second of the latency run's demo world.
    #[arg(long, default_value_t = 300.0, value_name = "N")]
    latency_speedup: f64,
}

/// `waveguard bench`.
pub async fn run(args: BenchArgs, _context: &Context) -> anyhow::Result<ExitCode> {
    let all = args.only.is_empty();
    let wants = |w: Which| all || args.only.contains(&w);
    println!("machine: {}", machine());
    if wants(Which::Detection) {
        detection(args.seeds, args.healthy_seeds)?;
    }
    if wants(Which::Rma) {
        super::bench_rma::run(args.rma_gpus);
        super::bench_rma::run_monitor(args.rma_gpus).await?;
    }
    if wants(Which::Throughput) {
        let processes = (!args.fleet_in_process).then(|| match args.fleet_processes {
            0 => bmc_sim::ProcessOptions::processes_for(args.nodes),
            n => n,
        });
        let nodes = match processes {
            // Fleet processes hold their own descriptors; the controller's are bounded.
            Some(_) => args.nodes,
            None => {
                let (nodes, note) = fitting_nodes(args.nodes);
                if let Some(note) = note {
                    println!("{note}");
                }
                nodes
            }
        };
        if args.ansible_forks.is_empty() || args.ansible_forks.contains(&0) {
            return Err(super::BadInput("--ansible-forks takes counts of at least 1, e.g. 10,50".into()).into());
        }
        let mut runs = vec![throughput(nodes, None, processes).await?];
        if args.postgres_url.is_empty() {
            println!("throughput on PostgreSQL: skipped (--postgres-url is empty)");
        } else {
            match FreshPostgres::create(&args.postgres_url) {
                Ok(pg) => {
                    let outcome = throughput(nodes, Some(&pg.url), processes).await;
                    pg.drop_database();
                    runs.push(outcome?);
                }
                Err(err) => println!("throughput on PostgreSQL: SKIPPED ({:#})", anyhow::Error::new(err)),
            }
        }
        let ansible = super::bench_ansible::Options {
            hosts: args.ansible_hosts,
            forks: args.ansible_forks.clone(),
        };
        super::bench_ansible::run(&ansible, &runs).await;
    }
    if wants(Which::Scale) {
        scale(args.scale_nodes).await?;
    }
    if wants(Which::Latency) {
        let demo_ok = args.latency_demo_nodes == 0 || (20..=5_000).contains(&args.latency_demo_nodes);
        if !demo_ok || args.latency_nodes + args.latency_demo_nodes == 0 {
            return Err(super::BadInput(format!(
                "--latency-demo-nodes must be 20 to 5000, or 0 to skip the demo's world (--latency-nodes 0 skips \
                 the large one; not both) (got {} and {})",
                args.latency_nodes, args.latency_demo_nodes
            ))
            .into());
        }
        let speedup_ok = args.latency_speedup.is_finite() && args.latency_speedup >= 1.0;
        let rate_ok = args.latency_write_rate.is_finite() && args.latency_write_rate > 0.0;
        if !speedup_ok || !rate_ok || args.latency_requests == 0 {
            return Err(super::BadInput(
                "--latency-speedup must be >= 1, --latency-write-rate above 0, --latency-requests at least 1".into(),
            )
            .into());
        }
        super::bench_latency::run(&super::bench_latency::Options {
            nodes: args.latency_nodes,
            requests: args.latency_requests,
            write_rate: args.latency_write_rate,
            demo_nodes: args.latency_demo_nodes,
            speedup: args.latency_speedup,
        })
        .await?;
    }
    Ok(ExitCode::SUCCESS)
}

async fn throughput(
    nodes: usize,
    postgres: Option<&str>,
    processes: Option<usize>,
) -> anyhow::Result<super::bench_ansible::WaveguardRun> {
    let backend = if postgres.is_some() { "PostgreSQL" } else { "SQLite" };
    let placement = match processes {
        Some(n) => format!("fleet in {n} bmc-sim processes, keep-alive"),
        None => "fleet in this process, Connection: close".to_owned(),
    };
    println!(
        "\n== throughput: {nodes} simulated BMCs, zero flash time, canary (100) -> fleet, {backend}, {placement} =="
    );
    let run = orchestrator_sim::bench::throughput(nodes, postgres, processes).await?;
    println!(
        "policy: {} (Redfish health gates xid_errors and gpu_temp, judged against control cohorts)",
        run.policy
    );
    println!(
        "setup (fleet start, import, inventory, release): {:.1}s",
        run.setup.as_secs_f64()
    );
    println!(
        "outcome: rollout {} ({} of {} steps succeeded)",
        run.state, run.succeeded, run.steps
    );
    println!("planning + storing the plan: {:.2}s", run.planned.as_secs_f64());
    println!(
        "wall time (start_rollout -> completed, bakes included): {:.1}s; node-updates/s: {:.0}",
        run.wall.as_secs_f64(),
        run.succeeded as f64 / run.wall.as_secs_f64()
    );
    println!(
        "of which baking: {:.1}s (simulated clock at {:.0}x); health polls recorded: {}",
        run.baking.as_secs_f64(),
        run.speedup,
        run.health_polls
    );
    println!(
        "CPU seconds: controller {:.1}, bmc-sim {:.1}; controller CPU per node-update: {:.2} ms",
        run.controller_cpu,
        run.sim_cpu,
        run.controller_cpu * 1000.0 / run.succeeded.max(1) as f64
    );
    println!("load average at the end: {}", load_average());
    match run.fleet_processes {
        Some(n) => {
            println!("peak RSS of the controller process: {:.0} MiB", run.peak_rss_mib);
            println!(
                "peak RSS of the {n} bmc-sim processes: {} MiB",
                run.fleet_rss_mib
                    .iter()
                    .map(|m| format!("{m:.0}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
        None => println!(
            "peak RSS of the process (controller + {nodes} simulated BMCs): {:.0} MiB",
            run.peak_rss_mib
        ),
    }
    println!("BMC connection bound: {}", run.connection_limit);
    Ok(super::bench_ansible::WaveguardRun {
        backend,
        updates_per_second: run.succeeded as f64 / run.wall.as_secs_f64(),
        cpu_per_update: run.controller_cpu / run.succeeded.max(1) as f64,
    })
}

/// The machine's 1/5/15-minute load averages, for reading the wall-clock figures.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

// ---------------------------------------------------------------------------

async fn scale(nodes: usize) -> anyhow::Result<()> {
    use axum::body::Body;
    use axum::http::{Request, StatusCode};
    use tower::ServiceExt as _;

    println!("\n== scale: {nodes} nodes in SQLite; API list endpoints, in-process router ==");
    let dir = tempfile::tempdir().context("temp dir")?;
    let url = format!("sqlite://{}", dir.path().join("scale.db").display());
    let db = orchestrator_db::Db::connect_and_migrate(&url, std::sync::Arc::new(orchestrator_types::SystemClock))
        .await
        .context("database")?;
    let rss_before = proc_status_kib("/proc/self/status", "VmRSS:").unwrap_or(0);
    let started = Instant::now();
    let all: Vec<NewNode> = (0..nodes)
        .map(|i| NewNode {
            name: format!("node-{i:06}"),
            bmc_url: format!("https://10.{}.{}.{}", i / 65536 % 256, i / 256 % 256, i % 256),
            credential_ref: "prod".into(),
            platform_sku: if i % 3 == 0 { "hgx-b200-8gpu" } else { "hgx-h100-8gpu" }.into(),
            labels: NodeLabels {
                region: format!("region-{}", i % 4),
                cluster: format!("cluster-{}", i % 40),
                rack: format!("rack-{}", i / 20),
                nvlink_domain: format!("nvl-{}", i / 4),
            },
        })
        .collect();
    for chunk in all.chunks(5_000) {
        db.import_nodes(chunk, "bench").await.context("import")?;
    }
    println!("imported {nodes} nodes in {:.1}s", started.elapsed().as_secs_f64());
    // An API token for an admin, as automation would use.
    let token = "wg_bench_token_0123456789abcdef0123456789abcdef";
    db.add_user("bench", "bench", orchestrator_types::Role::Admin, None, "bench")
        .await
        .context("user")?;
    db.add_api_token("bench", "bench", &web::auth::token_hash(token), "bench")
        .await
        .context("token")?;
    let app = web::app(web::AppState::new(db.clone()));
    let paths = [
        "/api/v1/nodes?limit=100",
        "/api/v1/nodes?limit=100&offset=50000",
        "/api/v1/releases",
        "/api/v1/rollouts",
        "/api/v1/audit?limit=100",
        "/",
    ];
    for path in paths {
        let mut times = Vec::new();
        let mut status = StatusCode::OK;
        for _ in 0..200 {
            let request = Request::get(path)
                .header("authorization", format!("Bearer {token}"))
                .body(Body::empty())
                .context("request")?;
            let t = Instant::now();
            let response = app.clone().oneshot(request).await.context("oneshot")?;
            status = response.status();
            let _ = axum::body::to_bytes(response.into_body(), usize::MAX).await;
            times.push(t.elapsed());
        }
        times.sort();
        let p = |q: f64| times[((times.len() as f64 - 1.0) * q).round() as usize].as_secs_f64() * 1000.0;
        println!("GET {path:<40} {status}: p50 {:.2} ms, p99 {:.2} ms", p(0.50), p(0.99));
    }
    let rss = proc_status_kib("/proc/self/status", "VmRSS:").unwrap_or(0);
    println!(
        "RSS: {:.0} MiB before the import, {:.0} MiB after the requests",
        rss_before as f64 / 1024.0,
        rss as f64 / 1024.0
    );
    db.close().await.ok();
    Ok(())
}

// ---------------------------------------------------------------------------

fn quantile(sorted: &[f64], q: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let index = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted.get(index).copied()
}

fn fmt(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| format!("{v:.0}"))
}

fn pct(hits: usize, n: usize) -> String {
    format!("{:.1}%", 100.0 * hits as f64 / n.max(1) as f64)
}

/// The 95% one-sided Clopper-Pearson upper bound of a rate, in percent.
fn upper95(hits: usize, n: usize) -> f64 {
    100.0 * orchestrator_detect::stats::clopper_pearson_upper(hits as u64, n as u64, 0.05)
}

fn sorted(mut v: Vec<f64>) -> Vec<f64> {
    v.sort_by(f64::total_cmp);
    v
}

/// The figures of one cell and method that the ratio table compares.
#[derive(Debug, Clone, Copy)]
struct Summary {
    /// Share of rollouts stopped by a Fail (harmful: caught; healthy: false rollbacks).
    failed: f64,
    /// Share caught with only the canary on the release.
    canary: f64,
    /// Median nodes on the release at a catch.
    nodes50: Option<f64>,
    /// Median hours from the first flash to a catch.
    hours50: Option<f64>,
}

/// One cell's figures for one method.
fn report_cell(cell: &detection_sim::Cell, method: &str, runs: &[detection_sim::Run]) -> Summary {
    use detection_sim::End;
    let n = runs.len();
    let mut detect_h = Vec::new();
    let mut exposed = Vec::new();
    let (mut holds, mut proven, mut unjudged, mut canary_only, mut before_15) = (0, 0, 0, 0, 0);
    let mut hold_ext = Vec::new();
    let mut proven_h = Vec::new();
    for run in runs {
        match run.end {
            End::Detected { hour, exposed: e } => {
                detect_h.push(hour);
                exposed.push(e as f64);
                canary_only += usize::from(e <= 32);
                before_15 += usize::from(e * 100 < 15 * detection_sim::NODES);
            }
            End::Held { extension, .. } => {
                holds += 1;
                if extension.is_finite() {
                    hold_ext.push(extension);
                }
            }
            End::FleetProven { hour } => {
                proven += 1;
                proven_h.push(hour);
            }
            End::CompletedUnjudged { .. } => unjudged += 1,
        }
    }
    let detect_h = sorted(detect_h);
    let exposed = sorted(exposed);
    let wave = |k: usize| sorted(runs.iter().filter_map(|r| r.wave_pass_h[k]).collect());
    let (w0, w1) = (wave(0), wave(1));
    let hold_ext = sorted(hold_ext);
    let proven_h = sorted(proven_h);
    if cell.harmful() {
        println!(
            "{:<28} {:<7} {:>7} {:>7} {:>7} {:>9} {:>9} {:>14} {:>8} {:>6} {:>7} {:>7}",
            cell.label,
            method,
            pct(detect_h.len(), n),
            pct(canary_only, n),
            pct(before_15, n),
            format!("{}/{}", fmt(quantile(&exposed, 0.5)), fmt(quantile(&exposed, 0.9))),
            format!("{}/{}", fmt(quantile(&detect_h, 0.5)), fmt(quantile(&detect_h, 0.95))),
            detection_sim::bound_ratios(runs).text(),
            pct(holds, n),
            pct(proven, n),
            pct(unjudged, n),
            n
        );
    } else {
        let fails = detect_h.len();
        println!(
            "{:<28} {:<7} {:>7} {:>7.1}% {:>7} {:>9} {:>9} {:>9} {:>7} {:>9} {:>7} {:>6}",
            cell.label,
            method,
            pct(fails, n),
            upper95(fails, n),
            pct(holds, n),
            fmt(quantile(&hold_ext, 0.5)),
            format!("{}/{}", fmt(quantile(&w0, 0.5)), fmt(quantile(&w0, 0.95))),
            format!("{}/{}", fmt(quantile(&w1, 0.5)), fmt(quantile(&w1, 0.95))),
            pct(proven, n),
            fmt(quantile(&proven_h, 0.5)),
            pct(unjudged, n),
            n
        );
    }
    Summary {
        failed: detect_h.len() as f64 / n.max(1) as f64,
        canary: canary_only as f64 / n.max(1) as f64,
        nodes50: quantile(&exposed, 0.5),
        hours50: quantile(&detect_h, 0.5),
    }
}

/// Rollouts caught with at most `nodes` on the release.
fn caught_within(runs: &[detection_sim::Run], nodes: usize) -> usize {
    runs.iter()
        .filter(|r| matches!(r.end, detection_sim::End::Detected { exposed, .. } if exposed <= nodes))
        .count()
}

/// `policy power`'s predicted chance of a catch by a wave's end against the observed share, with the
/// observed share's two-sided 99% Clopper-Pearson interval and whether the prediction lies inside it.
fn calibration(predicted: f64, hits: usize, n: usize) -> (String, bool) {
    let (x, n64) = (hits as u64, n as u64);
    let lower = orchestrator_detect::stats::clopper_pearson_lower(x, n64, 0.005);
    let upper = orchestrator_detect::stats::clopper_pearson_upper(x, n64, 0.005);
    let inside = (lower..=upper).contains(&predicted);
    (
        format!(
            "{:>5.1}% {:>5.1}% [{:>5.1}, {:>5.1}] {:<3}",
            predicted * 100.0,
            100.0 * hits as f64 / n.max(1) as f64,
            lower * 100.0,
            upper * 100.0,
            if inside { "in" } else { "OUT" }
        ),
        inside,
    )
}

/// `a / b` to one decimal, or `-`.
fn ratio_text(a: Option<f64>, b: Option<f64>) -> String {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 && a.is_finite() => format!("{:.2}", a / b),
        _ => "-".into(),
    }
}

/// The example GPU policy the detection bench simulates, as built in: changing the example changes
/// the bench (issue 22: "under the example GPU policy").
const EXAMPLE_GPU_POLICY: (&str, &str) = (
    "policies/hgx-gpu-firmware.yaml",
    include_str!("../../../policies/hgx-gpu-firmware.yaml"),
);

/// Strata of the simulated fleet (`detection_sim`: four rack rows); a wave is spread evenly over them.
const SIM_STRATA: usize = 4;

/// The metrics the simulated world has, in the order of `BenchPolicy::nulls`.
const SIM_METRICS: [RedfishMetric; 4] = [
    RedfishMetric::XidErrorsPerGpuHour,
    RedfishMetric::PcieAerPerNodeHour,
    RedfishMetric::GpuTempC,
    RedfishMetric::GpuPowerW,
];

/// Why a policy cannot be simulated by the detection bench.
#[derive(Debug, thiserror::Error)]
#[error("{file}: the detection bench cannot simulate this policy: {reason}")]
pub struct BenchPolicyError {
    file: String,
    reason: String,
}

/// The detection bench's policy derived from a policy file: its canary, one percentage wave and the
/// rest (sizes on the simulated 1,000 nodes, spread over the 4 strata), bakes, `max_bake`s, each gate's
/// `must_detect` per wave and over the soak (the last wave's; a wave's own where it sets one), the
/// holdback the planner would keep (rounded down to whole nodes per stratum), the soak's `min`/`max`,
/// the four gates' `min_effect` (the nulls), the detection budgets, and `health.alpha` for the current
/// method.
/// The simulated world has XID, PCIe AER, GPU temperature and power, all bad when they rise, judged
/// by every wave: a policy with other gates, or a wave that leaves one out, is refused rather than
/// simulated as something it is not.
fn bench_policy(file: &str, source: &str) -> Result<detection_sim::BenchPolicy, BenchPolicyError> {
    let refuse = |reason: String| BenchPolicyError {
        file: file.to_owned(),
        reason,
    };
    let policy = orchestrator_policy::parse_policy(source).map_err(|e| refuse(e.to_string()))?;
    let gates = SIM_METRICS
        .iter()
        .map(|metric| {
            policy
                .health
                .gates
                .iter()
                .find(|g| matches!(g.source, GateSource::Redfish { metric: m } if m == *metric))
                .ok_or_else(|| refuse(format!("it has no gate on {}", metric.as_str())))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let gates: [&HealthGate; 4] = gates
        .try_into()
        .map_err(|_| refuse("one gate per simulated metric".into()))?;
    if policy.health.gates.len() != SIM_METRICS.len() {
        return Err(refuse(format!(
            "it has {} gates; the simulated world has one gate each on {}",
            policy.health.gates.len(),
            SIM_METRICS.map(RedfishMetric::as_str).join(", ")
        )));
    }
    if let Some(g) = gates.iter().find(|g| g.direction != Direction::IncreaseIsBad) {
        return Err(refuse(format!("gate {:?} is not increase_is_bad", g.name)));
    }
    let [canary, early, rest] = policy.waves.as_slice() else {
        return Err(refuse(format!(
            "it has {} waves; the bench simulates a canary, one more wave and the rest",
            policy.waves.len()
        )));
    };
    for wave in &policy.waves {
        if wave.gates.len() != gates.len() {
            return Err(refuse(format!("wave {:?} does not watch every gate", wave.name)));
        }
    }
    let soak = policy
        .detection
        .soak
        .as_ref()
        .filter(|_| policy.detection.enabled)
        .ok_or_else(|| refuse("it has no detection.soak".into()))?;
    let nodes = detection_sim::NODES;
    let hours = |d: chrono::TimeDelta| u32::try_from((d.num_seconds().max(0) + 3599) / 3600).unwrap_or(u32::MAX);
    let per_stratum = |size: WaveSize| (size.nodes(nodes, nodes) as f64 / SIM_STRATA as f64).round().max(1.0) as usize;
    let wave = |w: &orchestrator_policy::Wave| detection_sim::WavePlan {
        per_stratum: per_stratum(w.size),
        bake_h: hours(w.bake),
        max_bake_h: hours(w.max_bake),
        must_detect: gates.map(|g| policy.must_detect(&w.name, g)),
    };
    let holdback = power::soak_sizing(
        &policy,
        nodes,
        &BTreeMap::new(),
        &BTreeMap::new(),
        power::DEFAULT_GPUS_PER_NODE,
    )
    .map_or(0, |s| s.holdback_nodes);
    let budget = ErrorBudget::new(policy.detection.false_rollback, policy.detection.false_pass)
        .map_err(|e| refuse(e.to_string()))?;
    if rest.size != WaveSize::Rest {
        return Err(refuse(format!("the last wave {:?} is not `rest: true`", rest.name)));
    }
    Ok(detection_sim::BenchPolicy {
        waves: [wave(canary), wave(early)],
        rest_bake_h: hours(rest.bake),
        holdback_per_stratum: (holdback / SIM_STRATA).max(1),
        soak_h: (hours(soak.min), hours(soak.max)),
        soak_must_detect: gates.map(|g| policy.must_detect(&rest.name, g)),
        nulls: gates.map(|g| g.min_effect),
        budget,
        current_alpha: policy.health.alpha,
        pre_period_h: policy.detection.pre_period.map_or(0, hours),
    })
}

fn detection(effect_seeds: u32, healthy_seeds: u32) -> anyhow::Result<()> {
    let (file, source) = EXAMPLE_GPU_POLICY;
    let policy = bench_policy(file, source)?;
    let started = Instant::now();
    println!(
        "\n== detection: {} nodes x 8 GPUs, 4 strata; fleet-scale method (issue 22) vs the current per-wave method ==",
        detection_sim::NODES
    );
    let [canary, early] = policy.waves;
    // The other gates' must_detect, once when every wave holds them alike (the example), else per wave.
    let others = |m: [f64; 4]| format!("aer {}x, temp +{} C, power +{} W", m[1], m[2], m[3]);
    let alike =
        early.must_detect[1..] == canary.must_detect[1..] && policy.soak_must_detect[1..] == canary.must_detect[1..];
    let other_must_detect = if alike {
        others(canary.must_detect)
    } else {
        format!(
            "canary {}; 10% {}; soak {}",
            others(canary.must_detect),
            others(early.must_detect),
            others(policy.soak_must_detect)
        )
    };
    println!(
        "policy {file} (built in), on the simulated fleet: canary {} (bake {} h, max {} h, xid must_detect {}x), 10% {} (bake {} h, max {} h, {}x), rest (bake {} h), \
         holdback {}, soak {}..{} h ({}x); nulls xid {}x, aer {}x, temp +{} C, power +{} W; must_detect {}; \
         budgets: false rollback {:.0}%, false pass {:.0}% (current method: alpha {} per wave)",
        canary.per_stratum * 4,
        canary.bake_h,
        canary.max_bake_h,
        canary.must_detect[0],
        early.per_stratum * 4,
        early.bake_h,
        early.max_bake_h,
        early.must_detect[0],
        policy.rest_bake_h,
        policy.holdback_per_stratum * 4,
        policy.soak_h.0,
        policy.soak_h.1,
        policy.soak_must_detect[0],
        policy.nulls[0],
        policy.nulls[1],
        policy.nulls[2],
        policy.nulls[3],
        other_must_detect,
        policy.budget.false_rollback * 100.0,
        policy.budget.false_pass * 100.0,
        policy.current_alpha
    );
    println!("seeds: {effect_seeds} per effect cell, {healthy_seeds} healthy");
    println!(
        "\n{:<28} {:<7} {:>7} {:>7} {:>7} {:>9} {:>9} {:>14} {:>8} {:>6} {:>7} {:>7}",
        "harmful cell",
        "method",
        "caught",
        "canary",
        "<15%",
        "nodes50/90",
        "hours50/95",
        "x bound (50%)",
        "held",
        "proven",
        "unjudg",
        "seeds"
    );
    let cells = detection_sim::cells(effect_seeds, healthy_seeds);
    let run_all = |cell: &detection_sim::Cell, fleet: bool| -> Vec<detection_sim::Run> {
        (0..u64::from(cell.seeds))
            .map(|seed| {
                if fleet {
                    detection_sim::run_fleet_method(cell, &policy, seed)
                } else {
                    detection_sim::run_current_method(cell, &policy, seed)
                }
            })
            .collect()
    };
    let mut harmful = Vec::new();
    for cell in cells.iter().filter(|c| c.harmful()) {
        let fleet = run_all(cell, true);
        let fleet_summary = report_cell(cell, "fleet", &fleet);
        let current_summary = report_cell(cell, "current", &run_all(cell, false));
        harmful.push((cell, fleet, fleet_summary, current_summary));
    }
    println!(
        "\n{:<28} {:<7} {:>7} {:>8} {:>7} {:>9} {:>9} {:>9} {:>7} {:>9} {:>7} {:>6}",
        "healthy cell",
        "method",
        "rollbk",
        "up95",
        "held",
        "hold+h",
        "canary h",
        "10% h",
        "proven",
        "proven h",
        "unjudg",
        "seeds"
    );
    let mut healthy = Vec::new();
    for cell in cells.iter().filter(|c| !c.harmful()) {
        let fleet = report_cell(cell, "fleet", &run_all(cell, true));
        let current = report_cell(cell, "current", &run_all(cell, false));
        healthy.push((cell, fleet, current));
    }
    let [canary_nodes, early_nodes] = detection_sim::wave_exposure(&policy);
    println!(
        "\ncalibration: `policy power`'s chance of a catch by each wave's end (XID gate; forecast_catch) against the \
         fleet method's observed share caught with at most {canary_nodes} (canary) and {early_nodes} (canary + 10%) nodes \
         on the release; [99% Clopper-Pearson interval of the observed]"
    );
    println!(
        "{:<28} {:>6} {:>6} {:>14} {:<3}  {:>6} {:>6} {:>14} {:<3}",
        "rate cell", "pred", "obs", "canary 99%", "", "pred", "obs", "10% 99%", ""
    );
    let (mut inside, mut checked) = (0, 0);
    for (cell, runs, _, _) in &harmful {
        let Some([p_canary, p_early]) = detection_sim::predicted_catch(cell, &policy) else {
            continue;
        };
        let (a, in_a) = calibration(p_canary, caught_within(runs, canary_nodes), runs.len());
        let (b, in_b) = calibration(p_early, caught_within(runs, early_nodes), runs.len());
        inside += usize::from(in_a) + usize::from(in_b);
        checked += 2;
        println!("{:<28} {a}  {b}", cell.label);
    }
    println!("predictions inside the observed 99% interval: {inside} of {checked}");
    println!(
        "\nfleet method against the current one (ratios fleet / current; for nodes and hours at a catch, lower is \
         better)"
    );
    println!(
        "{:<28} {:>8} {:>8} {:>8} {:>8}",
        "cell", "caught", "canary", "nodes50", "hours50"
    );
    for (cell, _, fleet, current) in &harmful {
        println!(
            "{:<28} {:>8} {:>8} {:>8} {:>8}",
            cell.label,
            ratio_text(Some(fleet.failed), Some(current.failed)),
            ratio_text(Some(fleet.canary), Some(current.canary)),
            ratio_text(fleet.nodes50, current.nodes50),
            ratio_text(fleet.hours50, current.hours50)
        );
    }
    for (cell, fleet, current) in &healthy {
        println!(
            "{:<28} false rollbacks {:.1}% vs {:.1}%",
            cell.label,
            fleet.failed * 100.0,
            current.failed * 100.0
        );
    }
    println!("\ndetection bench took {:.0} s", started.elapsed().as_secs_f64());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bench simulates the example GPU policy as written: its waves, bakes, per-wave XID
    /// must_detect, soak, holdback, nulls and budgets (BENCHMARKS.md, "Detection").
    #[test]
    fn the_detection_bench_runs_the_example_gpu_policy() {
        let (file, source) = EXAMPLE_GPU_POLICY;
        let p = bench_policy(file, source).unwrap();
        let [canary, early] = p.waves;
        assert_eq!(
            (canary.per_stratum, canary.bake_h, canary.max_bake_h, canary.must_detect),
            (8, 12, 720, [2.0, 2.0, 2.0, 40.0])
        );
        assert_eq!(
            (early.per_stratum, early.bake_h, early.max_bake_h, early.must_detect),
            (25, 8, 168, [1.5, 2.0, 2.0, 40.0])
        );
        assert_eq!(p.rest_bake_h, 4);
        // 5% of 1,000 is 50 nodes; the simulated strata take whole nodes each.
        assert_eq!(p.holdback_per_stratum, 12);
        assert_eq!((p.soak_h, p.soak_must_detect), ((24, 400), [1.5, 2.0, 2.0, 40.0]));
        assert_eq!(p.nulls, [1.1, 1.25, 0.5, 10.0]);
        assert_eq!((p.budget.false_rollback, p.budget.false_pass), (0.02, 0.05));
        assert_eq!(p.current_alpha, 0.05);
        assert_eq!(p.pre_period_h, 6);
        // Without the key the canary has no pre-flash watch.
        let without = source.replace("  pre_period: 6h\n", "");
        assert_eq!(bench_policy(file, &without).unwrap().pre_period_h, 0);
    }

    #[test]
    fn changing_the_example_changes_the_bench() {
        let (file, source) = EXAMPLE_GPU_POLICY;
        let edited = source
            .replace("    count: 32\n", "    count: 64\n")
            .replace("    max_bake: 168h\n", "    max_bake: 96h\n")
            .replace("      min_effect: 1.1\n", "      min_effect: 1.2\n");
        let p = bench_policy(file, &edited).unwrap();
        assert_eq!(p.waves[0].per_stratum, 16);
        assert_eq!(p.waves[1].max_bake_h, 96);
        assert_eq!(p.nulls[0], 1.2);
    }

    #[test]
    fn a_policy_the_world_cannot_simulate_is_refused() {
        let (file, source) = EXAMPLE_GPU_POLICY;
        let check = |edited: String, want: &str| {
            let err = bench_policy(file, &edited).unwrap_err().to_string();
            assert!(err.contains(want), "{err}");
        };
        check(
            source.replace(
                "      metric: gpu_power_w\n      kind: level\n",
                "      metric: link_degraded_per_node_day\n      kind: rate\n",
            ),
            "no gate on gpu_power_w",
        );
        check(source.replace("detection:\n", "unknown_key:\n"), "unknown field");
    }

    /// A wave's own must_detect for any gate reaches the simulation: the 10% wave's AER and power, and the
    /// soak's temperature, each apart from the others.
    #[test]
    fn a_waves_own_must_detect_for_any_gate_is_simulated() {
        let (file, source) = EXAMPLE_GPU_POLICY;
        let edited = source
            .replacen(
                "    must_detect:\n      xid_errors: 1.5\n",
                "    must_detect:\n      xid_errors: 1.5\n      pcie_aer: 3\n      gpu_power: 30\n",
                1,
            )
            .replace(
                "    approvers: 2\n    max_in_flight: 128\n    must_detect:\n      xid_errors: 1.5\n",
                "    approvers: 2\n    max_in_flight: 128\n    must_detect:\n      xid_errors: 1.5\n      gpu_temp: 1.5\n",
            );
        let p = bench_policy(file, &edited).unwrap();
        assert_eq!(p.waves[0].must_detect, [2.0, 2.0, 2.0, 40.0]);
        assert_eq!(p.waves[1].must_detect, [1.5, 3.0, 2.0, 30.0]);
        assert_eq!(p.soak_must_detect, [1.5, 2.0, 1.5, 40.0]);
    }
}
