//! Health watch storage: aggregated health samples per (wave, node, metric,
//! window), the per-node collection state (event-log cursor, exposure
//! accounted so far) and the detector's evaluated looks (the decision trace).
//!
//! Samples are aggregates, never raw readings; the sizing argument is in
//! `orchestrator_db::health`.

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
                    .table(HealthSamples::Table)
                    .col(big_pk_auto(HealthSamples::Id))
                    .col(big_integer(HealthSamples::RolloutId))
                    .col(big_integer(HealthSamples::WaveId))
                    .col(big_integer(HealthSamples::NodeId))
                    .col(string(HealthSamples::Cohort))
                    .col(string(HealthSamples::Metric))
                    .col(timestamp_with_time_zone(HealthSamples::WindowStart))
                    .col(big_integer(HealthSamples::Events).default(0))
                    .col(double(HealthSamples::Exposure).default(0.0))
                    .col(big_integer(HealthSamples::Readings).default(0))
                    .col(double(HealthSamples::Sum).default(0.0))
                    .col(double_null(HealthSamples::Min))
                    .col(double_null(HealthSamples::Max))
                    .col(json_null(HealthSamples::Units))
                    .col(timestamp_with_time_zone(HealthSamples::UpdatedAt))
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("uq_health_samples_key")
                    .table(HealthSamples::Table)
                    .col(HealthSamples::WaveId)
                    .col(HealthSamples::NodeId)
                    .col(HealthSamples::Metric)
                    .col(HealthSamples::WindowStart)
                    .unique()
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("idx_health_samples_rollout")
                    .table(HealthSamples::Table)
                    .col(HealthSamples::RolloutId)
                    .to_owned(),
            )
            .await?;

        manager
            .create_table(
                Table::create()
                    .table(HealthCursors::Table)
                    .col(big_pk_auto(HealthCursors::Id))
                    .col(big_integer(HealthCursors::RolloutId))
                    .col(big_integer(HealthCursors::WaveId))
                    .col(big_integer(HealthCursors::NodeId))
                    .col(string(HealthCursors::Cohort))
                    .col(timestamp_with_time_zone(HealthCursors::ExposureStart))
                    .col(timestamp_with_time_zone(HealthCursors::AccountedUntil))
                    .col(json_null(HealthCursors::EventCursor))
                    .col(integer(HealthCursors::Gpus).default(0))
                    .col(big_integer(HealthCursors::Polls).default(0))
                    .col(text_null(HealthCursors::LastError))
                    .col(timestamp_with_time_zone(HealthCursors::UpdatedAt))
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("uq_health_cursors_wave_node")
                    .table(HealthCursors::Table)
                    .col(HealthCursors::WaveId)
                    .col(HealthCursors::NodeId)
                    .unique()
                    .to_owned(),
            )
            .await?;

        manager
            .create_table(
                Table::create()
                    .table(HealthLooks::Table)
                    .col(big_pk_auto(HealthLooks::Id))
                    .col(big_integer(HealthLooks::RolloutId))
                    .col(big_integer(HealthLooks::WaveId))
                    .col(string(HealthLooks::Gate))
                    .col(integer(HealthLooks::LookNumber))
                    .col(integer(HealthLooks::PlannedLooks))
                    .col(string(HealthLooks::Outcome))
                    .col(json(HealthLooks::Verdict))
                    .col(timestamp_with_time_zone(HealthLooks::EvaluatedAt))
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("uq_health_looks_wave_gate_look")
                    .table(HealthLooks::Table)
                    .col(HealthLooks::WaveId)
                    .col(HealthLooks::Gate)
                    .col(HealthLooks::LookNumber)
                    .unique()
                    .to_owned(),
            )
            .await?;
        Ok(())
    }
}

#[derive(DeriveIden)]
enum HealthSamples {
    Table,
    Id,
    RolloutId,
    WaveId,
    NodeId,
    Cohort,
    Metric,
    WindowStart,
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
enum HealthCursors {
    Table,
    Id,
    RolloutId,
    WaveId,
    NodeId,
    Cohort,
    ExposureStart,
    AccountedUntil,
    EventCursor,
    Gpus,
    Polls,
    LastError,
    UpdatedAt,
}

#[derive(DeriveIden)]
enum HealthLooks {
    Table,
    Id,
    RolloutId,
    WaveId,
    Gate,
    LookNumber,
    PlannedLooks,
    Outcome,
    Verdict,
    EvaluatedAt,
}
