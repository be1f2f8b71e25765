//! The rollout planner: fleet snapshot + policy + release + seed → an
//! immutable [`Plan`].
//!
//! Invariant: this crate does no I/O, reads no clock and uses no global
//! random-number generator; it depends on no tokio, reqwest, sea-orm or
//! axum. Every input is passed in ([`PlanInput`]), so the same inputs always
//! give the same plan, and the plan's [`Plan::fingerprint`] says which
//! inputs those were. The engine stores the plan and executes it without
//! making choices of its own; a stored plan is never edited, only
//! superseded.
//!
//! # Algorithm
//!
//! 1. **Release check.** A blocked or deprecated release, or one for another
//!    component kind, is a [`PlanError`]. A release that is not qualified
//!    (state `qualified`/`default` *and* every gate the policy requires
//!    passed) is an error unless the policy allows an unqualified canary; then
//!    every wave after the first carries [`WaveBlocker::AwaitingQualification`]
//!    (data the engine waits on, not an error).
//! 2. **Eligibility.** Nodes are taken in node-id order (the snapshot's order
//!    does not matter). Each node is either eligible or excluded with the
//!    first [`ExclusionReason`] that applies, checked in this order:
//!    targeting (policy platforms, release platforms, label selector,
//!    exclusion selectors, exclusion by name, component kind, inventory-id
//!    pattern), an unparseable current version, *already at target* (every
//!    matching component already runs the release: nothing to do), node state,
//!    health, and for the components that need the update: updateable,
//!    the policy's `from` constraint, and downgrade. A node updates all its
//!    matching components or none, so a baseboard never ends up half
//!    flashed by the planner's choice.
//! 3. **Wave sizes.** `count: n` takes `n` nodes, `percent: p` takes
//!    `ceil(p% of all eligible nodes)` — at least one node while any remain —
//!    and the last wave takes every node left. A wave never takes more than
//!    remain; waves the eligible nodes do not reach are left out and named in
//!    the plan's notes.
//! 4. **Stratified order.** The remaining eligible nodes are ordered so that
//!    every prefix is spread out: grouped by the coarsest label first
//!    (platform, region, cluster, then rack, NVLink domain, plus the wave's
//!    `stratify_by` labels, coarsest first by number of distinct values),
//!    each group ordered recursively, then merged taking first one node of
//!    every group (group order shuffled with the seed) and then the rest in
//!    proportion to group size with seeded offsets (systematic sampling).
//!    The canary, a short prefix, therefore covers as many platforms,
//!    clusters and racks as its size allows rather than being the first N.
//! 5. **Caps.** Every wave but the last is filled greedily in that order
//!    under membership caps per rack, NVLink domain and cluster, see
//!    [`WaveCaps`] for the interpretation of the policy's `concurrency`
//!    block. When racks and NVLink domains cross, the greedy pass can get
//!    stuck short of the wave's size; the choice is then completed as a
//!    maximum flow (source → cluster → rack → node → domain → sink, caps as
//!    capacities) starting from the greedy choice. A choice within every cap
//!    always exists because each cap is at least its stratum's fair share;
//!    a wave would record a [`CapRelaxation`] if that ever failed. The
//!    order of a wave's nodes is the order the engine should start them in.
//! 6. **Control cohorts.** For each wave, comparable nodes (same platform and
//!    same current versions of the target components) that are not in this
//!    wave or an earlier one: first nodes of later waves in the wave's
//!    clusters, then later waves elsewhere, then healthy active nodes outside
//!    the rollout (in the wave's clusters first). The cohort is sized
//!    `max(wave size, MIN_CONTROL_COHORT)` capped at `MAX_CONTROL_COHORT`,
//!    split across the wave's comparability classes in proportion; each
//!    tier is taken in stratified order. A class with too few candidates is a
//!    [`ControlShortfall`]; a wave with none at all (typically the last) says
//!    so with [`ControlPlan::Unavailable`] and a reason.
//! 7. **Rollback assessment.** Rollback re-flashes each component's recorded
//!    previous version. It is impossible when the release metadata forbids
//!    downgrades, when a component updates from below the release's rollback
//!    floor, or when a component is known to refuse older images; the plan
//!    says so before the first wave.
//!
//! Randomness comes from a SplitMix64 generator derived from the seed and a
//! purpose (`wave k`, `control of wave k`), kept in this crate so a plan is
//! reproducible from its seed across dependency upgrades.

mod baseline;
mod eligibility;
mod error;
mod input;
mod plan;
mod planner;
pub mod power;
mod rng;
mod select;
mod soak;
mod strata;

pub use error::PlanError;
pub use input::{ComponentSnapshot, FleetSnapshot, NodeHealth, NodeSnapshot, ReleaseSpec};
pub use plan::{
    ApprovalRule, CapDimension, CapRelaxation, ControlMember, ControlPlan, ControlShortfall, ControlSource,
    ExclusionReason, NodeEligibility, NodePlan, Outcome, PLAN_FORMAT_VERSION, Plan, PlanSummary, ReleaseSummary,
    RollbackAssessment, RollbackBlocker, SizeRule, StepPlan, TARGET_EXAMPLES, TargetGroup, WaveBlocker, WaveCaps,
    WavePlan,
};
pub use planner::{MAX_CONTROL_COHORT, MIN_CONTROL_COHORT, PlanInput, plan};

/// The strata a node counts against for [`WaveCaps`], as
/// `(dimension, key)` pairs; exposed so tests and the engine count caps
/// exactly as the planner does.
pub fn cap_strata(node: &NodeSnapshot) -> Vec<(CapDimension, String)> {
    select::cap_strata(node)
}
