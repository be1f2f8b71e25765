//! Health watch storage: aggregated samples, per-node collection state and
//! the detector's evaluated looks (the decision trace).
//!
//! # Sizing
//!
//! Raw readings are never stored. A poll adds into one row per
//! (wave, node, metric, window) with [`SAMPLE_WINDOW`] = one hour: rate
//! metrics keep `events` + `exposure`, level metrics keep `readings`,
//! `sum`, `min`, `max` for the node plus the same four numbers per unit
//! (GPU sensor) in `units`, because the detector needs one value per GPU.
//!
//! Worst case, the whole fleet baking at once: 100,000 nodes × 5 Redfish
//! metrics (3 rates, 2 levels) × 24 windows a day = 12 M rows a day. A rate
//! row is about 100 bytes, a level row about 100 + 8 GPUs × ~60 bytes of
//! unit aggregates ≈ 600 bytes, so (3 × 100 + 2 × 600) × 100,000 × 24 ≈
//! 3.6 GB a day, and realistically far less: only baking waves and their
//! control cohorts (at most 2,048 nodes) are watched, and big waves bake for
//! hours, not days. Raw samples at a 15-minute poll would be 100,000 × 8
//! GPUs × 2 sensors × 96 polls ≈ 154 M readings a day plus every event-log
//! entry, which is why they are folded into windows as they arrive.
//! Windows (rather than one running total per node) keep the time profile
//! for the evidence package and let a window be recomputed or pruned.
//!
//! Invariant: a poll's deltas and the cursor that produced them are written
//! in one transaction, and the cursor update is conditional on the poll
//! count read before the poll, so events are never counted twice, even
//! when two controllers poll the same node at once. A collection round
//! writes its polls in one transaction ([`Db::record_health_polls`]); a poll
//! whose cursor did not move adds nothing, the others are unaffected.

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Duration, DurationRound, Utc};
use futures::TryStreamExt as _;
use orchestrator_types::{NodeId, Outcome, RolloutId, WaveId};
use sea_orm::sea_query::{Expr, OnConflict};
use sea_orm::{ActiveModelTrait, ColumnTrait, EntityTrait, QueryFilter, QueryOrder, QueryTrait, Set, TransactionTrait};
use serde::{Deserialize, Serialize};

use crate::audit;
use crate::entity::{health_cursors, health_looks, health_samples};
use crate::error::is_unique_violation;
use crate::{Db, DbError};

/// Length of one sample window (see the module documentation for why an hour).
pub const SAMPLE_WINDOW: Duration = Duration::hours(1);

/// The window a time falls in.
pub fn window_start(at: DateTime<Utc>) -> DateTime<Utc> {
    at.duration_trunc(SAMPLE_WINDOW).unwrap_or(at)
}

/// Which side of the comparison a node is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Cohort {
    /// Took the new firmware in this wave.
    Canary,
    /// Did not: the concurrent comparison.
    Control,
}

impl Cohort {
    /// Stored spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Cohort::Canary => "canary",
            Cohort::Control => "control",
        }
    }

    pub(crate) fn parse(raw: &str) -> Result<Self, DbError> {
        match raw {
            "canary" => Ok(Cohort::Canary),
            "control" => Ok(Cohort::Control),
            other => Err(DbError::corrupt("health cohort", format!("unknown cohort {other:?}"))),
        }
    }
}

/// Running summary of level readings (one unit, or a whole node).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LevelAgg {
    /// Readings folded in.
    pub n: u64,
    /// Their sum.
    pub sum: f64,
    /// Smallest reading.
    pub min: f64,
    /// Largest reading.
    pub max: f64,
}

impl LevelAgg {
    /// No readings: what [`LevelAgg::merge`] starts from.
    pub const EMPTY: LevelAgg = LevelAgg {
        n: 0,
        sum: 0.0,
        min: 0.0,
        max: 0.0,
    };

    /// A summary of one reading.
    pub fn of(value: f64) -> Self {
        Self {
            n: 1,
            sum: value,
            min: value,
            max: value,
        }
    }

    /// Folds another summary in.
    pub fn merge(&mut self, other: &LevelAgg) {
        if other.n == 0 {
            return;
        }
        if self.n == 0 {
            *self = *other;
            return;
        }
        self.n += other.n;
        self.sum += other.sum;
        self.min = self.min.min(other.min);
        self.max = self.max.max(other.max);
    }

    /// Mean reading, `None` without readings.
    pub fn mean(&self) -> Option<f64> {
        (self.n > 0).then(|| self.sum / self.n as f64)
    }
}

/// What one poll of one node adds to one (metric, window) row.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct WindowDelta {
    /// Policy metric name (`xid_errors_per_gpu_hour`, `gpu_temp_c`, ...).
    pub metric: String,
    /// Start of the window ([`window_start`]).
    pub window_start: DateTime<Utc>,
    /// Events counted (rate metrics).
    pub events: u64,
    /// Exposure added, in the metric's unit (GPU-hours, node-hours, node-days).
    pub exposure: f64,
    /// Level readings per unit (GPU), for level metrics; for a rate metric, its events attributed
    /// to a GPU, each a reading of 1 in that GPU's unit (so `n` is the GPU's count).
    pub units: BTreeMap<String, LevelAgg>,
}

/// Where collection of one node for one wave stands.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HealthCursor {
    pub rollout_id: RolloutId,
    pub wave_id: WaveId,
    pub node_id: NodeId,
    pub cohort: Cohort,
    /// When exposure starts counting: the update's activation for canary
    /// nodes, the bake start for control nodes. Events before it are ignored.
    pub exposure_start: DateTime<Utc>,
    /// Exposure has been added up to this instant.
    pub accounted_until: DateTime<Utc>,
    /// The BMC event-log cursor (opaque here: the driver's `EventCursor`).
    pub event_cursor: Option<serde_json::Value>,
    /// GPUs seen on the node (for GPU-hour exposure).
    pub gpus: u32,
    /// Polls recorded so far; the optimistic-concurrency version of the row.
    pub polls: i64,
    /// The last poll's error, if it failed (cleared by a good poll).
    pub last_error: Option<String>,
}

/// A poll to record: the cursor as it is after the poll (with `polls` as it
/// was read before it) and what the poll adds.
#[derive(Debug, Clone, PartialEq)]
pub struct NodePoll {
    pub cursor: HealthCursor,
    /// True when no cursor row existed before this poll.
    pub first: bool,
    pub deltas: Vec<WindowDelta>,
}

/// One stored aggregate row.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HealthSample {
    pub rollout_id: RolloutId,
    pub wave_id: WaveId,
    pub node_id: NodeId,
    pub cohort: Cohort,
    pub metric: String,
    pub window_start: DateTime<Utc>,
    pub events: u64,
    pub exposure: f64,
    /// Level readings over every unit of the node.
    pub readings: u64,
    pub sum: f64,
    pub min: Option<f64>,
    pub max: Option<f64>,
    /// Level readings per unit.
    pub units: BTreeMap<String, LevelAgg>,
}

/// A scope's health history: the hourly windows still stored, and the days
/// retention has reduced (`crate::retention`), each day standing as one
/// sample whose `window_start` is the day's start (UTC).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HealthHistory {
    /// Hourly windows, as [`Db::health_samples`] returns them.
    pub hourly: Vec<HealthSample>,
    /// Per-node daily aggregates of reduced days, in the same order.
    pub daily: Vec<HealthSample>,
}

impl HealthHistory {
    /// Every sample, hourly first, then daily. Sums over both count each
    /// reading once: an hourly window is deleted in the transaction that
    /// folds it into its day.
    pub fn all(&self) -> impl Iterator<Item = &HealthSample> + Clone {
        self.hourly.iter().chain(self.daily.iter())
    }
}

/// Which samples to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SampleScope {
    /// One wave's samples.
    Wave(WaveId),
    /// Every wave of a rollout.
    Rollout(RolloutId),
}

/// One gate's evaluation at one planned look, to record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NewHealthLook {
    pub rollout_id: RolloutId,
    pub wave_id: WaveId,
    pub gate: String,
    pub look_number: u32,
    pub planned_looks: u32,
    /// The gate's outcome at this look (its own column, for queries).
    pub outcome: Outcome,
    /// The detector's verdict with its evidence.
    pub verdict: serde_json::Value,
}

/// A recorded look: one line of the decision trace.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HealthLook {
    pub id: i64,
    #[serde(flatten)]
    pub look: NewHealthLook,
    pub evaluated_at: DateTime<Utc>,
}

fn to_cursor(row: health_cursors::Model) -> Result<HealthCursor, DbError> {
    Ok(HealthCursor {
        rollout_id: RolloutId(row.rollout_id),
        wave_id: WaveId(row.wave_id),
        node_id: NodeId(row.node_id),
        cohort: Cohort::parse(&row.cohort)?,
        exposure_start: row.exposure_start,
        accounted_until: row.accounted_until,
        event_cursor: row.event_cursor.filter(|v| !v.is_null()),
        gpus: u32::try_from(row.gpus).unwrap_or(0),
        polls: row.polls,
        last_error: row.last_error,
    })
}

pub(crate) fn to_sample(row: health_samples::Model) -> Result<HealthSample, DbError> {
    let units = match row.units {
        None | Some(serde_json::Value::Null) => BTreeMap::new(),
        Some(v) => serde_json::from_value(v).map_err(|e| DbError::corrupt("health sample units", e))?,
    };
    Ok(HealthSample {
        rollout_id: RolloutId(row.rollout_id),
        wave_id: WaveId(row.wave_id),
        node_id: NodeId(row.node_id),
        cohort: Cohort::parse(&row.cohort)?,
        metric: row.metric,
        window_start: row.window_start,
        events: u64::try_from(row.events).unwrap_or(0),
        exposure: row.exposure,
        readings: u64::try_from(row.readings).unwrap_or(0),
        sum: row.sum,
        min: row.min,
        max: row.max,
        units,
    })
}

fn to_look(row: health_looks::Model) -> Result<HealthLook, DbError> {
    Ok(HealthLook {
        id: row.id,
        look: NewHealthLook {
            rollout_id: RolloutId(row.rollout_id),
            wave_id: WaveId(row.wave_id),
            gate: row.gate,
            look_number: u32::try_from(row.look_number).unwrap_or(0),
            planned_looks: u32::try_from(row.planned_looks).unwrap_or(0),
            outcome: row
                .outcome
                .parse()
                .map_err(|e| DbError::corrupt("health look outcome", e))?,
            verdict: row.verdict,
        },
        evaluated_at: row.evaluated_at,
    })
}

pub(crate) fn units_json(units: &BTreeMap<String, LevelAgg>) -> Option<serde_json::Value> {
    if units.is_empty() {
        None
    } else {
        // Plain numbers and strings always serialize.
        serde_json::to_value(units).ok()
    }
}

pub(crate) fn saturating_i64(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// Sample rows one statement reads and writes when deltas are folded in: 14 columns a row keep an
/// upsert at 7,000 bind parameters, under SQLite's 32,766 and PostgreSQL's 65,535. Bounded by rows,
/// not nodes: a node's first poll may span many hourly windows (its exposure runs from its flash).
const FOLD_ROWS_PER_STATEMENT: usize = 500;

/// One node's deltas to fold in.
struct NodeDeltas<'a> {
    rollout: RolloutId,
    wave: WaveId,
    node: NodeId,
    cohort: Cohort,
    deltas: &'a [WindowDelta],
}

impl HealthSample {
    /// A row with nothing in it yet: what a window's first delta is folded into, and what a day's
    /// aggregate starts from.
    pub fn empty(
        rollout_id: RolloutId,
        wave_id: WaveId,
        node_id: NodeId,
        cohort: Cohort,
        metric: String,
        window_start: DateTime<Utc>,
    ) -> Self {
        Self {
            rollout_id,
            wave_id,
            node_id,
            cohort,
            metric,
            window_start,
            events: 0,
            exposure: 0.0,
            readings: 0,
            sum: 0.0,
            min: None,
            max: None,
            units: BTreeMap::new(),
        }
    }
}

/// A (wave, node, metric, window) row: the unique key of `health_samples`.
type SampleKey = (i64, i64, String, DateTime<Utc>);

/// Adds each delta into its (wave, node, metric, window) row, inside the caller's transaction: per
/// [`FOLD_ROWS_PER_STATEMENT`] rows, one read of those that exist and one multi-row upsert of the
/// merged rows (the merge of per-GPU aggregates is done here, not in SQL, so both backends share it).
async fn fold_deltas<C: sea_orm::ConnectionTrait>(
    txn: &C,
    now: DateTime<Utc>,
    items: &[NodeDeltas<'_>],
) -> Result<(), DbError> {
    // What is added per row; a key twice in one statement is an error on PostgreSQL (an upsert may
    // not touch a row twice), so deltas of the same row are merged first.
    let mut adds: BTreeMap<SampleKey, HealthSample> = BTreeMap::new();
    for item in items {
        for delta in item.deltas {
            let key = (item.wave.0, item.node.0, delta.metric.clone(), delta.window_start);
            let add = adds.entry(key).or_insert_with(|| {
                HealthSample::empty(
                    item.rollout,
                    item.wave,
                    item.node,
                    item.cohort,
                    delta.metric.clone(),
                    delta.window_start,
                )
            });
            fold_into(add, delta.events, delta.exposure, &delta.units);
        }
    }
    let adds: Vec<(SampleKey, HealthSample)> = adds.into_iter().collect();
    for chunk in adds.chunks(FOLD_ROWS_PER_STATEMENT) {
        let waves: BTreeSet<i64> = chunk.iter().map(|(k, _)| k.0).collect();
        let nodes: BTreeSet<i64> = chunk.iter().map(|(k, _)| k.1).collect();
        let windows: BTreeSet<DateTime<Utc>> = chunk.iter().map(|(k, _)| k.3).collect();
        let wanted: BTreeSet<&SampleKey> = chunk.iter().map(|(k, _)| k).collect();
        let mut existing: BTreeMap<SampleKey, HealthSample> = BTreeMap::new();
        for row in health_samples::Entity::find()
            .filter(health_samples::Column::WaveId.is_in(waves))
            .filter(health_samples::Column::NodeId.is_in(nodes))
            .filter(health_samples::Column::WindowStart.is_in(windows))
            .all(txn)
            .await?
        {
            let key = (row.wave_id, row.node_id, row.metric.clone(), row.window_start);
            if wanted.contains(&key) {
                existing.insert(key, to_sample(row)?);
            }
        }
        let rows: Vec<health_samples::ActiveModel> = chunk
            .iter()
            .map(|(key, add)| {
                // A stored row keeps its rollout and cohort; only its aggregates grow.
                let mut row = existing.remove(key).unwrap_or_else(|| {
                    HealthSample::empty(
                        add.rollout_id,
                        add.wave_id,
                        add.node_id,
                        add.cohort,
                        add.metric.clone(),
                        add.window_start,
                    )
                });
                fold_into(&mut row, add.events, add.exposure, &add.units);
                health_samples::ActiveModel {
                    rollout_id: Set(row.rollout_id.0),
                    wave_id: Set(row.wave_id.0),
                    node_id: Set(row.node_id.0),
                    cohort: Set(row.cohort.as_str().to_owned()),
                    metric: Set(row.metric),
                    window_start: Set(row.window_start),
                    events: Set(saturating_i64(row.events)),
                    exposure: Set(row.exposure),
                    readings: Set(saturating_i64(row.readings)),
                    sum: Set(row.sum),
                    min: Set(row.min),
                    max: Set(row.max),
                    units: Set(units_json(&row.units)),
                    updated_at: Set(now),
                    ..Default::default()
                }
            })
            .collect();
        health_samples::Entity::insert_many(rows)
            .on_conflict(
                OnConflict::columns([
                    health_samples::Column::WaveId,
                    health_samples::Column::NodeId,
                    health_samples::Column::Metric,
                    health_samples::Column::WindowStart,
                ])
                .update_columns([
                    health_samples::Column::Events,
                    health_samples::Column::Exposure,
                    health_samples::Column::Readings,
                    health_samples::Column::Sum,
                    health_samples::Column::Min,
                    health_samples::Column::Max,
                    health_samples::Column::Units,
                    health_samples::Column::UpdatedAt,
                ])
                .to_owned(),
            )
            .exec_without_returning(txn)
            .await?;
    }
    Ok(())
}

/// Adds events, exposure and per-unit level readings to a sample (its node-wide level aggregate
/// included).
fn fold_into(sample: &mut HealthSample, events: u64, exposure: f64, units: &BTreeMap<String, LevelAgg>) {
    let mut added = LevelAgg::EMPTY;
    for (unit, agg) in units {
        added.merge(agg);
        sample
            .units
            .entry(unit.clone())
            .and_modify(|a| a.merge(agg))
            .or_insert(*agg);
    }
    let mut total = LevelAgg {
        n: sample.readings,
        sum: sample.sum,
        min: sample.min.unwrap_or(0.0),
        max: sample.max.unwrap_or(0.0),
    };
    total.merge(&added);
    sample.events = sample.events.saturating_add(events);
    sample.exposure += exposure;
    sample.readings = total.n;
    sample.sum = total.sum;
    sample.min = (total.n > 0).then_some(total.min);
    sample.max = (total.n > 0).then_some(total.max);
}

/// Cursor rows one statement moves: 11 columns a row keep it at 5,500 bind parameters, under SQLite's
/// 32,766 and PostgreSQL's 65,535.
const CURSOR_ROWS_PER_STATEMENT: usize = 500;

/// Moves the cursors of a round's polls, inside the caller's transaction: whether each poll's cursor
/// moved, in order. A node's first poll inserts its row; a later poll advances the row only from the
/// poll count it read. `false` when another writer got there first (the poll must then add nothing).
///
/// One upsert per [`CURSOR_ROWS_PER_STATEMENT`] polls rather than one statement per node: each
/// statement is a round trip to the database (on SQLite, to its worker thread), and a round's
/// thousands of them were a third of the statements of a node-update (BENCHMARKS.md, issue 23).
/// The upsert's `WHERE stored.polls = new.polls - 1` is both rules at once: a first poll carries
/// poll 1, which no stored row (polls >= 1) precedes, so it inserts or does nothing; a later poll
/// moves only a row still at the count it read. The rows that moved come back by `RETURNING`. A
/// conflict never aborts the statement, so one stale poll does not fail the round on PostgreSQL.
async fn move_cursors<C: sea_orm::ConnectionTrait>(
    txn: &C,
    now: DateTime<Utc>,
    polls: &[NodePoll],
) -> Result<Vec<bool>, DbError> {
    let mut moved = vec![false; polls.len()];
    let mut start = 0;
    while start < polls.len() {
        // A row may be upserted once per statement (PostgreSQL refuses a second touch), so a node
        // polled twice in one round starts the next statement; its second poll then finds the count
        // the first one moved, as one statement per poll did.
        let mut keys = BTreeSet::new();
        let mut end = start;
        while end < polls.len()
            && end - start < CURSOR_ROWS_PER_STATEMENT
            && keys.insert((polls[end].cursor.wave_id.0, polls[end].cursor.node_id.0))
        {
            end += 1;
        }
        let chunk = &polls[start..end];
        let rows = chunk.iter().map(|poll| {
            let c = &poll.cursor;
            health_cursors::ActiveModel {
                rollout_id: Set(c.rollout_id.0),
                wave_id: Set(c.wave_id.0),
                node_id: Set(c.node_id.0),
                cohort: Set(c.cohort.as_str().to_owned()),
                exposure_start: Set(c.exposure_start),
                accounted_until: Set(c.accounted_until),
                event_cursor: Set(c.event_cursor.clone()),
                gpus: Set(i32::try_from(c.gpus).unwrap_or(i32::MAX)),
                polls: Set(if poll.first { 1 } else { c.polls + 1 }),
                last_error: Set(c.last_error.clone()),
                updated_at: Set(now),
                ..Default::default()
            }
        });
        let mut upsert = health_cursors::Entity::insert_many(rows)
            .on_conflict(
                OnConflict::columns([health_cursors::Column::WaveId, health_cursors::Column::NodeId])
                    // The cohort and exposure start move too: a first-wave node watched as a control
                    // before its flash keeps its row when it is watched as an updated node.
                    .update_columns([
                        health_cursors::Column::Cohort,
                        health_cursors::Column::ExposureStart,
                        health_cursors::Column::AccountedUntil,
                        health_cursors::Column::EventCursor,
                        health_cursors::Column::Gpus,
                        health_cursors::Column::Polls,
                        health_cursors::Column::LastError,
                        health_cursors::Column::UpdatedAt,
                    ])
                    .action_and_where(Expr::cust("health_cursors.polls = excluded.polls - 1"))
                    .to_owned(),
            )
            .into_query();
        upsert.returning(
            sea_orm::sea_query::Query::returning()
                .columns([health_cursors::Column::WaveId, health_cursors::Column::NodeId]),
        );
        let mut written = BTreeSet::new();
        for row in txn.query_all(&upsert).await? {
            written.insert((row.try_get::<i64>("", "wave_id")?, row.try_get::<i64>("", "node_id")?));
        }
        for (slot, poll) in moved[start..end].iter_mut().zip(chunk) {
            *slot = written.contains(&(poll.cursor.wave_id.0, poll.cursor.node_id.0));
        }
        start = end;
    }
    Ok(moved)
}

/// The audit log's details of a `health.look` entry: written and read
/// through this one type so no reader digs the outcome out by key.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LookAuditDetails {
    pub rollout: RolloutId,
    pub gate: String,
    pub look: u32,
    pub planned: u32,
    pub outcome: Outcome,
    /// The detector's verdict as stored with the look.
    pub verdict: serde_json::Value,
}

impl LookAuditDetails {
    /// The details of a `health.look` audit entry; `None` for any other
    /// shape (entries of other actions).
    pub fn from_audit(details: &serde_json::Value) -> Option<Self> {
        Self::deserialize(details).ok()
    }
}

impl Db {
    /// Collection state of every node watched for a wave.
    pub async fn health_cursors(&self, wave: WaveId) -> Result<Vec<HealthCursor>, DbError> {
        health_cursors::Entity::find()
            .filter(health_cursors::Column::WaveId.eq(wave.0))
            .order_by_asc(health_cursors::Column::NodeId)
            .all(&self.reader)
            .await?
            .into_iter()
            .map(to_cursor)
            .collect()
    }

    /// The watched nodes of a wave whose latest poll failed, filtered in
    /// SQL: the rollout page shows them beside its verdict tables on every
    /// refresh, and a wave may watch thousands of nodes that are fine.
    pub async fn health_poll_errors(&self, wave: WaveId) -> Result<Vec<HealthCursor>, DbError> {
        health_cursors::Entity::find()
            .filter(health_cursors::Column::WaveId.eq(wave.0))
            .filter(health_cursors::Column::LastError.is_not_null())
            .order_by_asc(health_cursors::Column::NodeId)
            .all(&self.reader)
            .await?
            .into_iter()
            .map(to_cursor)
            .collect()
    }

    /// Records one poll: the new cursor and the window deltas, in one
    /// transaction. [`DbError::Stale`] when another writer recorded a poll
    /// of the node first (nothing is written then).
    pub async fn record_health_poll(&self, poll: &NodePoll) -> Result<(), DbError> {
        if self.record_health_polls(std::slice::from_ref(poll)).await? == [true] {
            return Ok(());
        }
        let c = &poll.cursor;
        Err(DbError::Stale {
            what: "health cursor",
            key: format!("wave {} node {}", c.wave_id, c.node_id),
            expected: format!("at poll {}", c.polls),
        })
    }

    /// Records the polls of many nodes (a collection round) in one transaction: each poll's cursor
    /// moves under the same condition as in [`Db::record_health_poll`], and only a poll whose cursor
    /// moved adds its deltas. Returns, in order, whether each poll was recorded (`false`: another
    /// writer recorded a poll of that node first; nothing of it is written).
    ///
    /// One transaction per round rather than per node: a round of thousands of nodes was thousands
    /// of commits on the one SQLite writer, each waited for by the other pollers and by the engine.
    pub async fn record_health_polls(&self, polls: &[NodePoll]) -> Result<Vec<bool>, DbError> {
        let now = self.clock.now();
        let txn = self.writer.begin().await?;
        let recorded = move_cursors(&txn, now, polls).await?;
        let items: Vec<NodeDeltas<'_>> = polls
            .iter()
            .zip(&recorded)
            .filter(|(_, moved)| **moved)
            .map(|(poll, _)| NodeDeltas {
                rollout: poll.cursor.rollout_id,
                wave: poll.cursor.wave_id,
                node: poll.cursor.node_id,
                cohort: poll.cursor.cohort,
                deltas: &poll.deltas,
            })
            .collect();
        fold_deltas(&txn, now, &items).await?;
        txn.commit().await?;
        Ok(recorded)
    }

    /// Notes a failed poll on an existing cursor without moving it (the next
    /// poll reads the same events again).
    pub async fn record_health_poll_error(&self, wave: WaveId, node: NodeId, error: &str) -> Result<(), DbError> {
        health_cursors::Entity::update_many()
            .col_expr(health_cursors::Column::LastError, Expr::value(Some(error.to_owned())))
            .col_expr(health_cursors::Column::UpdatedAt, Expr::value(self.clock.now()))
            .filter(health_cursors::Column::WaveId.eq(wave.0))
            .filter(health_cursors::Column::NodeId.eq(node.0))
            .exec(&self.writer)
            .await?;
        Ok(())
    }

    /// Records samples that come without a cursor (a Prometheus query's
    /// values at one instant), in one transaction.
    pub async fn record_health_samples(
        &self,
        rollout: RolloutId,
        wave: WaveId,
        node: NodeId,
        cohort: Cohort,
        deltas: &[WindowDelta],
    ) -> Result<(), DbError> {
        let txn = self.writer.begin().await?;
        let item = NodeDeltas {
            rollout,
            wave,
            node,
            cohort,
            deltas,
        };
        fold_deltas(&txn, self.clock.now(), std::slice::from_ref(&item)).await?;
        txn.commit().await?;
        Ok(())
    }

    /// Stored samples, ordered by wave, node, metric and window.
    pub async fn health_samples(&self, scope: SampleScope) -> Result<Vec<HealthSample>, DbError> {
        let mut samples = Vec::new();
        self.each_health_sample(scope, None, |s| samples.push(s)).await?;
        Ok(samples)
    }

    /// Hands a scope's stored samples (of one metric, or of all) to `visit` one at a time, in
    /// [`Db::health_samples`]' order, so a reader that keeps a few numbers of each never holds the
    /// rows themselves: a fleet look over 100,000 nodes would otherwise hold every node's per-unit
    /// readings of every metric at once.
    pub async fn each_health_sample(
        &self,
        scope: SampleScope,
        metric: Option<&str>,
        mut visit: impl FnMut(HealthSample),
    ) -> Result<(), DbError> {
        let mut query = match scope {
            SampleScope::Wave(wave) => health_samples::Entity::find().filter(health_samples::Column::WaveId.eq(wave.0)),
            SampleScope::Rollout(rollout) => {
                health_samples::Entity::find().filter(health_samples::Column::RolloutId.eq(rollout.0))
            }
        };
        if let Some(metric) = metric {
            query = query.filter(health_samples::Column::Metric.eq(metric));
        }
        // Streamed and converted row by row: collecting the rows first held every row's raw values,
        // its model and its sample at once, three copies of a rollout's whole history (at 2,000
        // nodes a look's read peaked at ~200 MB of raw rows alone).
        let rows = query
            .order_by_asc(health_samples::Column::WaveId)
            .order_by_asc(health_samples::Column::NodeId)
            .order_by_asc(health_samples::Column::Metric)
            .order_by_asc(health_samples::Column::WindowStart)
            .stream(&self.reader)
            .await?;
        let mut rows = std::pin::pin!(rows);
        while let Some(row) = rows.try_next().await? {
            visit(to_sample(row)?);
        }
        Ok(())
    }

    /// Stored samples with the days retention has reduced: what every
    /// reader of a finished rollout's history (its page's charts, its
    /// evidence package) reads, since its old hourly windows may be gone.
    pub async fn health_history(&self, scope: SampleScope) -> Result<HealthHistory, DbError> {
        Ok(HealthHistory {
            hourly: self.health_samples(scope).await?,
            daily: self.health_daily(scope).await?,
        })
    }

    /// Records one gate's evaluation at one look, with its audit entry, in
    /// one transaction. [`DbError::AlreadyExists`] when that look of that
    /// gate was already evaluated: each look is evaluated once, so a
    /// restarted controller never spends a boundary twice.
    pub async fn record_health_look(&self, look: &NewHealthLook, actor: &str) -> Result<HealthLook, DbError> {
        let now = self.clock.now();
        let txn = self.writer.begin().await?;
        let inserted = health_looks::ActiveModel {
            rollout_id: Set(look.rollout_id.0),
            wave_id: Set(look.wave_id.0),
            gate: Set(look.gate.clone()),
            look_number: Set(i32::try_from(look.look_number).unwrap_or(i32::MAX)),
            planned_looks: Set(i32::try_from(look.planned_looks).unwrap_or(i32::MAX)),
            outcome: Set(look.outcome.as_str().to_owned()),
            verdict: Set(look.verdict.clone()),
            evaluated_at: Set(now),
            ..Default::default()
        }
        .insert(&txn)
        .await;
        let row = match inserted {
            Ok(row) => row,
            Err(err) if is_unique_violation(&err) => {
                return Err(DbError::AlreadyExists {
                    what: "health look",
                    key: format!("wave {} gate {} look {}", look.wave_id, look.gate, look.look_number),
                });
            }
            Err(err) => return Err(err.into()),
        };
        audit::append(
            &txn,
            now,
            actor,
            "health.look",
            "wave",
            &look.wave_id.to_string(),
            serde_json::to_value(LookAuditDetails {
                rollout: look.rollout_id,
                gate: look.gate.clone(),
                look: look.look_number,
                planned: look.planned_looks,
                outcome: look.outcome,
                verdict: look.verdict.clone(),
            })
            .map_err(|e| DbError::corrupt("look audit details", e))?,
        )
        .await?;
        txn.commit().await?;
        to_look(row)
    }

    /// Evaluated looks, oldest first: of one wave, or of every wave of a rollout.
    pub async fn health_looks(&self, scope: SampleScope) -> Result<Vec<HealthLook>, DbError> {
        let query = match scope {
            SampleScope::Wave(wave) => health_looks::Entity::find().filter(health_looks::Column::WaveId.eq(wave.0)),
            SampleScope::Rollout(rollout) => {
                health_looks::Entity::find().filter(health_looks::Column::RolloutId.eq(rollout.0))
            }
        };
        query
            .order_by_asc(health_looks::Column::Id)
            .all(&self.reader)
            .await?
            .into_iter()
            .map(to_look)
            .collect()
    }
}
