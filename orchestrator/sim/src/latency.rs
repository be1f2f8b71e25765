//! The stores `waveguard bench --only latency` measures the pages over.
//!
//! - [`seed_large_store`]: a fleet of N nodes (100,000 by default) with the
//!   nine inventory rows per node that discovery records on an HGX node, the
//!   fleet's versions as each SKU's default release, and one rollout over
//!   every node planned by the real planner, left where a rollout of that
//!   size stands mid-way: canary and 10% promoted (a few failures), the rest
//!   running with part of its nodes done.
//! - [`StepWriter`]: what loads the controller's database while "a rollout
//!   runs" at that size: a task that moves the running wave's steps through
//!   the engine's own states (prechecked, pushing, flashing, activating,
//!   verifying, succeeded), one fenced transition with its audit entry at a
//!   time, at a chosen rate of node-updates per second. There is no fleet of
//!   100,000 simulated BMCs in one process (one descriptor each, and 20,000
//!   is this machine's limit), so the writer stands in for the engine's
//!   writes; the demo's world (`demo`) measures the real engine.
//! - [`Moment`]: which moment of the demo's story a rollout's waves are in.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration as StdDuration, Instant};

use orchestrator_db::execution::{ExecWave, Fence, StepChange, StepFilter, StepState, WaveChange, WaveKind, WaveState};
use orchestrator_db::model::{ComponentReading, NewNode, NewRelease, NodeLabels};
use orchestrator_db::{Db, DbError};
use orchestrator_engine::{EXECUTOR_LEASE, EngineError, StartRollout};
use orchestrator_types::{
    ComponentKind, FirmwareVersion, QualificationState, ReleaseId, RolloutId, StepId, TransitionRequest, VersionError,
    WaveId,
};
use serde_json::json;

use crate::world::SIM_AUTHOR;

/// The platform SKUs of the large fleet (two of every three nodes on the
/// first), so the dashboard has more than one compliance row.
const SKUS: [&str; 2] = ["hgx-h100-8gpu", "hgx-b200-8gpu"];
const GPU_FROM: &str = "96.00.5E.00.01";
const GPU_TO: &str = "96.00.61.00.01";
const BMC_AT: &str = "24.04.1";
/// Steps of the running wave already finished when measuring starts: a
/// rollout a fifth of the way through its last wave.
const REST_DONE_FRACTION: f64 = 0.2;
/// One step in this many of the 10% wave failed (the budget allows 1%).
const FAILED_ONE_IN: usize = 500;

/// The policy of the large rollout: canary, 10%, rest, as the example
/// policies shape a fleet rollout (no gates: no detector runs here).
const LARGE_POLICY: &str = r#"
name: bench-latency
target:
  component: gpu
  inventory_id: "HGX_FW_GPU_*"
  platforms: [hgx-h100-8gpu, hgx-b200-8gpu]
versions:
  allow_downgrade: false
qualification:
  required_gates: []
waves:
  - name: canary
    count: 100
    stratify_by: [rack]
    bake: 6h
    max_in_flight: 100
  - name: wave-10pct
    percent: 10
    bake: 4h
    max_in_flight: 512
  - name: rest
    rest: true
    bake: 2h
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

/// What could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum LatencyError {
    #[error("version")]
    Version(#[source] VersionError),
    #[error(transparent)]
    Db(#[from] DbError),
    #[error("start the rollout")]
    Start(#[source] EngineError),
    #[error("the executor lease is held by another controller")]
    Lease,
    #[error("the planned rollout has no wave named {0:?}")]
    NoWave(&'static str),
}

/// The large store, ready to be measured.
#[derive(Debug, Clone)]
pub struct LargeStore {
    pub rollout: RolloutId,
    pub release: ReleaseId,
    /// A node in the middle of the fleet, for its page.
    pub node_name: String,
    pub nodes: usize,
    pub steps: usize,
    /// The running wave and its steps not yet started, for [`StepWriter`].
    pub running_wave: WaveId,
    pub pending: Vec<StepId>,
    /// The fence the store was written under (the executor lease).
    pub fence: Fence,
}

fn version(text: &str) -> Result<FirmwareVersion, LatencyError> {
    FirmwareVersion::parse(text).map_err(LatencyError::Version)
}

/// The nine inventory rows discovery records for one HGX node: its BMC and
/// eight GPUs.
fn readings(gpu: &FirmwareVersion, bmc: &FirmwareVersion) -> Vec<ComponentReading> {
    let reading = |id: String, kind, version: &FirmwareVersion| ComponentReading {
        inventory_id: id,
        kind,
        version: version.clone(),
        updateable: true,
        software_id: None,
        health: Some("OK".into()),
    };
    let mut out = vec![reading("BMC_Firmware".into(), ComponentKind::Bmc, bmc)];
    out.extend((0..8).map(|i| reading(format!("HGX_FW_GPU_{i}"), ComponentKind::Gpu, gpu)));
    out
}

async fn add_release(
    db: &Db,
    kind: ComponentKind,
    version: &FirmwareVersion,
    path: &[QualificationState],
) -> Result<ReleaseId, LatencyError> {
    let release = db
        .add_release(
            &NewRelease {
                component_kind: kind,
                version: version.clone(),
                image_uri: format!("http://127.0.0.1:1/images/{kind}-{version}.fw"),
                sha256: "0".repeat(64),
                size_bytes: 1,
                platforms: SKUS.iter().map(|s| (*s).to_owned()).collect(),
                release_notes: String::new(),
            },
            SIM_AUTHOR,
        )
        .await?;
    for to in path {
        db.transition_release(release.id, &TransitionRequest { to: *to, reason: None }, SIM_AUTHOR)
            .await?;
    }
    Ok(release.id)
}

/// Stores `nodes` nodes with their inventory, the releases and one rollout
/// over all of them, left mid-way (see the module docs). `say` hears the
/// progress of the slow parts.
pub async fn seed_large_store(db: &Db, nodes: usize, say: &mut dyn FnMut(String)) -> Result<LargeStore, LatencyError> {
    let gpu_from = version(GPU_FROM)?;
    let gpu_to = version(GPU_TO)?;
    let bmc = version(BMC_AT)?;
    let started = Instant::now();
    let all: Vec<NewNode> = (0..nodes)
        .map(|i| NewNode {
            name: format!("node-{i:06}"),
            bmc_url: format!("https://10.{}.{}.{}", i / 65536 % 256, i / 256 % 256, i % 256),
            credential_ref: "prod".into(),
            platform_sku: SKUS[usize::from(i % 3 == 2)].into(),
            labels: NodeLabels {
                region: format!("region-{}", i % 4),
                cluster: format!("cluster-{}", i % 40),
                rack: format!("rack-{}", i / 20),
                nvlink_domain: format!("nvl-{}", i / 4),
            },
        })
        .collect();
    for chunk in all.chunks(5_000) {
        db.import_nodes(chunk, SIM_AUTHOR).await?;
    }
    let stored = db.all_nodes().await?;
    let rows = readings(&gpu_from, &bmc);
    for node in &stored {
        db.record_inventory(node.id, &rows).await?;
    }
    say(format!(
        "stored {} nodes with {} inventory rows each in {:.0} s",
        stored.len(),
        rows.len(),
        started.elapsed().as_secs_f64()
    ));

    use QualificationState::{Default as Dflt, Qualified, Qualifying};
    add_release(db, ComponentKind::Gpu, &gpu_from, &[Qualifying, Qualified, Dflt]).await?;
    add_release(db, ComponentKind::Bmc, &bmc, &[Qualifying, Qualified, Dflt]).await?;
    let release = add_release(db, ComponentKind::Gpu, &gpu_to, &[Qualifying, Qualified]).await?;

    let started = Instant::now();
    let rollout = orchestrator_engine::start_rollout(
        db,
        &StartRollout {
            release_id: release,
            policy_source: LARGE_POLICY.into(),
            policy_commit: None,
            policy_blob: None,
            seed: 1,
        },
        SIM_AUTHOR,
    )
    .await
    .map_err(LatencyError::Start)?;
    let steps = db
        .steps(&StepFilter {
            rollout_id: Some(rollout.id),
            ..Default::default()
        })
        .await?;
    say(format!(
        "planned and stored a rollout of {} steps in {:.0} s",
        steps.len(),
        started.elapsed().as_secs_f64()
    ));

    let fence = db
        .acquire_lease(EXECUTOR_LEASE, "bench-latency", chrono::Duration::days(3650))
        .await?
        .ok_or(LatencyError::Lease)?;
    let waves = db.rollout_waves(rollout.id).await?;
    let wave = |name: &'static str| {
        waves
            .iter()
            .find(|w| w.name == name && w.kind == WaveKind::Update)
            .cloned()
            .ok_or(LatencyError::NoWave(name))
    };
    let (canary, early, rest) = (wave("canary")?, wave("wave-10pct")?, wave("rest")?);
    let started = Instant::now();
    let mut pending = Vec::new();
    let rest_done = (rest.node_count.max(0) as f64 * REST_DONE_FRACTION) as usize;
    for wave in [&canary, &early, &rest] {
        let promoted = wave.id != rest.id;
        move_wave(db, &fence, wave, WaveState::Planned, WaveState::Running).await?;
        let ids: Vec<StepId> = steps.iter().filter(|s| s.wave_id == wave.id).map(|s| s.id).collect();
        let finished = if promoted { ids.len() } else { rest_done };
        for (i, id) in ids.iter().enumerate() {
            if i >= finished {
                pending.push(*id);
                continue;
            }
            let outcome = if promoted && i % FAILED_ONE_IN == FAILED_ONE_IN - 1 {
                StepState::Failed
            } else {
                StepState::Succeeded
            };
            finish_step(db, &fence, *id, outcome).await?;
        }
        if promoted {
            move_wave(db, &fence, wave, WaveState::Running, WaveState::Baking).await?;
            move_wave(db, &fence, wave, WaveState::Baking, WaveState::Promoted).await?;
        }
    }
    say(format!(
        "moved the canary and 10% waves to promoted and {rest_done} steps of the rest to succeeded in {:.0} s",
        started.elapsed().as_secs_f64()
    ));
    Ok(LargeStore {
        rollout: rollout.id,
        release,
        node_name: format!("node-{:06}", nodes / 2),
        nodes: stored.len(),
        steps: steps.len(),
        running_wave: rest.id,
        pending,
        fence,
    })
}

async fn move_wave(db: &Db, fence: &Fence, wave: &ExecWave, from: WaveState, to: WaveState) -> Result<(), DbError> {
    let now = db.clock().now();
    let change = WaveChange {
        state: Some(to),
        started_at: (to == WaveState::Running).then_some(now),
        bake_started_at: (to == WaveState::Baking).then_some(now),
        ended_at: (to == WaveState::Promoted).then_some(now),
        decision: (to == WaveState::Promoted).then(|| "promoted".to_owned()),
        ..Default::default()
    };
    db.transition_wave(fence, wave.id, from, &change, json!({"by": "bench"}))
        .await?;
    Ok(())
}

/// A step of the seeded history: pending -> flashing -> its outcome (two
/// audited transitions; the writer walks every state of the engine).
async fn finish_step(db: &Db, fence: &Fence, id: StepId, outcome: StepState) -> Result<(), DbError> {
    let now = db.clock().now();
    let flashing = StepChange {
        state: Some(StepState::Flashing),
        started_at: Some(now),
        ..Default::default()
    };
    db.transition_step(fence, id, StepState::Pending, &flashing, json!({}))
        .await?;
    let done = StepChange {
        state: Some(outcome),
        finished_at: Some(now),
        error: (outcome == StepState::Failed).then(|| Some("inventory read back 96.00.5E.00.01".to_owned())),
        ..Default::default()
    };
    db.transition_step(fence, id, StepState::Flashing, &done, json!({}))
        .await?;
    Ok(())
}

/// The engine's path of a step that succeeds, after `pending`.
const STEP_PATH: [StepState; 6] = [
    StepState::Prechecked,
    StepState::Pushing,
    StepState::Flashing,
    StepState::Activating,
    StepState::Verifying,
    StepState::Succeeded,
];

/// The writer standing in for the engine while a rollout runs (see the
/// module docs). Stop it with [`StepWriter::stop`], which says how many
/// node-updates it finished and in what time.
#[derive(Debug)]
pub struct StepWriter {
    stop: Arc<AtomicBool>,
    done: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<Result<(), DbError>>,
    started: Instant,
}

/// Tick of the writer: each tick admits a tenth of a second's steps and
/// moves every step in flight one state on, so a step spends six ticks in
/// flight as it would spend six engine passes.
const WRITER_TICK: StdDuration = StdDuration::from_millis(100);

impl StepWriter {
    /// Starts moving `pending` steps at `per_second` node-updates per
    /// second (each one six fenced transitions with their audit entries).
    pub fn start(db: Db, fence: Fence, pending: Vec<StepId>, per_second: f64) -> StepWriter {
        let stop = Arc::new(AtomicBool::new(false));
        let done = Arc::new(AtomicU64::new(0));
        let (stop2, done2) = (stop.clone(), done.clone());
        let task = tokio::spawn(async move {
            let mut queue = pending.into_iter();
            let mut in_flight: Vec<(StepId, usize)> = Vec::new();
            let per_tick = per_second * WRITER_TICK.as_secs_f64();
            let mut owed = 0.0;
            let mut ticker = tokio::time::interval(WRITER_TICK);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            while !stop2.load(Ordering::Relaxed) {
                ticker.tick().await;
                owed += per_tick;
                while owed >= 1.0 {
                    owed -= 1.0;
                    match queue.next() {
                        Some(id) => in_flight.push((id, 0)),
                        None => break,
                    }
                }
                if in_flight.is_empty() {
                    break;
                }
                let now = db.clock().now();
                for (id, at) in &mut in_flight {
                    let from = if *at == 0 {
                        StepState::Pending
                    } else {
                        STEP_PATH[*at - 1]
                    };
                    let to = STEP_PATH[*at];
                    let change = StepChange {
                        state: Some(to),
                        started_at: (from == StepState::Pending).then_some(now),
                        finished_at: (to == StepState::Succeeded).then_some(now),
                        ..Default::default()
                    };
                    db.transition_step(&fence, *id, from, &change, json!({})).await?;
                    *at += 1;
                }
                let before = in_flight.len();
                in_flight.retain(|(_, at)| *at < STEP_PATH.len());
                done2.fetch_add((before - in_flight.len()) as u64, Ordering::Relaxed);
            }
            Ok(())
        });
        StepWriter {
            stop,
            done,
            task,
            started: Instant::now(),
        }
    }

    /// Node-updates finished so far.
    pub fn finished(&self) -> u64 {
        self.done.load(Ordering::Relaxed)
    }

    /// Stops the writer; node-updates finished and the seconds it ran.
    pub async fn stop(self) -> Result<(u64, f64), DbError> {
        self.stop.store(true, Ordering::Relaxed);
        let elapsed = self.started.elapsed().as_secs_f64();
        match self.task.await {
            Ok(result) => result?,
            Err(err) => tracing::warn!(error = %err, "the step writer task"),
        }
        Ok((self.done.load(Ordering::Relaxed), elapsed))
    }
}

/// A moment of the demo's story, read from its rollouts' waves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Moment {
    /// A wave of the rollout is flashing its nodes (update or rollback).
    Flashing,
    /// No wave of the rollout flashes and one bakes.
    Baking,
}

impl Moment {
    /// The moment one rollout's waves are in, if any: a flashing wave wins
    /// over a baking one (a rollback wave flashes while the wave it undoes
    /// may still read as baking). Judged per rollout: in the demo's story
    /// one rollout keeps a wave running while the other bakes, so a moment
    /// judged over both would never be "baking".
    pub fn of<'a>(waves: impl IntoIterator<Item = &'a ExecWave>) -> Option<Moment> {
        let mut baking = false;
        for wave in waves {
            match wave.state {
                WaveState::Running => return Some(Moment::Flashing),
                WaveState::Baking => baking = true,
                _ => {}
            }
        }
        baking.then_some(Moment::Baking)
    }

    /// Its name in the table.
    pub fn as_str(self) -> &'static str {
        match self {
            Moment::Flashing => "demo: a wave flashing",
            Moment::Baking => "demo: a wave baking",
        }
    }
}
