//! The RMA pipeline's inputs (issue 25): every part keyed by its serial
//! number (`parts`, from Redfish discovery and the parts manifest), the
//! per-part samples the candidate rules judge (`part_observations`, one row
//! per sample at its source, so re-reading a source is idempotent), files
//! attached to a case (`rma_attachments`: Redfish diagnostic data and
//! uploaded vendor diagnostics), the vendors' criteria pinned to the commit
//! they were read at (`rma_criteria`) and the defect-cluster scans
//! (`rma_cluster_scans`).

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
                    .table(Parts::Table)
                    .col(string(Parts::Serial).primary_key())
                    .col(string(Parts::Vendor))
                    .col(string(Parts::PartKind))
                    .col(string(Parts::PartNumber))
                    .col(string_null(Parts::Model))
                    .col(string(Parts::NodeName))
                    .col(string(Parts::Slot))
                    .col(timestamp_with_time_zone_null(Parts::ProductionDate))
                    // From the parts manifest: no Redfish property names a lot.
                    .col(string_null(Parts::Lot))
                    .col(string_null(Parts::DateCode))
                    .col(string_null(Parts::FirmwareVersion))
                    .col(string_null(Parts::Health))
                    .col(timestamp_with_time_zone(Parts::FirstSeen))
                    .col(timestamp_with_time_zone(Parts::LastSeen))
                    // Set when discovery no longer finds the part in its node (replaced).
                    .col(timestamp_with_time_zone_null(Parts::RemovedAt))
                    .to_owned(),
            )
            .await?;
        for (name, column) in [("idx_parts_node", Parts::NodeName), ("idx_parts_lot", Parts::Lot)] {
            manager
                .create_index(Index::create().name(name).table(Parts::Table).col(column).to_owned())
                .await?;
        }

        manager
            .create_table(
                Table::create()
                    .table(PartObservations::Table)
                    .col(big_pk_auto(PartObservations::Id))
                    .col(string(PartObservations::Serial))
                    .col(timestamp_with_time_zone(PartObservations::At))
                    .col(string(PartObservations::SourceId))
                    .col(json(PartObservations::KindJson))
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("uq_part_observations_source")
                    .table(PartObservations::Table)
                    .col(PartObservations::Serial)
                    .col(PartObservations::SourceId)
                    .unique()
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("idx_part_observations_at")
                    .table(PartObservations::Table)
                    .col(PartObservations::At)
                    .to_owned(),
            )
            .await?;

        manager
            .create_table(
                Table::create()
                    .table(RmaAttachments::Table)
                    .col(big_pk_auto(RmaAttachments::Id))
                    .col(string(RmaAttachments::CaseId))
                    .col(string(RmaAttachments::Name))
                    // redfish_diagnostic | field_diagnostic
                    .col(string(RmaAttachments::Kind))
                    .col(blob(RmaAttachments::Content))
                    .col(string(RmaAttachments::Sha256))
                    .col(big_integer(RmaAttachments::SizeBytes))
                    .col(string(RmaAttachments::AddedBy))
                    .col(timestamp_with_time_zone(RmaAttachments::AddedAt))
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("uq_rma_attachments_name")
                    .table(RmaAttachments::Table)
                    .col(RmaAttachments::CaseId)
                    .col(RmaAttachments::Name)
                    .unique()
                    .to_owned(),
            )
            .await?;

        manager
            .create_table(
                Table::create()
                    .table(RmaCriteria::Table)
                    .col(string(RmaCriteria::Path).primary_key())
                    .col(string(RmaCriteria::CommitId))
                    .col(string(RmaCriteria::BlobId))
                    .col(text(RmaCriteria::Source))
                    .col(string(RmaCriteria::LoadedBy))
                    .col(timestamp_with_time_zone(RmaCriteria::LoadedAt))
                    .to_owned(),
            )
            .await?;

        manager
            .create_table(
                Table::create()
                    .table(RmaClusterScans::Table)
                    .col(big_pk_auto(RmaClusterScans::Id))
                    .col(timestamp_with_time_zone(RmaClusterScans::PeriodStart))
                    .col(timestamp_with_time_zone(RmaClusterScans::PeriodEnd))
                    .col(timestamp_with_time_zone(RmaClusterScans::ScannedAt))
                    .col(json(RmaClusterScans::ReportJson))
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("uq_rma_cluster_scans_period")
                    .table(RmaClusterScans::Table)
                    .col(RmaClusterScans::PeriodStart)
                    .unique()
                    .to_owned(),
            )
            .await?;
        Ok(())
    }
}

#[derive(DeriveIden)]
enum Parts {
    Table,
    Serial,
    Vendor,
    PartKind,
    PartNumber,
    Model,
    NodeName,
    Slot,
    ProductionDate,
    Lot,
    DateCode,
    FirmwareVersion,
    Health,
    FirstSeen,
    LastSeen,
    RemovedAt,
}

#[derive(DeriveIden)]
enum PartObservations {
    Table,
    Id,
    Serial,
    At,
    SourceId,
    KindJson,
}

#[derive(DeriveIden)]
enum RmaAttachments {
    Table,
    Id,
    CaseId,
    Name,
    Kind,
    Content,
    Sha256,
    SizeBytes,
    AddedBy,
    AddedAt,
}

#[derive(DeriveIden)]
enum RmaCriteria {
    Table,
    Path,
    CommitId,
    BlobId,
    Source,
    LoadedBy,
    LoadedAt,
}

#[derive(DeriveIden)]
enum RmaClusterScans {
    Table,
    Id,
    PeriodStart,
    PeriodEnd,
    ScannedAt,
    ReportJson,
}
