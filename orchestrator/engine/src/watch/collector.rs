//! The Redfish health collector: polls every node of a baking wave and of
//! its control cohort, with bounded concurrency, and folds what it reads
//! into the stored window aggregates.
//!
//! A poll reads the node's GPU sensors and the event-log entries after the
//! stored cursor. Exposure accrues from the last accounted instant to now,
//! so a BMC that was unreachable for a while loses nothing: its events are
//! still in its log and its exposure is added when it answers again.

use std::collections::HashMap;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use futures::StreamExt;
use orchestrator_bmc::EventCursor;
use orchestrator_db::execution::{ExecRollout, ExecWave, StepFilter, StepPurpose, StepState};
use orchestrator_db::health::{Cohort, HealthCursor, LevelAgg, NodePoll, WindowDelta, window_start};
use orchestrator_db::model::NodeAddress;
use orchestrator_db::{Db, DbError};
use orchestrator_policy::RedfishMetric;
use orchestrator_types::{DrainPhase, NodeId};

use super::classify::{classify_event, event_gpu, gpu_count, gpu_levels, poll_deltas};
use crate::connector::HealthBmcs;
use crate::prometheus::{NodeIndex, PrometheusClient};

/// GPUs assumed on a node whose BMC lists no GPU processor and no GPU
/// sensor (the HGX baseboards this product targets carry eight). The count
/// comes from the inventory's GPU processors, then from the GPU sensors; this
/// is the last resort, used only for exposure and only until either shows GPUs.
pub const DEFAULT_GPUS_PER_NODE: u32 = orchestrator_planner::power::DEFAULT_GPUS_PER_NODE;

/// When an updated node starts to count as exposed: from its verified
/// flash (a step without a finish time, from older rows, from the bake
/// start), but not before the scheduler gave it back its load when it was
/// drained; `None` while Waveguard keeps it quarantined (out of service).
pub(crate) fn canary_exposure_start(
    finished_at: Option<DateTime<Utc>>,
    drain: Option<&orchestrator_db::drains::DrainRow>,
    bake_start: DateTime<Utc>,
) -> Option<DateTime<Utc>> {
    let start = finished_at.unwrap_or(bake_start).min(bake_start);
    let Some(drain) = drain else {
        return Some(start);
    };
    match (drain.phase, drain.closed_at) {
        (DrainPhase::Quarantined, _) => None,
        (DrainPhase::Closed, Some(resumed)) => Some(start.max(resumed.min(bake_start))),
        // Still held or being resumed: no load before the bake at best.
        _ => Some(bake_start),
    }
}

/// One node to watch for a wave.
#[derive(Debug, Clone)]
pub(crate) struct Member {
    pub(crate) node: NodeAddress,
    pub(crate) cohort: Cohort,
    pub(crate) exposure_start: DateTime<Utc>,
}

impl Member {
    /// Watches `node` as `cohort` from `exposure_start`.
    pub(crate) fn of(node: NodeAddress, cohort: Cohort, exposure_start: DateTime<Utc>) -> Self {
        Self {
            node,
            cohort,
            exposure_start,
        }
    }
}

/// What one collection round did, for logs and tests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CollectReport {
    /// Nodes polled successfully.
    pub polled: usize,
    /// Nodes whose BMC could not be read (retried next round).
    pub failed: usize,
    /// Event-log entries counted into a metric.
    pub events: u64,
}

/// Polls whose results are written in one transaction ([`Db::record_health_polls`]): a round of up
/// to this many nodes is one write, a larger one a write per this many, so the SQLite writer (which
/// the engine's step transitions share) is never held for a whole fleet's polls at once, and a
/// crash mid-round loses at most this many polls (their events are read again from the unmoved
/// cursors).
const POLLS_PER_WRITE: usize = 1_000;

/// Window aggregates written in one transaction at most, whatever the number of polls: a poll
/// splits its exposure into one aggregate per hourly window it spans, so after a controller outage
/// of a day every node's first poll carries a day of windows, and a write of 1,000 such polls would
/// hold tens of thousands of aggregates (each with its per-GPU readings) in memory at once.
const DELTAS_PER_WRITE: usize = 20_000;

/// Polls read and not yet written, with the events each counted.
#[derive(Default)]
struct PollBatch {
    polls: Vec<NodePoll>,
    events: Vec<u64>,
    deltas: usize,
}

impl PollBatch {
    fn push(&mut self, poll: NodePoll, events: u64) {
        self.deltas += poll.deltas.len();
        self.polls.push(poll);
        self.events.push(events);
    }

    fn is_full(&self) -> bool {
        self.polls.len() >= POLLS_PER_WRITE || self.deltas >= DELTAS_PER_WRITE
    }

    /// Writes the batch in one transaction and empties it.
    async fn write(&mut self, db: &Db, report: &mut CollectReport) -> Result<(), DbError> {
        if self.polls.is_empty() {
            return Ok(());
        }
        // A poll another controller recorded first is neither counted nor written.
        for (recorded, events) in db
            .record_health_polls(&self.polls)
            .await?
            .into_iter()
            .zip(self.events.drain(..))
        {
            if recorded {
                report.polled += 1;
                report.events += events;
            }
        }
        self.polls.clear();
        self.deltas = 0;
        Ok(())
    }
}

/// Polls a wave's nodes and control cohort.
#[derive(Debug, Clone)]
pub struct Collector {
    db: Db,
    bmcs: Arc<dyn HealthBmcs>,
    concurrency: usize,
}

impl Collector {
    /// `concurrency`: BMCs polled at once (at least one).
    pub fn new(db: Db, bmcs: Arc<dyn HealthBmcs>, concurrency: usize) -> Self {
        Self {
            db,
            bmcs,
            concurrency: concurrency.max(1),
        }
    }

    /// The wave's watched nodes as the health-source seam takes them.
    pub(crate) async fn watched_nodes(
        &self,
        wave: &ExecWave,
        bake_start: DateTime<Utc>,
    ) -> Result<Vec<crate::metric_source::WatchedNode>, DbError> {
        Ok(self
            .members(wave, bake_start)
            .await?
            .into_iter()
            .map(|m| crate::metric_source::WatchedNode {
                node: m.node.id,
                name: m.node.name,
                cohort: m.cohort,
                from: m.exposure_start,
            })
            .collect())
    }

    /// The wave's canary nodes (updates that succeeded, from their
    /// activation) and its control cohort (from the bake start).
    async fn members(&self, wave: &ExecWave, bake_start: DateTime<Utc>) -> Result<Vec<Member>, DbError> {
        let steps = self
            .db
            .watched_steps(&StepFilter {
                wave_id: Some(wave.id),
                purpose: Some(StepPurpose::Update),
                state: Some(StepState::Succeeded),
                ..Default::default()
            })
            .await?;
        let mut members = Vec::with_capacity(steps.len() + wave.control_nodes.len());
        // A node drained through its workload scheduler carries no load
        // until it is resumed: its exposure starts there, or it is left out
        // while Waveguard keeps it quarantined, so idle GPUs never dilute a
        // regression or fake a healthy rate.
        let drains: HashMap<i64, orchestrator_db::drains::DrainRow> = self
            .db
            .rollout_drains(wave.rollout_id)
            .await?
            .into_iter()
            .map(|d| (d.step_id.0, d))
            .collect();
        for step in steps {
            let Some(start) = canary_exposure_start(step.finished_at, drains.get(&step.step_id.0), bake_start) else {
                continue;
            };
            members.push(Member::of(step.node, Cohort::Canary, start));
        }
        let mut controls = self.db.node_addresses(&wave.control_nodes).await?;
        for node_id in &wave.control_nodes {
            match controls.remove(node_id) {
                Some(node) => members.push(Member::of(node, Cohort::Control, bake_start)),
                None => {
                    tracing::warn!(node = %node_id, wave = %wave.name, "control node no longer exists");
                }
            }
        }
        Ok(members)
    }

    /// Polls every member of `wave` once, concurrently, for `metrics`.
    pub async fn collect(
        &self,
        rollout: &ExecRollout,
        wave: &ExecWave,
        metrics: &[RedfishMetric],
        bake_start: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<CollectReport, DbError> {
        let members = self.members(wave, bake_start).await?;
        self.collect_members(rollout, wave, members, metrics, now).await
    }

    /// Polls `members` once for `wave`, concurrently (at most the collector's bound at once), for
    /// `metrics`: the wave's own cohorts, or the fleet-scale watch (every node on the release so far
    /// and the concurrent control).
    pub(crate) async fn collect_members(
        &self,
        rollout: &ExecRollout,
        wave: &ExecWave,
        members: Vec<Member>,
        metrics: &[RedfishMetric],
        now: DateTime<Utc>,
    ) -> Result<CollectReport, DbError> {
        let cursors: HashMap<NodeId, HealthCursor> = self
            .db
            .health_cursors(wave.id)
            .await?
            .into_iter()
            .map(|c| (c.node_id, c))
            .collect();
        let mut report = CollectReport::default();
        let mut polls = std::pin::pin!(
            futures::stream::iter(members)
                .map(|member| {
                    let cursor = cursors.get(&member.node.id).cloned();
                    async move { self.poll(rollout, wave, &member, cursor, metrics, now).await }
                })
                .buffer_unordered(self.concurrency)
        );
        let mut batch = PollBatch::default();
        while let Some(polled) = polls.next().await {
            match polled {
                Ok(Some((poll, events))) => batch.push(poll, events),
                Ok(None) => report.failed += 1,
                Err(DbError::Stale { .. }) => {}
                Err(err) => return Err(err),
            }
            if batch.is_full() {
                batch.write(&self.db, &mut report).await?;
            }
        }
        batch.write(&self.db, &mut report).await?;
        Ok(report)
    }

    /// Runs each `(metric key, PromQL)` level query at `now` over the
    /// wave's canary and control nodes and stores one reading per series
    /// (a series per GPU stays its own unit). A failing query is logged and
    /// counted; its gate then simply has less data.
    pub async fn collect_prometheus(
        &self,
        client: &PrometheusClient,
        rollout: &ExecRollout,
        wave: &ExecWave,
        queries: &[(String, String)],
        bake_start: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Result<CollectReport, DbError> {
        let members = self.members(wave, bake_start).await?;
        self.collect_prometheus_members(client, rollout, wave, &members, queries, now)
            .await
    }

    /// [`Collector::collect_prometheus`] over given members.
    pub(crate) async fn collect_prometheus_members(
        &self,
        client: &PrometheusClient,
        rollout: &ExecRollout,
        wave: &ExecWave,
        members: &[Member],
        queries: &[(String, String)],
        now: DateTime<Utc>,
    ) -> Result<CollectReport, DbError> {
        let index: NodeIndex = members.iter().map(|m| (m.node.id, m.node.name.clone())).collect();
        let cohorts: HashMap<NodeId, Cohort> = members.iter().map(|m| (m.node.id, m.cohort)).collect();
        let node_label = client.config().node_label.clone();
        let mut report = CollectReport::default();
        for (metric, query) in queries {
            let mapped = match client.node_samples(query, now, &index).await {
                Ok(mapped) => mapped,
                Err(err) => {
                    tracing::warn!(error = %orchestrator_types::error_chain(&err), wave = %wave.name, %metric, "Prometheus query failed");
                    report.failed += 1;
                    continue;
                }
            };
            if !mapped.unmatched.is_empty() {
                tracing::debug!(%metric, unmatched = mapped.unmatched.len(), "series without a watched node");
            }
            let mut by_node: HashMap<NodeId, WindowDelta> = HashMap::new();
            for sample in mapped.matched.into_iter().filter(|s| s.value.is_finite()) {
                let unit: Vec<String> = sample
                    .labels
                    .iter()
                    .filter(|(k, _)| **k != node_label && k.as_str() != "__name__")
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect();
                let unit = if unit.is_empty() {
                    "node".to_owned()
                } else {
                    unit.join(",")
                };
                by_node
                    .entry(sample.node)
                    .or_insert_with(|| WindowDelta {
                        metric: metric.clone(),
                        window_start: window_start(now),
                        ..Default::default()
                    })
                    .units
                    .insert(unit, LevelAgg::of(sample.value));
            }
            for (node, delta) in by_node {
                let Some(cohort) = cohorts.get(&node).copied() else {
                    continue;
                };
                self.db
                    .record_health_samples(rollout.id, wave.id, node, cohort, std::slice::from_ref(&delta))
                    .await?;
                report.polled += 1;
            }
        }
        Ok(report)
    }

    /// Polls one node: what to record and the events it counted, `Ok(None)` when its BMC could not
    /// be read (the failure is recorded here, at once).
    async fn poll(
        &self,
        rollout: &ExecRollout,
        wave: &ExecWave,
        member: &Member,
        cursor: Option<HealthCursor>,
        metrics: &[RedfishMetric],
        now: DateTime<Utc>,
    ) -> Result<Option<(NodePoll, u64)>, DbError> {
        let first = cursor.is_none();
        // A node of the first wave watched before its flash (`detection.pre_period`) was a control
        // then; as an updated node its watch starts afresh, from its own exposure start. The event
        // cursor carries over: entries before the new start are skipped below anyway.
        let cursor = cursor.map(|c| {
            if c.cohort == member.cohort {
                c
            } else {
                HealthCursor {
                    cohort: member.cohort,
                    exposure_start: member.exposure_start,
                    accounted_until: member.exposure_start,
                    ..c
                }
            }
        });
        let mut cursor = cursor.unwrap_or(HealthCursor {
            rollout_id: rollout.id,
            wave_id: wave.id,
            node_id: member.node.id,
            cohort: member.cohort,
            exposure_start: member.exposure_start,
            accounted_until: member.exposure_start,
            event_cursor: None,
            gpus: 0,
            polls: 0,
            last_error: None,
        });
        // A failed poll is stored on the node's cursor (created for it when this was the node's
        // first poll), so the gate can name the node and the reason; the next good poll clears it.
        let previous_error = cursor.last_error.clone();
        let failed = |reason: String| {
            let mut failed_cursor = cursor.clone();
            async move {
                if previous_error.as_deref() == Some(reason.as_str()) {
                    tracing::debug!(node = %member.node.name, wave = %wave.name, %reason, "health poll failed again");
                } else {
                    tracing::warn!(node = %member.node.name, wave = %wave.name, %reason, "health poll failed");
                }
                if first {
                    failed_cursor.last_error = Some(reason);
                    match self
                        .db
                        .record_health_poll(&NodePoll {
                            cursor: failed_cursor,
                            first: true,
                            deltas: Vec::new(),
                        })
                        .await
                    {
                        // Another controller recorded the node first; its row stands.
                        Ok(()) | Err(DbError::Stale { .. }) => {}
                        Err(err) => return Err(err),
                    }
                } else {
                    self.db
                        .record_health_poll_error(wave.id, member.node.id, &reason)
                        .await?;
                }
                Ok(None)
            }
        };
        let bmc = match self.bmcs.bmc(&member.node.bmc_url, &member.node.credential_ref) {
            Ok(bmc) => bmc,
            Err(err) => return failed(err.to_string()).await,
        };
        let wants_rates = metrics.iter().any(|m| {
            matches!(
                m,
                RedfishMetric::XidErrorsPerGpuHour
                    | RedfishMetric::PcieAerPerNodeHour
                    | RedfishMetric::LinkDegradedPerNodeDay
            )
        });
        let sensors = match bmc.read_sensors().await {
            Ok(sensors) => sensors,
            Err(err) => return failed(orchestrator_types::error_chain(&err)).await,
        };
        // The inventory's GPUs; a BMC that cannot list them is read by its sensors alone.
        let gpu_units = match bmc.gpus().await {
            Ok(units) => units,
            Err(err) => {
                tracing::debug!(node = %member.node.name, error = %orchestrator_types::error_chain(&err), "no GPU inventory");
                Vec::new()
            }
        };
        let gpus = match gpu_count(&sensors, &gpu_units) {
            0 if cursor.gpus > 0 => cursor.gpus,
            0 => DEFAULT_GPUS_PER_NODE,
            n => n,
        };
        let mut events = Vec::new();
        if wants_rates {
            let since: EventCursor = cursor
                .event_cursor
                .as_ref()
                .and_then(|v| serde_json::from_value(v.clone()).ok())
                .unwrap_or_default();
            let batch = match bmc.read_events(&since).await {
                Ok(batch) => batch,
                Err(err) => return failed(orchestrator_types::error_chain(&err)).await,
            };
            for entry in &batch.entries {
                // Before the exposure period: the old firmware's (or the
                // control's pre-bake) history, not evidence about this wave.
                if entry.created < cursor.exposure_start {
                    continue;
                }
                if let Some(metric) = classify_event(entry).filter(|m| metrics.contains(m)) {
                    events.push((metric, entry.created, event_gpu(entry, &gpu_units)));
                }
            }
            cursor.event_cursor = serde_json::to_value(&batch.cursor).ok();
        }
        let from = cursor.accounted_until.max(cursor.exposure_start);
        let to = now.max(from);
        let deltas = poll_deltas(metrics, &events, gpus, from, to, &gpu_levels(&sensors, &gpu_units));
        cursor.accounted_until = to;
        cursor.gpus = gpus;
        cursor.last_error = None;
        Ok(Some((NodePoll { cursor, first, deltas }, events.len() as u64)))
    }
}

#[cfg(test)]
mod tests {
    use chrono::Duration;
    use orchestrator_db::drains::DrainRow;
    use orchestrator_types::{RolloutId, StepId, WaveId};

    use super::*;

    fn drain(phase: DrainPhase, closed_at: Option<DateTime<Utc>>) -> DrainRow {
        let t = Utc::now();
        DrainRow {
            id: 1,
            rollout_id: RolloutId(1),
            wave_id: WaveId(1),
            step_id: StepId(1),
            node_id: NodeId(1),
            scheduler_kind: "slurm".into(),
            scheduler_node: "n1".into(),
            phase,
            reason_text: "waveguard rollout=1 firmware maintenance".into(),
            observed_before: None,
            last_seen: None,
            drain_started_at: t,
            held_at: Some(t),
            resume_intended_at: None,
            closed_at,
            close_reason: closed_at.map(|_| "resumed".into()),
            updated_at: t,
        }
    }

    #[test]
    fn a_drained_canary_is_exposed_only_once_it_is_back_in_service() {
        let bake = Utc::now();
        let flashed = bake - Duration::hours(2);
        let resumed = bake - Duration::minutes(30);
        assert_eq!(canary_exposure_start(Some(flashed), None, bake), Some(flashed));
        let closed = drain(DrainPhase::Closed, Some(resumed));
        assert_eq!(canary_exposure_start(Some(flashed), Some(&closed), bake), Some(resumed));
        // A node resumed after the bake started (a replayed resume) counts from the bake start at most.
        let late = drain(DrainPhase::Closed, Some(bake + Duration::hours(1)));
        assert_eq!(canary_exposure_start(Some(flashed), Some(&late), bake), Some(bake));
        let held = drain(DrainPhase::Held, None);
        assert_eq!(canary_exposure_start(Some(flashed), Some(&held), bake), Some(bake));
        let quarantined = drain(DrainPhase::Quarantined, None);
        assert_eq!(canary_exposure_start(Some(flashed), Some(&quarantined), bake), None);
    }
}
