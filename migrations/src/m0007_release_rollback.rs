//! What decides whether a rollout can be undone: release metadata (the
//! vendor's reason the image forbids downgrades, and the rollback floor, the
//! oldest version a component accepts once the image runs) and what each
//! BMC reports as a component's Redfish `LowestSupportedVersion`. All
//! nullable: unknown means nothing forbids a rollback.

use sea_orm_migration::prelude::*;
use sea_orm_migration::schema::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        // SQLite accepts one ADD COLUMN per ALTER TABLE, so each column is its
        // own statement on both backends.
        for column in [
            text_null(Releases::DowngradeForbidden),
            text_null(Releases::RollbackFloor),
        ] {
            manager
                .alter_table(Table::alter().table(Releases::Table).add_column(column).to_owned())
                .await?;
        }
        manager
            .alter_table(
                Table::alter()
                    .table(NodeComponents::Table)
                    .add_column(text_null(NodeComponents::LowestSupportedVersion))
                    .to_owned(),
            )
            .await?;
        Ok(())
    }
}

#[derive(DeriveIden)]
enum Releases {
    Table,
    DowngradeForbidden,
    RollbackFloor,
}

#[derive(DeriveIden)]
enum NodeComponents {
    Table,
    LowestSupportedVersion,
}
