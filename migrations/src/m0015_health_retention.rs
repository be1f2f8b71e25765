//! Health-sample retention (issue 23): per-node daily aggregates of the hourly
//! `health_samples` windows once nothing refers to them any more, and the
//! stored evidence package of a finished rollout, so its download survives the
//! reduction and is not rebuilt from samples on every request. Both backends.
//!
//! `health_daily` has the same numbers as an hourly window (events, exposure,
//! readings, sum, min, max, per-unit aggregates) over a UTC day, plus how many
//! hourly windows were folded in; one row per (wave, node, metric, day), so a
//! node that was a control in one wave and a canary in another keeps both.

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
                    .table(HealthDaily::Table)
                    .col(big_pk_auto(HealthDaily::Id))
                    .col(big_integer(HealthDaily::RolloutId))
                    .col(big_integer(HealthDaily::WaveId))
                    .col(big_integer(HealthDaily::NodeId))
                    .col(string(HealthDaily::Cohort))
                    .col(string(HealthDaily::Metric))
                    .col(timestamp_with_time_zone(HealthDaily::Day))
                    .col(big_integer(HealthDaily::Windows).default(0))
                    .col(big_integer(HealthDaily::Events).default(0))
                    .col(double(HealthDaily::Exposure).default(0.0))
                    .col(big_integer(HealthDaily::Readings).default(0))
                    .col(double(HealthDaily::Sum).default(0.0))
                    .col(double_null(HealthDaily::Min))
                    .col(double_null(HealthDaily::Max))
                    .col(json_null(HealthDaily::Units))
                    .col(timestamp_with_time_zone(HealthDaily::UpdatedAt))
                    .to_owned(),
            )
            .await?;
        let indexes = [
            Index::create()
                .name("uq_health_daily_key")
                .table(HealthDaily::Table)
                .col(HealthDaily::WaveId)
                .col(HealthDaily::NodeId)
                .col(HealthDaily::Metric)
                .col(HealthDaily::Day)
                .unique()
                .to_owned(),
            Index::create()
                .name("idx_health_daily_rollout")
                .table(HealthDaily::Table)
                .col(HealthDaily::RolloutId)
                .to_owned(),
            // A node's trend over days.
            Index::create()
                .name("idx_health_daily_node_day")
                .table(HealthDaily::Table)
                .col(HealthDaily::NodeId)
                .col(HealthDaily::Day)
                .to_owned(),
            // The retention pass picks a finished rollout's old windows
            // without scanning its recent ones.
            Index::create()
                .name("idx_health_samples_rollout_window")
                .table(HealthSamples::Table)
                .col(HealthSamples::RolloutId)
                .col(HealthSamples::WindowStart)
                .to_owned(),
        ];
        for index in indexes {
            manager.create_index(index).await?;
        }

        manager
            .create_table(
                Table::create()
                    .table(RolloutEvidence::Table)
                    .col(big_integer(RolloutEvidence::RolloutId).primary_key())
                    .col(string(RolloutEvidence::RolloutState))
                    .col(string(RolloutEvidence::Sha256))
                    .col(big_integer(RolloutEvidence::SizeBytes))
                    .col(blob(RolloutEvidence::Archive))
                    .col(timestamp_with_time_zone(RolloutEvidence::CreatedAt))
                    .to_owned(),
            )
            .await?;
        Ok(())
    }
}

#[derive(DeriveIden)]
enum HealthDaily {
    Table,
    Id,
    RolloutId,
    WaveId,
    NodeId,
    Cohort,
    Metric,
    Day,
    Windows,
    Events,
    Exposure,
    Readings,
    Sum,
    Min,
    Max,
    Units,
    UpdatedAt,
}

#[derive(DeriveIden)]
enum HealthSamples {
    Table,
    RolloutId,
    WindowStart,
}

#[derive(DeriveIden)]
enum RolloutEvidence {
    Table,
    RolloutId,
    RolloutState,
    Sha256,
    SizeBytes,
    Archive,
    CreatedAt,
}
