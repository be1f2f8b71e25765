//! RMA cases (issue 25): one row per case for one part, holding the pure
//! `orchestrator_rma::Case` (state, history, the vendor's answers) and the
//! candidate that opened it (rule, samples, firmware suspicion). A node with
//! an open case is kept out of rollouts.

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
                    .table(RmaCases::Table)
                    // `RMA-<serial>-<rule>-<n>`.
                    .col(string(RmaCases::Id).primary_key())
                    .col(string(RmaCases::Serial))
                    .col(string(RmaCases::Rule))
                    .col(string(RmaCases::NodeName))
                    .col(string(RmaCases::Vendor))
                    // candidate | evidence_collected | submitted | accepted | rejected | replaced | verified | closed
                    .col(string(RmaCases::State))
                    .col(boolean(RmaCases::Open))
                    .col(json(RmaCases::CaseJson))
                    .col(json(RmaCases::CandidateJson))
                    .col(timestamp_with_time_zone(RmaCases::OpenedAt))
                    .col(timestamp_with_time_zone(RmaCases::UpdatedAt))
                    .to_owned(),
            )
            .await?;
        for (name, column) in [
            ("idx_rma_cases_open", RmaCases::Open),
            ("idx_rma_cases_serial", RmaCases::Serial),
            ("idx_rma_cases_node", RmaCases::NodeName),
        ] {
            manager
                .create_index(Index::create().name(name).table(RmaCases::Table).col(column).to_owned())
                .await?;
        }
        Ok(())
    }
}

#[derive(DeriveIden)]
enum RmaCases {
    Table,
    Id,
    Serial,
    Rule,
    NodeName,
    Vendor,
    State,
    Open,
    CaseJson,
    CandidateJson,
    OpenedAt,
    UpdatedAt,
}
