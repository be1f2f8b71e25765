//! What the pure wave decision needs and the old schema did not keep:
//! when a step entered its current state (every step state has a deadline,
//! measured from there), and the wave state and verdict outcome an approval
//! was given under (an approval counts only for the state and verdict it was
//! given under, never later for another). All nullable: a step from before
//! this migration falls back to its last update, and an approval from
//! before it was given under an unknown verdict, so it counts for none.

use sea_orm_migration::prelude::*;
use sea_orm_migration::schema::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table(UpdateSteps::Table)
                    .add_column(timestamp_with_time_zone_null(UpdateSteps::StateEnteredAt))
                    .to_owned(),
            )
            .await?;
        // SQLite accepts one ADD COLUMN per ALTER TABLE.
        for column in [
            text_null(WaveApprovals::WaveState),
            text_null(WaveApprovals::VerdictOutcome),
        ] {
            manager
                .alter_table(Table::alter().table(WaveApprovals::Table).add_column(column).to_owned())
                .await?;
        }
        Ok(())
    }
}

#[derive(DeriveIden)]
enum UpdateSteps {
    Table,
    StateEnteredAt,
}

#[derive(DeriveIden)]
enum WaveApprovals {
    Table,
    WaveState,
    VerdictOutcome,
}
