//! Hardening (issue 24): login throttling kept in the database, so every
//! replica enforces the same counts, and CSRF tokens no longer stored in
//! plain text (sessions now hold a SHA-256 of a token derived from the
//! session secret; old plain values are blanked).

use sea_orm_migration::prelude::*;
use sea_orm_migration::schema::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table(LoginThrottles::Table)
                    // `account`, `pair` (account at one address) or `address`.
                    .col(string(LoginThrottles::Scope))
                    // Lower-cased user name; empty for `address`.
                    .col(string(LoginThrottles::Username))
                    // Client address; empty for `account`.
                    .col(string(LoginThrottles::Address))
                    .col(integer(LoginThrottles::Failures))
                    .col(timestamp_with_time_zone(LoginThrottles::WindowStartedAt))
                    .col(timestamp_with_time_zone(LoginThrottles::LastFailureAt))
                    .col(timestamp_with_time_zone_null(LoginThrottles::BlockedUntil))
                    .primary_key(
                        Index::create()
                            .col(LoginThrottles::Scope)
                            .col(LoginThrottles::Username)
                            .col(LoginThrottles::Address),
                    )
                    .to_owned(),
            )
            .await?;
        manager
            .exec_stmt(
                Query::update()
                    .table(Sessions::Table)
                    .value(Sessions::CsrfToken, "")
                    .to_owned(),
            )
            .await?;
        Ok(())
    }
}

#[derive(DeriveIden)]
enum LoginThrottles {
    Table,
    Scope,
    Username,
    Address,
    Failures,
    WindowStartedAt,
    LastFailureAt,
    BlockedUntil,
}

#[derive(DeriveIden)]
enum Sessions {
    Table,
    CsrfToken,
}
