//! What a scheduler says about a node, in scheduler-neutral terms, and the
//! reason tag by which Waveguard marks its own drains.

use orchestrator_types::RolloutId;
use serde::Serialize;

/// The node's base state (Slurm's word before any `+FLAG`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BaseState {
    /// No job.
    Idle,
    /// Every CPU allocated.
    Allocated,
    /// Some CPUs allocated.
    Mixed,
    /// Out of service: set by an operator, or by the scheduler when the
    /// node stopped responding or rebooted unexpectedly.
    Down,
    /// Defined but not yet in the cluster.
    Future,
    /// The scheduler has not heard from the node yet (e.g. just started).
    Unknown,
}

/// A drain (or down) reason with who set it and when, as reported.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Reason {
    /// The text (`Reason=`), without Slurm's `[user@time]` suffix.
    pub text: String,
    /// Who set it (a user name, or `slurm`/root when the scheduler did).
    pub set_by: Option<String>,
    /// When, as Unix seconds, if reported.
    pub set_at: Option<i64>,
}

/// A node as its scheduler reports it at one moment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NodeState {
    /// The scheduler's name for it.
    pub name: String,
    /// Base state.
    pub base: BaseState,
    /// The DRAIN flag: no new jobs. With jobs still running Slurm calls the
    /// node DRAINING; with none, DRAINED (`IDLE+DRAIN`).
    pub drain: bool,
    /// False when the node's daemon is not answering (Slurm's `*` suffix or
    /// `NOT_RESPONDING` flag): after a host reboot until slurmd registers
    /// again, or when the host is dead. `drained*` is such a node and is not
    /// known to be empty.
    pub responding: bool,
    /// Jobs are finishing (`COMPLETING`): not empty yet.
    pub completing: bool,
    /// A reboot was requested or issued through the scheduler
    /// (`scontrol reboot`), so it will go away and come back by itself.
    pub reboot_pending: bool,
    /// CPUs allocated to jobs (0 when idle).
    pub alloc_cpus: u32,
    /// The drain/down reason, if any.
    pub reason: Option<Reason>,
    /// Boot time of the host as Unix seconds, when reported: a change means
    /// the host rebooted.
    pub boot_time: Option<i64>,
}

/// Slurm's reason when a node registers with a boot time newer than the
/// last it knew and `ReturnToService` does not return it (`< 2`).
pub const UNEXPECTED_REBOOT_REASON: &str = "Node unexpectedly rebooted";

impl NodeState {
    /// Where the node stands for maintenance purposes.
    pub fn service(&self) -> Service {
        if !self.responding {
            return Service::NotResponding;
        }
        if self.base == BaseState::Down {
            return Service::Down;
        }
        if matches!(self.base, BaseState::Future | BaseState::Unknown) {
            return Service::NotResponding;
        }
        let busy =
            self.alloc_cpus > 0 || self.completing || matches!(self.base, BaseState::Allocated | BaseState::Mixed);
        match (self.drain, busy) {
            (false, busy) => Service::InService { busy },
            (true, true) => Service::Draining {
                alloc_cpus: self.alloc_cpus,
            },
            (true, false) => Service::Drained,
        }
    }

    /// The DOWN state Slurm sets after an unexpected reboot (without
    /// `ReturnToService=2`).
    pub fn rebooted_unexpectedly(&self) -> bool {
        self.base == BaseState::Down
            && self
                .reason
                .as_ref()
                .is_some_and(|r| r.text.starts_with(UNEXPECTED_REBOOT_REASON))
    }

    /// The Waveguard tag in the node's reason, if it carries one.
    pub fn tag(&self) -> Option<ReasonTag> {
        self.reason.as_ref().and_then(|r| ReasonTag::parse(&r.text))
    }
}

/// The maintenance view of a node, derived from [`NodeState`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "service")]
pub enum Service {
    /// Accepting jobs (`busy`: running some now).
    InService {
        /// Jobs are running.
        busy: bool,
    },
    /// DRAIN set, jobs still running (`ALLOCATED+DRAIN`, `MIXED+DRAIN`,
    /// or completing).
    Draining {
        /// CPUs still allocated.
        alloc_cpus: u32,
    },
    /// DRAIN set, no jobs, daemon responding (`IDLE+DRAIN`): the only state
    /// in which the node may be flashed.
    Drained,
    /// Not responding (`*`): rebooting, or dead. Its jobs are unknown.
    NotResponding,
    /// DOWN while responding (operator, or an unexpected reboot).
    Down,
}

/// What Waveguard wrote in a drain reason, so that humans reading `sinfo -R`
/// see whose drain it is and why.
///
/// The tag alone never proves ownership (anyone, often root, can write the
/// same text, and `State=RESUME` erases it); Waveguard's durable drain
/// record does, and the tag is checked against it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReasonTag {
    /// The rollout that drained the node.
    pub rollout: RolloutId,
    /// Maintenance or quarantine.
    pub kind: TagKind,
}

/// Why Waveguard holds the node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TagKind {
    /// Taken out for a firmware update; returned afterwards.
    Maintenance,
    /// Kept out after an update because it is not healthy; a human decides.
    Quarantine {
        /// Why, in a few words.
        why: String,
    },
}

/// Prefix of every reason Waveguard writes.
pub const TAG_PREFIX: &str = "waveguard rollout=";

/// Longest reason text written (Slurm stores any length; `sinfo` columns and
/// humans do not).
const MAX_REASON_LEN: usize = 200;

impl ReasonTag {
    /// A maintenance drain for `rollout`.
    pub fn maintenance(rollout: RolloutId) -> Self {
        Self {
            rollout,
            kind: TagKind::Maintenance,
        }
    }

    /// A quarantine for `rollout`, saying `why`.
    pub fn quarantine(rollout: RolloutId, why: &str) -> Self {
        Self {
            rollout,
            kind: TagKind::Quarantine { why: why.to_owned() },
        }
    }

    /// The reason text: `waveguard rollout=7 firmware maintenance` or
    /// `waveguard rollout=7 quarantine: <why>`. Control characters are
    /// replaced (the text is one argument, but a newline would garble
    /// `scontrol show node` for everyone) and the length is bounded.
    pub fn render(&self) -> String {
        let text = match &self.kind {
            TagKind::Maintenance => format!("{TAG_PREFIX}{} firmware maintenance", self.rollout),
            TagKind::Quarantine { why } => format!("{TAG_PREFIX}{} quarantine: {why}", self.rollout),
        };
        text.chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .take(MAX_REASON_LEN)
            .collect()
    }

    /// Reads a reason text back; `None` if it is not one of Waveguard's.
    pub fn parse(text: &str) -> Option<Self> {
        let rest = text.trim().strip_prefix(TAG_PREFIX)?;
        let (id, rest) = rest.split_once(' ').unwrap_or((rest, ""));
        let rollout = RolloutId(id.parse().ok()?);
        let kind = if rest == "firmware maintenance" {
            TagKind::Maintenance
        } else if let Some(why) = rest.strip_prefix("quarantine: ") {
            TagKind::Quarantine { why: why.to_owned() }
        } else {
            return None;
        };
        Some(Self { rollout, kind })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_round_trip_and_foreign_reasons_are_not_tags() {
        for tag in [
            ReasonTag::maintenance(RolloutId(7)),
            ReasonTag::quarantine(RolloutId(12), "GPU 3 missing after flash"),
        ] {
            assert_eq!(ReasonTag::parse(&tag.render()), Some(tag));
        }
        for foreign in [
            "operator maintenance",
            "waveguard rollout=x firmware maintenance",
            "waveguard rollout=7",
            "waveguard rollout=7 something else",
            "Node unexpectedly rebooted boot_time=1",
        ] {
            assert_eq!(ReasonTag::parse(foreign), None, "{foreign:?}");
        }
        let long = ReasonTag::quarantine(RolloutId(1), &"x\n".repeat(500)).render();
        assert!(long.chars().count() <= MAX_REASON_LEN && !long.contains('\n'));
    }
}
