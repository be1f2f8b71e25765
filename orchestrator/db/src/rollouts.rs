use orchestrator_types::{ReleaseId, RolloutId};
use sea_orm::{ActiveModelTrait, EntityTrait, QueryOrder, Set, TransactionTrait};
use serde_json::json;

use crate::audit;
use crate::entity::{releases, rollouts};
use crate::model::{NewRollout, Rollout};
use crate::{Db, DbError};

/// The state a rollout is created in, before its plan is made.
pub const ROLLOUT_CREATED: &str = "created";

fn to_rollout(row: rollouts::Model) -> Rollout {
    Rollout {
        id: RolloutId(row.id),
        release_id: ReleaseId(row.release_id),
        policy_name: row.policy_name,
        policy_commit: row.policy_commit,
        policy_blob: row.policy_blob,
        state: row.state,
        state_reason: row.state_reason,
        seed: row.seed,
        created_by: row.created_by,
        created_at: row.created_at,
        updated_at: row.updated_at,
    }
}

impl Db {
    /// Creates a rollout pinned to the policy commit and blob it starts
    /// from; later policy changes never alter it.
    pub async fn create_rollout(&self, new: &NewRollout, actor: &str) -> Result<Rollout, DbError> {
        let now = self.clock.now();
        let txn = self.writer.begin().await?;
        if releases::Entity::find_by_id(new.release_id.0)
            .one(&txn)
            .await?
            .is_none()
        {
            return Err(DbError::NotFound {
                what: "release",
                key: new.release_id.to_string(),
            });
        }
        let row = rollouts::ActiveModel {
            release_id: Set(new.release_id.0),
            policy_name: Set(new.policy_name.clone()),
            policy_commit: Set(new.policy_commit.clone()),
            policy_blob: Set(new.policy_blob.clone()),
            state: Set(ROLLOUT_CREATED.to_owned()),
            state_reason: Set(None),
            seed: Set(new.seed),
            created_by: Set(actor.to_owned()),
            created_at: Set(now),
            updated_at: Set(now),
            ..Default::default()
        }
        .insert(&txn)
        .await?;
        audit::append(
            &txn,
            now,
            actor,
            "rollout.create",
            "rollout",
            &row.id.to_string(),
            json!({ "release_id": new.release_id, "policy": new.policy_name,
                    "policy_commit": new.policy_commit, "policy_blob": new.policy_blob, "seed": new.seed }),
        )
        .await?;
        txn.commit().await?;
        Ok(to_rollout(row))
    }

    /// One rollout by id.
    pub async fn rollout(&self, id: RolloutId) -> Result<Rollout, DbError> {
        rollouts::Entity::find_by_id(id.0)
            .one(&self.reader)
            .await?
            .map(to_rollout)
            .ok_or_else(|| DbError::NotFound {
                what: "rollout",
                key: id.to_string(),
            })
    }

    /// Every rollout, newest first.
    pub async fn list_rollouts(&self) -> Result<Vec<Rollout>, DbError> {
        let rows = rollouts::Entity::find()
            .order_by_desc(rollouts::Column::Id)
            .all(&self.reader)
            .await?;
        Ok(rows.into_iter().map(to_rollout).collect())
    }
}
