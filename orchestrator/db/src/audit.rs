use chrono::{DateTime, Utc};
use sea_orm::{ActiveModelTrait, ColumnTrait, ConnectionTrait, EntityTrait, QueryFilter, QueryOrder, QuerySelect, Set};
use serde::{Deserialize, Serialize};

use crate::entity::audit_log;
use crate::model::AuditEntry;
use crate::{Db, DbError};

/// Which audit entries to read; newest first.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditFilter {
    pub actor: Option<String>,
    pub action: Option<String>,
    pub subject_type: Option<String>,
    pub subject_id: Option<String>,
    pub since: Option<DateTime<Utc>>,
    pub limit: Option<u64>,
    /// Only entries with an id below this (for paging backwards).
    pub before_id: Option<i64>,
}

/// The audit entry marking a database whose timestamps come from an
/// accelerated clock. Its subject is indexed (`idx_audit_log_subject`), so
/// asking for it costs one index lookup however long the log; and the log
/// is append-only, so the mark outlives whoever wrote it, like the times.
const ACCELERATED_CLOCK_ACTION: &str = "database.accelerated_clock";
const CLOCK_SUBJECT_TYPE: &str = "database";
const CLOCK_SUBJECT_ID: &str = "clock";

/// Who put a database on an accelerated clock, and how fast it runs: a
/// process on the real clock that wrote there would record times that
/// disagree with every other timestamp in it.
#[derive(Debug, Clone, PartialEq)]
pub struct AcceleratedClockMark {
    /// Who runs it (e.g. `waveguard-demo`).
    pub by: String,
    /// Simulated seconds per real second.
    pub speedup: f64,
    /// When the mark was written, on the accelerated clock.
    pub at: DateTime<Utc>,
}

/// Most entries one read returns.
const MAX_AUDIT_PAGE: u64 = 1000;

/// Appends one entry; called inside the transaction of the change it
/// describes.
pub(crate) async fn append<C: ConnectionTrait>(
    conn: &C,
    at: DateTime<Utc>,
    actor: &str,
    action: &str,
    subject_type: &str,
    subject_id: &str,
    details: serde_json::Value,
) -> Result<(), DbError> {
    audit_log::ActiveModel {
        at: Set(at),
        actor: Set(actor.to_owned()),
        action: Set(action.to_owned()),
        subject_type: Set(subject_type.to_owned()),
        subject_id: Set(subject_id.to_owned()),
        details: Set(details),
        ..Default::default()
    }
    .insert(conn)
    .await?;
    Ok(())
}

impl Db {
    /// Reads the audit log, newest first.
    pub async fn audit_entries(&self, filter: &AuditFilter) -> Result<Vec<AuditEntry>, DbError> {
        let mut query = audit_log::Entity::find();
        if let Some(actor) = &filter.actor {
            query = query.filter(audit_log::Column::Actor.eq(actor.as_str()));
        }
        if let Some(action) = &filter.action {
            query = query.filter(audit_log::Column::Action.eq(action.as_str()));
        }
        if let Some(subject_type) = &filter.subject_type {
            query = query.filter(audit_log::Column::SubjectType.eq(subject_type.as_str()));
        }
        if let Some(subject_id) = &filter.subject_id {
            query = query.filter(audit_log::Column::SubjectId.eq(subject_id.as_str()));
        }
        if let Some(since) = filter.since {
            query = query.filter(audit_log::Column::At.gte(since));
        }
        if let Some(before_id) = filter.before_id {
            query = query.filter(audit_log::Column::Id.lt(before_id));
        }
        let limit = filter.limit.unwrap_or(100).min(MAX_AUDIT_PAGE);
        let rows = query
            .order_by_desc(audit_log::Column::Id)
            .limit(limit)
            .all(&self.reader)
            .await?;
        Ok(rows
            .into_iter()
            .map(|row| AuditEntry {
                id: row.id,
                at: row.at,
                actor: row.actor,
                action: row.action,
                subject_type: row.subject_type,
                subject_id: row.subject_id,
                details: row.details,
            })
            .collect())
    }

    /// Marks this database as running on an accelerated clock (see
    /// [`AcceleratedClockMark`]); `waveguard demo` does, and the CLI refuses
    /// to write where it finds the mark.
    pub async fn mark_accelerated_clock(&self, by: &str, speedup: f64) -> Result<(), DbError> {
        self.record_audit(
            by,
            ACCELERATED_CLOCK_ACTION,
            CLOCK_SUBJECT_TYPE,
            CLOCK_SUBJECT_ID,
            serde_json::json!({ "speedup": speedup }),
        )
        .await
    }

    /// The newest accelerated-clock mark, if this database has one.
    pub async fn accelerated_clock_mark(&self) -> Result<Option<AcceleratedClockMark>, DbError> {
        let entries = self
            .audit_entries(&AuditFilter {
                action: Some(ACCELERATED_CLOCK_ACTION.into()),
                subject_type: Some(CLOCK_SUBJECT_TYPE.into()),
                subject_id: Some(CLOCK_SUBJECT_ID.into()),
                limit: Some(1),
                ..Default::default()
            })
            .await?;
        Ok(entries.into_iter().next().map(|entry| AcceleratedClockMark {
            speedup: entry.details["speedup"].as_f64().unwrap_or(f64::NAN),
            by: entry.actor,
            at: entry.at,
        }))
    }

    /// Records an event that is not a database change of its own (a CLI
    /// action, a decision by the engine).
    pub async fn record_audit(
        &self,
        actor: &str,
        action: &str,
        subject_type: &str,
        subject_id: &str,
        details: serde_json::Value,
    ) -> Result<(), DbError> {
        append(
            &self.writer,
            self.clock.now(),
            actor,
            action,
            subject_type,
            subject_id,
            details,
        )
        .await
    }
}
