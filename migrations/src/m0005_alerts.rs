//! Alerts received from Alertmanager: one row per (fingerprint, status,
//! startsAt), so a redelivered notification is recognised and never acts
//! twice, and a firing and its later resolution are both kept as evidence.

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
                    .table(Alerts::Table)
                    .col(big_pk_auto(Alerts::Id))
                    .col(string(Alerts::Fingerprint))
                    .col(string(Alerts::Status))
                    .col(timestamp_with_time_zone(Alerts::StartsAt))
                    .col(timestamp_with_time_zone_null(Alerts::EndsAt))
                    .col(string(Alerts::Alertname))
                    .col(json(Alerts::Labels))
                    .col(json(Alerts::Annotations))
                    .col(text_null(Alerts::GeneratorUrl))
                    .col(string(Alerts::Receiver))
                    .col(text(Alerts::GroupKey))
                    .col(timestamp_with_time_zone(Alerts::ReceivedAt))
                    // Null until every action the alert triggers is taken; a
                    // redelivery of an unprocessed alert is processed again.
                    .col(timestamp_with_time_zone_null(Alerts::ProcessedAt))
                    .col(json_null(Alerts::Outcome))
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("uq_alerts_fingerprint_status_starts_at")
                    .table(Alerts::Table)
                    .col(Alerts::Fingerprint)
                    .col(Alerts::Status)
                    .col(Alerts::StartsAt)
                    .unique()
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("idx_alerts_received_at")
                    .table(Alerts::Table)
                    .col(Alerts::ReceivedAt)
                    .to_owned(),
            )
            .await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager.drop_table(Table::drop().table(Alerts::Table).to_owned()).await
    }
}

#[derive(DeriveIden)]
enum Alerts {
    Table,
    Id,
    Fingerprint,
    Status,
    StartsAt,
    EndsAt,
    Alertname,
    Labels,
    Annotations,
    GeneratorUrl,
    Receiver,
    GroupKey,
    ReceivedAt,
    ProcessedAt,
    Outcome,
}
