//! Waveguard's durable record of each drain it made through a node's
//! workload scheduler (issue 27): the proof of ownership that lets it resume
//! only nodes it drained (the scheduler's reason text alone proves nothing:
//! everyone may be root, and a resume erases it), written before each effect
//! so a controller killed between drain and flash, or flash and resume,
//! finds what it owes the node.

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
                    .table(SchedulerDrains::Table)
                    .col(big_pk_auto(SchedulerDrains::Id))
                    .col(big_integer(SchedulerDrains::RolloutId))
                    .col(big_integer(SchedulerDrains::WaveId))
                    .col(big_integer(SchedulerDrains::StepId))
                    .col(big_integer(SchedulerDrains::NodeId))
                    // `slurm`, `command`: whose drain this is.
                    .col(string(SchedulerDrains::SchedulerKind))
                    // The mapped name the scheduler knows the node by.
                    .col(string(SchedulerDrains::SchedulerNode))
                    // drain_intended | held | resume_intended | quarantined | closed
                    .col(string(SchedulerDrains::Phase))
                    // The reason tag written with the drain.
                    .col(string(SchedulerDrains::ReasonText))
                    // The scheduler's state read before draining: proves the
                    // node was not drained by anyone then.
                    .col(json_null(SchedulerDrains::ObservedBefore))
                    // The last state read and what the node waits on, for pages.
                    .col(json_null(SchedulerDrains::LastSeen))
                    .col(timestamp_with_time_zone(SchedulerDrains::DrainStartedAt))
                    .col(timestamp_with_time_zone_null(SchedulerDrains::HeldAt))
                    .col(timestamp_with_time_zone_null(SchedulerDrains::ResumeIntendedAt))
                    .col(timestamp_with_time_zone_null(SchedulerDrains::ClosedAt))
                    // resumed | already_in_service | taken_over | ... with the other party's reason.
                    .col(text_null(SchedulerDrains::CloseReason))
                    .col(timestamp_with_time_zone(SchedulerDrains::UpdatedAt))
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("idx_scheduler_drains_phase")
                    .table(SchedulerDrains::Table)
                    .col(SchedulerDrains::Phase)
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("idx_scheduler_drains_step")
                    .table(SchedulerDrains::Table)
                    .col(SchedulerDrains::StepId)
                    .to_owned(),
            )
            .await?;
        // At most one drain not closed per node, whoever made it: a second
        // would make two owners of one scheduler state. Partial unique
        // indexes read the same on SQLite and PostgreSQL.
        manager
            .get_connection()
            .execute_unprepared(
                "CREATE UNIQUE INDEX uq_scheduler_drains_open_node ON scheduler_drains (node_id) \
                 WHERE phase <> 'closed'",
            )
            .await?;
        Ok(())
    }
}

#[derive(DeriveIden)]
enum SchedulerDrains {
    Table,
    Id,
    RolloutId,
    WaveId,
    StepId,
    NodeId,
    SchedulerKind,
    SchedulerNode,
    Phase,
    ReasonText,
    ObservedBefore,
    LastSeen,
    DrainStartedAt,
    HeldAt,
    ResumeIntendedAt,
    ClosedAt,
    CloseReason,
    UpdatedAt,
}
