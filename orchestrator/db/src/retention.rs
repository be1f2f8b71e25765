//! Health-sample retention: a finished rollout's hourly windows
//! (`health_samples`) reduced to per-node daily aggregates (`health_daily`)
//! once nothing refers to them any more.
//!
//! A window is kept while anything refers to it:
//! - its rollout is not finished ([`RolloutState::is_finished`]: running,
//!   paused, halted, aborted and rolling back all still refer to their
//!   samples; the soak, when the engine runs it, is not finished either);
//! - its rollout's evidence package is not stored for the state it finished
//!   in (`crate::rollout_evidence`): the package is built from the windows;
//! - its node has an open RMA case (every RMA candidate the monitor finds
//!   opens one; the case's candidate is stored with it), whatever the window's age;
//! - it may be a pre-period baseline: its node is updated by an unfinished
//!   rollout and the window is no older than `pre_period` before the earliest
//!   unfinished rollout started (coarse on purpose: one subquery, no per-node times);
//! - it is younger than the cutoff (`[retention] raw_days`).
//!
//! Crash safety: one batch deletes its hourly windows and adds them into
//! their days in one transaction, fenced by the executor lease; the delete
//! must remove every window it read, or the batch is rolled back. A crash
//! (or a second controller) at any point leaves each window either still
//! hourly or folded into its day exactly once, so a replay neither
//! double-counts nor loses a reading.

use std::collections::BTreeMap;

use chrono::{DateTime, Duration, DurationRound, Utc};
use orchestrator_types::{RolloutId, RolloutState};
use sea_orm::sea_query::{Expr, ExprTrait, Query, SelectStatement};
use sea_orm::{
    ActiveModelTrait, ColumnTrait, Condition, EntityTrait, QueryFilter, QueryOrder, QuerySelect, Set, TransactionTrait,
};

use crate::entity::{health_daily, health_samples, nodes, rma_cases, rollouts, update_steps};
use crate::execution::Fence;
use crate::execution::check_fence;
use crate::health::{Cohort, HealthSample, LevelAgg, SampleScope, saturating_i64, units_json};
use crate::{Db, DbError};

/// Length of one reduced aggregate.
pub const DAY: Duration = Duration::days(1);

/// Most ids in one `IN (...)` list (SQLite allows 32,766 bound values).
const IDS_PER_STATEMENT: usize = 500;

/// The UTC day a time falls in.
pub fn day_start(at: DateTime<Utc>) -> DateTime<Utc> {
    at.duration_trunc(DAY).unwrap_or(at)
}

/// What one reduction batch may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReduceRequest {
    /// Hourly windows starting before this are old enough (a day's start, so
    /// a day is reduced whole).
    pub before: DateTime<Utc>,
    /// How far before an unfinished rollout's start its pre-period baseline reaches.
    pub pre_period: Duration,
    /// Most hourly windows folded in one transaction.
    pub batch: u64,
}

/// What one batch did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReducedBatch {
    /// The rollout whose windows were reduced; `None` when nothing was left to reduce.
    pub rollout: Option<RolloutId>,
    /// Hourly windows folded and deleted.
    pub windows: u64,
    /// Daily aggregates written (new or added to).
    pub days: u64,
}

/// Where a test cuts a batch short as a crash would: after the hourly
/// windows are deleted and their days written, before the commit. An error
/// from the seam rolls the batch back.
pub trait ReduceSeam: Send + Sync {
    /// Called once per batch, inside its transaction.
    fn before_commit(&self, batch: &ReducedBatch) -> Result<(), DbError>;
}

struct NoSeam;

impl ReduceSeam for NoSeam {
    fn before_commit(&self, _: &ReducedBatch) -> Result<(), DbError> {
        Ok(())
    }
}

/// Nodes with an open RMA case (by name: cases name their node).
fn open_case_nodes() -> SelectStatement {
    Query::select()
        .column(nodes::Column::Id)
        .from(nodes::Entity)
        .and_where(
            Expr::col(nodes::Column::Name).in_subquery(
                Query::select()
                    .column(rma_cases::Column::NodeName)
                    .from(rma_cases::Entity)
                    .and_where(Expr::col(rma_cases::Column::Open).eq(true))
                    .to_owned(),
            ),
        )
        .to_owned()
}

/// Nodes updated by any of `rollouts`.
fn updated_nodes(rollouts: &[i64]) -> SelectStatement {
    Query::select()
        .column(update_steps::Column::NodeId)
        .from(update_steps::Entity)
        .and_where(Expr::col(update_steps::Column::RolloutId).is_in(rollouts.iter().copied()))
        .to_owned()
}

/// The unfinished rollouts, and how far back their pre-period baselines reach.
#[derive(Debug, Clone)]
struct Holding {
    rollouts: Vec<i64>,
    baseline_from: Option<DateTime<Utc>>,
}

/// Which of `rollout`'s hourly windows nothing refers to (module docs).
fn reducible(rollout: RolloutId, request: &ReduceRequest, holding: &Holding) -> Condition {
    let mut condition = Condition::all()
        .add(health_samples::Column::RolloutId.eq(rollout.0))
        .add(health_samples::Column::WindowStart.lt(request.before))
        .add(health_samples::Column::NodeId.not_in_subquery(open_case_nodes()));
    if let Some(from) = holding.baseline_from {
        condition = condition.add(
            Condition::any()
                .add(health_samples::Column::WindowStart.lt(from))
                .add(health_samples::Column::NodeId.not_in_subquery(updated_nodes(&holding.rollouts))),
        );
    }
    condition
}

/// One day's sums while a batch is folded.
struct DayAcc {
    rollout: i64,
    cohort: Cohort,
    windows: u64,
    events: u64,
    exposure: f64,
    total: LevelAgg,
    units: BTreeMap<String, LevelAgg>,
}

impl DayAcc {
    fn add(&mut self, s: &HealthSample) {
        self.windows += 1;
        self.events = self.events.saturating_add(s.events);
        self.exposure += s.exposure;
        self.total.merge(&level_of(s));
        for (unit, agg) in &s.units {
            self.units.entry(unit.clone()).or_insert(LevelAgg::EMPTY).merge(agg);
        }
    }
}

/// A sample's node-level readings as one summary.
fn level_of(s: &HealthSample) -> LevelAgg {
    LevelAgg {
        n: s.readings,
        sum: s.sum,
        min: s.min.unwrap_or(0.0),
        max: s.max.unwrap_or(0.0),
    }
}

fn to_daily_sample(row: health_daily::Model) -> Result<HealthSample, DbError> {
    let units = match row.units {
        None | Some(serde_json::Value::Null) => BTreeMap::new(),
        Some(v) => serde_json::from_value(v).map_err(|e| DbError::corrupt("health daily units", e))?,
    };
    Ok(HealthSample {
        rollout_id: RolloutId(row.rollout_id),
        wave_id: orchestrator_types::WaveId(row.wave_id),
        node_id: orchestrator_types::NodeId(row.node_id),
        cohort: Cohort::parse(&row.cohort)?,
        metric: row.metric,
        window_start: row.day,
        events: u64::try_from(row.events).unwrap_or(0),
        exposure: row.exposure,
        readings: u64::try_from(row.readings).unwrap_or(0),
        sum: row.sum,
        min: row.min,
        max: row.max,
        units,
    })
}

impl Db {
    /// Finished rollouts ([`RolloutState::is_finished`]), oldest first.
    pub async fn finished_rollouts(&self) -> Result<Vec<(RolloutId, RolloutState)>, DbError> {
        let rows: Vec<(i64, String)> = rollouts::Entity::find()
            .select_only()
            .column(rollouts::Column::Id)
            .column(rollouts::Column::State)
            .order_by_asc(rollouts::Column::Id)
            .into_tuple()
            .all(&self.reader)
            .await?;
        Ok(rows
            .into_iter()
            // A row in a state this build does not know is not finished for it.
            .filter_map(|(id, state)| state.parse::<RolloutState>().ok().map(|s| (RolloutId(id), s)))
            .filter(|(_, state)| state.is_finished())
            .collect())
    }

    /// Events and exposure per metric on control nodes since `since`, over
    /// the hourly windows still stored and the days retention reduced (each
    /// reading counted once: a window is deleted in the transaction that
    /// folds it into its day), as `(metric, events, exposure)` in metric
    /// order. The fleet's measured base rates come from these (the planner's
    /// `history_rates`): control nodes ran the fleet's current firmware.
    ///
    /// Summed by the database, not streamed: a month of a large fleet's
    /// windows is millions of rows. The sums are cast to double precision
    /// because PostgreSQL's `SUM` of a `BIGINT` is a `NUMERIC`.
    pub async fn control_rate_totals(&self, since: DateTime<Utc>) -> Result<Vec<(String, f64, f64)>, DbError> {
        let events = || Expr::cust("CAST(SUM(events) AS DOUBLE PRECISION)");
        let exposure = || Expr::cust("CAST(SUM(exposure) AS DOUBLE PRECISION)");
        let hourly: Vec<(String, Option<f64>, Option<f64>)> = health_samples::Entity::find()
            .select_only()
            .column(health_samples::Column::Metric)
            .column_as(events(), "events")
            .column_as(exposure(), "exposure")
            .filter(health_samples::Column::Cohort.eq(Cohort::Control.as_str()))
            .filter(health_samples::Column::WindowStart.gte(since))
            .group_by(health_samples::Column::Metric)
            .into_tuple()
            .all(&self.reader)
            .await?;
        let daily: Vec<(String, Option<f64>, Option<f64>)> = health_daily::Entity::find()
            .select_only()
            .column(health_daily::Column::Metric)
            .column_as(events(), "events")
            .column_as(exposure(), "exposure")
            .filter(health_daily::Column::Cohort.eq(Cohort::Control.as_str()))
            .filter(health_daily::Column::Day.gte(since))
            .group_by(health_daily::Column::Metric)
            .into_tuple()
            .all(&self.reader)
            .await?;
        let mut totals: BTreeMap<String, (f64, f64)> = BTreeMap::new();
        for (metric, events, exposure) in hourly.into_iter().chain(daily) {
            let t = totals.entry(metric).or_default();
            t.0 += events.unwrap_or(0.0);
            t.1 += exposure.unwrap_or(0.0);
        }
        Ok(totals.into_iter().map(|(m, (e, x))| (m, e, x)).collect())
    }

    /// Per-node daily aggregates of reduced days, ordered by wave, node,
    /// metric and day; each stands as one sample starting at its day.
    pub async fn health_daily(&self, scope: SampleScope) -> Result<Vec<HealthSample>, DbError> {
        let query = match scope {
            SampleScope::Wave(wave) => health_daily::Entity::find().filter(health_daily::Column::WaveId.eq(wave.0)),
            SampleScope::Rollout(rollout) => {
                health_daily::Entity::find().filter(health_daily::Column::RolloutId.eq(rollout.0))
            }
        };
        query
            .order_by_asc(health_daily::Column::WaveId)
            .order_by_asc(health_daily::Column::NodeId)
            .order_by_asc(health_daily::Column::Metric)
            .order_by_asc(health_daily::Column::Day)
            .all(&self.reader)
            .await?
            .into_iter()
            .map(to_daily_sample)
            .collect()
    }

    /// Reduces one batch of hourly windows nothing refers to (module docs)
    /// into their days, as the holder of `fence`. `Fenced` when the lease was
    /// lost; `Stale` when another writer reduced some of the same windows
    /// first (nothing is written then).
    pub async fn reduce_health_samples(&self, fence: &Fence, request: &ReduceRequest) -> Result<ReducedBatch, DbError> {
        self.reduce_health_samples_with(fence, request, &NoSeam).await
    }

    /// [`Db::reduce_health_samples`] with a seam called before the commit.
    pub async fn reduce_health_samples_with(
        &self,
        fence: &Fence,
        request: &ReduceRequest,
        seam: &dyn ReduceSeam,
    ) -> Result<ReducedBatch, DbError> {
        let batch = Ord::max(request.batch, 1);
        let unfinished = self.unfinished_rollouts().await?;
        let holding = Holding {
            rollouts: unfinished.iter().map(|r| r.id.0).collect(),
            baseline_from: unfinished
                .iter()
                .map(|r| r.created_at)
                .min()
                .map(|at| at - request.pre_period),
        };
        let stored = self.stored_evidence_states().await?;
        // The first finished rollout with its package stored and windows left to reduce.
        let mut found: Option<(RolloutId, Vec<i64>)> = None;
        for (rollout, state) in self.finished_rollouts().await? {
            if stored.get(&rollout) != Some(&state) {
                continue;
            }
            let ids: Vec<i64> = health_samples::Entity::find()
                .select_only()
                .column(health_samples::Column::Id)
                .filter(reducible(rollout, request, &holding))
                .order_by_asc(health_samples::Column::Id)
                .limit(batch)
                .into_tuple()
                .all(&self.reader)
                .await?;
            if !ids.is_empty() {
                found = Some((rollout, ids));
                break;
            }
        }
        let Some((rollout, ids)) = found else {
            return Ok(ReducedBatch::default());
        };

        let now = self.clock.now();
        let txn = self.writer.begin().await?;
        check_fence(&txn, fence).await?;
        // Read again inside the transaction, under the same conditions: a
        // case opened since the search keeps its node's windows.
        let mut rows = Vec::with_capacity(ids.len());
        for chunk in ids.chunks(IDS_PER_STATEMENT) {
            rows.extend(
                health_samples::Entity::find()
                    .filter(health_samples::Column::Id.is_in(chunk.iter().copied()))
                    .filter(reducible(rollout, request, &holding))
                    .all(&txn)
                    .await?,
            );
        }
        let read: Vec<i64> = rows.iter().map(|r| r.id).collect();
        let mut deleted = 0;
        for chunk in read.chunks(IDS_PER_STATEMENT) {
            deleted += health_samples::Entity::delete_many()
                .filter(health_samples::Column::Id.is_in(chunk.iter().copied()))
                .exec(&txn)
                .await?
                .rows_affected;
        }
        if deleted != read.len() as u64 {
            // Another writer took some of them first: its batch counted them.
            return Err(DbError::Stale {
                what: "health samples",
                key: format!("rollout {rollout}"),
                expected: format!("{} windows to reduce, {deleted} left", read.len()),
            });
        }
        let mut days: BTreeMap<(i64, i64, String, DateTime<Utc>), DayAcc> = BTreeMap::new();
        for row in rows {
            let sample = crate::health::to_sample(row)?;
            let key = (
                sample.wave_id.0,
                sample.node_id.0,
                sample.metric.clone(),
                day_start(sample.window_start),
            );
            days.entry(key)
                .or_insert_with(|| DayAcc {
                    rollout: sample.rollout_id.0,
                    cohort: sample.cohort,
                    windows: 0,
                    events: 0,
                    exposure: 0.0,
                    total: LevelAgg::EMPTY,
                    units: BTreeMap::new(),
                })
                .add(&sample);
        }
        let report = ReducedBatch {
            rollout: Some(rollout),
            windows: read.len() as u64,
            days: days.len() as u64,
        };
        for ((wave, node, metric, day), acc) in days {
            let existing = health_daily::Entity::find()
                .filter(health_daily::Column::WaveId.eq(wave))
                .filter(health_daily::Column::NodeId.eq(node))
                .filter(health_daily::Column::Metric.eq(metric.as_str()))
                .filter(health_daily::Column::Day.eq(day))
                .one(&txn)
                .await?;
            match existing {
                Some(row) => {
                    let windows = u64::try_from(row.windows).unwrap_or(0) + acc.windows;
                    let stored = to_daily_sample(row.clone())?;
                    let mut total = level_of(&stored);
                    total.merge(&acc.total);
                    let mut units = stored.units;
                    for (unit, agg) in &acc.units {
                        units.entry(unit.clone()).or_insert(LevelAgg::EMPTY).merge(agg);
                    }
                    let mut active: health_daily::ActiveModel = row.into();
                    active.windows = Set(saturating_i64(windows));
                    active.events = Set(saturating_i64(stored.events.saturating_add(acc.events)));
                    active.exposure = Set(stored.exposure + acc.exposure);
                    active.readings = Set(saturating_i64(total.n));
                    active.sum = Set(total.sum);
                    active.min = Set((total.n > 0).then_some(total.min));
                    active.max = Set((total.n > 0).then_some(total.max));
                    active.units = Set(units_json(&units));
                    active.updated_at = Set(now);
                    active.update(&txn).await?;
                }
                None => {
                    health_daily::ActiveModel {
                        rollout_id: Set(acc.rollout),
                        wave_id: Set(wave),
                        node_id: Set(node),
                        cohort: Set(acc.cohort.as_str().to_owned()),
                        metric: Set(metric),
                        day: Set(day),
                        windows: Set(saturating_i64(acc.windows)),
                        events: Set(saturating_i64(acc.events)),
                        exposure: Set(acc.exposure),
                        readings: Set(saturating_i64(acc.total.n)),
                        sum: Set(acc.total.sum),
                        min: Set((acc.total.n > 0).then_some(acc.total.min)),
                        max: Set((acc.total.n > 0).then_some(acc.total.max)),
                        units: Set(units_json(&acc.units)),
                        updated_at: Set(now),
                        ..Default::default()
                    }
                    .insert(&txn)
                    .await?;
                }
            }
        }
        seam.before_commit(&report)?;
        txn.commit().await?;
        Ok(report)
    }
}
