//! Authentication state: browser sessions (each with its CSRF token) and API
//! tokens for automation. Only hashes of the secrets are stored, so a copy of
//! the database does not let anyone log in.

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
                    .table(Sessions::Table)
                    .col(big_pk_auto(Sessions::Id))
                    .col(string_uniq(Sessions::TokenHash))
                    .col(big_integer(Sessions::UserId))
                    .col(string(Sessions::CsrfToken))
                    .col(timestamp_with_time_zone(Sessions::CreatedAt))
                    .col(timestamp_with_time_zone(Sessions::ExpiresAt))
                    .foreign_key(
                        ForeignKey::create()
                            .from(Sessions::Table, Sessions::UserId)
                            .to(Users::Table, Users::Id)
                            .on_delete(ForeignKeyAction::Cascade),
                    )
                    .to_owned(),
            )
            .await?;
        manager
            .create_table(
                Table::create()
                    .table(ApiTokens::Table)
                    .col(big_pk_auto(ApiTokens::Id))
                    .col(string_uniq(ApiTokens::TokenHash))
                    .col(big_integer(ApiTokens::UserId))
                    .col(string(ApiTokens::Name))
                    .col(timestamp_with_time_zone(ApiTokens::CreatedAt))
                    .col(timestamp_with_time_zone_null(ApiTokens::LastUsedAt))
                    .col(boolean(ApiTokens::Revoked))
                    .foreign_key(
                        ForeignKey::create()
                            .from(ApiTokens::Table, ApiTokens::UserId)
                            .to(Users::Table, Users::Id)
                            .on_delete(ForeignKeyAction::Cascade),
                    )
                    .to_owned(),
            )
            .await?;
        Ok(())
    }
}

#[derive(DeriveIden)]
enum Sessions {
    Table,
    Id,
    TokenHash,
    UserId,
    CsrfToken,
    CreatedAt,
    ExpiresAt,
}

#[derive(DeriveIden)]
enum ApiTokens {
    Table,
    Id,
    TokenHash,
    UserId,
    Name,
    CreatedAt,
    LastUsedAt,
    Revoked,
}

#[derive(DeriveIden)]
enum Users {
    Table,
    Id,
}
