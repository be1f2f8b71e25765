//! The health-sample retention job: run by the executor-lease holder only,
//! beside the engine's passes. One pass:
//!
//! 1. stores the evidence package of every finished rollout that has none for
//!    the state it finished in (a few a pass): the package is what a vendor
//!    gets, and a rollout's samples may be reduced only once it is stored;
//! 2. reduces hourly windows nothing refers to any more into per-node daily
//!    aggregates (`orchestrator_db::retention`, which says what refers to a
//!    window), a bounded number of batches a pass, each batch one fenced
//!    transaction. A crash or a lost lease mid-pass loses nothing: the next
//!    pass (here or on the new holder) starts over from what is stored.

use std::future::Future;

use chrono::TimeDelta;
use orchestrator_db::execution::Fence;
use orchestrator_db::retention::{ReduceRequest, day_start};
use orchestrator_db::{Db, DbError};
use orchestrator_types::RolloutId;
use serde::Serialize;

use crate::runner::LeaseHolder;

/// The job's settings (`[retention]` in the controller's configuration).
#[derive(Debug, Clone, PartialEq)]
pub struct RetentionConfig {
    /// Hourly windows are kept this long (from the start of their day)
    /// before they may be reduced to daily aggregates.
    pub raw_days: u32,
    /// How far before an unfinished rollout's start its nodes' windows are
    /// kept as a pre-period baseline.
    pub pre_period: TimeDelta,
    /// Hourly windows folded per transaction: bounds how long one
    /// transaction holds the executor lease's row and the database's writer.
    pub batch: u64,
    /// Batches per pass: bounds a pass's work (`batch` × this windows).
    pub batches_per_pass: u32,
    /// Evidence packages built and stored per pass (each reads a rollout's samples).
    pub snapshots_per_pass: u64,
    /// Real time between passes.
    pub pass_interval: std::time::Duration,
}

/// Default of [`RetentionConfig::raw_days`]: two weeks of hourly windows, longer than any bake
/// a shipped policy plans, so a wave's samples stay hourly while anyone still reads its charts closely.
pub const DEFAULT_RAW_DAYS: u32 = 14;

impl Default for RetentionConfig {
    fn default() -> Self {
        Self {
            raw_days: DEFAULT_RAW_DAYS,
            pre_period: TimeDelta::days(7),
            batch: 2_000,
            batches_per_pass: 10,
            snapshots_per_pass: 4,
            pass_interval: std::time::Duration::from_secs(600),
        }
    }
}

/// What one pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct RetentionReport {
    /// Rollouts whose evidence package was stored.
    pub snapshots: Vec<RolloutId>,
    /// Reduction batches committed.
    pub batches: u32,
    /// Hourly windows reduced.
    pub windows: u64,
    /// Daily aggregates written.
    pub days: u64,
}

/// The job (see the module docs).
#[derive(Debug, Clone)]
pub struct RetentionJob {
    db: Db,
    config: RetentionConfig,
}

impl RetentionJob {
    /// A job over `db`.
    pub fn new(db: Db, config: RetentionConfig) -> Self {
        Self { db, config }
    }

    /// One pass as the holder of `fence` (module docs).
    pub async fn pass(&self, fence: &Fence) -> Result<RetentionReport, DbError> {
        let mut report = RetentionReport::default();
        for (rollout, state) in self
            .db
            .rollouts_without_evidence(self.config.snapshots_per_pass)
            .await?
        {
            self.db.snapshot_rollout_evidence(rollout, state).await?;
            report.snapshots.push(rollout);
        }
        let now = self.db.clock().now();
        let request = ReduceRequest {
            before: day_start(now - TimeDelta::days(i64::from(self.config.raw_days))),
            pre_period: self.config.pre_period,
            batch: self.config.batch,
        };
        for _ in 0..self.config.batches_per_pass {
            match self.db.reduce_health_samples(fence, &request).await {
                Ok(batch) if batch.windows == 0 => break,
                Ok(batch) => {
                    report.batches += 1;
                    report.windows += batch.windows;
                    report.days += batch.days;
                }
                // Another writer reduced the same windows first; the next pass goes on.
                Err(DbError::Stale { .. }) => break,
                Err(err) => return Err(err),
            }
        }
        Ok(report)
    }

    /// A pass when `lease` is held now; `None` (nothing read or written
    /// beyond the lease row) otherwise.
    pub async fn pass_if_holder(&self, lease: &LeaseHolder) -> Result<Option<RetentionReport>, DbError> {
        match lease.current().await? {
            Some(fence) => self.pass(&fence).await.map(Some),
            None => Ok(None),
        }
    }

    /// Runs a pass every `pass_interval` while `lease` is held, until `stop` resolves.
    pub async fn run(self, lease: LeaseHolder, stop: impl Future<Output = ()>) {
        tokio::pin!(stop);
        loop {
            match self.pass_if_holder(&lease).await {
                Ok(Some(report)) if report.windows > 0 || !report.snapshots.is_empty() => tracing::info!(
                    snapshots = report.snapshots.len(),
                    windows = report.windows,
                    days = report.days,
                    "health-sample retention pass"
                ),
                Ok(_) => {}
                Err(DbError::Fenced { .. }) => tracing::info!("retention pass stopped: the executor lease moved"),
                Err(err) => tracing::warn!(error = %orchestrator_types::error_chain(&err), "retention pass failed"),
            }
            tokio::select! {
                () = &mut stop => break,
                () = tokio::time::sleep(self.config.pass_interval) => {}
            }
        }
    }
}
