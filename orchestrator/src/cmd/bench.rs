//! `waveguard bench`: the figures in BENCHMARKS.md, printed, never asserted.
//!
//! - throughput: a simulated fleet with zero flash time rolled canary → fleet
//!   by the real engine over loopback Redfish, on SQLite and PostgreSQL;
//!   controller CPU is counted per thread, without bmc-sim's threads (the
//!   fleet runs on a runtime of its own);
//! - scale: process RSS and latency of the main API list endpoints with a
//!   large fleet in the database (in-process router, no network);
//! - detection: whole rollouts of a 1,000-node fleet simulated without I/O
//!   (`detection_sim`), judged by the fleet-scale method and by the current
//!   per-wave method in the same run: detection rate, nodes exposed and time
//!   at detection against the information bound, false rollbacks, holds,
//!   time for each wave to pass, fleet-proven.

use std::process::ExitCode;
use std::time::{Duration as StdDuration, Instant};

use anyhow::Context as _;
use bmc_sim::Scenario;
use orchestrator_db::execution::{StepFilter, StepState};
use orchestrator_db::model::{NewNode, NodeLabels};
use orchestrator_engine::{GatelessJudge, StartRollout};
use orchestrator_types::{ComponentKind, FirmwareVersion};

use super::simulate::{SIM_AUTHOR, SimWorld, WatchOptions, watch};
use crate::Context;
use orchestrator_detect::fleet::sim as detection_sim;

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
}

/// `waveguard bench`.
pub async fn run(args: BenchArgs, _context: &Context) -> anyhow::Result<ExitCode> {
    let all = args.only.is_empty();
    let wants = |w: Which| all || args.only.contains(&w);
    println!("machine: {}", machine());
    if wants(Which::Detection) {
        detection(args.seeds, args.healthy_seeds);
    }
    if wants(Which::Rma) {
        super::bench_rma::run(args.rma_gpus);
    }
    if wants(Which::Throughput) {
        let nodes = fitting_nodes(args.nodes);
        throughput(nodes, None).await?;
        if args.postgres_url.is_empty() {
            println!("throughput on PostgreSQL: skipped (--postgres-url is empty)");
        } else {
            match FreshPostgres::create(&args.postgres_url) {
                Ok(pg) => {
                    let outcome = throughput(nodes, Some(&pg.url)).await;
                    pg.drop_database();
                    outcome?;
                }
                Err(err) => println!("throughput on PostgreSQL: SKIPPED ({err:#})"),
            }
        }
    }
    if wants(Which::Scale) {
        scale(args.scale_nodes).await?;
    }
    Ok(ExitCode::SUCCESS)
}

/// With the fleet in this process every simulated BMC holds a listening
/// socket for the whole run. Its BMCs close each connection after one
/// response (see `SimWorld::start_on`), so beyond the listeners only the
/// requests in flight hold descriptors (client and server side, up to
/// four per BMC being updated at the fleet cap of 512, plus the image
/// server's and the database's); fewer nodes run when the hard limit is
/// lower, and the output says so.
fn fitting_nodes(wanted: usize) -> usize {
    const PER_NODE: usize = 1;
    const SPARE: usize = 6_000;
    let hard = std::fs::read_to_string("/proc/self/limits").ok().and_then(|t| {
        t.lines()
            .find(|l| l.starts_with("Max open files"))
            .and_then(|l| l.split_whitespace().nth(4))
            .and_then(|v| v.parse::<usize>().ok())
    });
    match hard {
        Some(hard) if wanted * PER_NODE + SPARE > hard => {
            let fits = hard.saturating_sub(SPARE) / PER_NODE;
            println!(
                "NOTE: the hard open-file limit is {hard}; {wanted} in-process BMCs need ~{} descriptors, so the \
                 throughput run uses {fits} nodes (raise `ulimit -Hn` for the full run)",
                wanted * PER_NODE + SPARE
            );
            fits.max(1)
        }
        _ => wanted,
    }
}

fn machine() -> String {
    let cpus = std::thread::available_parallelism().map_or(0, std::num::NonZero::get);
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let mem =
        proc_status_kib("/proc/meminfo", "MemTotal:").map_or(String::new(), |k| format!(", {} GiB RAM", k / 1_048_576));
    format!(
        "{cpus} CPU(s), {model}{mem}, {} {}",
        std::env::consts::OS,
        std::env::consts::ARCH
    )
}

/// A `Key:   123 kB` line of a /proc status file, in KiB.
fn proc_status_kib(path: &str, key: &str) -> Option<u64> {
    std::fs::read_to_string(path)
        .ok()?
        .lines()
        .find(|l| l.starts_with(key))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// CPU seconds used so far by this process's threads, split into
/// (bmc-sim threads, everything else = the controller).
fn cpu_by_thread() -> (f64, f64) {
    let ticks = 100.0; // USER_HZ on Linux
    let (mut sim, mut other) = (0.0, 0.0);
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return (0.0, 0.0);
    };
    for task in tasks.flatten() {
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else {
            continue;
        };
        // `pid (comm) state ...`: comm may hold spaces, so split at the last ')'.
        let Some((head, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let comm = head.split_once('(').map_or("", |(_, c)| c);
        let fields: Vec<&str> = rest.split_whitespace().collect();
        // utime and stime are fields 14 and 15 of the whole line; `rest`
        // starts at field 3.
        let used = fields.get(11).and_then(|u| u.parse::<f64>().ok()).unwrap_or(0.0)
            + fields.get(12).and_then(|s| s.parse::<f64>().ok()).unwrap_or(0.0);
        if comm.starts_with("bmc-sim") {
            sim += used / ticks;
        } else {
            other += used / ticks;
        }
    }
    (sim, other)
}

/// A database created for one run and dropped after it (with psql).
struct FreshPostgres {
    admin_url: String,
    name: String,
    url: String,
}

impl FreshPostgres {
    fn create(admin_url: &str) -> anyhow::Result<FreshPostgres> {
        let name = format!("wg_bench_{}", std::process::id());
        psql(admin_url, &format!("CREATE DATABASE {name}"))?;
        let base = admin_url.rsplit_once('/').map_or(admin_url, |(base, _)| base);
        Ok(FreshPostgres {
            admin_url: admin_url.to_owned(),
            url: format!("{base}/{name}"),
            name,
        })
    }

    fn drop_database(&self) {
        if let Err(err) = psql(
            &self.admin_url,
            &format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name),
        ) {
            eprintln!("warning: could not drop {}: {err:#}", self.name);
        }
    }
}

fn psql(url: &str, sql: &str) -> anyhow::Result<()> {
    let out = std::process::Command::new("psql")
        .args([url, "-v", "ON_ERROR_STOP=1", "-q", "-c", sql])
        .output()
        .context("cannot run psql")?;
    anyhow::ensure!(
        out.status.success(),
        "psql: {}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(())
}

// ---------------------------------------------------------------------------

fn throughput_scenario(nodes: usize) -> String {
    format!(
        r#"
seed: 3
fleet:
  nodes: {nodes}
  racks: {racks}
  clusters: 10
  region: bench-1
  sku: hgx-h100-8gpu
  nodes_per_nvlink_domain: 4
  components:
    - {{id: BMC_Firmware, kind: bmc, version: "24.04.1"}}
    - {{id: "HGX_FW_GPU_{{0..7}}", kind: gpu, version: "96.00.5E.00.01"}}
firmware:
  - kind: gpu
    version: "96.00.61.00.01"
    flash_time: {{min: 0s, max: 0s}}
bmc_faults:
  reset_time: {{min: 0s, max: 0s}}
  reboot_time: {{min: 0s, max: 0s}}
"#,
        racks = nodes.div_ceil(20).max(1)
    )
}

const THROUGHPUT_POLICY: &str = r#"
name: bench-throughput
target:
  component: gpu
  inventory_id: "HGX_FW_GPU_*"
  platforms: [hgx-h100-8gpu]
versions:
  allow_downgrade: false
qualification:
  required_gates: []
waves:
  - name: canary
    count: 100
    stratify_by: [rack]
    bake: 1m
    max_in_flight: 100
  - name: fleet
    rest: true
    bake: 1m
    max_in_flight: 512
concurrency:
  max_in_flight: 512
  per_rack: 20
failure_budget:
  max_failed_percent: 1
rollback:
  automatic: false
  scope: rollout
"#;

async fn throughput(nodes: usize, postgres: Option<&str>) -> anyhow::Result<()> {
    let backend = if postgres.is_some() { "PostgreSQL" } else { "SQLite" };
    println!("\n== throughput: {nodes} simulated BMCs, zero flash time, canary (100) -> fleet, {backend} ==");
    let scenario = Scenario::from_yaml_str(&throughput_scenario(nodes)).context("bench scenario")?;
    // bmc-sim gets threads of its own, named so their CPU is not counted
    // as the controller's.
    let fleet_runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("bmc-sim")
        .enable_all()
        .build()
        .context("bmc-sim runtime")?;
    let setup = Instant::now();
    let world = SimWorld::start_on(scenario, 60.0, postgres, Some(fleet_runtime.handle().clone()), false).await?;
    let version = FirmwareVersion::parse("96.00.61.00.01").context("version")?;
    let release = world
        .register_release(ComponentKind::Gpu, &version, Some(&[]), "bench")
        .await
        .context("release")?;
    println!(
        "setup (fleet start, import, inventory, release): {:.1}s",
        setup.elapsed().as_secs_f64()
    );
    let (sim_cpu0, ctl_cpu0) = cpu_by_thread();
    let started = Instant::now();
    let rollout = orchestrator_engine::start_rollout(
        &world.db,
        &StartRollout {
            release_id: release.id,
            policy_source: THROUGHPUT_POLICY.into(),
            policy_commit: None,
            policy_blob: None,
            seed: 1,
        },
        SIM_AUTHOR,
    )
    .await
    .context("start the rollout")?;
    let planned = started.elapsed();
    let engine = world.start_engine("bench", std::sync::Arc::new(GatelessJudge));
    let watched = watch(
        &world,
        &rollout,
        WatchOptions {
            approve: true,
            skip_bake: true,
            timeout: StdDuration::from_secs(1800),
        },
    )
    .await;
    let wall = started.elapsed();
    engine.shutdown().await;
    let watched = watched?;
    let (sim_cpu1, ctl_cpu1) = cpu_by_thread();
    let steps = world
        .db
        .steps(&StepFilter {
            rollout_id: Some(rollout.id),
            ..Default::default()
        })
        .await?;
    let succeeded = steps.iter().filter(|s| s.state == StepState::Succeeded).count();
    let peak_rss_mib = proc_status_kib("/proc/self/status", "VmHWM:").unwrap_or(0) as f64 / 1024.0;
    println!(
        "outcome: rollout {} ({succeeded} of {} steps succeeded)",
        watched.rollout.state,
        steps.len()
    );
    println!("planning + storing the plan: {:.2}s", planned.as_secs_f64());
    println!(
        "wall time (start_rollout -> completed, bakes skipped): {:.1}s; node-updates/s: {:.0}",
        wall.as_secs_f64(),
        succeeded as f64 / wall.as_secs_f64()
    );
    println!(
        "CPU seconds: controller {:.1}, bmc-sim {:.1}",
        ctl_cpu1 - ctl_cpu0,
        sim_cpu1 - sim_cpu0
    );
    println!("peak RSS of the process (controller + {nodes} simulated BMCs): {peak_rss_mib:.0} MiB");
    world.shutdown().await;
    fleet_runtime.shutdown_background();
    Ok(())
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

/// One cell's figures for one method.
fn report_cell(cell: &detection_sim::Cell, method: &str, runs: &[detection_sim::Run]) {
    use detection_sim::End;
    let n = runs.len();
    let mut detect_h = Vec::new();
    let mut exposed = Vec::new();
    let mut ratio_median = Vec::new();
    let mut ratio_p95 = Vec::new();
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
                if let Some((m, p)) = run.bound_h {
                    ratio_median.push(hour / m);
                    ratio_p95.push(hour / p);
                }
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
        let bound_m = sorted(runs.iter().filter_map(|r| r.bound_h.map(|b| b.0)).collect());
        let bound_p = sorted(runs.iter().filter_map(|r| r.bound_h.map(|b| b.1)).collect());
        let ratio = |t: Option<f64>, b: Option<f64>| match (t, b) {
            (Some(t), Some(b)) if b > 0.0 => format!("{:.1}", t / b),
            _ => "-".into(),
        };
        println!(
            "{:<28} {:<7} {:>7} {:>7} {:>7} {:>9} {:>9} {:>10} {:>8} {:>6} {:>7} {:>7}",
            cell.label,
            method,
            pct(detect_h.len(), n),
            pct(canary_only, n),
            pct(before_15, n),
            format!("{}/{}", fmt(quantile(&exposed, 0.5)), fmt(quantile(&exposed, 0.9))),
            format!("{}/{}", fmt(quantile(&detect_h, 0.5)), fmt(quantile(&detect_h, 0.95))),
            format!(
                "{}/{}",
                ratio(quantile(&detect_h, 0.5), quantile(&bound_m, 0.5)),
                ratio(quantile(&detect_h, 0.95), quantile(&bound_p, 0.5))
            ),
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
}

fn detection(effect_seeds: u32, healthy_seeds: u32) {
    let policy = detection_sim::BenchPolicy::default();
    let started = Instant::now();
    println!(
        "\n== detection: {} nodes x 8 GPUs, 4 strata; fleet-scale method (issue 22) vs the current per-wave method ==",
        detection_sim::NODES
    );
    let [canary, early] = policy.waves;
    println!(
        "policy: canary {} (bake {} h, max {} h, xid must_detect {}x), 10% {} (bake {} h, max {} h, {}x), rest (bake {} h), \
         holdback {}, soak {}..{} h ({}x); nulls xid {}x, aer {}x, temp +{} C, power +{} W; must_detect aer {}x, \
         temp +{} C, power +{} W; budgets: false rollback {:.0}%, false pass {:.0}% (current method: alpha {} per wave)",
        canary.per_stratum * 4,
        canary.bake_h,
        canary.max_bake_h,
        canary.xid_must_detect,
        early.per_stratum * 4,
        early.bake_h,
        early.max_bake_h,
        early.xid_must_detect,
        policy.rest_bake_h,
        policy.holdback_per_stratum * 4,
        policy.soak_h.0,
        policy.soak_h.1,
        policy.soak_xid_must_detect,
        policy.nulls[0],
        policy.nulls[1],
        policy.nulls[2],
        policy.nulls[3],
        policy.must_detect[0],
        policy.must_detect[1],
        policy.must_detect[2],
        policy.budget.false_rollback * 100.0,
        policy.budget.false_pass * 100.0,
        policy.current_alpha
    );
    println!("seeds: {effect_seeds} per effect cell, {healthy_seeds} healthy");
    println!(
        "\n{:<28} {:<7} {:>7} {:>7} {:>7} {:>9} {:>9} {:>10} {:>8} {:>6} {:>7} {:>7}",
        "harmful cell",
        "method",
        "caught",
        "canary",
        "<15%",
        "nodes50/90",
        "hours50/95",
        "x bound",
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
    for cell in cells.iter().filter(|c| c.harmful()) {
        report_cell(cell, "fleet", &run_all(cell, true));
        report_cell(cell, "current", &run_all(cell, false));
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
    for cell in cells.iter().filter(|c| !c.harmful()) {
        report_cell(cell, "fleet", &run_all(cell, true));
        report_cell(cell, "current", &run_all(cell, false));
    }
    println!("\ndetection bench took {:.0} s", started.elapsed().as_secs_f64());
}
