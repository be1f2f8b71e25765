//! Nodes and their components, firmware releases and their qualification,
//! rollouts, waves and per-node steps, users, and the append-only audit log.

use sea_orm_migration::prelude::*;
use sea_orm_migration::schema::*;
use sea_orm_migration::sea_orm::{ConnectionTrait, DbBackend};

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table(Nodes::Table)
                    .col(big_pk_auto(Nodes::Id))
                    .col(string_uniq(Nodes::Name))
                    .col(string(Nodes::BmcUrl))
                    .col(string(Nodes::CredentialRef))
                    .col(string(Nodes::PlatformSku))
                    .col(string(Nodes::Region))
                    .col(string(Nodes::Cluster))
                    .col(string(Nodes::Rack))
                    .col(string(Nodes::NvlinkDomain))
                    .col(string(Nodes::State))
                    .col(text_null(Nodes::StateReason))
                    .col(timestamp_with_time_zone_null(Nodes::LastDiscoveredAt))
                    .col(text_null(Nodes::LastDiscoveryError))
                    .col(timestamp_with_time_zone(Nodes::CreatedAt))
                    .col(timestamp_with_time_zone(Nodes::UpdatedAt))
                    .to_owned(),
            )
            .await?;
        for (name, column) in [("idx_nodes_cluster", Nodes::Cluster), ("idx_nodes_rack", Nodes::Rack)] {
            manager
                .create_index(Index::create().name(name).table(Nodes::Table).col(column).to_owned())
                .await?;
        }

        manager
            .create_table(
                Table::create()
                    .table(NodeComponents::Table)
                    .col(big_pk_auto(NodeComponents::Id))
                    .col(big_integer(NodeComponents::NodeId))
                    .col(string(NodeComponents::InventoryId))
                    .col(string(NodeComponents::Kind))
                    .col(string(NodeComponents::Version))
                    .col(boolean(NodeComponents::Updateable))
                    .col(string_null(NodeComponents::SoftwareId))
                    .col(string_null(NodeComponents::Health))
                    .col(timestamp_with_time_zone(NodeComponents::LastReadAt))
                    .foreign_key(
                        ForeignKey::create()
                            .from(NodeComponents::Table, NodeComponents::NodeId)
                            .to(Nodes::Table, Nodes::Id)
                            .on_delete(ForeignKeyAction::Cascade),
                    )
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("uq_node_components_node_inventory")
                    .table(NodeComponents::Table)
                    .col(NodeComponents::NodeId)
                    .col(NodeComponents::InventoryId)
                    .unique()
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("idx_node_components_kind_version")
                    .table(NodeComponents::Table)
                    .col(NodeComponents::Kind)
                    .col(NodeComponents::Version)
                    .to_owned(),
            )
            .await?;

        manager
            .create_table(
                Table::create()
                    .table(Releases::Table)
                    .col(big_pk_auto(Releases::Id))
                    .col(string(Releases::ComponentKind))
                    .col(string(Releases::Version))
                    .col(text(Releases::ImageUri))
                    .col(string(Releases::Sha256))
                    .col(big_integer(Releases::SizeBytes))
                    .col(json(Releases::Platforms))
                    .col(text(Releases::ReleaseNotes))
                    .col(string(Releases::QualificationState))
                    .col(text_null(Releases::StateReason))
                    .col(string(Releases::CreatedBy))
                    .col(timestamp_with_time_zone(Releases::CreatedAt))
                    .col(timestamp_with_time_zone(Releases::UpdatedAt))
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("uq_releases_kind_version")
                    .table(Releases::Table)
                    .col(Releases::ComponentKind)
                    .col(Releases::Version)
                    .unique()
                    .to_owned(),
            )
            .await?;

        manager
            .create_table(
                Table::create()
                    .table(QualificationResults::Table)
                    .col(big_pk_auto(QualificationResults::Id))
                    .col(big_integer(QualificationResults::ReleaseId))
                    .col(string(QualificationResults::Gate))
                    .col(boolean(QualificationResults::Passed))
                    .col(text(QualificationResults::Evidence))
                    .col(string(QualificationResults::RecordedBy))
                    .col(timestamp_with_time_zone(QualificationResults::RecordedAt))
                    .foreign_key(
                        ForeignKey::create()
                            .from(QualificationResults::Table, QualificationResults::ReleaseId)
                            .to(Releases::Table, Releases::Id)
                            .on_delete(ForeignKeyAction::Restrict),
                    )
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("idx_qualification_results_release_gate")
                    .table(QualificationResults::Table)
                    .col(QualificationResults::ReleaseId)
                    .col(QualificationResults::Gate)
                    .to_owned(),
            )
            .await?;

        manager
            .create_table(
                Table::create()
                    .table(Rollouts::Table)
                    .col(big_pk_auto(Rollouts::Id))
                    .col(big_integer(Rollouts::ReleaseId))
                    .col(string(Rollouts::PolicyName))
                    .col(string(Rollouts::PolicyCommit))
                    .col(string(Rollouts::PolicyBlob))
                    .col(string(Rollouts::State))
                    .col(text_null(Rollouts::StateReason))
                    .col(big_integer(Rollouts::Seed))
                    .col(string(Rollouts::CreatedBy))
                    .col(timestamp_with_time_zone(Rollouts::CreatedAt))
                    .col(timestamp_with_time_zone(Rollouts::UpdatedAt))
                    .foreign_key(
                        ForeignKey::create()
                            .from(Rollouts::Table, Rollouts::ReleaseId)
                            .to(Releases::Table, Releases::Id)
                            .on_delete(ForeignKeyAction::Restrict),
                    )
                    .to_owned(),
            )
            .await?;

        manager
            .create_table(
                Table::create()
                    .table(Waves::Table)
                    .col(big_pk_auto(Waves::Id))
                    .col(big_integer(Waves::RolloutId))
                    .col(integer(Waves::Position))
                    .col(string(Waves::Name))
                    .col(string(Waves::State))
                    .col(integer(Waves::NodeCount))
                    .col(big_integer(Waves::BakeSeconds))
                    .col(integer(Waves::ApprovalsRequired))
                    .col(timestamp_with_time_zone_null(Waves::StartedAt))
                    .col(timestamp_with_time_zone_null(Waves::BakeStartedAt))
                    .col(timestamp_with_time_zone_null(Waves::EndedAt))
                    .col(string_null(Waves::Decision))
                    .foreign_key(
                        ForeignKey::create()
                            .from(Waves::Table, Waves::RolloutId)
                            .to(Rollouts::Table, Rollouts::Id)
                            .on_delete(ForeignKeyAction::Cascade),
                    )
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("uq_waves_rollout_position")
                    .table(Waves::Table)
                    .col(Waves::RolloutId)
                    .col(Waves::Position)
                    .unique()
                    .to_owned(),
            )
            .await?;

        manager
            .create_table(
                Table::create()
                    .table(WaveApprovals::Table)
                    .col(big_pk_auto(WaveApprovals::Id))
                    .col(big_integer(WaveApprovals::WaveId))
                    .col(string(WaveApprovals::Approver))
                    .col(text_null(WaveApprovals::Comment))
                    .col(timestamp_with_time_zone(WaveApprovals::ApprovedAt))
                    .foreign_key(
                        ForeignKey::create()
                            .from(WaveApprovals::Table, WaveApprovals::WaveId)
                            .to(Waves::Table, Waves::Id)
                            .on_delete(ForeignKeyAction::Cascade),
                    )
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("uq_wave_approvals_wave_approver")
                    .table(WaveApprovals::Table)
                    .col(WaveApprovals::WaveId)
                    .col(WaveApprovals::Approver)
                    .unique()
                    .to_owned(),
            )
            .await?;

        manager
            .create_table(
                Table::create()
                    .table(UpdateSteps::Table)
                    .col(big_pk_auto(UpdateSteps::Id))
                    .col(big_integer(UpdateSteps::RolloutId))
                    .col(big_integer(UpdateSteps::WaveId))
                    .col(big_integer(UpdateSteps::NodeId))
                    .col(string(UpdateSteps::InventoryId))
                    .col(string(UpdateSteps::Purpose))
                    .col(string(UpdateSteps::ExpectedFromVersion))
                    .col(string(UpdateSteps::TargetVersion))
                    .col(text(UpdateSteps::ImageUri))
                    .col(string(UpdateSteps::ImageSha256))
                    .col(string(UpdateSteps::State))
                    .col(text_null(UpdateSteps::TaskUri))
                    .col(integer(UpdateSteps::Attempts).default(0))
                    .col(timestamp_with_time_zone_null(UpdateSteps::NextAttemptAt))
                    .col(text_null(UpdateSteps::Error))
                    .col(timestamp_with_time_zone(UpdateSteps::CreatedAt))
                    .col(timestamp_with_time_zone(UpdateSteps::UpdatedAt))
                    .foreign_key(
                        ForeignKey::create()
                            .from(UpdateSteps::Table, UpdateSteps::WaveId)
                            .to(Waves::Table, Waves::Id)
                            .on_delete(ForeignKeyAction::Cascade),
                    )
                    .foreign_key(
                        ForeignKey::create()
                            .from(UpdateSteps::Table, UpdateSteps::NodeId)
                            .to(Nodes::Table, Nodes::Id)
                            .on_delete(ForeignKeyAction::Restrict),
                    )
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("uq_update_steps_wave_node_component_purpose")
                    .table(UpdateSteps::Table)
                    .col(UpdateSteps::WaveId)
                    .col(UpdateSteps::NodeId)
                    .col(UpdateSteps::InventoryId)
                    .col(UpdateSteps::Purpose)
                    .unique()
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("idx_update_steps_rollout_state")
                    .table(UpdateSteps::Table)
                    .col(UpdateSteps::RolloutId)
                    .col(UpdateSteps::State)
                    .to_owned(),
            )
            .await?;

        manager
            .create_table(
                Table::create()
                    .table(Users::Table)
                    .col(big_pk_auto(Users::Id))
                    .col(string_uniq(Users::Username))
                    .col(string(Users::DisplayName))
                    .col(string(Users::Role))
                    .col(text_null(Users::PasswordHash))
                    .col(boolean(Users::Disabled))
                    .col(timestamp_with_time_zone(Users::CreatedAt))
                    .to_owned(),
            )
            .await?;

        manager
            .create_table(
                Table::create()
                    .table(AuditLog::Table)
                    .col(big_pk_auto(AuditLog::Id))
                    .col(timestamp_with_time_zone(AuditLog::At))
                    .col(string(AuditLog::Actor))
                    .col(string(AuditLog::Action))
                    .col(string(AuditLog::SubjectType))
                    .col(string(AuditLog::SubjectId))
                    .col(json(AuditLog::Details))
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                Index::create()
                    .name("idx_audit_log_subject")
                    .table(AuditLog::Table)
                    .col(AuditLog::SubjectType)
                    .col(AuditLog::SubjectId)
                    .to_owned(),
            )
            .await?;

        forbid_audit_log_changes(manager).await
    }
}

/// The audit log is evidence; the database itself refuses to change or
/// delete an entry, so no code path (or hand-typed SQL) can rewrite history.
async fn forbid_audit_log_changes(manager: &SchemaManager<'_>) -> Result<(), DbErr> {
    let db = manager.get_connection();
    match manager.get_database_backend() {
        DbBackend::Sqlite => {
            for op in ["UPDATE", "DELETE"] {
                db.execute_unprepared(&format!(
                    "CREATE TRIGGER audit_log_no_{lower} BEFORE {op} ON audit_log \
                     BEGIN SELECT RAISE(ABORT, 'audit_log is append-only'); END;",
                    lower = op.to_lowercase()
                ))
                .await?;
            }
        }
        DbBackend::Postgres => {
            db.execute_unprepared(
                "CREATE FUNCTION audit_log_append_only() RETURNS trigger LANGUAGE plpgsql AS $$ \
                 BEGIN RAISE EXCEPTION 'audit_log is append-only'; END; $$;",
            )
            .await?;
            db.execute_unprepared(
                "CREATE TRIGGER audit_log_append_only BEFORE UPDATE OR DELETE ON audit_log \
                 FOR EACH ROW EXECUTE FUNCTION audit_log_append_only();",
            )
            .await?;
        }
        other => return Err(DbErr::Migration(format!("unsupported database backend {other:?}"))),
    }
    Ok(())
}

#[derive(DeriveIden)]
enum Nodes {
    Table,
    Id,
    Name,
    BmcUrl,
    CredentialRef,
    PlatformSku,
    Region,
    Cluster,
    Rack,
    NvlinkDomain,
    State,
    StateReason,
    LastDiscoveredAt,
    LastDiscoveryError,
    CreatedAt,
    UpdatedAt,
}

#[derive(DeriveIden)]
enum NodeComponents {
    Table,
    Id,
    NodeId,
    InventoryId,
    Kind,
    Version,
    Updateable,
    SoftwareId,
    Health,
    LastReadAt,
}

#[derive(DeriveIden)]
enum Releases {
    Table,
    Id,
    ComponentKind,
    Version,
    ImageUri,
    Sha256,
    SizeBytes,
    Platforms,
    ReleaseNotes,
    QualificationState,
    StateReason,
    CreatedBy,
    CreatedAt,
    UpdatedAt,
}

#[derive(DeriveIden)]
enum QualificationResults {
    Table,
    Id,
    ReleaseId,
    Gate,
    Passed,
    Evidence,
    RecordedBy,
    RecordedAt,
}

#[derive(DeriveIden)]
enum Rollouts {
    Table,
    Id,
    ReleaseId,
    PolicyName,
    PolicyCommit,
    PolicyBlob,
    State,
    StateReason,
    Seed,
    CreatedBy,
    CreatedAt,
    UpdatedAt,
}

#[derive(DeriveIden)]
enum Waves {
    Table,
    Id,
    RolloutId,
    Position,
    Name,
    State,
    NodeCount,
    BakeSeconds,
    ApprovalsRequired,
    StartedAt,
    BakeStartedAt,
    EndedAt,
    Decision,
}

#[derive(DeriveIden)]
enum WaveApprovals {
    Table,
    Id,
    WaveId,
    Approver,
    Comment,
    ApprovedAt,
}

#[derive(DeriveIden)]
enum UpdateSteps {
    Table,
    Id,
    RolloutId,
    WaveId,
    NodeId,
    InventoryId,
    Purpose,
    ExpectedFromVersion,
    TargetVersion,
    ImageUri,
    ImageSha256,
    State,
    TaskUri,
    Attempts,
    NextAttemptAt,
    Error,
    CreatedAt,
    UpdatedAt,
}

#[derive(DeriveIden)]
enum Users {
    Table,
    Id,
    Username,
    DisplayName,
    Role,
    PasswordHash,
    Disabled,
    CreatedAt,
}

#[derive(DeriveIden)]
enum AuditLog {
    Table,
    Id,
    At,
    Actor,
    Action,
    SubjectType,
    SubjectId,
    Details,
}
