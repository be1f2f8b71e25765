//! Indexes the cockpit's pages read through at 100,000 nodes and a
//! 100,000-step rollout (issues 23 and 26): each wave's step counts (by
//! rollout, wave and state), a node's steps, the finished steps of the
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
            Index::create()
                .name("idx_update_steps_node")
                .table(UpdateSteps::Table)
                .col(UpdateSteps::NodeId)
                .to_owned(),
            Index::create()
                .name("idx_update_steps_finished_at")
                .table(UpdateSteps::Table)
                .col(UpdateSteps::FinishedAt)
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
    RolloutId,
    WaveId,
    State,
    NodeId,
    FinishedAt,
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
