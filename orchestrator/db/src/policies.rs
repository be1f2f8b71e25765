//! Rollout policies synced from git.
//!
//! Every version that was ever in force is kept, addressed by the commit it
//! was read at and its blob id, so a rollout pinned to `(policy_commit,
//! policy_blob)` loads exactly the policy it started with, however far git
//! has moved on since. Which version is in force per name is a separate,
//! small table that each sync rewrites.
//!
//! This module stores decisions, it does not make them: which version wins
//! (and that an invalid newer file keeps the last good one in force) is
//! decided by `orchestrator-policy-git`'s pure `plan_sync`, and the caller
//! hands the outcome to [`Db::record_policy_sync`].

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Utc};
use sea_orm::sea_query::OnConflict;
use sea_orm::{ColumnTrait, ConnectionTrait, EntityTrait, QueryFilter, QueryOrder, Set, TransactionTrait};
use serde::{Deserialize, Serialize};
use serde_json::json;

#[cfg(feature = "openapi")]
use utoipa::ToSchema;

use crate::audit;
use crate::entity::{policy_in_force, policy_sync_state, policy_versions};
use crate::{Db, DbError};

/// Most diagnostic lines kept per rejected file in the audit log and in
/// `last_error`; a file with more is broken beyond what a reader scrolls
/// through, and the bound keeps a hostile repository from bloating the log.
pub const MAX_STORED_DIAGNOSTICS: usize = 100;

/// The sync state is one row: there is one policy source per controller.
const SYNC_STATE_ID: i32 = 1;

/// One version of one policy file, as read from git.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct PolicyVersion {
    /// The policy's `name`.
    pub name: String,
    /// Path of the file in the repository.
    pub path: String,
    /// Commit the version was first seen in force at.
    pub commit_id: String,
    /// Git blob id of the file: with the commit, what a rollout pins.
    pub blob_id: String,
    /// The file's text, exactly as committed.
    pub content: String,
    /// When this version was first stored.
    pub synced_at: DateTime<Utc>,
}

/// A newer file that was refused while an older version stayed in force.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct PolicySyncError {
    /// The commit the refused file was read at.
    pub commit_id: String,
    /// Path of the refused file.
    pub path: String,
    /// Blob id of the refused file.
    pub blob_id: String,
    /// `path:line:col: message` lines (at most [`MAX_STORED_DIAGNOSTICS`]).
    pub diagnostics: Vec<String>,
}

/// The version of a policy that new rollouts use.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct PolicyInForce {
    /// The version in force.
    pub version: PolicyVersion,
    /// The last commit synced while this version was in force.
    pub last_sync_commit: String,
    /// Set when the file at a newer commit was refused (and this version
    /// stayed in force); cleared once a sync accepts the file again.
    pub last_error: Option<PolicySyncError>,
    /// When this row was last written by a sync.
    pub updated_at: DateTime<Utc>,
}

/// A policy in force after a sync, as handed to [`Db::record_policy_sync`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SyncedPolicy {
    /// The policy's `name`.
    pub name: String,
    /// Path of the file in the repository.
    pub path: String,
    /// Commit it was read at (for a kept version, the older commit).
    pub commit_id: String,
    /// Blob id of the file.
    pub blob_id: String,
    /// The file's text.
    pub content: String,
}

/// A file refused by a sync.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RejectedPolicyFile {
    /// Path in the repository.
    pub path: String,
    /// Blob id of the refused file.
    pub blob_id: String,
    /// `path:line:col: message` lines.
    pub diagnostics: Vec<String>,
    /// Name of the policy whose last good version stays in force instead.
    pub kept: Option<String>,
}

/// The outcome of one sync, to store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicySync {
    /// Where the policies came from (repository and ref), for the audit log.
    /// Must not contain credentials.
    pub source: String,
    /// The commit the ref resolved to.
    pub commit_id: String,
    /// Every policy in force after the sync; names are unique.
    pub in_force: Vec<SyncedPolicy>,
    /// Names whose version in force changed (new or updated).
    pub changed: Vec<String>,
    /// Names no longer in force because their file is gone.
    pub removed: Vec<String>,
    /// Files refused at this commit.
    pub rejected: Vec<RejectedPolicyFile>,
    /// Warnings on accepted files.
    pub warnings: Vec<String>,
}

/// Where the last sync got to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct PolicySyncState {
    /// Repository and ref of the last sync.
    pub source: String,
    /// The commit it read.
    pub commit_id: String,
    /// When it ran.
    pub synced_at: DateTime<Utc>,
    /// When a sync last changed something (or read a new commit).
    pub changed_at: DateTime<Utc>,
}

/// What [`Db::record_policy_sync`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordedSync {
    /// False when the sync read the commit already recorded and changed
    /// nothing: periodic syncs of an idle repository do not fill the audit
    /// log.
    pub audited: bool,
}

fn to_version(row: policy_versions::Model) -> PolicyVersion {
    PolicyVersion {
        name: row.name,
        path: row.path,
        commit_id: row.commit_id,
        blob_id: row.blob_id,
        content: row.content,
        synced_at: row.synced_at,
    }
}

fn to_in_force(row: policy_in_force::Model, version: policy_versions::Model) -> Result<PolicyInForce, DbError> {
    let last_error = row
        .last_error
        .map(serde_json::from_value)
        .transpose()
        .map_err(|e| DbError::corrupt("policy last error", e))?;
    Ok(PolicyInForce {
        version: to_version(version),
        last_sync_commit: row.last_sync_commit,
        last_error,
        updated_at: row.updated_at,
    })
}

fn invalid(field: &str, reason: impl Into<String>) -> DbError {
    DbError::Invalid {
        field: field.to_owned(),
        reason: reason.into(),
    }
}

fn check_object_id(field: &str, id: &str) -> Result<(), DbError> {
    // SHA-1 (40) or SHA-256 (64) object ids, lowercase hex as git prints them.
    let hex = id.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    if (id.len() == 40 || id.len() == 64) && hex {
        Ok(())
    } else {
        Err(invalid(field, format!("{id:?} is not a git object id")))
    }
}

fn bounded(diagnostics: &[String]) -> Vec<String> {
    let mut kept: Vec<String> = diagnostics.iter().take(MAX_STORED_DIAGNOSTICS).cloned().collect();
    if diagnostics.len() > MAX_STORED_DIAGNOSTICS {
        kept.push(format!("... and {} more", diagnostics.len() - MAX_STORED_DIAGNOSTICS));
    }
    kept
}

impl PolicySync {
    /// Refuses a record that cannot have come from one sync: duplicate
    /// names, changed names that are not in force, malformed ids.
    fn validate(&self) -> Result<(), DbError> {
        check_object_id("commit_id", &self.commit_id)?;
        let mut names = BTreeSet::new();
        for policy in &self.in_force {
            if policy.name.trim().is_empty() {
                return Err(invalid("in_force.name", "must not be empty"));
            }
            if !names.insert(policy.name.as_str()) {
                return Err(invalid("in_force.name", format!("{:?} appears twice", policy.name)));
            }
            check_object_id("in_force.commit_id", &policy.commit_id)?;
            check_object_id("in_force.blob_id", &policy.blob_id)?;
        }
        if let Some(name) = self.changed.iter().find(|n| !names.contains(n.as_str())) {
            return Err(invalid("changed", format!("{name:?} is not in force")));
        }
        if let Some(name) = self.removed.iter().find(|n| names.contains(n.as_str())) {
            return Err(invalid("removed", format!("{name:?} is still in force")));
        }
        Ok(())
    }
}

impl Db {
    /// Stores the outcome of a sync in one transaction: new versions are
    /// added (existing ones are never rewritten), the in-force table becomes
    /// exactly `sync.in_force`, each kept policy records why its newer file
    /// was refused, and a `policy.sync` audit entry lists what changed and
    /// every rejected file with its diagnostics.
    ///
    /// Two syncs racing (the periodic one and a CLI one) both succeed; the
    /// later commit of the transaction wins, and both are audited.
    pub async fn record_policy_sync(&self, sync: &PolicySync, actor: &str) -> Result<RecordedSync, DbError> {
        sync.validate()?;
        let now = self.clock.now();
        let txn = self.writer.begin().await?;

        let mut version_ids = BTreeMap::new();
        for policy in &sync.in_force {
            let id = insert_version(&txn, policy, now).await?;
            version_ids.insert(policy.name.as_str(), id);
        }

        let errors: BTreeMap<&str, &RejectedPolicyFile> = sync
            .rejected
            .iter()
            .filter_map(|r| r.kept.as_deref().map(|name| (name, r)))
            .collect();
        for (name, version_id) in &version_ids {
            let last_error = errors.get(name).map(|r| {
                json!(PolicySyncError {
                    commit_id: sync.commit_id.clone(),
                    path: r.path.clone(),
                    blob_id: r.blob_id.clone(),
                    diagnostics: bounded(&r.diagnostics),
                })
            });
            policy_in_force::Entity::insert(policy_in_force::ActiveModel {
                name: Set((*name).to_owned()),
                version_id: Set(*version_id),
                last_sync_commit: Set(sync.commit_id.clone()),
                last_error: Set(last_error),
                updated_at: Set(now),
            })
            .on_conflict(
                OnConflict::column(policy_in_force::Column::Name)
                    .update_columns([
                        policy_in_force::Column::VersionId,
                        policy_in_force::Column::LastSyncCommit,
                        policy_in_force::Column::LastError,
                        policy_in_force::Column::UpdatedAt,
                    ])
                    .to_owned(),
            )
            .exec_without_returning(&txn)
            .await?;
        }
        // The in-force set is exactly what the sync decided: anything else
        // (removed files, or rows a racing sync left) goes.
        policy_in_force::Entity::delete_many()
            .filter(policy_in_force::Column::Name.is_not_in(version_ids.keys().copied()))
            .exec(&txn)
            .await?;

        let previous = policy_sync_state::Entity::find_by_id(SYNC_STATE_ID).one(&txn).await?;
        let idle = previous
            .as_ref()
            .is_some_and(|p| p.commit_id == sync.commit_id && p.source == sync.source)
            && sync.changed.is_empty()
            && sync.removed.is_empty();
        let changed_at = match (&previous, idle) {
            (Some(p), true) => p.changed_at,
            _ => now,
        };
        policy_sync_state::Entity::insert(policy_sync_state::ActiveModel {
            id: Set(SYNC_STATE_ID),
            source: Set(sync.source.clone()),
            commit_id: Set(sync.commit_id.clone()),
            synced_at: Set(now),
            changed_at: Set(changed_at),
        })
        .on_conflict(
            OnConflict::column(policy_sync_state::Column::Id)
                .update_columns([
                    policy_sync_state::Column::Source,
                    policy_sync_state::Column::CommitId,
                    policy_sync_state::Column::SyncedAt,
                    policy_sync_state::Column::ChangedAt,
                ])
                .to_owned(),
        )
        .exec_without_returning(&txn)
        .await?;

        if !idle {
            audit::append(
                &txn,
                now,
                actor,
                "policy.sync",
                "policy_source",
                &sync.source,
                audit_details(sync),
            )
            .await?;
        }
        txn.commit().await?;
        Ok(RecordedSync { audited: !idle })
    }

    /// The version of `name` that new rollouts use.
    pub async fn policy_in_force(&self, name: &str) -> Result<PolicyInForce, DbError> {
        let found = policy_in_force::Entity::find_by_id(name.to_owned())
            .one(&self.reader)
            .await?
            .ok_or_else(|| DbError::NotFound {
                what: "policy",
                key: name.to_owned(),
            })?;
        let version = policy_versions::Entity::find_by_id(found.version_id)
            .one(&self.reader)
            .await?
            .ok_or_else(|| DbError::corrupt("policy in force", format!("version {} is missing", found.version_id)))?;
        to_in_force(found, version)
    }

    /// Every policy in force, by name.
    pub async fn policies_in_force(&self) -> Result<Vec<PolicyInForce>, DbError> {
        let rows = policy_in_force::Entity::find()
            .order_by_asc(policy_in_force::Column::Name)
            .all(&self.reader)
            .await?;
        let ids: Vec<i64> = rows.iter().map(|r| r.version_id).collect();
        let mut versions: BTreeMap<i64, policy_versions::Model> = policy_versions::Entity::find()
            .filter(policy_versions::Column::Id.is_in(ids))
            .all(&self.reader)
            .await?
            .into_iter()
            .map(|v| (v.id, v))
            .collect();
        rows.into_iter()
            .map(|row| {
                let version = versions.remove(&row.version_id).ok_or_else(|| {
                    DbError::corrupt("policy in force", format!("version {} is missing", row.version_id))
                })?;
                to_in_force(row, version)
            })
            .collect()
    }

    /// The policy a rollout is pinned to, by the commit and blob it
    /// recorded; available for as long as the database is, whatever git
    /// does afterwards.
    pub async fn policy_version(&self, commit_id: &str, blob_id: &str) -> Result<PolicyVersion, DbError> {
        policy_versions::Entity::find()
            .filter(policy_versions::Column::CommitId.eq(commit_id))
            .filter(policy_versions::Column::BlobId.eq(blob_id))
            .order_by_asc(policy_versions::Column::Id)
            .one(&self.reader)
            .await?
            .map(to_version)
            .ok_or_else(|| DbError::NotFound {
                what: "policy version",
                key: format!("{commit_id}:{blob_id}"),
            })
    }

    /// Where the last sync got to; `None` before the first.
    pub async fn policy_sync_state(&self) -> Result<Option<PolicySyncState>, DbError> {
        Ok(policy_sync_state::Entity::find_by_id(SYNC_STATE_ID)
            .one(&self.reader)
            .await?
            .map(|row| PolicySyncState {
                source: row.source,
                commit_id: row.commit_id,
                synced_at: row.synced_at,
                changed_at: row.changed_at,
            }))
    }
}

/// Adds a version unless the same (commit, path) is stored already, and
/// returns its id. Stored versions are never rewritten: rollouts may be
/// pinned to them.
async fn insert_version<C: ConnectionTrait>(
    conn: &C,
    policy: &SyncedPolicy,
    now: DateTime<Utc>,
) -> Result<i64, DbError> {
    policy_versions::Entity::insert(policy_versions::ActiveModel {
        name: Set(policy.name.clone()),
        path: Set(policy.path.clone()),
        commit_id: Set(policy.commit_id.clone()),
        blob_id: Set(policy.blob_id.clone()),
        content: Set(policy.content.clone()),
        synced_at: Set(now),
        ..Default::default()
    })
    .on_conflict_do_nothing_on([policy_versions::Column::CommitId, policy_versions::Column::Path])
    .exec_without_returning(conn)
    .await?;
    let row = policy_versions::Entity::find()
        .filter(policy_versions::Column::CommitId.eq(policy.commit_id.as_str()))
        .filter(policy_versions::Column::Path.eq(policy.path.as_str()))
        .one(conn)
        .await?
        .ok_or_else(|| DbError::corrupt("policy version", "inserted row is missing"))?;
    if row.blob_id != policy.blob_id || row.name != policy.name {
        // A commit's path always holds the same blob; a mismatch means the
        // caller mixed up commits.
        return Err(invalid(
            "in_force",
            format!(
                "{} at commit {} is stored as blob {} ({:?}), not {} ({:?})",
                policy.path, policy.commit_id, row.blob_id, row.name, policy.blob_id, policy.name
            ),
        ));
    }
    Ok(row.id)
}

fn audit_details(sync: &PolicySync) -> serde_json::Value {
    let by_name: BTreeMap<&str, &SyncedPolicy> = sync.in_force.iter().map(|p| (p.name.as_str(), p)).collect();
    let changed: Vec<serde_json::Value> = sync
        .changed
        .iter()
        .filter_map(|name| by_name.get(name.as_str()))
        .map(|p| json!({ "name": p.name, "path": p.path, "commit": p.commit_id, "blob": p.blob_id }))
        .collect();
    let rejected: Vec<serde_json::Value> = sync
        .rejected
        .iter()
        .map(|r| {
            let kept = r
                .kept
                .as_deref()
                .and_then(|name| by_name.get(name))
                .map(|p| json!({ "name": p.name, "commit": p.commit_id, "blob": p.blob_id }));
            json!({ "path": r.path, "blob": r.blob_id, "diagnostics": bounded(&r.diagnostics), "kept": kept })
        })
        .collect();
    json!({
        "commit": sync.commit_id,
        "changed": changed,
        "removed": sync.removed,
        "rejected": rejected,
        "warnings": bounded(&sync.warnings),
        "in_force": sync.in_force.len(),
    })
}
