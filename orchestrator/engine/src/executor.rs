//! One executor pass: advance every admitted step one move, then walk each
//! unfinished rollout's waves one move and admit pending steps under the
//! caps. No input, idempotent: a crash at any line leaves a state the next
//! pass (here or on another replica) continues from.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};

use chrono::{DateTime, Duration, Utc};
use futures::StreamExt;
use orchestrator_db::execution::{
    Blocker, ExecRollout, ExecStep, ExecWave, Fence, PlacedStep, RolloutState, StepFilter, StepPurpose, StepState,
    WaveChange, WaveKind, WaveState,
};
use orchestrator_db::{Db, DbError};
use orchestrator_policy::{Policy, RollbackScope, next_window_start, window_open_at};
use orchestrator_types::{
    ComponentKind, Outcome, QualificationState, RolloutClock, RolloutId, StepId, TransitionRequest, WaveId, WaveRole,
    WaveVerdict, qualification_hold,
};
use serde_json::json;

use crate::config::EngineConfig;
use crate::connector::BmcConnector;
use crate::controller::ControllerHealth;
use crate::drain::{DrainView, Drains, Started};
use crate::health::HealthJudge;
use crate::step::{StepCtx, StepRules};
use crate::wave::{Decision, ReleaseStanding, WaveAction, WaveFacts, decide};

/// Long-lived state of the executor: caches that are safe to lose.
#[derive(Debug)]
pub(crate) struct Executor {
    pub db: Db,
    pub clock: RolloutClock,
    pub config: EngineConfig,
    pub connector: Arc<dyn BmcConnector>,
    pub judge: Arc<dyn HealthJudge>,
    /// The controller's own health: faults here pause flashing, never charge a node.
    pub health: Arc<ControllerHealth>,
    policies: Mutex<HashMap<RolloutId, Arc<Policy>>>,
    kinds: Mutex<HashMap<RolloutId, ComponentKind>>,
}

/// Pending steps a pass reads of each running wave, per step the fleet cap
/// lets in flight: admission walks them in id order and stops at the caps,
/// so a few times the cap leaves room for steps skipped by the per-rack,
/// per-domain and per-node caps without reading a 100,000-step wave's
/// every pending row each pass. A wave whose first rows are all held by
/// those caps admits fewer this pass, never more than the caps allow.
const PENDING_READ_PER_CAP: u64 = 8;
/// Pending steps read per running wave however small the fleet cap.
const MIN_PENDING_READ: u64 = 1024;

/// Longest evidence text put into a release's block reason; the whole
/// verdict stays on the wave.
const MAX_BLOCK_EVIDENCE: usize = 4000;

/// The working set of one pass's walk over the rollouts: the open steps,
/// what is in flight (for the caps) and what this pass admitted.
#[derive(Debug)]
struct Walk<'a> {
    fence: &'a Fence,
    open: &'a [PlacedStep],
    load: Load,
    cluster_sizes: BTreeMap<String, u64>,
    admitted: Vec<PlacedStep>,
    drains: DrainView,
    /// GPUs per node and per cluster, read only when a policy caps the
    /// capacity out of service.
    capacity: Option<Capacity>,
}

/// GPUs per node and per cluster, for `max_out_of_service_percent`.
#[derive(Debug, Default)]
struct Capacity {
    node_gpus: HashMap<i64, u64>,
    cluster_gpus: HashMap<String, u64>,
}

impl Capacity {
    fn gpus(&self, node: i64) -> u64 {
        self.node_gpus.get(&node).copied().unwrap_or(1)
    }
}

/// One blocker per step state with a deadline among the wave's steps in
/// flight: how many are in it and when the first of them fails.
fn step_deadline_blockers(config: &EngineConfig, open: &[PlacedStep], wave: &ExecWave) -> Vec<Blocker> {
    let mut earliest: BTreeMap<StepState, (u32, chrono::DateTime<chrono::Utc>)> = BTreeMap::new();
    for step in open.iter().map(|p| &p.step).filter(|s| s.wave_id == wave.id) {
        let Some(deadline) = config.step_deadline(step.state) else {
            continue;
        };
        let at = step.state_entered_at + deadline;
        let entry = earliest.entry(step.state).or_insert((0, at));
        entry.0 += 1;
        entry.1 = entry.1.min(at);
    }
    earliest
        .into_iter()
        .map(|(state, (nodes, at))| Blocker::StepDeadline { state, nodes, at })
        .collect()
}

/// In-flight counts across every rollout, for the caps.
#[derive(Debug, Default)]
struct Load {
    fleet: u32,
    rollout: HashMap<RolloutId, u32>,
    wave: HashMap<WaveId, u32>,
    rack: HashMap<String, u32>,
    nvlink: HashMap<String, u32>,
    cluster: HashMap<String, u32>,
    nodes: HashSet<i64>,
    /// GPUs out of service (flashing, or held drained) per cluster.
    out_of_service: HashMap<String, u64>,
}

impl Load {
    fn add(&mut self, placed: &PlacedStep, gpus: u64) {
        *self.out_of_service.entry(placed.cluster.clone()).or_default() += gpus;
        self.fleet += 1;
        *self.rollout.entry(placed.step.rollout_id).or_default() += 1;
        *self.wave.entry(placed.step.wave_id).or_default() += 1;
        *self
            .rack
            .entry(format!("{}/{}", placed.cluster, placed.rack))
            .or_default() += 1;
        if !placed.nvlink_domain.is_empty() {
            *self
                .nvlink
                .entry(format!("{}/{}", placed.cluster, placed.nvlink_domain))
                .or_default() += 1;
        }
        *self.cluster.entry(placed.cluster.clone()).or_default() += 1;
        self.nodes.insert(placed.step.node_id.0);
    }
}

/// The open steps as the moves left them: each moved step replaced by the
/// last row its transitions wrote, the finished ones dropped. A change made
/// meanwhile by anyone else is read at the next pass, as it would be had it
/// landed just after a fresh read.
fn after_moves(mut open: Vec<PlacedStep>, moved: Vec<ExecStep>) -> Vec<PlacedStep> {
    if moved.is_empty() {
        return open;
    }
    // Later rows of a step supersede earlier ones: one step's transitions
    // are made one after the other by the task moving it.
    let mut latest: HashMap<StepId, ExecStep> = moved.into_iter().map(|s| (s.id, s)).collect();
    for placed in &mut open {
        if let Some(step) = latest.remove(&placed.step.id) {
            placed.step = step;
        }
    }
    open.retain(|p| !p.step.state.is_terminal());
    open
}

fn is_fenced(err: &DbError) -> bool {
    matches!(err, DbError::Fenced { .. })
}

/// Logs a step-level error; a lost lease is passed up to stop the pass. A
/// database fault of the controller's own (pool exhausted) marks it degraded:
/// the step's state simply was not written, so no node is charged.
fn absorb(
    result: Result<(), DbError>,
    what: &str,
    health: &ControllerHealth,
    now: DateTime<Utc>,
) -> Result<(), DbError> {
    match result {
        Ok(()) => Ok(()),
        Err(err) if is_fenced(&err) => Err(err),
        Err(DbError::Stale { .. }) => Ok(()),
        Err(err) if err.is_controller_fault() => {
            tracing::warn!(error = %orchestrator_types::error_chain(&err), "{what}: controller database fault");
            health.report_fault("database", now);
            Ok(())
        }
        Err(err) => {
            tracing::warn!(error = %orchestrator_types::error_chain(&err), "{what}");
            Ok(())
        }
    }
}

impl Executor {
    pub fn new(db: Db, config: EngineConfig, connector: Arc<dyn BmcConnector>, judge: Arc<dyn HealthJudge>) -> Self {
        Self {
            health: Arc::new(ControllerHealth::new(config.controller_fault_hold)),
            clock: db.clock().clone(),
            db,
            config,
            connector,
            judge,
            policies: Mutex::new(HashMap::new()),
            kinds: Mutex::new(HashMap::new()),
        }
    }

    fn policy(&self, rollout: &ExecRollout) -> Result<Arc<Policy>, String> {
        let mut cache = self.policies.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(policy) = cache.get(&rollout.id) {
            return Ok(policy.clone());
        }
        let source = rollout
            .policy_source
            .as_deref()
            .ok_or_else(|| format!("rollout {} has no stored policy", rollout.id))?;
        let policy = Arc::new(orchestrator_policy::parse_policy(source).map_err(|e| e.to_string())?);
        cache.insert(rollout.id, policy.clone());
        Ok(policy)
    }

    async fn kind(&self, rollout: &ExecRollout) -> Result<ComponentKind, DbError> {
        if let Some(kind) = self.kinds.lock().unwrap_or_else(|p| p.into_inner()).get(&rollout.id) {
            return Ok(*kind);
        }
        let kind = self.db.release(rollout.release_id).await?.component_kind;
        self.kinds
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(rollout.id, kind);
        Ok(kind)
    }

    /// One pass under `fence`. Errors only when the lease is lost or the
    /// database is unreachable; everything else is logged and retried next
    /// pass.
    pub async fn pass(&self, fence: &Fence) -> Result<(), DbError> {
        let ctx = StepCtx {
            db: self.db.clone(),
            clock: self.clock.clone(),
            config: self.config.clone(),
            fence: fence.clone(),
            health: self.health.clone(),
            moved: Arc::default(),
        };
        // A controller short of descriptors (or its image source) would fail
        // every BMC call the same way and blame nothing but itself: while it
        // is degraded no step moves and nothing new is admitted. Waves,
        // bakes and verdicts below still advance; only BMC work waits, on
        // real time (the hold), not on the rollout clock.
        let degraded = self.health.refresh(self.clock.now());
        let rollouts = self.db.unfinished_rollouts().await?;
        let mut rules = HashMap::new();
        for rollout in &rollouts {
            // The policy was validated when the rollout started; a stored
            // policy that no longer parses keeps the driver's defaults.
            let update = self.policy(rollout).map(|p| p.update).unwrap_or_default();
            rules.insert(
                rollout.id,
                StepRules {
                    kind: self.kind(rollout).await?,
                    update,
                },
            );
        }

        // 1. Every admitted step moves once, whatever its rollout's state:
        // paused, aborted and halted rollouts let in-flight flashes finish.
        let open = if self.config.scheduler.is_some() {
            // Drains follow pending steps of any wave (one being drained
            // stays pending until its node is empty): read them all.
            self.db.open_steps().await?
        } else {
            let pending = u64::from(self.config.fleet_max_in_flight).saturating_mul(PENDING_READ_PER_CAP);
            self.db.open_steps_for_pass(pending.max(MIN_PENDING_READ)).await?
        };
        let in_flight: Vec<&PlacedStep> = if degraded {
            Vec::new()
        } else {
            open.iter().filter(|p| p.step.state.is_in_flight()).collect()
        };
        let lost = Mutex::new(None);
        futures::stream::iter(in_flight)
            .for_each_concurrent(self.config.bmc_concurrency, |placed| {
                let ctx = &ctx;
                let lost = &lost;
                let rules = rules
                    .get(&placed.step.rollout_id)
                    .copied()
                    .unwrap_or_else(|| StepRules::of_kind(ComponentKind::Other));
                async move {
                    let result = match self.connector.connect(placed) {
                        Ok(bmc) => ctx.advance(placed, bmc.as_ref(), rules).await,
                        Err(err) => ctx.fail_unaddressable(&placed.step, err.to_string()).await,
                    };
                    if let Err(err) = absorb(result, "step move failed", &self.health, self.clock.now()) {
                        *lost.lock().unwrap_or_else(|p| p.into_inner()) = Some(err);
                    }
                }
            })
            .await;
        if let Some(err) = lost.into_inner().unwrap_or_else(|p| p.into_inner()) {
            return Err(err);
        }

        // 2. Drains through the workload scheduler (when one is
        // configured): confirm, wait for empty nodes, resume after updates.
        // The moves returned the rows they wrote, so the open steps are not
        // read again (thousands of unchanged pending rows in a big wave).
        let open = after_moves(open, ctx.take_moved());
        let drains = self.config.scheduler.as_ref().map(|seam| Drains {
            seam,
            health: &self.health,
            db: &self.db,
            fence,
            now: self.clock.now(),
            brick_timeout: self.config.brick_timeout,
        });
        let drain_view = match &drains {
            Some(drains) if !degraded => {
                let mut live = HashMap::new();
                for rollout in &rollouts {
                    if let Ok(policy) = self.policy(rollout) {
                        live.insert(rollout.id, (rollout.state, policy));
                    }
                }
                drains.reconcile(&live, &open).await?
            }
            _ => DrainView::default(),
        };
        let open = if drains.is_some() {
            // Deferrals and resumes above moved steps.
            self.db.open_steps().await?
        } else {
            open
        };

        // 3. Waves and admissions, with caps computed after the moves.
        let capacity = if rollouts.iter().any(|r| {
            self.policy(r)
                .is_ok_and(|p| p.concurrency.max_out_of_service_percent.is_some())
        }) {
            let node_gpus = self.db.gpu_weights().await?;
            let mut cluster_gpus: HashMap<String, u64> = HashMap::new();
            for (node, cluster) in self.db.node_clusters().await? {
                *cluster_gpus.entry(cluster).or_default() += node_gpus.get(&node).copied().unwrap_or(1);
            }
            Some(Capacity {
                node_gpus,
                cluster_gpus,
            })
        } else {
            None
        };
        let mut walk = Walk {
            fence,
            open: &open,
            load: Load::default(),
            cluster_sizes: self.db.cluster_sizes().await?,
            admitted: Vec::new(),
            drains: drain_view,
            capacity,
        };
        for placed in open
            .iter()
            .filter(|p| p.step.state.is_in_flight() || walk.drains.holds_step(p.step.id.0))
        {
            let gpus = walk.capacity.as_ref().map_or(1, |c| c.gpus(placed.step.node_id.0));
            walk.load.add(placed, gpus);
        }
        walk.load.nodes.extend(walk.drains.nodes.iter().copied());
        for rollout in &rollouts {
            let rollout = match self.db.exec_rollout(rollout.id).await {
                Ok(r) => r,
                Err(err) => {
                    absorb(Err(err), "reading rollout", &self.health, self.clock.now())?;
                    continue;
                }
            };
            let policy = match self.policy(&rollout) {
                Ok(policy) => policy,
                Err(reason) => {
                    tracing::error!(rollout = %rollout.id, %reason, "cannot read the rollout's policy");
                    continue;
                }
            };
            let result = self.reconcile_rollout(&mut walk, &rollout, &policy).await;
            absorb(result, "rollout pass failed", &self.health, self.clock.now())?;
        }
        let mut admitted = walk.admitted;
        let mut drain_view = walk.drains;
        if self.health.is_degraded() {
            // Admitted but not prechecked stays pending: nothing is charged.
            if !admitted.is_empty() {
                tracing::debug!(held = admitted.len(), "controller degraded: admissions wait");
            }
            admitted.clear();
        }
        if let Some(drains) = &drains {
            // A node is flashed only once its scheduler says it is empty.
            let mut to_precheck = Vec::new();
            for placed in admitted {
                let Some(rollout) = rollouts.iter().find(|r| r.id == placed.step.rollout_id) else {
                    continue;
                };
                match drains.start(&placed, rollout, &mut drain_view).await? {
                    Started::Ready => to_precheck.push(placed),
                    Started::Draining | Started::NotNow => {}
                }
            }
            if !self.health.is_degraded() {
                to_precheck.extend(
                    open.iter()
                        .filter(|p| p.step.state == StepState::Pending && drain_view.ready.contains(&p.step.id.0))
                        .cloned(),
                );
            }
            admitted = to_precheck;
        }

        // 4. Prechecks of the admitted steps (reads only), concurrently.
        let lost = Mutex::new(None);
        futures::stream::iter(admitted.iter())
            .for_each_concurrent(self.config.bmc_concurrency, |placed| {
                let ctx = &ctx;
                let lost = &lost;
                async move {
                    let result = match self.connector.connect(placed) {
                        Ok(bmc) => ctx.precheck(placed, bmc.as_ref()).await,
                        Err(err) => ctx.fail_unaddressable(&placed.step, err.to_string()).await,
                    };
                    if let Err(err) = absorb(result, "precheck failed", &self.health, self.clock.now()) {
                        *lost.lock().unwrap_or_else(|p| p.into_inner()) = Some(err);
                    }
                }
            })
            .await;
        if let Some(err) = lost.into_inner().unwrap_or_else(|p| p.into_inner()) {
            return Err(err);
        }
        Ok(())
    }

    async fn reconcile_rollout(
        &self,
        walk: &mut Walk<'_>,
        rollout: &ExecRollout,
        policy: &Policy,
    ) -> Result<(), DbError> {
        let fence = walk.fence;
        let waves = self.db.rollout_waves(rollout.id).await?;
        match rollout.state {
            RolloutState::Running => {
                let Some(wave) = waves
                    .iter()
                    .find(|w| w.kind == WaveKind::Update && w.state != WaveState::Promoted)
                else {
                    self.db
                        .engine_set_rollout_state(
                            fence,
                            rollout.id,
                            &[RolloutState::Running],
                            RolloutState::Completed,
                            None,
                            json!({}),
                        )
                        .await?;
                    return Ok(());
                };
                self.reconcile_wave(walk, rollout, policy, wave).await
            }
            RolloutState::RollingBack => self.reconcile_rollback(walk, rollout, policy, &waves).await,
            RolloutState::Paused => self.set_rollout_blockers(fence, rollout, vec![Blocker::Paused]).await,
            // Halted and aborted rollouts only let in-flight steps finish (step 1).
            _ => self.set_rollout_blockers(fence, rollout, Vec::new()).await,
        }
    }

    async fn set_rollout_blockers(
        &self,
        fence: &Fence,
        rollout: &ExecRollout,
        blockers: Vec<Blocker>,
    ) -> Result<(), DbError> {
        if rollout.blockers != blockers {
            self.db.set_rollout_blockers(fence, rollout.id, &blockers).await?;
        }
        Ok(())
    }

    async fn set_wave_blockers(&self, fence: &Fence, wave: &ExecWave, blockers: Vec<Blocker>) -> Result<(), DbError> {
        if wave.blockers != blockers {
            self.db.set_wave_blockers(fence, wave.id, &blockers).await?;
        }
        Ok(())
    }

    /// One move of the rollout's current update wave: gather its facts,
    /// ask the pure decision ([`crate::wave::decide`]), apply the answer.
    async fn reconcile_wave(
        &self,
        walk: &mut Walk<'_>,
        rollout: &ExecRollout,
        policy: &Policy,
        wave: &ExecWave,
    ) -> Result<(), DbError> {
        self.set_rollout_blockers(walk.fence, rollout, Vec::new()).await?;
        let resume_owed = walk.drains.resume_owed.get(&wave.id).copied().unwrap_or(0);
        let facts = self.wave_facts(walk.open, rollout, policy, wave, resume_owed).await?;
        let action = decide(&facts);
        self.apply(walk, rollout, policy, wave, action).await
    }

    /// What the decision needs to know about `wave`, read only as far as
    /// its state needs (the judge is asked only while the wave bakes).
    async fn wave_facts(
        &self,
        open: &[PlacedStep],
        rollout: &ExecRollout,
        policy: &Policy,
        wave: &ExecWave,
        resume_owed: u64,
    ) -> Result<WaveFacts, DbError> {
        let now = self.clock.now();
        let mut facts = WaveFacts {
            state: wave.state,
            position: wave.position,
            node_count: usize::try_from(wave.node_count).unwrap_or(0),
            now,
            release: ReleaseStanding::Usable,
            failed_steps: 0,
            unfinished_steps: 0,
            failure_budget: policy.failure_budget,
            bake_ends_at: wave.bake_started_at.unwrap_or(now) + Duration::seconds(wave.bake_seconds),
            max_bake_ends_at: wave.bake_started_at.unwrap_or(now)
                + Duration::seconds(crate::watch::max_bake_seconds(policy, wave)),
            verdict: wave.verdict.clone(),
            approvals_required: wave.approvals_required,
            approvals: Vec::new(),
            step_deadlines: Vec::new(),
            pre_flash_watch_until: pre_flash_watch_until(policy, wave),
            rollback_automatic: policy.rollback.automatic,
        };
        if wave.state.is_closed() {
            return Ok(facts);
        }
        facts.release = self.release_standing(rollout, policy, wave).await?;
        match wave.state {
            WaveState::Running => {
                let counts = self.db.step_counts(rollout.id, Some(wave.id)).await?;
                facts.failed_steps = counts.get(&StepState::Failed).copied().unwrap_or(0);
                // A node still drained by us is not back in service: the
                // bake waits for it (its health would say nothing loaded).
                facts.unfinished_steps = counts
                    .iter()
                    .filter(|(s, _)| !s.is_terminal())
                    .map(|(_, n)| *n)
                    .sum::<u64>()
                    + resume_owed;
                facts.step_deadlines = step_deadline_blockers(&self.config, open, wave);
                if facts.pre_flash_watch_until.is_some_and(|until| now < until) {
                    self.judge.watch_before_flash(rollout, wave, policy).await;
                }
            }
            WaveState::Baking => {
                facts.verdict = if now < facts.bake_ends_at {
                    self.judge.check(rollout, wave, policy).await
                } else {
                    Some(self.judge.judge(rollout, wave, policy).await)
                };
            }
            WaveState::AwaitingApproval => facts.approvals = self.db.wave_approvals(wave.id).await?,
            _ => {}
        }
        Ok(facts)
    }

    /// Applies the decision's action; every write is conditional on the
    /// state the facts were read in, so a pass that lost a race does nothing.
    async fn apply(
        &self,
        walk: &mut Walk<'_>,
        rollout: &ExecRollout,
        policy: &Policy,
        wave: &ExecWave,
        action: WaveAction,
    ) -> Result<(), DbError> {
        let fence = walk.fence;
        let now = self.clock.now();
        match action {
            WaveAction::Nothing => Ok(()),
            WaveAction::Start => {
                self.db
                    .transition_wave(
                        fence,
                        wave.id,
                        WaveState::Planned,
                        &WaveChange {
                            state: Some(WaveState::Running),
                            started_at: Some(now),
                            ..Default::default()
                        },
                        json!({}),
                    )
                    .await?;
                Ok(())
            }
            WaveAction::Admit { blockers: extra } => {
                let mut blockers = self.admit(walk, rollout, policy, wave, true);
                blockers.extend(extra);
                blockers.extend(walk.drains.blockers.get(&wave.id).cloned().unwrap_or_default());
                self.set_wave_blockers(fence, wave, blockers).await
            }
            WaveAction::StartBake => {
                let counts = self.db.step_counts(rollout.id, Some(wave.id)).await?;
                self.db
                    .transition_wave(
                        fence,
                        wave.id,
                        WaveState::Running,
                        &WaveChange {
                            state: Some(WaveState::Baking),
                            bake_started_at: Some(now),
                            ..Default::default()
                        },
                        json!({ "counts": counts.iter().map(|(k, v)| (k.as_str(), *v)).collect::<BTreeMap<_, _>>() }),
                    )
                    .await?;
                Ok(())
            }
            WaveAction::Wait { blockers } => self.set_wave_blockers(fence, wave, blockers).await,
            WaveAction::Halt { reason } => self.halt(fence, rollout, wave, &reason).await,
            WaveAction::Promote {
                decision,
                verdict,
                approvers,
            } => {
                // A passing soak proves the release in the fleet, before the wave moves on: a crash
                // between the two replays the same recorded looks, and a release already proven
                // stays as it is. Promoting anyway over a soak that did not pass proves nothing.
                let passed = verdict
                    .as_ref()
                    .or(wave.verdict.as_ref())
                    .is_some_and(|v| v.outcome == Outcome::Pass);
                if wave.role == Some(WaveRole::Soak) && decision == Decision::Promote && passed {
                    self.prove_release(rollout, wave).await?;
                }
                let details = json!({
                    "decision": decision.as_str(),
                    "verdict": verdict.as_ref().or(wave.verdict.as_ref()).map(|v| v.outcome),
                    "approvers": approvers,
                    "by": if approvers.is_empty() { "engine" } else { "approvers" },
                });
                self.db
                    .transition_wave(
                        fence,
                        wave.id,
                        wave.state,
                        &WaveChange {
                            state: Some(WaveState::Promoted),
                            ended_at: Some(now),
                            decision: Some(decision.as_str().into()),
                            verdict,
                            ..Default::default()
                        },
                        details,
                    )
                    .await?;
                self.set_wave_blockers(fence, wave, Vec::new()).await
            }
            WaveAction::AwaitApproval { verdict, need } => {
                let outcome = verdict.outcome;
                self.db
                    .transition_wave(
                        fence,
                        wave.id,
                        WaveState::Baking,
                        &WaveChange {
                            state: Some(WaveState::AwaitingApproval),
                            verdict: Some(verdict),
                            approvals_required: Some(need),
                            ..Default::default()
                        },
                        json!({ "verdict": outcome }),
                    )
                    .await?;
                Ok(())
            }
            WaveAction::Failed {
                verdict,
                decision,
                reason,
            } => {
                let outcome = verdict.outcome;
                let halted = self
                    .db
                    .transition_wave(
                        fence,
                        wave.id,
                        WaveState::Baking,
                        &WaveChange {
                            state: Some(WaveState::Halted),
                            state_reason: Some(Some(reason)),
                            ended_at: Some(now),
                            decision: Some(decision.as_str().into()),
                            verdict: Some(verdict),
                            ..Default::default()
                        },
                        json!({ "verdict": outcome }),
                    )
                    .await?;
                self.finish_halted_wave(fence, rollout, policy, &halted).await
            }
            WaveAction::FinishHalted => self.finish_halted_wave(fence, rollout, policy, wave).await,
        }
    }

    /// What the release's qualification says about `wave`: a blocked
    /// release halts every rollout of it, whatever the wave is doing
    /// (in-flight flashes finish); waves after the canary wait until the
    /// release is qualified and has passed every gate the policy requires
    /// (the planner let an unqualified canary run only because the policy
    /// allows it).
    async fn release_standing(
        &self,
        rollout: &ExecRollout,
        policy: &Policy,
        wave: &ExecWave,
    ) -> Result<ReleaseStanding, DbError> {
        let release = self.db.release(rollout.release_id).await?;
        if release.qualification_state == QualificationState::Blocked {
            return Ok(ReleaseStanding::Blocked {
                reason: format!(
                    "release {} is blocked: {}",
                    release.id,
                    release.state_reason.as_deref().unwrap_or("no reason recorded")
                ),
            });
        }
        // Only a wave about to start after the canary is held; the gate
        // results are read for it alone.
        if wave.state != WaveState::Planned || wave.position == 0 {
            return Ok(ReleaseStanding::Usable);
        }
        let passed: HashSet<String> = self
            .db
            .gate_results(release.id)
            .await?
            .into_iter()
            .filter(|g| g.passed)
            .map(|g| g.gate)
            .collect();
        Ok(
            match qualification_hold(release.qualification_state, &policy.qualification.required_gates, |g| {
                passed.contains(g)
            }) {
                None => ReleaseStanding::Usable,
                Some(missing_gates) => ReleaseStanding::AwaitingQualification {
                    state: release.qualification_state,
                    missing_gates,
                },
            },
        )
    }

    /// After a wave halted on a failed verdict (or anything else) while the
    /// rollout runs: block the release on a failed verdict, then roll back
    /// when the wave's recorded decision says so, else halt the rollout.
    /// Every write is conditional, so running it twice is harmless.
    async fn finish_halted_wave(
        &self,
        fence: &Fence,
        rollout: &ExecRollout,
        policy: &Policy,
        wave: &ExecWave,
    ) -> Result<(), DbError> {
        if rollout.state != RolloutState::Running {
            return Ok(());
        }
        let mut reason = wave
            .state_reason
            .clone()
            .unwrap_or_else(|| format!("wave {} halted", wave.name));
        let failed_verdict = wave.verdict.as_ref().filter(|v| v.outcome == Outcome::Fail);
        if let Some(verdict) = failed_verdict {
            self.block_release(rollout, wave, verdict).await?;
        }
        if failed_verdict.is_some() && wave.decision.as_deref() == Some("rollback") && policy.rollback.automatic {
            let scope = match policy.rollback.scope {
                RollbackScope::Wave => json!({ "scope": "wave", "waves": [wave.id] }),
                RollbackScope::Rollout => json!({ "scope": "rollout" }),
            };
            match self
                .db
                .begin_rollback(Some(fence), rollout.id, scope, &reason, crate::ENGINE_ACTOR)
                .await
            {
                Ok(_) => return Ok(()),
                Err(DbError::Invalid { reason: why, .. }) => {
                    tracing::error!(rollout = %rollout.id, %why, "automatic rollback impossible");
                    // The halt's reason (audited, shown) says why nothing was rolled back.
                    reason = format!("{reason}; automatic rollback refused: {why}");
                }
                Err(err) => return Err(err),
            }
        }
        self.db
            .engine_set_rollout_state(
                fence,
                rollout.id,
                &[RolloutState::Running],
                RolloutState::Halted,
                Some(&reason),
                json!({ "wave": wave.name }),
            )
            .await?;
        Ok(())
    }

    /// The soak passed: the release becomes fleet-proven (from qualified only; `default` is still a
    /// person's decision). A release that cannot be proven (blocked or deprecated meanwhile by a
    /// person) is left as it is and the refusal logged: the wave still moves on, as its verdict says.
    async fn prove_release(&self, rollout: &ExecRollout, wave: &ExecWave) -> Result<(), DbError> {
        match self
            .db
            .mark_fleet_proven(rollout.release_id, rollout.id, crate::ENGINE_ACTOR)
            .await
        {
            Ok(changed) => {
                if changed {
                    tracing::info!(release = %rollout.release_id, rollout = %rollout.id, wave = %wave.name, "soak passed: release fleet-proven");
                }
                Ok(())
            }
            Err(err) if err.is_caller_error() => {
                tracing::warn!(error = %orchestrator_types::error_chain(&err), "the release was not made fleet-proven");
                Ok(())
            }
            Err(err) => Err(err),
        }
    }

    /// A failed verdict blocks the release for every rollout, with the
    /// evidence as the reason (audited by the datastore). Already blocked
    /// (by the detector, or a human): nothing to do.
    async fn block_release(
        &self,
        rollout: &ExecRollout,
        wave: &ExecWave,
        verdict: &WaveVerdict,
    ) -> Result<(), DbError> {
        let release = self.db.release(rollout.release_id).await?;
        if release.qualification_state == QualificationState::Blocked {
            return Ok(());
        }
        let mut evidence = serde_json::to_string(&verdict.evidence).unwrap_or_default();
        if evidence.len() > MAX_BLOCK_EVIDENCE {
            let mut cut = MAX_BLOCK_EVIDENCE;
            while !evidence.is_char_boundary(cut) {
                cut -= 1;
            }
            evidence.truncate(cut);
            evidence.push('…');
        }
        let request = TransitionRequest {
            to: QualificationState::Blocked,
            reason: Some(format!(
                "rollout {} wave {}: health verdict failed: {}; evidence: {evidence}",
                rollout.id, wave.name, verdict.summary
            )),
        };
        match self
            .db
            .transition_release(release.id, &request, crate::ENGINE_ACTOR)
            .await
        {
            Ok(_) => {
                tracing::warn!(release = %release.id, rollout = %rollout.id, "release blocked after a failed verdict");
                Ok(())
            }
            // Someone moved it meanwhile (e.g. a human blocked it first).
            Err(err) if err.is_caller_error() => {
                tracing::warn!(error = %orchestrator_types::error_chain(&err), "could not block the release");
                Ok(())
            }
            Err(err) => Err(err),
        }
    }

    async fn halt(&self, fence: &Fence, rollout: &ExecRollout, wave: &ExecWave, reason: &str) -> Result<(), DbError> {
        tracing::warn!(rollout = %rollout.id, wave = %wave.name, reason, "halting");
        self.db
            .transition_wave(
                fence,
                wave.id,
                wave.state,
                &WaveChange {
                    state: Some(WaveState::Halted),
                    state_reason: Some(Some(reason.to_owned())),
                    ended_at: Some(self.clock.now()),
                    decision: Some("halt".into()),
                    ..Default::default()
                },
                json!({ "reason": reason }),
            )
            .await?;
        self.db
            .engine_set_rollout_state(
                fence,
                rollout.id,
                &[RolloutState::Running, RolloutState::RollingBack],
                RolloutState::Halted,
                Some(reason),
                json!({ "wave": wave.name }),
            )
            .await?;
        Ok(())
    }

    /// Picks pending steps of `wave` that the caps allow, counting them into
    /// `load`; returns what holds the rest back.
    fn admit(
        &self,
        walk: &mut Walk<'_>,
        rollout: &ExecRollout,
        policy: &Policy,
        wave: &ExecWave,
        respect_windows: bool,
    ) -> Vec<Blocker> {
        let Walk {
            open,
            load,
            cluster_sizes,
            admitted,
            drains,
            capacity,
            ..
        } = walk;
        let now = self.clock.now();
        if respect_windows && !window_open_at(policy, now) {
            return vec![Blocker::WindowOpensAt {
                at: next_window_start(policy, now),
            }];
        }
        if let Some(error) = &drains.unavailable {
            // Nothing starts on a node whose workload is unknown.
            return vec![Blocker::SchedulerUnavailable { error: error.clone() }];
        }
        let mut blockers: Vec<Blocker> = Vec::new();
        let mut note = |b: Blocker| {
            if !blockers.contains(&b) {
                blockers.push(b);
            }
        };
        let wave_cap = u32::try_from(wave.max_in_flight)
            .ok()
            .filter(|n| *n > 0)
            .unwrap_or(policy.concurrency.max_in_flight);
        let rollout_cap = policy.concurrency.max_in_flight;
        for placed in open
            .iter()
            .filter(|p| p.step.wave_id == wave.id && p.step.state == StepState::Pending)
            .filter(|p| !drains.by_step.contains_key(&p.step.id.0))
        {
            if let Some(at) = placed.step.next_attempt_at.filter(|at| *at > now) {
                note(Blocker::Backoff { at });
                continue;
            }
            let caps: [(&str, u32, u32); 3] = [
                ("fleet", load.fleet, self.config.fleet_max_in_flight),
                (
                    "rollout",
                    load.rollout.get(&rollout.id).copied().unwrap_or(0),
                    rollout_cap,
                ),
                ("wave", load.wave.get(&wave.id).copied().unwrap_or(0), wave_cap),
            ];
            if let Some((scope, _, limit)) = caps.iter().find(|(_, used, limit)| used >= limit) {
                note(Blocker::InFlightCap {
                    scope: (*scope).to_owned(),
                    limit: *limit,
                });
                // Global caps: nothing else of this wave can start either.
                break;
            }
            if load.nodes.contains(&placed.step.node_id.0) {
                note(Blocker::InFlightCap {
                    scope: "node".into(),
                    limit: 1,
                });
                continue;
            }
            let rack_key = format!("{}/{}", placed.cluster, placed.rack);
            if let Some(limit) = policy.concurrency.per_rack
                && load.rack.get(&rack_key).copied().unwrap_or(0) >= limit
            {
                note(Blocker::InFlightCap {
                    scope: "rack".into(),
                    limit,
                });
                continue;
            }
            let nvl_key = format!("{}/{}", placed.cluster, placed.nvlink_domain);
            if let Some(limit) = policy.concurrency.per_domain
                && !placed.nvlink_domain.is_empty()
                && load.nvlink.get(&nvl_key).copied().unwrap_or(0) >= limit
            {
                note(Blocker::InFlightCap {
                    scope: "nvlink_domain".into(),
                    limit,
                });
                continue;
            }
            if let Some(percent) = policy.concurrency.per_cluster_percent {
                let size = cluster_sizes.get(&placed.cluster).copied().unwrap_or(0) as f64;
                // At least one, so a small cluster is not frozen by rounding.
                let limit = ((size * percent / 100.0).floor() as u32).max(1);
                if load.cluster.get(&placed.cluster).copied().unwrap_or(0) >= limit {
                    note(Blocker::InFlightCap {
                        scope: "cluster".into(),
                        limit,
                    });
                    continue;
                }
            }
            let gpus = capacity.as_ref().map_or(1, |c| c.gpus(placed.step.node_id.0));
            if let (Some(percent), Some(capacity)) = (policy.concurrency.max_out_of_service_percent, capacity.as_ref())
            {
                let out = load.out_of_service.get(&placed.cluster).copied().unwrap_or(0);
                let total = capacity.cluster_gpus.get(&placed.cluster).copied().unwrap_or(gpus);
                if !orchestrator_scheduler::rules::capacity_allows(percent, out, gpus, total) {
                    note(Blocker::CapacityCap {
                        cluster: placed.cluster.clone(),
                        out_of_service: out,
                        total,
                    });
                    continue;
                }
            }
            load.add(placed, gpus);
            admitted.push(placed.clone());
        }
        blockers
    }

    /// Rolling back: add a rollback step for every updated node in scope
    /// (as in-flight updates finish, more appear), run them under the caps
    /// without bake or windows, and finish when nothing is left.
    async fn reconcile_rollback(
        &self,
        walk: &mut Walk<'_>,
        rollout: &ExecRollout,
        policy: &Policy,
        waves: &[ExecWave],
    ) -> Result<(), DbError> {
        let fence = walk.fence;
        let Some(rollback_wave) = waves.iter().rev().find(|w| w.kind == WaveKind::Rollback) else {
            tracing::error!(rollout = %rollout.id, "rolling back without a rollback wave");
            return Ok(());
        };
        let scope_waves: Option<Vec<WaveId>> = rollback_wave
            .scope
            .as_ref()
            .filter(|s| s.get("scope").and_then(|v| v.as_str()) == Some("wave"))
            .and_then(|s| s.get("waves"))
            .and_then(|w| serde_json::from_value(w.clone()).ok());
        let in_scope = |step: &ExecStep| scope_waves.as_ref().is_none_or(|ws| ws.contains(&step.wave_id));
        let all_steps = self
            .db
            .steps(&StepFilter {
                rollout_id: Some(rollout.id),
                ..Default::default()
            })
            .await?;
        let covered: HashSet<i64> = all_steps.iter().filter_map(|s| s.rollback_of.map(|id| id.0)).collect();
        let kind = self.kind(rollout).await?;
        for step in all_steps.iter().filter(|s| {
            s.purpose == StepPurpose::Update
                && s.state == StepState::Succeeded
                && in_scope(s)
                && !covered.contains(&s.id.0)
        }) {
            let previous = step
                .previous_version
                .clone()
                .unwrap_or_else(|| step.expected_from_version.clone());
            let image = match orchestrator_types::FirmwareVersion::parse(&previous) {
                Ok(version) => match self.db.release_by_version(kind, &version).await {
                    Ok(release) => Some(release),
                    Err(DbError::NotFound { .. }) => None,
                    Err(err) => return Err(err),
                },
                Err(_) => None,
            };
            let (uri, sha) = image
                .as_ref()
                .map(|r| (r.image_uri.clone(), r.sha256.clone()))
                .unwrap_or_default();
            let added = self
                .db
                .add_rollback_step(fence, rollback_wave.id, step, &uri, &sha)
                .await?;
            if image.is_none() {
                StepCtx {
                    db: self.db.clone(),
                    clock: self.clock.clone(),
                    config: self.config.clone(),
                    fence: fence.clone(),
                    health: self.health.clone(),
                    moved: Arc::default(),
                }
                .fail_unaddressable(
                    &added,
                    format!("no release is registered for the previous version {previous}: no image to roll back to"),
                )
                .await?;
            }
        }
        let updates_in_flight = all_steps
            .iter()
            .any(|s| s.purpose == StepPurpose::Update && s.state.is_in_flight());
        let rollback_open = all_steps
            .iter()
            .any(|s| s.purpose == StepPurpose::Rollback && !s.state.is_terminal());
        // Steps just added are not in `all_steps`; the next pass sees them.
        let just_added = all_steps.iter().any(|s| {
            s.purpose == StepPurpose::Update
                && s.state == StepState::Succeeded
                && in_scope(s)
                && !covered.contains(&s.id.0)
        });
        if !updates_in_flight && !rollback_open && !just_added {
            let failed = all_steps
                .iter()
                .filter(|s| s.purpose == StepPurpose::Rollback && s.state == StepState::Failed)
                .count();
            // A node its scheduler kept (an operator's drain) was not rolled
            // back either: the rollout's reason must say so.
            let deferred = all_steps
                .iter()
                .filter(|s| s.purpose == StepPurpose::Rollback && s.state == StepState::Deferred)
                .count();
            let now = self.clock.now();
            for wave in waves.iter().filter(|w| {
                w.kind == WaveKind::Update
                    && w.state != WaveState::Planned
                    && w.state != WaveState::RolledBack
                    && scope_waves.as_ref().is_none_or(|ws| ws.contains(&w.id))
            }) {
                self.db
                    .transition_wave(
                        fence,
                        wave.id,
                        wave.state,
                        &WaveChange {
                            state: Some(WaveState::RolledBack),
                            ended_at: Some(now),
                            ..Default::default()
                        },
                        json!({}),
                    )
                    .await?;
            }
            self.db
                .transition_wave(
                    fence,
                    rollback_wave.id,
                    rollback_wave.state,
                    &WaveChange {
                        state: Some(WaveState::Promoted),
                        ended_at: Some(now),
                        decision: Some("rollback complete".into()),
                        ..Default::default()
                    },
                    json!({ "failed": failed }),
                )
                .await?;
            let reason = match (failed, deferred) {
                (0, 0) => None,
                (failed, 0) => Some(format!("{failed} node(s) could not be rolled back")),
                (0, deferred) => Some(format!(
                    "{deferred} node(s) were kept by their workload scheduler and not rolled back"
                )),
                (failed, deferred) => Some(format!(
                    "{failed} node(s) could not be rolled back; {deferred} were kept by their workload scheduler"
                )),
            };
            self.db
                .engine_set_rollout_state(
                    fence,
                    rollout.id,
                    &[RolloutState::RollingBack],
                    RolloutState::RolledBack,
                    reason.as_deref(),
                    json!({ "failed": failed, "deferred": deferred }),
                )
                .await?;
            return Ok(());
        }
        let mut blockers = self.admit(walk, rollout, policy, rollback_wave, false);
        blockers.extend(step_deadline_blockers(&self.config, walk.open, rollback_wave));
        blockers.extend(walk.drains.blockers.get(&rollback_wave.id).cloned().unwrap_or_default());
        self.set_wave_blockers(fence, rollback_wave, blockers).await
    }
}

/// When the first wave's pre-flash watch ends (`detection.pre_period` after the wave started), for
/// a policy judged by fleet-scale detection; `None` for every other wave and policy.
fn pre_flash_watch_until(policy: &Policy, wave: &ExecWave) -> Option<DateTime<Utc>> {
    let period = policy.detection.pre_period.filter(|_| policy.detection.enabled)?;
    (wave.position == 0 && wave.kind == WaveKind::Update).then_some(wave.started_at? + period)
}
