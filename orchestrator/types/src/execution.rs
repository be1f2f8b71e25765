//! Where rollouts, waves and steps stand, and why they are not moving: the
//! execution vocabulary every layer names (engine, database, API, UI), kept
//! here so none of them needs the database crate to say "halted".
//!
//! The text forms are the stored and serialized spellings; changing one is a
//! migration.

use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

#[cfg(feature = "openapi")]
use utoipa::ToSchema;

macro_rules! string_enum {
    ($(#[$doc:meta])* $name:ident { $($(#[$vdoc:meta])* $variant:ident => $text:literal),* $(,)? }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
        #[cfg_attr(feature = "openapi", derive(ToSchema))]
        #[serde(rename_all = "snake_case")]
        pub enum $name { $($(#[$vdoc])* $variant),* }

        impl $name {
            /// The stored and serialized spelling.
            pub fn as_str(self) -> &'static str {
                match self { $($name::$variant => $text),* }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl FromStr for $name {
            type Err = String;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                match s {
                    $($text => Ok($name::$variant),)*
                    other => Err(format!("unknown {} {other:?}", stringify!($name))),
                }
            }
        }
    };
}

string_enum!(
    /// Where one per-node update stands. See the engine's crate docs for
    /// what each state means after a crash.
    StepState {
        /// Planned, nothing done yet.
        Pending => "pending",
        /// Inventory read and as expected; admitted under the caps.
        Prechecked => "prechecked",
        /// Intent to push written; whether the BMC accepted it is unknown.
        Pushing => "pushing",
        /// The BMC accepted the push; its task URI is stored.
        Flashing => "flashing",
        /// The image is staged; a reset activates it.
        Activating => "activating",
        /// The new version should be running; inventory must say so.
        Verifying => "verifying",
        /// Inventory read back the target version.
        Succeeded => "succeeded",
        /// Gave up; `error` says why.
        Failed => "failed",
        /// Already at the target: nothing flashed.
        Skipped => "skipped",
        /// Left out of this wave for a reason that is not the firmware's:
        /// its workload scheduler did not give the node up (drained by an
        /// operator, never emptied). Nothing flashed; the node keeps its
        /// version and a later rollout picks it up. Never a failure.
        Deferred => "deferred",
    }
);

impl StepState {
    /// No further transition happens.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            StepState::Succeeded | StepState::Failed | StepState::Skipped | StepState::Deferred
        )
    }

    /// Counts against concurrency caps: admitted and not finished.
    pub fn is_in_flight(self) -> bool {
        !self.is_terminal() && self != StepState::Pending
    }

    /// Every state, in lifecycle order.
    pub const ALL: [StepState; 10] = [
        StepState::Pending,
        StepState::Prechecked,
        StepState::Pushing,
        StepState::Flashing,
        StepState::Activating,
        StepState::Verifying,
        StepState::Succeeded,
        StepState::Failed,
        StepState::Skipped,
        StepState::Deferred,
    ];
}

string_enum!(
    /// How far Waveguard's drain of one node through its workload scheduler
    /// has got. Each phase is written *before* the effect it announces, so a
    /// crash leaves at worst a phase whose effect may or may not have
    /// happened; the scheduler rules accept both. Lifecycle order.
    DrainPhase {
        /// Checked the node was in service; about to issue the drain.
        DrainIntended => "drain_intended",
        /// The drain read back with our tag; waiting for it to empty,
        /// flashing, verifying. A reboot may happen in this phase.
        Held => "held",
        /// About to resume (or already resumed).
        ResumeIntended => "resume_intended",
        /// Kept drained with a quarantine tag for a human; Waveguard no
        /// longer resumes it by itself.
        Quarantined => "quarantined",
        /// Done: resumed, or found no longer ours (the close reason says).
        Closed => "closed",
    }
);

impl DrainPhase {
    /// Every phase, in lifecycle order.
    pub const ALL: [DrainPhase; 5] = [
        DrainPhase::DrainIntended,
        DrainPhase::Held,
        DrainPhase::ResumeIntended,
        DrainPhase::Quarantined,
        DrainPhase::Closed,
    ];

    /// Waveguard still owes the node something: a drain to confirm, a
    /// flash to wait for, or a resume. A quarantined node is a human's.
    pub fn is_open(self) -> bool {
        matches!(
            self,
            DrainPhase::DrainIntended | DrainPhase::Held | DrainPhase::ResumeIntended
        )
    }
}

impl PartialOrd for DrainPhase {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for DrainPhase {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        let pos = |p: &DrainPhase| DrainPhase::ALL.iter().position(|x| x == p).unwrap_or(0);
        pos(self).cmp(&pos(other))
    }
}

string_enum!(
    /// Why a step exists.
    StepPurpose {
        /// Move the node to the release.
        Update => "update",
        /// Move an updated node back to its recorded previous version.
        Rollback => "rollback",
    }
);

string_enum!(
    /// A wave's lifecycle: planned → running → baking → awaiting approval →
    /// promoted, or halted, or rolled back.
    WaveState {
        /// Not started.
        Planned => "planned",
        /// Its steps are being executed.
        Running => "running",
        /// Every step is done; health is watched until the bake ends.
        Baking => "baking",
        /// Bake over; waits for approvals (or a human verdict).
        AwaitingApproval => "awaiting_approval",
        /// Done; the next wave may start.
        Promoted => "promoted",
        /// Stopped by the failure budget, a bricked node, a failed verdict or a user.
        Halted => "halted",
        /// Its nodes were moved back to their previous versions.
        RolledBack => "rolled_back",
    }
);

impl WaveState {
    /// Every state, in lifecycle order.
    pub const ALL: [WaveState; 7] = [
        WaveState::Planned,
        WaveState::Running,
        WaveState::Baking,
        WaveState::AwaitingApproval,
        WaveState::Promoted,
        WaveState::Halted,
        WaveState::RolledBack,
    ];

    /// Closed: nothing moves the wave any more.
    pub fn is_closed(self) -> bool {
        matches!(self, WaveState::Promoted | WaveState::Halted | WaveState::RolledBack)
    }
}

string_enum!(
    /// A rollout's lifecycle.
    RolloutState {
        /// Executing waves.
        Running => "running",
        /// A user paused it: no new flash starts; in-flight ones finish.
        Paused => "paused",
        /// Stopped by the engine (budget, bricked node, failed verdict).
        Halted => "halted",
        /// Stopped by a user: no new flash; in-flight ones finish; rollback is left to the user.
        Aborted => "aborted",
        /// Moving updated nodes back to their previous versions.
        RollingBack => "rolling_back",
        /// Rollback finished.
        RolledBack => "rolled_back",
        /// Every wave promoted.
        Completed => "completed",
    }
);

impl RolloutState {
    /// Whether the engine still moves the rollout forward: running or
    /// paused. Only then are its blockers current (elsewhere a stored
    /// blocker is history) and only then may a wave of it be approved: a
    /// finished, aborted, halted or rolled-back rollout starts no wave, so an
    /// approval there would count for nothing, or later for a verdict nobody
    /// read. The datastore refuses it and the UI never offers it.
    pub fn is_active(self) -> bool {
        matches!(self, RolloutState::Running | RolloutState::Paused)
    }

    /// Whether the rollout is over for good: completed or rolled back. An
    /// unfinished rollout (halted and aborted ones too: a human may still
    /// roll them back) still refers to its health samples, and its evidence
    /// package still changes, so health-sample retention keeps its samples.
    ///
    /// Hook for the soak (issue 22, built on its own branch): a rollout in its
    /// soak is not finished, so whatever state the soak adds belongs outside
    /// this list, and the soak's samples are kept until the rollout ends.
    pub fn is_finished(self) -> bool {
        matches!(self, RolloutState::Completed | RolloutState::RolledBack)
    }
}

string_enum!(
    /// What a wave is for.
    WaveKind {
        /// A planned wave of the release.
        Update => "update",
        /// Rollback steps, created when a rollback starts.
        Rollback => "rollback",
    }
);

string_enum!(
    /// The part an update wave plays in a rollout's soak (issue 22); most waves play none.
    WaveRole {
        /// The last wave of the policy: its bake is the soak, the whole fleet on the release against
        /// the holdback, and only its pass makes the release fleet-proven.
        Soak => "soak",
        /// The holdback: nodes kept on the old version as the soak's control, updated after the soak
        /// passed with their own steps.
        Holdback => "holdback",
    }
);

/// The name the planner gives the holdback wave; a policy with a soak may not name a wave so.
pub const HOLDBACK_WAVE: &str = "holdback";

/// Why something is not moving, as data the UI shows ("waiting on: ...").
/// A closed set: the engine never reports a free-text wait.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Blocker {
    /// No maintenance window is open; the next opens at `at`.
    WindowOpensAt { at: Option<DateTime<Utc>> },
    /// The bake ends at `at`.
    BakeEndsAt { at: DateTime<Utc> },
    /// The planned bake is over but the evidence does not yet rule out what must be caught
    /// (`waiting_on`, per gate); the bake extends, at most `until` (the wave's `max_bake`), then a
    /// human decides.
    BakeExtended { until: DateTime<Utc>, waiting_on: String },
    /// The first wave's nodes and the controls are watched before the first flash (the policy's
    /// `detection.pre_period`), so level gates can compare each node with itself; flashing starts at
    /// `until`.
    PreFlashWatch { until: DateTime<Utc> },
    /// Approvals given and needed.
    Approvals { have: u32, need: u32 },
    /// The health verdict is not a pass; a human must decide.
    Verdict { verdict: crate::Outcome, summary: String },
    /// A concurrency cap is full (`scope`: wave, rollout, fleet, rack,
    /// nvlink_domain, cluster, node).
    InFlightCap { scope: String, limit: u32 },
    /// Retrying after a transient BMC error; the earliest retry is at `at`.
    Backoff { at: DateTime<Utc> },
    /// The rollout is paused.
    Paused,
    /// The previous wave is not promoted yet.
    PreviousWave { wave: String },
    /// Only the canary may run until the release is qualified: its
    /// qualification `state` and the policy's gates it has not passed.
    AwaitingQualification { state: String, missing_gates: Vec<String> },
    /// `nodes` steps are in `state`, the first of which fails at `at` unless
    /// it moves on: every step state has a deadline, so a BMC task that never
    /// ends cannot hold a wave for good.
    StepDeadline {
        state: StepState,
        nodes: u32,
        at: DateTime<Utc>,
    },
    /// A node drained through its workload scheduler is not empty yet
    /// (`waiting_on`: jobs, not_responding, down); after `until` the wave's
    /// `on_drain_timeout` applies.
    Drain {
        node: String,
        waiting_on: String,
        until: DateTime<Utc>,
    },
    /// A node did not empty within the wave's `drain_timeout` and the
    /// policy says `hold`: it stays drained until a human acts (or its
    /// jobs end).
    DrainTimedOut { node: String },
    /// Draining more would take more than the policy's
    /// `max_out_of_service_percent` of the cluster's GPUs out of service
    /// (`out_of_service` of `total` GPUs already are).
    CapacityCap {
        cluster: String,
        out_of_service: u64,
        total: u64,
    },
    /// The workload scheduler cannot be asked right now; nothing is
    /// drained or resumed until it answers (no node is charged).
    SchedulerUnavailable { error: String },
}

impl PartialOrd for StepState {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for StepState {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        let pos = |s: &StepState| StepState::ALL.iter().position(|x| x == s).unwrap_or(0);
        pos(self).cmp(&pos(other))
    }
}
