//! The story `waveguard demo` tells on a [`SimWorld`]: a qualified BMC
//! firmware rolls canary -> 10% -> rest with one manual approval (given by
//! [`DEMO_AUTOPILOT`] when the visitor does not), while a bad GPU firmware
//! (3x the XID error rate) is caught in its canary against the control
//! cohort, rolled back, and its release blocked. The command serves the UI
//! and prints what [`Story::tell`] says.

use std::collections::BTreeMap;
use std::time::{Duration as StdDuration, Instant};

use chrono::{DateTime, Utc};
use orchestrator_db::execution::{ExecRollout, RolloutState, WaveKind, WaveState};
use orchestrator_db::{Db, DbError};
use orchestrator_engine::{EngineError, StartRollout};
use orchestrator_types::{
    Clock, ComponentKind, FirmwareVersion, QualificationState, ReleaseId, RolloutId, TransitionRequest, VersionError,
    WaveId,
};

use crate::watch::idle_until;
use crate::world::SimWorld;

/// The simulated fleet (its node count is set by `--nodes`).
pub const DEMO_SCENARIO: &str = include_str!("../../../bmc-sim/scenarios/simulate-1000.yaml");

/// The story's policies, embedded for when the repository is not there to
/// read them from git (a binary run elsewhere).
pub const EMBEDDED_POLICIES: [(&str, &str); 2] = [
    (
        "bmc-firmware-lab",
        include_str!("../../../policies/bmc-firmware-lab.yaml"),
    ),
    (
        "gpu-fast-canary",
        include_str!("../../../policies/gpu-fast-canary.yaml"),
    ),
];

/// The story's releases.
pub const BMC_FROM: &str = "24.04.1";
pub const BMC_TO: &str = "24.04.2";
pub const GPU_FROM: &str = "96.00.5E.00.01";
pub const GPU_BAD: &str = "96.00.66.00.01";
pub const GPU_GOOD: &str = "96.00.61.00.01";

/// Who starts the story's rollouts, in the audit log.
pub const DEMO_AUTHOR: &str = "waveguard-demo";
/// Who approves when the visitor does not.
pub const DEMO_AUTOPILOT: &str = "demo-autopilot";
/// What went wrong setting the story up.
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    #[error("version {version}")]
    Version {
        version: &'static str,
        #[source]
        source: VersionError,
    },
    #[error("{what}")]
    Register {
        what: &'static str,
        #[source]
        source: DbError,
    },
    #[error("making release {release} the fleet default")]
    MakeDefault {
        release: ReleaseId,
        #[source]
        source: DbError,
    },
    #[error("no policy {0:?}")]
    NoPolicy(String),
    #[error("starting the rollout under {name}")]
    Start {
        name: String,
        #[source]
        source: Box<EngineError>,
    },
}

/// A rollout of the story and what was last said about it.
#[derive(Debug)]
pub struct Chapter {
    /// What the narration calls it (`BMC 24.04.2`).
    pub title: String,
    pub id: RolloutId,
    last_rollout_state: Option<RolloutState>,
    last_wave_states: BTreeMap<WaveId, WaveState>,
    waiting_since: BTreeMap<WaveId, Instant>,
}

/// The story's two rollouts.
#[derive(Debug)]
pub struct Story {
    pub chapters: Vec<Chapter>,
}

/// The story's releases to roll out.
#[derive(Debug)]
pub struct StoryReleases {
    bmc: orchestrator_db::model::Release,
    gpu_bad: orchestrator_db::model::Release,
}

fn version(v: &'static str) -> Result<FirmwareVersion, DemoError> {
    FirmwareVersion::parse(v).map_err(|source| DemoError::Version { version: v, source })
}

fn register(what: &'static str) -> impl FnOnce(DbError) -> DemoError {
    move |source| DemoError::Register { what, source }
}

/// Registers the story's releases (qualified with the gates their policies
/// require) and the fleet's current versions as each SKU's default, then
/// the good GPU build for the visitor to roll out.
pub async fn register_releases(world: &SimWorld) -> Result<StoryReleases, DemoError> {
    let db = &world.db;
    let bmc_gates = required_gates(db, "bmc-firmware-lab").await;
    let gpu_gates = required_gates(db, "gpu-fast-canary").await;
    let bmc = world
        .register_release(
            ComponentKind::Bmc,
            &version(BMC_TO)?,
            Some(&bmc_gates),
            "BMC 24.04.2: Redfish session fixes",
        )
        .await
        .map_err(register("registering the BMC release"))?;
    let bmc_current = world
        .register_release(
            ComponentKind::Bmc,
            &version(BMC_FROM)?,
            None,
            "the fleet's BMC firmware",
        )
        .await
        .map_err(register("registering the current BMC release"))?;
    let gpu_bad = world
        .register_release(
            ComponentKind::Gpu,
            &version(GPU_BAD)?,
            Some(&gpu_gates),
            "GPU 96.00.66: passed lab qualification; regresses XID errors in the fleet",
        )
        .await
        .map_err(register("registering the GPU release"))?;
    let gpu_current = world
        .register_release(
            ComponentKind::Gpu,
            &version(GPU_FROM)?,
            None,
            "the fleet's GPU firmware",
        )
        .await
        .map_err(register("registering the current GPU release"))?;
    // What the fleet runs is its baseline: the fleet page measures
    // compliance against the default release of each SKU and component.
    for release in [&bmc_current, &gpu_current] {
        make_default(db, release.id).await?;
    }
    world
        .register_release(
            ComponentKind::Gpu,
            &version(GPU_GOOD)?,
            Some(&gpu_gates),
            "GPU 96.00.61: a good build, for you to roll out",
        )
        .await
        .map_err(register("registering the good GPU release"))?;

    Ok(StoryReleases { bmc, gpu_bad })
}

impl Story {
    /// Starts the story's two rollouts.
    pub async fn start(db: &Db, releases: &StoryReleases) -> Result<Story, DemoError> {
        let mut chapters = Vec::new();
        for (title, release, policy) in [
            (format!("BMC {BMC_TO}"), &releases.bmc, "bmc-firmware-lab"),
            (format!("GPU {GPU_BAD}"), &releases.gpu_bad, "gpu-fast-canary"),
        ] {
            let rollout = start(db, release.id, policy).await?;
            chapters.push(Chapter {
                title,
                id: rollout.id,
                last_rollout_state: None,
                last_wave_states: BTreeMap::new(),
                waiting_since: BTreeMap::new(),
            });
        }
        Ok(Story { chapters })
    }
}

/// Takes a registered release through qualification to `default`.
async fn make_default(db: &Db, release: ReleaseId) -> Result<(), DemoError> {
    for to in [
        QualificationState::Qualifying,
        QualificationState::Qualified,
        QualificationState::Default,
    ] {
        db.transition_release(release, &TransitionRequest { to, reason: None }, DEMO_AUTHOR)
            .await
            .map_err(|source| DemoError::MakeDefault { release, source })?;
    }
    Ok(())
}

/// A policy in force by name (with its commit and blob), or the embedded
/// copy as an inline policy.
async fn policy(db: &Db, name: &str) -> Result<(String, Option<String>, Option<String>), DemoError> {
    if let Ok(in_force) = db.policies_in_force().await
        && let Some(p) = in_force.into_iter().find(|p| p.version.name == name)
    {
        return Ok((p.version.content, Some(p.version.commit_id), Some(p.version.blob_id)));
    }
    EMBEDDED_POLICIES
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, text)| ((*text).to_owned(), None, None))
        .ok_or_else(|| DemoError::NoPolicy(name.to_owned()))
}

async fn required_gates(db: &Db, name: &str) -> Vec<String> {
    match policy(db, name).await {
        Ok((text, _, _)) => orchestrator_engine::parse_policy(&text)
            .map(|p| p.qualification.required_gates)
            .unwrap_or_default(),
        Err(_) => Vec::new(),
    }
}

async fn start(db: &Db, release: ReleaseId, name: &str) -> Result<ExecRollout, DemoError> {
    let (source, commit, blob) = policy(db, name).await?;
    orchestrator_engine::start_rollout(
        db,
        &StartRollout {
            release_id: release,
            policy_source: source,
            policy_commit: commit,
            policy_blob: blob,
            seed: 7,
        },
        DEMO_AUTHOR,
    )
    .await
    .map_err(|source| DemoError::Start {
        name: name.to_owned(),
        source: Box::new(source),
    })
}

fn clock_label(started: DateTime<Utc>, now: DateTime<Utc>) -> String {
    let minutes = (now - started).num_minutes().max(0);
    format!("[+{:02}h{:02}m]", minutes / 60, minutes % 60)
}

impl Story {
    /// Says what changed since the last call, gives overdue approvals as
    /// [`DEMO_AUTOPILOT`], and jumps over simulated time while every
    /// unfinished rollout waits only for a window. True when every chapter
    /// has ended.
    pub async fn tell(
        &mut self,
        world: &SimWorld,
        started: DateTime<Utc>,
        approve_after: Option<StdDuration>,
        say: &mut dyn FnMut(String),
    ) -> Result<bool, DbError> {
        let db = &world.db;
        let chapters = &mut self.chapters;
        let mut all_done = true;
        let mut idle: Vec<Option<DateTime<Utc>>> = Vec::new();
        for chapter in chapters.iter_mut() {
            let rollout = db.exec_rollout(chapter.id).await?;
            let waves = db.rollout_waves(chapter.id).await?;
            let now = world.clock.now();
            let stamp = clock_label(started, now);
            if chapter.last_rollout_state != Some(rollout.state) {
                chapter.last_rollout_state = Some(rollout.state);
                let reason = rollout
                    .state_reason
                    .as_deref()
                    .map(|r| format!(": {r}"))
                    .unwrap_or_default();
                say(format!("{stamp} {} rollout {}{reason}", chapter.title, rollout.state));
                if matches!(rollout.state, RolloutState::Halted | RolloutState::RolledBack) {
                    let release = db.release(rollout.release_id).await?;
                    say(format!(
                        "{stamp} {} release is now {}{}",
                        chapter.title,
                        release.qualification_state.as_str(),
                        release
                            .state_reason
                            .map(|r| format!(" ({})", headline(&r)))
                            .unwrap_or_default()
                    ));
                }
            }
            for wave in &waves {
                if chapter.last_wave_states.get(&wave.id) == Some(&wave.state) {
                    continue;
                }
                chapter.last_wave_states.insert(wave.id, wave.state);
                if wave.state == WaveState::Planned {
                    continue;
                }
                let what = match wave.state {
                    WaveState::Running if wave.kind == WaveKind::Rollback => "rolling the updated nodes back".into(),
                    WaveState::Running => format!("flashing {} node(s)", wave.node_count),
                    WaveState::Baking if wave.gates.is_empty() => format!("baking {} h", wave.bake_seconds / 3600),
                    WaveState::Baking => format!(
                        "baking {} h; gates {} watch it against {} control node(s)",
                        wave.bake_seconds / 3600,
                        wave.gates.join(", "),
                        wave.control_nodes.len()
                    ),
                    WaveState::AwaitingApproval => {
                        chapter.waiting_since.insert(wave.id, Instant::now());
                        format!(
                            "waits for approval ({}): approve it at /rollouts/{}",
                            verdict_summary(wave.verdict.as_ref()).unwrap_or_else(|| "a manual wave follows".into()),
                            chapter.id
                        )
                    }
                    WaveState::Promoted => "promoted".into(),
                    WaveState::Halted => format!(
                        "halted: {}",
                        wave.state_reason.clone().unwrap_or_else(|| "see the rollout".into())
                    ),
                    WaveState::RolledBack => "rolled back".into(),
                    WaveState::Planned => continue,
                };
                say(format!("{stamp} {} · {}: {what}", chapter.title, wave.name));
            }
            if let Some(limit) = approve_after {
                for wave in waves.iter().filter(|w| w.state == WaveState::AwaitingApproval) {
                    let since = *chapter.waiting_since.entry(wave.id).or_insert_with(Instant::now);
                    if since.elapsed() < limit {
                        continue;
                    }
                    let have = db.wave_approvals(wave.id).await?;
                    if have.iter().any(|a| a.approver == DEMO_AUTOPILOT) {
                        continue;
                    }
                    match db
                        .approve_wave(
                            wave.id,
                            DEMO_AUTOPILOT,
                            Some("approved by the demo after waiting for a visitor"),
                        )
                        .await
                    {
                        Ok(_) => say(format!(
                            "{stamp} {} · {}: nobody approved for {} s; {DEMO_AUTOPILOT} approved",
                            chapter.title,
                            wave.name,
                            limit.as_secs()
                        )),
                        Err(err) => tracing::warn!(error = %err, "demo approval"),
                    }
                }
            }
            let finished = matches!(
                rollout.state,
                RolloutState::Completed | RolloutState::RolledBack | RolloutState::Aborted | RolloutState::Halted
            );
            if !finished {
                all_done = false;
                let counts = db.step_counts(chapter.id, None).await?;
                let in_flight = counts.iter().any(|(s, n)| s.is_in_flight() && *n > 0);
                idle.push(if in_flight || rollout.state != RolloutState::Running {
                    None
                } else {
                    idle_until(&waves, false)
                });
            }
        }
        // Every unfinished rollout waits only for a window: jump to the first
        // that opens.
        if !idle.is_empty()
            && idle.iter().all(Option::is_some)
            && let Some(at) = idle.iter().flatten().min()
        {
            world.skip_to(*at).await;
        }
        Ok(all_done)
    }
}

/// The first part of a reason, without the evidence JSON the engine appends.
fn headline(reason: &str) -> String {
    let head = reason.split("; evidence:").next().unwrap_or(reason);
    if head.chars().count() > 240 {
        format!("{}...", head.chars().take(240).collect::<String>())
    } else {
        head.to_owned()
    }
}

fn verdict_summary(verdict: Option<&orchestrator_types::WaveVerdict>) -> Option<String> {
    let v = verdict?;
    Some(if v.summary.is_empty() {
        format!("verdict {}", v.outcome)
    } else {
        format!("verdict {}: {}", v.outcome, v.summary)
    })
}
