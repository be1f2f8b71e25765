use orchestrator_types::{ComponentKind, FirmwareVersion, QualificationState, ReleaseId, RolloutId, TransitionRequest};
use sea_orm::sea_query::Expr;
use sea_orm::{
    ActiveModelTrait, ColumnTrait, DatabaseTransaction, EntityTrait, QueryFilter, QueryOrder, Set, TransactionTrait,
    UpdateMany,
};
use serde_json::json;

use crate::audit;
use crate::entity::{qualification_results, releases};
use crate::error::is_unique_violation;
use crate::model::{GateResult, NewGateResult, NewRelease, Release, ReleaseRollback};
use crate::{Db, DbError};

/// The release's qualification state as `txn` sees it, the precondition of every transition.
async fn qualification_in(txn: &DatabaseTransaction, id: ReleaseId) -> Result<QualificationState, DbError> {
    let row = releases::Entity::find_by_id(id.0)
        .one(txn)
        .await?
        .ok_or_else(|| DbError::NotFound {
            what: "release",
            key: id.to_string(),
        })?;
    Ok(to_release(row)?.qualification_state)
}

/// Applies `update` only while the release is still in `read` state: two people (or a person and
/// the engine) acting on the same release cannot both win.
async fn set_qualification_if(
    txn: &DatabaseTransaction,
    id: ReleaseId,
    read: QualificationState,
    update: UpdateMany<releases::Entity>,
) -> Result<(), DbError> {
    let updated = update
        .filter(releases::Column::Id.eq(id.0))
        .filter(releases::Column::QualificationState.eq(read.as_str()))
        .exec(txn)
        .await?;
    if updated.rows_affected != 1 {
        return Err(DbError::Invalid {
            field: "qualification_state".into(),
            reason: "the release changed state concurrently; reload and retry".into(),
        });
    }
    Ok(())
}

fn to_release(row: releases::Model) -> Result<Release, DbError> {
    Ok(Release {
        id: ReleaseId(row.id),
        component_kind: row
            .component_kind
            .parse()
            .map_err(|e| DbError::corrupt("release component kind", e))?,
        version: row
            .version
            .parse()
            .map_err(|e| DbError::corrupt("release version", e))?,
        platforms: serde_json::from_value(row.platforms).map_err(|e| DbError::corrupt("release platforms", e))?,
        qualification_state: row
            .qualification_state
            .parse()
            .map_err(|e| DbError::corrupt("release qualification state", e))?,
        size_bytes: u64::try_from(row.size_bytes).map_err(|e| DbError::corrupt("release size", e))?,
        image_uri: row.image_uri,
        sha256: row.sha256,
        release_notes: row.release_notes,
        state_reason: row.state_reason,
        downgrade_forbidden: row.downgrade_forbidden,
        rollback_floor: row
            .rollback_floor
            .map(|floor| floor.parse())
            .transpose()
            .map_err(|e| DbError::corrupt("release rollback floor", e))?,
        created_by: row.created_by,
        created_at: row.created_at,
        updated_at: row.updated_at,
        fleet_proven_by: row.fleet_proven_by.map(RolloutId),
    })
}

fn to_gate_result(row: qualification_results::Model) -> GateResult {
    GateResult {
        id: row.id,
        release_id: ReleaseId(row.release_id),
        gate: row.gate,
        passed: row.passed,
        evidence: row.evidence,
        recorded_by: row.recorded_by,
        recorded_at: row.recorded_at,
    }
}

fn invalid(errors: Vec<crate::model::FieldError>) -> Result<(), DbError> {
    match errors.into_iter().next() {
        Some(error) => Err(DbError::Invalid {
            field: error.field,
            reason: error.message,
        }),
        None => Ok(()),
    }
}

impl Db {
    /// Registers a release in state `registered`, with nothing known to
    /// forbid rolling it back. A (kind, version) pair is registered once.
    pub async fn add_release(&self, new: &NewRelease, actor: &str) -> Result<Release, DbError> {
        self.add_release_with(new, &ReleaseRollback::default(), actor).await
    }

    /// [`Db::add_release`] with the release's rollback metadata, which the
    /// planner turns into the rollout's rollback assessment.
    pub async fn add_release_with(
        &self,
        new: &NewRelease,
        rollback: &ReleaseRollback,
        actor: &str,
    ) -> Result<Release, DbError> {
        invalid(new.validate())?;
        invalid(rollback.validate(&new.version))?;
        let downgrade_forbidden = rollback
            .downgrade_forbidden
            .as_deref()
            .map(str::trim)
            .map(str::to_owned);
        let rollback_floor = rollback.rollback_floor.as_ref().map(|v| v.as_str().to_owned());
        let now = self.clock.now();
        let txn = self.writer.begin().await?;
        let inserted = releases::ActiveModel {
            component_kind: Set(new.component_kind.as_str().to_owned()),
            version: Set(new.version.as_str().to_owned()),
            image_uri: Set(new.image_uri.clone()),
            sha256: Set(new.sha256.to_ascii_lowercase()),
            size_bytes: Set(i64::try_from(new.size_bytes).unwrap_or(i64::MAX)),
            platforms: Set(json!(new.platforms)),
            release_notes: Set(new.release_notes.clone()),
            qualification_state: Set(QualificationState::Registered.as_str().to_owned()),
            state_reason: Set(None),
            downgrade_forbidden: Set(downgrade_forbidden.clone()),
            rollback_floor: Set(rollback_floor.clone()),
            created_by: Set(actor.to_owned()),
            created_at: Set(now),
            updated_at: Set(now),
            ..Default::default()
        }
        .insert(&txn)
        .await;
        let row = match inserted {
            Ok(row) => row,
            Err(err) if is_unique_violation(&err) => {
                return Err(DbError::AlreadyExists {
                    what: "release",
                    key: format!("{}@{}", new.component_kind, new.version),
                });
            }
            Err(err) => return Err(err.into()),
        };
        audit::append(
            &txn,
            now,
            actor,
            "release.add",
            "release",
            &row.id.to_string(),
            json!({ "component_kind": new.component_kind, "version": new.version, "sha256": row.sha256,
                    "image_uri": new.image_uri, "platforms": new.platforms,
                    "downgrade_forbidden": downgrade_forbidden, "rollback_floor": rollback_floor }),
        )
        .await?;
        txn.commit().await?;
        to_release(row)
    }

    /// Every release, newest first.
    pub async fn list_releases(&self) -> Result<Vec<Release>, DbError> {
        let rows = releases::Entity::find()
            .order_by_desc(releases::Column::Id)
            .all(&self.reader)
            .await?;
        rows.into_iter().map(to_release).collect()
    }

    /// One release by id.
    pub async fn release(&self, id: ReleaseId) -> Result<Release, DbError> {
        let row = releases::Entity::find_by_id(id.0)
            .one(&self.reader)
            .await?
            .ok_or_else(|| DbError::NotFound {
                what: "release",
                key: id.to_string(),
            })?;
        to_release(row)
    }

    /// One release by component kind and exact version text.
    pub async fn release_by_version(&self, kind: ComponentKind, version: &FirmwareVersion) -> Result<Release, DbError> {
        let row = releases::Entity::find()
            .filter(releases::Column::ComponentKind.eq(kind.as_str()))
            .filter(releases::Column::Version.eq(version.as_str()))
            .one(&self.reader)
            .await?
            .ok_or_else(|| DbError::NotFound {
                what: "release",
                key: format!("{kind}@{version}"),
            })?;
        to_release(row)
    }

    /// Moves a release through the qualification state machine, audited.
    /// The update is conditional on the state read, so two concurrent
    /// transitions cannot both succeed from the same state.
    pub async fn transition_release(
        &self,
        id: ReleaseId,
        request: &TransitionRequest,
        actor: &str,
    ) -> Result<Release, DbError> {
        let now = self.clock.now();
        let txn = self.writer.begin().await?;
        let current = qualification_in(&txn, id).await?;
        let reason = request.reason.as_deref().map(str::trim).filter(|r| !r.is_empty());
        let next = current.transition(request.to, reason)?;
        set_qualification_if(
            &txn,
            id,
            current,
            releases::Entity::update_many()
                .col_expr(releases::Column::QualificationState, Expr::value(next.as_str()))
                .col_expr(releases::Column::StateReason, Expr::value(reason.map(str::to_owned)))
                .col_expr(releases::Column::UpdatedAt, Expr::value(now)),
        )
        .await?;
        let action = match (current, next) {
            (_, QualificationState::Blocked) => "release.block",
            (QualificationState::Blocked, _) => "release.unblock",
            _ => "release.transition",
        };
        audit::append(
            &txn,
            now,
            actor,
            action,
            "release",
            &id.to_string(),
            json!({ "from": current, "to": next, "reason": reason }),
        )
        .await?;
        txn.commit().await?;
        self.release(id).await
    }

    /// The engine's one way to `fleet-proven`: `rollout`'s soak against its holdback passed
    /// (`QualificationState::prove_in_fleet`). Conditional on the state read and audited; a release
    /// already fleet-proven or the default is left as it is and `Ok(false)` returned, so a pass
    /// replayed after a crash changes nothing. People cannot ask for this state
    /// ([`Db::transition_release`] refuses it).
    pub async fn mark_fleet_proven(&self, id: ReleaseId, rollout: RolloutId, actor: &str) -> Result<bool, DbError> {
        let now = self.clock.now();
        let txn = self.writer.begin().await?;
        let current = qualification_in(&txn, id).await?;
        let Some(next) = current.prove_in_fleet()? else {
            return Ok(false);
        };
        let reason = format!("rollout {rollout}: the soak against the holdback passed");
        set_qualification_if(
            &txn,
            id,
            current,
            releases::Entity::update_many()
                .col_expr(releases::Column::QualificationState, Expr::value(next.as_str()))
                .col_expr(releases::Column::StateReason, Expr::value(Some(reason.clone())))
                .col_expr(releases::Column::FleetProvenBy, Expr::value(Some(rollout.0)))
                .col_expr(releases::Column::UpdatedAt, Expr::value(now)),
        )
        .await?;
        audit::append(
            &txn,
            now,
            actor,
            "release.fleet_proven",
            "release",
            &id.to_string(),
            json!({ "from": current, "to": next, "rollout": rollout, "reason": reason }),
        )
        .await?;
        txn.commit().await?;
        Ok(true)
    }

    /// Records one qualification gate outcome for a release, audited.
    /// Results are appended, never replaced: a re-run gate adds a row and the
    /// latest one counts.
    pub async fn record_gate_result(
        &self,
        id: ReleaseId,
        result: &NewGateResult,
        actor: &str,
    ) -> Result<GateResult, DbError> {
        invalid(result.validate())?;
        let now = self.clock.now();
        let txn = self.writer.begin().await?;
        if releases::Entity::find_by_id(id.0).one(&txn).await?.is_none() {
            return Err(DbError::NotFound {
                what: "release",
                key: id.to_string(),
            });
        }
        let row = qualification_results::ActiveModel {
            release_id: Set(id.0),
            gate: Set(result.gate.trim().to_owned()),
            passed: Set(result.passed),
            evidence: Set(result.evidence.clone()),
            recorded_by: Set(actor.to_owned()),
            recorded_at: Set(now),
            ..Default::default()
        }
        .insert(&txn)
        .await?;
        audit::append(
            &txn,
            now,
            actor,
            "release.gate_result",
            "release",
            &id.to_string(),
            json!({ "gate": row.gate, "passed": row.passed, "evidence": row.evidence }),
        )
        .await?;
        txn.commit().await?;
        Ok(to_gate_result(row))
    }

    /// Every gate result of a release, oldest first.
    pub async fn gate_results(&self, id: ReleaseId) -> Result<Vec<GateResult>, DbError> {
        let rows = qualification_results::Entity::find()
            .filter(qualification_results::Column::ReleaseId.eq(id.0))
            .order_by_asc(qualification_results::Column::Id)
            .all(&self.reader)
            .await?;
        Ok(rows.into_iter().map(to_gate_result).collect())
    }
}
