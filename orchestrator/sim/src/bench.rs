//! The measurements behind `waveguard bench` that run on the simulated
//! world: rollout throughput (a fleet with zero flash time rolled canary ->
//! fleet by the real engine), and what the process used doing it, read from
//! `/proc`. The command prints them.

use std::time::{Duration as StdDuration, Instant};

use bmc_sim::{Scenario, ScenarioError};
use orchestrator_db::DbError;
use orchestrator_db::execution::{RolloutState, StepFilter, StepState};
use orchestrator_engine::{EngineError, StartRollout};
use orchestrator_types::{ComponentKind, FirmwareVersion, VersionError};

use crate::error::SimError;
use crate::fleet::FleetPlacement;
use crate::watch::{WatchOptions, watch};
use crate::world::{SIM_AUTHOR, SimWorld, WorldError, WorldOptions, judge_for};

/// With the fleet in this process every simulated BMC holds a listening
/// socket for the whole run. Its BMCs close each connection after one
/// response (see `SimWorld::start_on`), so beyond the listeners only the
/// requests in flight hold descriptors (client and server side, up to
/// four per BMC being updated at the fleet cap of 512, plus the image
/// server's and the database's); fewer nodes run when the hard limit is
/// lower, with a note saying so.
pub fn fitting_nodes(wanted: usize) -> (usize, Option<String>) {
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
            let note = format!(
                "NOTE: the hard open-file limit is {hard}; {wanted} in-process BMCs need ~{} descriptors, so the \
                 throughput run uses {fits} nodes (raise `ulimit -Hn` for the full run)",
                wanted * PER_NODE + SPARE
            );
            (fits.max(1), Some(note))
        }
        _ => (wanted, None),
    }
}

/// The machine, in one line: CPUs, model, memory, OS.
pub fn machine() -> String {
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
pub fn proc_status_kib(path: &str, key: &str) -> Option<u64> {
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
pub fn cpu_by_thread() -> (f64, f64) {
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

/// A PostgreSQL database created for one run and dropped after it (with
/// psql, so no test crate is needed).
#[derive(Debug)]
pub struct FreshPostgres {
    admin_url: String,
    name: String,
    /// Where the fresh database is.
    pub url: String,
}

/// psql could not run, or failed.
#[derive(Debug, thiserror::Error)]
pub enum PsqlError {
    #[error("cannot run psql")]
    Run(#[source] std::io::Error),
    #[error("psql: {0}")]
    Failed(String),
}

impl FreshPostgres {
    /// Creates a database on the server `admin_url` names.
    pub fn create(admin_url: &str) -> Result<FreshPostgres, PsqlError> {
        let name = format!("wg_bench_{}", std::process::id());
        psql(admin_url, &format!("CREATE DATABASE {name}"))?;
        let base = admin_url.rsplit_once('/').map_or(admin_url, |(base, _)| base);
        Ok(FreshPostgres {
            admin_url: admin_url.to_owned(),
            url: format!("{base}/{name}"),
            name,
        })
    }

    /// Drops the database; a failure is only a warning (it is a bench's
    /// leftover, not data).
    pub fn drop_database(&self) {
        if let Err(err) = psql(
            &self.admin_url,
            &format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name),
        ) {
            eprintln!("warning: could not drop {}: {err}", self.name);
        }
    }
}

fn psql(url: &str, sql: &str) -> Result<(), PsqlError> {
    let out = std::process::Command::new("psql")
        .args([url, "-v", "ON_ERROR_STOP=1", "-q", "-c", sql])
        .output()
        .map_err(PsqlError::Run)?;
    if !out.status.success() {
        return Err(PsqlError::Failed(
            String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        ));
    }
    Ok(())
}

// ---------------------------------------------------------------------------

/// The throughput run's fleet. Its BMCs advertise and honour `$expand`, as the HGX management
/// controllers this product targets do (NVIDIA's bmcweb-based HMC): the controller then reads a
/// node's firmware inventory, GPU sensors and GPU processors in one request each. Without it every
/// inventory entry and every sensor is a request of its own, which is what bmc-sim's plain layout
/// measures (`redfish_layout` left out). Public so that `bench`'s Ansible comparison updates BMCs
/// of the same kind.
pub fn throughput_scenario(nodes: usize) -> String {
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
redfish_layout:
  expand_query: true
"#,
        racks = nodes.div_ceil(20).max(1)
    )
}

/// The throughput run's policy, by the name it prints: GPU firmware canary
/// (100) -> the rest of the fleet, with the Redfish health gates of
/// `policies/gpu-fast-canary.yaml` (an XID rate and a GPU temperature level)
/// judged by the detector against each wave's control cohort. The collector
/// polls the wave's updated nodes and its controls every `interval` through
/// the bake, as `waveguard serve` does, so the run pays for health polling
/// (the bakes' real time is in the wall time too, and printed apart).
pub const THROUGHPUT_POLICY_NAME: &str = "bench-throughput-gated";

const THROUGHPUT_POLICY: &str = r#"
name: bench-throughput-gated
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
    bake: 20m
    max_in_flight: 100
  - name: fleet
    rest: true
    bake: 20m
    max_in_flight: 512
concurrency:
  max_in_flight: 512
  per_rack: 20
health:
  alpha: 0.05
  gates:
    - name: xid_errors
      source: redfish
      metric: xid_errors_per_gpu_hour
      kind: rate
      direction: increase_is_bad
      min_effect: 1.5
      interval: 5m
    - name: gpu_temp
      source: redfish
      metric: gpu_temp_c
      kind: level
      direction: increase_is_bad
      min_effect: 3
      interval: 5m
failure_budget:
  max_failed_percent: 1
rollback:
  automatic: false
  scope: rollout
"#;

/// Simulated seconds per real second in the throughput run up to 10,000 nodes: a 20-minute bake
/// lasts 2 real seconds, a 5-minute poll interval half a second.
const THROUGHPUT_SPEEDUP: f64 = 600.0;

/// Nodes up to which the throughput run keeps [`THROUGHPUT_SPEEDUP`].
const FULL_SPEEDUP_NODES: usize = 10_000;

/// The throughput run's speedup for a fleet of `nodes`: [`THROUGHPUT_SPEEDUP`] up to
/// [`FULL_SPEEDUP_NODES`], slower in proportion above. A poll round over a wave takes real time in
/// proportion to the wave, and at a fixed speedup its simulated span grows with it: at 100,000
/// nodes and 600x the bake's closing round spanned ~20 simulated hours, so every node's poll split
/// its exposure into ~20 hourly windows, 20 times the sample writes (and the memory for them) a
/// controller on a real clock makes for the same round.
pub fn throughput_speedup(nodes: usize) -> f64 {
    if nodes <= FULL_SPEEDUP_NODES {
        THROUGHPUT_SPEEDUP
    } else {
        THROUGHPUT_SPEEDUP * FULL_SPEEDUP_NODES as f64 / nodes as f64
    }
}

/// What the throughput run measured.
#[derive(Debug, Clone)]
pub struct Throughput {
    /// The policy's name.
    pub policy: &'static str,
    /// Health polls the collector recorded (updated nodes and controls).
    pub health_polls: u64,
    /// Real time the waves spent baking (in `wall`).
    pub baking: StdDuration,
    /// Simulated seconds per real second ([`throughput_speedup`]).
    pub speedup: f64,
    /// Fleet start, import, inventory and release registration.
    pub setup: StdDuration,
    /// The rollout's state at the end.
    pub state: RolloutState,
    pub steps: usize,
    pub succeeded: usize,
    /// Planning and storing the plan.
    pub planned: StdDuration,
    /// From `start_rollout` to the end, bakes included.
    pub wall: StdDuration,
    /// CPU seconds of the controller's threads and of bmc-sim's.
    pub controller_cpu: f64,
    pub sim_cpu: f64,
    /// Peak RSS of the whole process (controller, and the simulated BMCs when in-process).
    pub peak_rss_mib: f64,
    /// Fleet processes (`None`: the fleet ran in this process).
    pub fleet_processes: Option<usize>,
    /// Peak RSS of each fleet process, MiB.
    pub fleet_rss_mib: Vec<f64>,
    /// The controller's bound on open BMC connections.
    pub connection_limit: usize,
}

/// Why the throughput run could not run.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("bench scenario")]
    Scenario(#[source] ScenarioError),
    #[error("bmc-sim runtime")]
    Runtime(#[source] std::io::Error),
    #[error(transparent)]
    World(#[from] WorldError),
    #[error("version")]
    Version(#[source] VersionError),
    #[error("release")]
    Release(#[source] DbError),
    #[error("start the rollout")]
    Start(#[source] EngineError),
    #[error(transparent)]
    Watch(#[from] SimError),
    #[error(transparent)]
    Db(#[from] DbError),
}

/// Rolls a GPU release canary (100) -> fleet over `nodes` simulated BMCs
/// with zero flash time, on SQLite or on the PostgreSQL database `postgres`,
/// with the fleet in this process or in `fleet_processes` processes of its own
/// (then with HTTP keep-alive, as real BMCs mostly do).
pub async fn throughput(
    nodes: usize,
    postgres: Option<&str>,
    fleet_processes: Option<usize>,
) -> Result<Throughput, BenchError> {
    let yaml = throughput_scenario(nodes);
    let scenario = Scenario::from_yaml_str(&yaml).map_err(BenchError::Scenario)?;
    // bmc-sim gets threads of its own, named so their CPU is not counted
    // as the controller's.
    let fleet_runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("bmc-sim")
        .enable_all()
        .build()
        .map_err(BenchError::Runtime)?;
    let speedup = throughput_speedup(nodes);
    let mut options = WorldOptions::new(speedup);
    options.db_url = postgres.map(str::to_owned);
    match fleet_processes {
        Some(processes) => {
            options.placement = FleetPlacement::own_processes(processes).map_err(BenchError::Runtime)?;
            options.scenario_yaml = Some(yaml);
        }
        None => {
            options.fleet_runtime = Some(fleet_runtime.handle().clone());
            options.keep_alive = false;
        }
    }
    let setup = Instant::now();
    let world = SimWorld::start_with(scenario, options).await?;
    let measured = measure_throughput(&world, setup, speedup).await;
    world.shutdown().await;
    fleet_runtime.shutdown_background();
    measured.map(|mut m| {
        m.fleet_processes = fleet_processes;
        m
    })
}

async fn measure_throughput(world: &SimWorld, setup: Instant, speedup: f64) -> Result<Throughput, BenchError> {
    let version = FirmwareVersion::parse("96.00.61.00.01").map_err(BenchError::Version)?;
    let release = world
        .register_release(ComponentKind::Gpu, &version, Some(&[]), "bench")
        .await
        .map_err(BenchError::Release)?;
    let setup = setup.elapsed();
    let (sim_cpu0, ctl_cpu0) = cpu_by_thread();
    let fleet_cpu0 = world.fleet.process_cpu_seconds();
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
    .map_err(BenchError::Start)?;
    let planned = started.elapsed();
    // The detector with its collector, as `simulate` and `serve` judge: the
    // bakes are watched (not skipped) and every poll is paid for.
    let judge = judge_for(world);
    let engine = world.start_engine("bench", judge.judge);
    let watched = watch(
        world,
        &rollout,
        WatchOptions {
            approve: true,
            skip_bake: !judge.watches_health,
            timeout: StdDuration::from_secs(3600),
        },
    )
    .await;
    let wall = started.elapsed();
    engine.shutdown().await;
    // The run's high-water mark, read before the bench's own queries below add theirs.
    let peak_rss_mib = proc_status_kib("/proc/self/status", "VmHWM:").unwrap_or(0) as f64 / 1024.0;
    let watched = watched?;
    let (sim_cpu1, ctl_cpu1) = cpu_by_thread();
    let fleet_cpu = match (fleet_cpu0, world.fleet.process_cpu_seconds()) {
        (Some(before), Some(after)) => after - before,
        _ => sim_cpu1 - sim_cpu0,
    };
    let of_rollout = StepFilter {
        rollout_id: Some(rollout.id),
        ..Default::default()
    };
    let steps = world.db.count_steps(&of_rollout).await?;
    let succeeded = world
        .db
        .count_steps(&StepFilter {
            state: Some(StepState::Succeeded),
            ..of_rollout
        })
        .await?;
    let mut health_polls = 0;
    let mut baking = 0.0;
    for wave in world.db.rollout_waves(rollout.id).await? {
        health_polls += world
            .db
            .health_cursors(wave.id)
            .await?
            .iter()
            .map(|c| u64::try_from(c.polls).unwrap_or(0))
            .sum::<u64>();
        if let (Some(from), Some(to)) = (wave.bake_started_at, wave.ended_at) {
            baking += (to - from).num_milliseconds().max(0) as f64 / 1000.0 / speedup;
        }
    }
    Ok(Throughput {
        policy: THROUGHPUT_POLICY_NAME,
        health_polls,
        baking: StdDuration::from_secs_f64(baking),
        speedup,
        setup,
        state: watched.rollout.state,
        steps: usize::try_from(steps).unwrap_or(usize::MAX),
        succeeded: usize::try_from(succeeded).unwrap_or(usize::MAX),
        planned,
        wall,
        controller_cpu: ctl_cpu1 - ctl_cpu0,
        sim_cpu: fleet_cpu,
        peak_rss_mib,
        fleet_processes: None,
        fleet_rss_mib: match &world.fleet {
            crate::fleet::SimFleet::Processes(p) => p.peak_rss_mib(),
            crate::fleet::SimFleet::InProcess(_) => Vec::new(),
        },
        connection_limit: world.connection_usage().limit,
    })
}
