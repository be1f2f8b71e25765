//! The executor lease and the fence every engine write passes.

use chrono::{DateTime, Duration, Utc};
use sea_orm::sea_query::Expr;
use sea_orm::{ActiveModelTrait, ColumnTrait, ConnectionTrait, EntityTrait, QueryFilter, Set, TransactionTrait};
use serde_json::json;

use crate::audit;
use crate::entity::engine_leases;
use crate::error::is_unique_violation;
use crate::{Db, DbError};

/// The lease a controller must hold to execute, and the token that proves it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fence {
    /// Lease name (one per engine role, e.g. `executor`).
    pub lease: String,
    /// Who holds it (process identity, for humans).
    pub holder: String,
    /// Increases by one on every takeover.
    pub token: i64,
    /// When the lease expires unless renewed, per the clock of the holder.
    pub expires_at: DateTime<Utc>,
}

/// Checks, inside the caller's transaction, that `fence` still holds its
/// lease, and locks the lease row until the transaction ends so a takeover
/// waits for this write (PostgreSQL row lock; SQLite's single writer).
pub(crate) async fn check_fence<C: ConnectionTrait>(conn: &C, fence: &Fence) -> Result<(), DbError> {
    let result = engine_leases::Entity::update_many()
        .col_expr(engine_leases::Column::Token, Expr::col(engine_leases::Column::Token))
        .filter(engine_leases::Column::Name.eq(fence.lease.as_str()))
        .filter(engine_leases::Column::Holder.eq(fence.holder.as_str()))
        .filter(engine_leases::Column::Token.eq(fence.token))
        .exec(conn)
        .await?;
    if result.rows_affected == 1 {
        Ok(())
    } else {
        Err(DbError::Fenced {
            lease: fence.lease.clone(),
            token: fence.token,
        })
    }
}

impl Db {
    /// Takes the lease when it is free or expired (a new, higher token), or
    /// renews it when `holder` already has it (same token). `None` when
    /// someone else holds an unexpired lease.
    pub async fn acquire_lease(&self, lease: &str, holder: &str, ttl: Duration) -> Result<Option<Fence>, DbError> {
        let now = self.clock.now();
        let expires_at = now + ttl;
        let txn = self.writer.begin().await?;
        let current = engine_leases::Entity::find_by_id(lease.to_owned()).one(&txn).await?;
        let fence = match current {
            None => {
                let inserted = engine_leases::ActiveModel {
                    name: Set(lease.to_owned()),
                    holder: Set(holder.to_owned()),
                    token: Set(1),
                    expires_at: Set(expires_at),
                    acquired_at: Set(now),
                }
                .insert(&txn)
                .await;
                match inserted {
                    Ok(_) => Some(1),
                    // Another controller created it first; try again next time.
                    Err(err) if is_unique_violation(&err) => None,
                    Err(err) => return Err(err.into()),
                }
            }
            Some(row) if row.holder == holder && row.expires_at > now => {
                let result = engine_leases::Entity::update_many()
                    .col_expr(engine_leases::Column::ExpiresAt, Expr::value(expires_at))
                    .filter(engine_leases::Column::Name.eq(lease))
                    .filter(engine_leases::Column::Holder.eq(holder))
                    .filter(engine_leases::Column::Token.eq(row.token))
                    .exec(&txn)
                    .await?;
                (result.rows_affected == 1).then_some(row.token)
            }
            Some(row) if row.expires_at <= now => {
                // Conditional on the token read, so two takers cannot both win.
                let token = row.token + 1;
                let result = engine_leases::Entity::update_many()
                    .col_expr(engine_leases::Column::Holder, Expr::value(holder))
                    .col_expr(engine_leases::Column::Token, Expr::value(token))
                    .col_expr(engine_leases::Column::ExpiresAt, Expr::value(expires_at))
                    .col_expr(engine_leases::Column::AcquiredAt, Expr::value(now))
                    .filter(engine_leases::Column::Name.eq(lease))
                    .filter(engine_leases::Column::Token.eq(row.token))
                    .exec(&txn)
                    .await?;
                if result.rows_affected == 1 {
                    audit::append(
                        &txn,
                        now,
                        holder,
                        "lease.takeover",
                        "lease",
                        lease,
                        json!({ "token": token, "previous_holder": row.holder }),
                    )
                    .await?;
                    Some(token)
                } else {
                    None
                }
            }
            Some(_) => None,
        };
        txn.commit().await?;
        Ok(fence.map(|token| Fence {
            lease: lease.to_owned(),
            holder: holder.to_owned(),
            token,
            expires_at,
        }))
    }

    /// Gives the lease up (expires it now) so a standby takes over at once.
    pub async fn release_lease(&self, fence: &Fence) -> Result<(), DbError> {
        let now = self.clock.now();
        engine_leases::Entity::update_many()
            .col_expr(engine_leases::Column::ExpiresAt, Expr::value(now))
            .filter(engine_leases::Column::Name.eq(fence.lease.as_str()))
            .filter(engine_leases::Column::Holder.eq(fence.holder.as_str()))
            .filter(engine_leases::Column::Token.eq(fence.token))
            .exec(&self.writer)
            .await?;
        Ok(())
    }

    /// Who holds a lease now, if anyone ever did: (holder, token, expires_at).
    pub async fn lease_holder(&self, lease: &str) -> Result<Option<(String, i64, DateTime<Utc>)>, DbError> {
        Ok(engine_leases::Entity::find_by_id(lease.to_owned())
            .one(&self.reader)
            .await?
            .map(|row| (row.holder, row.token, row.expires_at)))
    }
}
