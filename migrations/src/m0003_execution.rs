//! The rollout engine's execution state: the policy a rollout runs under,
//! wave blockers and verdicts, the per-step facts replay needs after a crash
//! (tasks seen before a push, when a reset was requested, since when a BMC
//! has been silent), and the executor lease with its fencing token.

use sea_orm_migration::prelude::*;
use sea_orm_migration::schema::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        // SQLite accepts one ADD COLUMN per ALTER TABLE, so each column is its
        // own statement on both backends.
        let rollout_columns = [
            text_null(Rollouts::PolicySource),
            json_null(Rollouts::RollbackAssessment),
            json_null(Rollouts::Blockers),
        ];
        for column in rollout_columns {
            manager
                .alter_table(Table::alter().table(Rollouts::Table).add_column(column).to_owned())
                .await?;
        }

        let wave_columns = [
            string(Waves::Kind).default("update").to_owned(),
            text_null(Waves::StateReason),
            json_null(Waves::Blockers),
            json_null(Waves::Gates),
            json_null(Waves::ControlNodes),
            json_null(Waves::Verdict),
            json_null(Waves::Scope),
            integer(Waves::MaxInFlight).default(0).to_owned(),
        ];
        for column in wave_columns {
            manager
                .alter_table(Table::alter().table(Waves::Table).add_column(column).to_owned())
                .await?;
        }

        let step_columns = [
            json_null(UpdateSteps::Targets),
            json_null(UpdateSteps::KnownTasks),
            string_null(UpdateSteps::PreviousVersion),
            timestamp_with_time_zone_null(UpdateSteps::PushStartedAt),
            timestamp_with_time_zone_null(UpdateSteps::ResetIssuedAt),
            timestamp_with_time_zone_null(UpdateSteps::UnreachableSince),
            timestamp_with_time_zone_null(UpdateSteps::StartedAt),
            timestamp_with_time_zone_null(UpdateSteps::FinishedAt),
            big_integer_null(UpdateSteps::RollbackOf),
        ];
        for column in step_columns {
            manager
                .alter_table(Table::alter().table(UpdateSteps::Table).add_column(column).to_owned())
                .await?;
        }
        manager
            .create_index(
                Index::create()
                    .name("idx_update_steps_state")
                    .table(UpdateSteps::Table)
                    .col(UpdateSteps::State)
                    .to_owned(),
            )
            .await?;

        manager
            .create_table(
                Table::create()
                    .table(EngineLeases::Table)
                    .col(string(EngineLeases::Name).primary_key())
                    .col(string(EngineLeases::Holder))
                    .col(big_integer(EngineLeases::Token))
                    .col(timestamp_with_time_zone(EngineLeases::ExpiresAt))
                    .col(timestamp_with_time_zone(EngineLeases::AcquiredAt))
                    .to_owned(),
            )
            .await?;
        Ok(())
    }
}

#[derive(DeriveIden)]
enum Rollouts {
    Table,
    PolicySource,
    RollbackAssessment,
    Blockers,
}

#[derive(DeriveIden)]
enum Waves {
    Table,
    Kind,
    StateReason,
    Blockers,
    Gates,
    ControlNodes,
    Verdict,
    Scope,
    MaxInFlight,
}

#[derive(DeriveIden)]
enum UpdateSteps {
    Table,
    Targets,
    KnownTasks,
    PreviousVersion,
    PushStartedAt,
    ResetIssuedAt,
    UnreachableSince,
    StartedAt,
    FinishedAt,
    RollbackOf,
    State,
}

#[derive(DeriveIden)]
enum EngineLeases {
    Table,
    Name,
    Holder,
    Token,
    ExpiresAt,
    AcquiredAt,
}
