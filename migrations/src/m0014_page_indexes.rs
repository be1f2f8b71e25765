//! Indexes the cockpit's pages read through at 100,000 nodes and a
//! 100,000-step rollout (issues 23 and 26): each wave's step counts (by
//! rollout, wave and state, and whether they moved), a page of a rollout's
//! steps in id order, a node's steps, the finished steps of the
//! failure trends, and the newest inventory reading and node change that
//! mark the fleet's version distribution as unchanged, and nodes by state.
//! Both backends.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let indexes = [
            Index::create()
                .name("idx_update_steps_rollout_wave_state")
                .table(UpdateSteps::Table)
                .col(UpdateSteps::RolloutId)
                .col(UpdateSteps::WaveId)
                .col(UpdateSteps::State)
                .to_owned(),
            // A page of a rollout's steps in id order, without sorting them all.
            Index::create()
                .name("idx_update_steps_rollout_id")
                .table(UpdateSteps::Table)
                .col(UpdateSteps::RolloutId)
                .col(UpdateSteps::Id)
                .to_owned(),
            // The newest change of a rollout's steps: whether its counts moved.
            Index::create()
                .name("idx_update_steps_rollout_updated")
                .table(UpdateSteps::Table)
                .col(UpdateSteps::RolloutId)
                .col(UpdateSteps::UpdatedAt)
                .to_owned(),
            Index::create()
                .name("idx_update_steps_node")
                .table(UpdateSteps::Table)
                .col(UpdateSteps::NodeId)
                .to_owned(),
            // Covering: the trends count from the index alone.
            Index::create()
                .name("idx_update_steps_finished")
                .table(UpdateSteps::Table)
                .col(UpdateSteps::FinishedAt)
                .col(UpdateSteps::State)
                .col(UpdateSteps::Purpose)
                .col(UpdateSteps::TargetVersion)
                .to_owned(),
            Index::create()
                .name("idx_node_components_last_read_at")
                .table(NodeComponents::Table)
                .col(NodeComponents::LastReadAt)
                .to_owned(),
            Index::create()
                .name("idx_nodes_updated_at")
                .table(Nodes::Table)
                .col(Nodes::UpdatedAt)
                .to_owned(),
            // The dashboard's counts per state. (Not the discovery error:
            // an error's text may exceed what a PostgreSQL btree entry holds.)
            Index::create()
                .name("idx_nodes_state")
                .table(Nodes::Table)
                .col(Nodes::State)
                .to_owned(),
        ];
        for index in indexes {
            manager.create_index(index).await?;
        }
        Ok(())
    }
}

#[derive(DeriveIden)]
enum UpdateSteps {
    Table,
    Id,
    RolloutId,
    WaveId,
    State,
    NodeId,
    FinishedAt,
    Purpose,
    TargetVersion,
    UpdatedAt,
}

#[derive(DeriveIden)]
enum NodeComponents {
    Table,
    LastReadAt,
}

#[derive(DeriveIden)]
enum Nodes {
    Table,
    UpdatedAt,
    State,
}
