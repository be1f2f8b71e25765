//! Workload-aware maintenance in the executor: a node is drained through
//! its workload scheduler before its flash, flashed only once it is empty,
//! and resumed afterwards, with Waveguard's own durable record
//! (`orchestrator_db::drains`) as the proof of ownership.
//!
//! The decisions are the scheduler crate's pure rules
//! (`orchestrator_scheduler::rules`); this module reads the scheduler's
//! state once per pass, writes intent before each scheduler effect (fenced,
//! like a flash), and turns the rules' answers into step moves and wave
//! blockers. A step whose node is being drained stays `pending` until the
//! node is empty; its record makes it count as in flight for the caps.
//!
//! Replay table (a record not closed, by phase and its step's state):
//!
//! | Record | Step | Next move |
//! |---|---|---|
//! | none | `pending`, admitted | read state; `decide_drain`: skip → step `deferred` with the reason; drain → record `drain_intended` (intent), drain with the rollout's tag, read back, record `held` |
//! | `drain_intended` | `pending` | `decide_drain` with the record: drain again (same tag) / already ours → `held` / skip → record closed, step `deferred` |
//! | `held` | `pending` | `flash_readiness`: ready → precheck (the normal step path); wait → blocker until `drain_timeout`, then `skip` → record `resume_intended`, step `deferred`, or `hold` → blocker for a human; abandon (no longer ours) → record closed, step `deferred` |
//! | `held` | in flight | nothing: the flash runs |
//! | `drain_intended` / `held` | terminal, or `pending` under a rollout that no longer runs | `after_update`: healthy → `resume_intended`; quarantined by Waveguard → record `quarantined` (intent), re-tag the drain with the quarantine reason |
//! | `resume_intended` | any | `decide_resume`: resume → `Scheduler::resume`, read back, closed `resumed`; already in service → closed; not responding → wait (blocker) up to `brick_timeout`, then `quarantined` (node quarantined in Waveguard with the reason, left drained for a human); taken over → closed with their reason, never resumed |
//!
//! A wave is not finished while a record of it still owes a resume, so its
//! bake starts with its nodes back in service (a drained node carries no
//! load and would dilute the health gates).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use chrono::{DateTime, Duration, Utc};
use orchestrator_db::drains::{DrainRow, NewDrain};
use orchestrator_db::execution::{ExecRollout, Fence, PlacedStep, StepChange, StepPurpose, StepState};
use orchestrator_db::{Db, DbError};
use orchestrator_policy::{DrainRules, Policy};
use orchestrator_scheduler::rules::{
    AfterUpdate, DrainDecision, DrainRecord, DrainWait, LeaveAlone, Readiness, ResumeDecision, Waiting,
};
use orchestrator_scheduler::{NodeState, ReasonTag, SchedulerNodeName, confirm_drain, rules};

use crate::config::WorkloadScheduler;
use orchestrator_types::{Blocker, DrainPhase, NodeState as WaveguardNodeState, RolloutId, RolloutState, WaveId};
use serde_json::json;

/// What the drain pass found, for the walk over the rollouts.
#[derive(Debug, Default)]
pub(crate) struct DrainView {
    /// Records not closed, by step id.
    pub by_step: HashMap<i64, DrainRow>,
    /// Nodes with a record not closed (quarantined included): no other
    /// step may start on them.
    pub nodes: HashSet<i64>,
    /// Steps whose node is drained and empty: precheck them this pass.
    pub ready: HashSet<i64>,
    /// What holds each wave back on the scheduler's side.
    pub blockers: HashMap<WaveId, Vec<Blocker>>,
    /// Records per wave whose step is done but which still owe a resume.
    pub resume_owed: HashMap<WaveId, u64>,
    /// The scheduler could not be read: nothing new is drained.
    pub unavailable: Option<String>,
    /// The scheduler's view of the nodes, read once this pass (or node by
    /// node, for an adapter that cannot list every node).
    states: HashMap<String, NodeState>,
    per_node: bool,
}

impl DrainView {
    /// Does the step's node have a drain of ours holding it (counts as in
    /// flight for the caps)?
    pub fn holds_step(&self, step: i64) -> bool {
        self.by_step
            .get(&step)
            .is_some_and(|d| matches!(d.phase, DrainPhase::DrainIntended | DrainPhase::Held))
    }

    fn block(&mut self, wave: WaveId, blocker: Blocker) {
        let list = self.blockers.entry(wave).or_default();
        if !list.contains(&blocker) {
            list.push(blocker);
        }
    }
}

/// How a newly admitted step's drain went.
#[derive(Debug)]
pub(crate) enum Started {
    /// Drained and already empty: precheck now.
    Ready,
    /// Drained (or draining); wait for it to empty.
    Draining,
    /// Left out of this wave (the step is `deferred`), or not yet possible.
    NotNow,
}

/// One pass's drain work under one fence.
pub(crate) struct Drains<'a> {
    pub seam: &'a WorkloadScheduler,
    pub health: &'a crate::controller::ControllerHealth,
    pub db: &'a Db,
    pub fence: &'a Fence,
    pub now: DateTime<Utc>,
    pub brick_timeout: Duration,
}

/// A phrase for why a node is left alone, for steps and pages.
pub(crate) fn describe(why: &LeaveAlone) -> String {
    let reason = |r: &Option<orchestrator_scheduler::Reason>| match r {
        Some(r) => match &r.set_by {
            Some(by) => format!("{:?} (set by {by})", r.text),
            None => format!("{:?}", r.text),
        },
        None => "no reason given".into(),
    };
    match why {
        LeaveAlone::DrainedByOther { reason: r } => {
            format!("drained by someone else in the workload scheduler: {}", reason(r))
        }
        LeaveAlone::Down { reason: r } => format!("down in the workload scheduler: {}", reason(r)),
        LeaveAlone::NotResponding => "the workload scheduler's node daemon does not respond".into(),
        LeaveAlone::ResumedByOther => "returned to service by someone else before the flash".into(),
        LeaveAlone::NoDrainRecord => "no drain record of Waveguard's".into(),
    }
}

fn waiting_on(w: Waiting) -> String {
    match w {
        Waiting::Jobs { alloc_cpus } => format!("jobs ({alloc_cpus} CPUs allocated)"),
        Waiting::NotResponding => "not_responding".into(),
        Waiting::Down => "down".into(),
    }
}

fn record_of(row: &DrainRow) -> DrainRecord {
    DrainRecord {
        rollout: row.rollout_id,
        node: row.scheduler_node.clone(),
        phase: row.phase,
    }
}

impl Drains<'_> {
    /// Reads every node's scheduler state once (Slurm lists the whole
    /// cluster in one call anyway); an adapter without a list command is
    /// asked node by node instead. `Err` is the scheduler's fault, never a
    /// node's.
    async fn read_states(&self, view: &mut DrainView) -> Result<(), String> {
        if !self.seam.scheduler.can_list() {
            view.per_node = true;
            return Ok(());
        }
        match self.seam.scheduler.all_states().await {
            Ok(states) => {
                view.states = states.into_iter().map(|s| (s.name.clone(), s)).collect();
                Ok(())
            }
            Err(err) => Err(orchestrator_types::error_chain(&err)),
        }
    }

    /// The node's state this pass; `Ok(None)` when the scheduler does not
    /// know it.
    async fn state_of(
        &self,
        view: &mut DrainView,
        name: &str,
    ) -> Result<Option<NodeState>, orchestrator_scheduler::SchedulerError> {
        if let Some(state) = view.states.get(name) {
            return Ok(Some(state.clone()));
        }
        if !view.per_node {
            return Ok(None);
        }
        let Ok(node) = SchedulerNodeName::new(name) else {
            return Ok(None);
        };
        match self.seam.scheduler.node_state(&node).await {
            Ok(state) => {
                view.states.insert(name.to_owned(), state.clone());
                Ok(Some(state))
            }
            Err(orchestrator_scheduler::SchedulerError::UnknownNode { .. }) => Ok(None),
            Err(err) => Err(err),
        }
    }

    /// Moves every record that is not closed one step (see the module's
    /// table). `rollouts` are the unfinished rollouts with their policies.
    pub async fn reconcile(
        &self,
        rollouts: &HashMap<RolloutId, (RolloutState, Arc<Policy>)>,
        open: &[PlacedStep],
    ) -> Result<DrainView, DbError> {
        let mut view = DrainView::default();
        let records = self.db.open_drains().await?;
        let live_rollout = rollouts
            .iter()
            .any(|(_, (s, _))| matches!(s, RolloutState::Running | RolloutState::RollingBack));
        if records.is_empty() && !live_rollout {
            return Ok(view);
        }
        match self.read_states(&mut view).await {
            Ok(()) => {}
            Err(error) => {
                tracing::warn!(%error, "cannot read the workload scheduler; nothing is drained or resumed");
                self.health
                    .set_scheduler_report(self.health.status().orphaned_drains, Some(error.clone()));
                for record in &records {
                    view.nodes.insert(record.node_id.0);
                    view.by_step.insert(record.step_id.0, record.clone());
                }
                view.unavailable = Some(error);
                return Ok(view);
            }
        }
        // The periodic check: a node carrying our tag with no record of
        // ours (a record lost with a restored database, or a tag an
        // operator copied) is reported, never resumed.
        let recorded: HashSet<&str> = records.iter().map(|r| r.scheduler_node.as_str()).collect();
        let mut orphaned: Vec<String> = view
            .states
            .values()
            .filter(|s| s.drain && s.tag().is_some() && !recorded.contains(s.name.as_str()))
            .map(|s| s.name.clone())
            .collect();
        orphaned.sort();
        self.health.set_scheduler_report(orphaned, None);
        let steps: HashMap<i64, &PlacedStep> = open.iter().map(|p| (p.step.id.0, p)).collect();
        let mut wave_rules: HashMap<WaveId, DrainRules> = HashMap::new();
        for record in records {
            view.nodes.insert(record.node_id.0);
            view.by_step.insert(record.step_id.0, record.clone());
            if record.phase == DrainPhase::Quarantined {
                continue;
            }
            let (step_state, purpose) = match steps.get(&record.step_id.0) {
                Some(placed) => (placed.step.state, placed.step.purpose),
                None => {
                    let step = self.db.step(record.step_id).await?;
                    (step.state, step.purpose)
                }
            };
            // Only a step its rollout will still run may be flashed: a
            // rolling-back rollout runs its rollback steps, never the
            // update steps it left pending.
            let step_will_run = rollouts.get(&record.rollout_id).is_some_and(|(s, _)| {
                matches!(
                    (s, purpose),
                    (RolloutState::Running, StepPurpose::Update) | (RolloutState::RollingBack, StepPurpose::Rollback)
                )
            });
            let before_flash = step_state == StepState::Pending && step_will_run;
            let result = match record.phase {
                DrainPhase::DrainIntended if before_flash => self.confirm_intent(&record, &mut view).await,
                DrainPhase::Held if before_flash => {
                    let rules = match wave_rules.get(&record.wave_id) {
                        Some(r) => *r,
                        None => {
                            let r = self.drain_rules(&record, rollouts).await?;
                            wave_rules.insert(record.wave_id, r);
                            r
                        }
                    };
                    self.await_empty(&record, rules, &mut view).await
                }
                DrainPhase::DrainIntended | DrainPhase::Held if step_state.is_in_flight() => Ok(()),
                DrainPhase::DrainIntended | DrainPhase::Held => self.after_update(&record, &mut view).await,
                DrainPhase::ResumeIntended => self.resume(&record, &mut view).await,
                DrainPhase::Quarantined | DrainPhase::Closed => Ok(()),
            };
            match result {
                Ok(()) => {}
                Err(err @ DbError::Fenced { .. }) => return Err(err),
                Err(DbError::Stale { .. }) => {}
                Err(err) => return Err(err),
            }
            if let Some(row) = view.by_step.get(&record.step_id.0)
                && row.phase.is_open()
                && step_state.is_terminal()
            {
                *view.resume_owed.entry(record.wave_id).or_default() += 1;
            }
        }
        Ok(view)
    }

    async fn drain_rules(
        &self,
        record: &DrainRow,
        rollouts: &HashMap<RolloutId, (RolloutState, Arc<Policy>)>,
    ) -> Result<DrainRules, DbError> {
        let Some((_, policy)) = rollouts.get(&record.rollout_id) else {
            return Ok(DrainRules::default());
        };
        let waves = self.db.rollout_waves(record.rollout_id).await?;
        let name = waves.iter().find(|w| w.id == record.wave_id).map(|w| w.name.as_str());
        Ok(policy
            .waves
            .iter()
            .find(|w| Some(w.name.as_str()) == name)
            .map(|w| w.drain)
            .unwrap_or_default())
    }

    fn name(&self, row: &DrainRow) -> Option<SchedulerNodeName> {
        SchedulerNodeName::new(&row.scheduler_node).ok()
    }

    /// Replaces the view's copy of a record after a move.
    fn moved(view: &mut DrainView, row: DrainRow) {
        if row.phase == DrainPhase::Closed {
            view.by_step.remove(&row.step_id.0);
            view.nodes.remove(&row.node_id.0);
        } else {
            view.by_step.insert(row.step_id.0, row);
        }
    }

    async fn close(&self, view: &mut DrainView, row: &DrainRow, reason: &str) -> Result<(), DbError> {
        // Why the resume was decided (`drain_timeout`) stays in front.
        let reason = match &row.close_reason {
            Some(why) if row.phase == DrainPhase::ResumeIntended => format!("{why}: {reason}"),
            _ => reason.to_owned(),
        };
        let closed = self
            .db
            .move_drain(self.fence, row.id, row.phase, DrainPhase::Closed, Some(&reason))
            .await?;
        tracing::debug!(node = %row.scheduler_node, rollout = %row.rollout_id, reason, "scheduler drain closed");
        Self::moved(view, closed);
        Ok(())
    }

    /// Leaves the step out of this wave: not a failure, nothing flashed.
    async fn defer(&self, step: orchestrator_types::StepId, reason: &str) -> Result<(), DbError> {
        let change = StepChange {
            state: Some(StepState::Deferred),
            error: Some(Some(reason.to_owned())),
            finished_at: Some(self.now),
            ..Default::default()
        };
        match self
            .db
            .transition_step(
                self.fence,
                step,
                StepState::Pending,
                &change,
                json!({ "scheduler": reason }),
            )
            .await
        {
            Ok(_) | Err(DbError::Stale { .. }) => Ok(()),
            Err(err) => Err(err),
        }
    }

    /// [`Drains::state_of`], or `None` once the wave is blocked because the
    /// scheduler could not be asked (its fault, never the node's).
    async fn state_or_block(&self, view: &mut DrainView, name: &str, wave: WaveId) -> Option<Option<NodeState>> {
        match self.state_of(view, name).await {
            Ok(state) => Some(state),
            Err(err) => {
                self.unavailable(view, wave, &err);
                None
            }
        }
    }

    fn unavailable(&self, view: &mut DrainView, wave: WaveId, err: &orchestrator_scheduler::SchedulerError) {
        let error = orchestrator_types::error_chain(err);
        tracing::warn!(%error, "workload scheduler call failed");
        view.block(wave, Blocker::SchedulerUnavailable { error });
    }

    /// Issues the drain (again) and records it held once it reads back
    /// with our tag.
    async fn drain_and_confirm(&self, row: &DrainRow, view: &mut DrainView) -> Result<Option<NodeState>, DbError> {
        let Some(name) = self.name(row) else {
            return Ok(None);
        };
        let tag = ReasonTag::maintenance(row.rollout_id);
        if let Err(err) = self.seam.scheduler.drain(&name, &tag).await {
            self.unavailable(view, row.wave_id, &err);
            return Ok(None);
        }
        match confirm_drain(self.seam.scheduler.as_ref(), &name, &tag).await {
            Ok(state) => {
                let held = self
                    .db
                    .move_drain(self.fence, row.id, DrainPhase::DrainIntended, DrainPhase::Held, None)
                    .await?;
                self.db.set_drain_seen(self.fence, row.id, json!(state)).await?;
                Self::moved(view, held);
                Ok(Some(state))
            }
            Err(err) => {
                self.unavailable(view, row.wave_id, &err);
                Ok(None)
            }
        }
    }

    /// `drain_intended` before the flash: the crash may have come before or
    /// after the drain landed.
    async fn confirm_intent(&self, row: &DrainRow, view: &mut DrainView) -> Result<(), DbError> {
        let Some(state) = self.state_or_block(view, &row.scheduler_node, row.wave_id).await else {
            return Ok(());
        };
        let Some(state) = state else {
            let reason = format!("the workload scheduler no longer lists node {}", row.scheduler_node);
            self.close(view, row, &reason).await?;
            return self.defer(row.step_id, &reason).await;
        };
        match rules::decide_drain(&state, Some(&record_of(row)), row.rollout_id) {
            DrainDecision::Drain => {
                self.drain_and_confirm(row, view).await?;
                Ok(())
            }
            DrainDecision::AlreadyOurs => {
                let held = self
                    .db
                    .move_drain(self.fence, row.id, DrainPhase::DrainIntended, DrainPhase::Held, None)
                    .await?;
                Self::moved(view, held);
                Ok(())
            }
            DrainDecision::Skip(why) => {
                let reason = describe(&why);
                self.close(view, row, &format!("taken_over: {reason}")).await?;
                self.defer(row.step_id, &reason).await
            }
        }
    }

    /// `held` before the flash: flash once empty, else wait up to the
    /// wave's `drain_timeout`.
    async fn await_empty(&self, row: &DrainRow, rules: DrainRules, view: &mut DrainView) -> Result<(), DbError> {
        let Some(state) = self.state_or_block(view, &row.scheduler_node, row.wave_id).await else {
            return Ok(());
        };
        let Some(state) = state else {
            view.block(
                row.wave_id,
                Blocker::Drain {
                    node: row.scheduler_node.clone(),
                    waiting_on: "the scheduler to list the node".into(),
                    until: row.held_at.unwrap_or(row.drain_started_at) + rules.timeout,
                },
            );
            return Ok(());
        };
        if row.last_seen.as_ref() != Some(&json!(state)) {
            self.db.set_drain_seen(self.fence, row.id, json!(state)).await?;
        }
        match rules::flash_readiness(&state, Some(&record_of(row))) {
            Readiness::Ready => {
                view.ready.insert(row.step_id.0);
                Ok(())
            }
            Readiness::Wait(waiting) => {
                let since = row.held_at.unwrap_or(row.drain_started_at);
                let until = since + rules.timeout;
                match rules::drain_wait(self.now - since, rules.timeout, rules.on_timeout) {
                    DrainWait::KeepWaiting => {
                        view.block(
                            row.wave_id,
                            Blocker::Drain {
                                node: row.scheduler_node.clone(),
                                waiting_on: waiting_on(waiting),
                                until,
                            },
                        );
                        Ok(())
                    }
                    DrainWait::Hold => {
                        view.block(
                            row.wave_id,
                            Blocker::DrainTimedOut {
                                node: row.scheduler_node.clone(),
                            },
                        );
                        Ok(())
                    }
                    DrainWait::SkipAndResume => {
                        let reason = format!(
                            "did not empty within the wave's drain_timeout ({} min; waiting on {}): skipped for this wave",
                            rules.timeout.num_minutes(),
                            waiting_on(waiting)
                        );
                        let resuming = self
                            .db
                            .move_drain(
                                self.fence,
                                row.id,
                                DrainPhase::Held,
                                DrainPhase::ResumeIntended,
                                Some("drain_timeout"),
                            )
                            .await?;
                        Self::moved(view, resuming.clone());
                        self.defer(row.step_id, &reason).await?;
                        self.resume(&resuming, view).await
                    }
                }
            }
            Readiness::Abandon(why) => {
                let reason = describe(&why);
                self.close(view, row, &format!("taken_over: {reason}")).await?;
                self.defer(row.step_id, &reason).await
            }
        }
    }

    /// The step is done (or will not run under this rollout): give the node
    /// back, or keep it out with a quarantine reason when Waveguard
    /// quarantined it.
    async fn after_update(&self, row: &DrainRow, view: &mut DrainView) -> Result<(), DbError> {
        let node = self.db.node(row.node_id).await?;
        let unhealthy = (node.state == WaveguardNodeState::Quarantined).then(|| {
            node.state_reason
                .clone()
                .unwrap_or_else(|| "quarantined by Waveguard".into())
        });
        match rules::after_update(row.rollout_id, unhealthy.as_deref()) {
            AfterUpdate::Resume => {
                let resuming = self
                    .db
                    .move_drain(self.fence, row.id, row.phase, DrainPhase::ResumeIntended, None)
                    .await?;
                Self::moved(view, resuming.clone());
                self.resume(&resuming, view).await
            }
            AfterUpdate::Quarantine(tag) => {
                let why = unhealthy.unwrap_or_default();
                let quarantined = self
                    .db
                    .move_drain(self.fence, row.id, row.phase, DrainPhase::Quarantined, Some(&why))
                    .await?;
                Self::moved(view, quarantined);
                if let Some(name) = self.name(row)
                    && let Err(err) = self.seam.scheduler.drain(&name, &tag).await
                {
                    // The node stays drained under our maintenance tag;
                    // the record says quarantined, which is what counts.
                    tracing::warn!(node = %name, error = %orchestrator_types::error_chain(&err), "could not re-tag a quarantined node");
                }
                Ok(())
            }
        }
    }

    /// `resume_intended`: resume unless someone else owns the drain now.
    async fn resume(&self, row: &DrainRow, view: &mut DrainView) -> Result<(), DbError> {
        let Some(state) = self.state_or_block(view, &row.scheduler_node, row.wave_id).await else {
            return Ok(());
        };
        let Some(state) = state else {
            return self
                .close(
                    view,
                    row,
                    "the workload scheduler no longer lists the node: nothing to resume",
                )
                .await;
        };
        let Some(name) = self.name(row) else {
            return self.close(view, row, "invalid scheduler node name").await;
        };
        let record = record_of(row);
        match rules::decide_resume(&state, Some(&record)) {
            ResumeDecision::Resume => {
                if let Err(err) = self.seam.scheduler.resume(&name).await {
                    self.unavailable(view, row.wave_id, &err);
                    return Ok(());
                }
                match self.seam.scheduler.node_state(&name).await {
                    Ok(after) => {
                        view.states.insert(row.scheduler_node.clone(), after.clone());
                        if rules::decide_resume(&after, Some(&record)) == ResumeDecision::Done {
                            self.close(view, row, "resumed").await?;
                        }
                        Ok(())
                    }
                    Err(err) => {
                        self.unavailable(view, row.wave_id, &err);
                        Ok(())
                    }
                }
            }
            ResumeDecision::Done => self.close(view, row, "resumed").await,
            ResumeDecision::Wait(waiting) => {
                let until = row.resume_intended_at.unwrap_or(self.now) + self.brick_timeout;
                if self.now < until {
                    view.block(
                        row.wave_id,
                        Blocker::Drain {
                            node: row.scheduler_node.clone(),
                            waiting_on: waiting_on(waiting),
                            until,
                        },
                    );
                    return Ok(());
                }
                // Its scheduler daemon never came back after the update:
                // not a node to put jobs on, and not one to wait on for
                // ever. Kept out, on purpose and with the reason, for a human.
                let why = format!(
                    "not back in its workload scheduler ({}) within {} min after the update; left drained for a human",
                    waiting_on(waiting),
                    self.brick_timeout.num_minutes()
                );
                let quarantined = self
                    .db
                    .move_drain(
                        self.fence,
                        row.id,
                        DrainPhase::ResumeIntended,
                        DrainPhase::Quarantined,
                        Some(&why),
                    )
                    .await?;
                Self::moved(view, quarantined);
                self.db
                    .set_node_state(
                        row.node_id,
                        WaveguardNodeState::Quarantined,
                        Some(&why),
                        crate::ENGINE_ACTOR,
                    )
                    .await?;
                tracing::warn!(node = %row.scheduler_node, %why, "quarantined after the update");
                Ok(())
            }
            ResumeDecision::LeaveAlone(why) => {
                let reason = describe(&why);
                tracing::warn!(node = %name, %reason, "not resuming a node whose drain is no longer ours");
                self.close(view, row, &format!("taken_over: {reason}")).await
            }
        }
    }

    /// Drains the node of a step just admitted under the caps. Anything the
    /// scheduler says against it defers the step (not a failure); a
    /// scheduler that does not answer leaves it pending (not the node's
    /// fault either).
    pub async fn start(
        &self,
        placed: &PlacedStep,
        rollout: &ExecRollout,
        view: &mut DrainView,
    ) -> Result<Started, DbError> {
        let step = &placed.step;
        let name = match self.seam.names.map(&placed.node_name) {
            Ok(name) => name,
            Err(err) => {
                let reason = format!("no workload scheduler name for this node: {err}");
                self.defer(step.id, &reason).await?;
                return Ok(Started::NotNow);
            }
        };
        let Some(state) = self.state_or_block(view, name.as_str(), step.wave_id).await else {
            return Ok(Started::NotNow);
        };
        let Some(state) = state else {
            // Never flash a node whose workload is unknown.
            let reason = format!(
                "the workload scheduler has no node {name} (check [scheduler.names]); not flashed while its workload is unknown"
            );
            self.defer(step.id, &reason).await?;
            return Ok(Started::NotNow);
        };
        match rules::decide_drain(&state, None, rollout.id) {
            DrainDecision::Skip(why) => {
                self.defer(step.id, &describe(&why)).await?;
                Ok(Started::NotNow)
            }
            DrainDecision::Drain | DrainDecision::AlreadyOurs => {
                let tag = ReasonTag::maintenance(rollout.id);
                let new = NewDrain {
                    rollout_id: rollout.id,
                    wave_id: step.wave_id,
                    step_id: step.id,
                    node_id: step.node_id,
                    scheduler_kind: self.seam.scheduler.kind().to_owned(),
                    scheduler_node: name.to_string(),
                    reason_text: tag.render(),
                    observed_before: json!(state),
                };
                let row = match self.db.record_drain_intent(self.fence, &new).await {
                    Ok(row) => row,
                    Err(DbError::Conflict { reason, .. }) => {
                        tracing::info!(node = %placed.node_name, %reason, "drain owned elsewhere; waiting");
                        return Ok(Started::NotNow);
                    }
                    Err(err) => return Err(err),
                };
                view.nodes.insert(row.node_id.0);
                view.by_step.insert(row.step_id.0, row.clone());
                let Some(confirmed) = self.drain_and_confirm(&row, view).await? else {
                    return Ok(Started::NotNow);
                };
                let held = view.by_step.get(&row.step_id.0).map(record_of);
                Ok(match rules::flash_readiness(&confirmed, held.as_ref()) {
                    Readiness::Ready => Started::Ready,
                    _ => Started::Draining,
                })
            }
        }
    }
}
