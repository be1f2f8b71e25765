//! The soak and the fleet-proven state (issue 22): which part a wave plays in its rollout's soak
//! (`soak`: its bake compares the fleet with the holdback; `holdback`: the nodes kept on the old
//! version, updated after the soak passed), and on a release, the rollout whose passing soak made it
//! `fleet-proven` (the qualification state itself is the existing text column). Both nullable:
//! waves and releases from before keep their meaning (no soak, never proven by one). Both backends.

use sea_orm_migration::prelude::*;
use sea_orm_migration::schema::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        // SQLite accepts one ADD COLUMN per ALTER TABLE: one statement each on both backends.
        manager
            .alter_table(
                Table::alter()
                    .table(Waves::Table)
                    .add_column(string_null(Waves::Role))
                    .to_owned(),
            )
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table(Releases::Table)
                    .add_column(big_integer_null(Releases::FleetProvenBy))
                    .to_owned(),
            )
            .await?;
        Ok(())
    }
}

#[derive(DeriveIden)]
enum Waves {
    Table,
    Role,
}

#[derive(DeriveIden)]
enum Releases {
    Table,
    FleetProvenBy,
}
