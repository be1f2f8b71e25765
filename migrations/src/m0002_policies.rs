//! Rollout policies synced from git: every version ever in force (content
//! addressed by commit and blob, so a rollout pinned to one can always load
//! it), which version is in force per policy name, and where the last sync
//! got to.

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
                    .table(PolicyVersions::Table)
                    .col(big_pk_auto(PolicyVersions::Id))
                    .col(string(PolicyVersions::Name))
                    .col(text(PolicyVersions::Path))
                    .col(string(PolicyVersions::CommitId))
                    .col(string(PolicyVersions::BlobId))
                    .col(text(PolicyVersions::Content))
                    .col(timestamp_with_time_zone(PolicyVersions::SyncedAt))
                    .to_owned(),
            )
            .await?;
        // A path names exactly one blob in a commit: the natural key, and
        // what makes re-recording the same sync a no-op.
        manager
            .create_index(
                Index::create()
                    .name("uq_policy_versions_commit_path")
                    .table(PolicyVersions::Table)
                    .col(PolicyVersions::CommitId)
                    .col(PolicyVersions::Path)
                    .unique()
                    .to_owned(),
            )
            .await?;
        // Rollouts load their pinned policy by (commit, blob).
        manager
            .create_index(
                Index::create()
                    .name("idx_policy_versions_commit_blob")
                    .table(PolicyVersions::Table)
                    .col(PolicyVersions::CommitId)
                    .col(PolicyVersions::BlobId)
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("idx_policy_versions_name")
                    .table(PolicyVersions::Table)
                    .col(PolicyVersions::Name)
                    .to_owned(),
            )
            .await?;

        manager
            .create_table(
                Table::create()
                    .table(PoliciesInForce::Table)
                    .col(string(PoliciesInForce::Name).primary_key())
                    .col(big_integer(PoliciesInForce::VersionId))
                    .col(string(PoliciesInForce::LastSyncCommit))
                    .col(json_null(PoliciesInForce::LastError))
                    .col(timestamp_with_time_zone(PoliciesInForce::UpdatedAt))
                    .foreign_key(
                        ForeignKey::create()
                            .from(PoliciesInForce::Table, PoliciesInForce::VersionId)
                            .to(PolicyVersions::Table, PolicyVersions::Id)
                            .on_delete(ForeignKeyAction::Restrict),
                    )
                    .to_owned(),
            )
            .await?;

        manager
            .create_table(
                Table::create()
                    .table(PolicySyncState::Table)
                    .col(integer(PolicySyncState::Id).primary_key())
                    .col(text(PolicySyncState::Source))
                    .col(string(PolicySyncState::CommitId))
                    .col(timestamp_with_time_zone(PolicySyncState::SyncedAt))
                    .col(timestamp_with_time_zone(PolicySyncState::ChangedAt))
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_table(Table::drop().table(PolicySyncState::Table).to_owned())
            .await?;
        manager
            .drop_table(Table::drop().table(PoliciesInForce::Table).to_owned())
            .await?;
        manager
            .drop_table(Table::drop().table(PolicyVersions::Table).to_owned())
            .await?;
        Ok(())
    }
}

#[derive(DeriveIden)]
enum PolicyVersions {
    Table,
    Id,
    Name,
    Path,
    CommitId,
    BlobId,
    Content,
    SyncedAt,
}

#[derive(DeriveIden)]
enum PoliciesInForce {
    Table,
    Name,
    VersionId,
    LastSyncCommit,
    LastError,
    UpdatedAt,
}

#[derive(DeriveIden)]
enum PolicySyncState {
    Table,
    Id,
    Source,
    CommitId,
    SyncedAt,
    ChangedAt,
}
