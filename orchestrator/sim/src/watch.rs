//! Drives a simulated rollout to its end: gives manual approvals when asked
//! to, jumps over idle simulated time, and stops when the rollout ends or
//! waits for a human who will not come.

use std::collections::BTreeSet;
use std::time::{Duration as StdDuration, Instant};

use chrono::{DateTime, Utc};
use orchestrator_db::execution::{Blocker, ExecRollout, ExecWave, RolloutState, WaveState};
use orchestrator_types::Clock;

use crate::error::SimError;
use crate::world::SimWorld;

/// Synthetic approvers used by `--approve auto`; distinct people as far as the
/// two-person rule is concerned.
pub const SIM_APPROVERS: [&str; 3] = ["sim-approver-1", "sim-approver-2", "sim-approver-3"];

/// Real time between the simulation's looks at the database.
const WATCH_INTERVAL: StdDuration = StdDuration::from_millis(25);

/// What the watch loop saw.
#[derive(Debug, Clone)]
pub struct Watched {
    /// The rollout at the end.
    pub rollout: ExecRollout,
    /// Why the watch stopped, when not the rollout's own end.
    pub stopped_because: Option<String>,
    /// Simulated instant the simulation ended.
    pub ended_at: DateTime<Utc>,
    /// Real time the rollout took.
    pub wall: StdDuration,
    /// Approvals given by `--approve auto`.
    pub approvals: u32,
    /// When the watch first saw a failed verdict (the engine overwrites the
    /// wave's end when its rollback finishes).
    pub first_fail_seen: Option<DateTime<Utc>>,
}

/// How to watch.
#[derive(Debug, Clone, Copy)]
pub struct WatchOptions {
    /// Give manual approvals automatically.
    pub approve: bool,
    /// Jump over bakes (nothing samples health during them).
    pub skip_bake: bool,
    /// Real-time limit.
    pub timeout: StdDuration,
}

/// Drives a rollout to its end: approves when asked to, jumps over idle
/// time, and returns when the rollout is finished (or halted with nothing in
/// flight, or waits for a human who will not come, or the time is up).
pub async fn watch(world: &SimWorld, rollout: &ExecRollout, options: WatchOptions) -> Result<Watched, SimError> {
    let db = &world.db;
    let wall_start = Instant::now();
    let mut approvals = 0u32;
    let mut quiet_since: Option<Instant> = None;
    let mut first_fail_seen: Option<DateTime<Utc>> = None;
    loop {
        let current = db.exec_rollout(rollout.id).await?;
        let waves = db.rollout_waves(rollout.id).await?;
        let counts = db.step_counts(rollout.id, None).await?;
        if first_fail_seen.is_none() && waves.iter().any(verdict_failed) {
            first_fail_seen = Some(world.clock.now());
        }
        let in_flight: u64 = counts.iter().filter(|(s, _)| s.is_in_flight()).map(|(_, n)| *n).sum();
        let done = |stopped_because: Option<String>, approvals: u32| Watched {
            rollout: current.clone(),
            stopped_because,
            ended_at: world.clock.now(),
            wall: wall_start.elapsed(),
            approvals,
            first_fail_seen,
        };
        match current.state {
            RolloutState::Completed | RolloutState::RolledBack | RolloutState::Aborted => {
                return Ok(done(None, approvals));
            }
            RolloutState::Halted if in_flight == 0 => {
                // A halted rollout waits for a human; let the engine write
                // its last pass first, then stop.
                if quiet_since.is_some_and(|t| t.elapsed() > StdDuration::from_millis(300)) {
                    return Ok(done(None, approvals));
                }
                quiet_since.get_or_insert_with(Instant::now);
            }
            _ => quiet_since = None,
        }
        for wave in waves.iter().filter(|w| w.state == WaveState::AwaitingApproval) {
            if !options.approve {
                return Ok(done(
                    Some(format!(
                        "wave {:?} waits for manual approval (pass --approve auto to give it)",
                        wave.name
                    )),
                    approvals,
                ));
            }
            let have = db.wave_approvals(wave.id).await?;
            let need = usize::try_from(wave.approvals_required.max(1)).unwrap_or(1);
            let given: BTreeSet<&str> = have.iter().map(|a| a.approver.as_str()).collect();
            for approver in SIM_APPROVERS
                .iter()
                .filter(|a| !given.contains(**a))
                .take(need.saturating_sub(have.len()))
            {
                db.approve_wave(wave.id, approver, Some("approved by waveguard simulate --approve auto"))
                    .await
                    .map_err(|source| SimError::Approve {
                        wave: wave.name.clone(),
                        source,
                    })?;
                approvals += 1;
            }
        }
        if current.state == RolloutState::Running && in_flight == 0 {
            skip_idle(world, &waves, options.skip_bake).await;
        }
        if wall_start.elapsed() > options.timeout {
            return Ok(done(
                Some(format!(
                    "gave up after {} real seconds (rollout {})",
                    options.timeout.as_secs(),
                    current.state
                )),
                approvals,
            ));
        }
        tokio::time::sleep(WATCH_INTERVAL).await;
    }
}

/// With nothing in flight, a wave held only by time (a window that opens
/// later; a bake that ends later, when `skip_bake`) is idle until then.
/// `None`: something other than time holds it, or nothing does.
pub fn idle_until(waves: &[ExecWave], skip_bake: bool) -> Option<DateTime<Utc>> {
    let wave = waves
        .iter()
        .find(|w| matches!(w.state, WaveState::Running | WaveState::Baking))?;
    let mut until: Option<DateTime<Utc>> = None;
    for blocker in &wave.blockers {
        let at = match blocker {
            Blocker::WindowOpensAt { at: Some(at) } => *at,
            Blocker::BakeEndsAt { at } if skip_bake && wave.state == WaveState::Baking => *at,
            _ => return None,
        };
        until = Some(until.map_or(at, |u| u.max(at)));
    }
    until
}

async fn skip_idle(world: &SimWorld, waves: &[ExecWave], skip_bake: bool) {
    if let Some(at) = idle_until(waves, skip_bake) {
        tracing::debug!(to = %at, "skipping idle simulated time");
        world.skip_to(at).await;
    }
}

pub(crate) fn verdict_failed(wave: &ExecWave) -> bool {
    wave.verdict
        .as_ref()
        .is_some_and(|v| v.outcome == orchestrator_types::Outcome::Fail)
}
