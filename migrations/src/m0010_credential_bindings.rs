//! Credential profiles bound to hosts on first import (issue 24 #1): a
//! profile whose configuration lists no `hosts` is bound to the hosts of the
//! nodes it was first imported with, durably, so a later node on a new host
//! gets no password until an admin extends the binding.

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
                    .table(CredentialHostBindings::Table)
                    // The node's `credential_ref`.
                    .col(string(CredentialHostBindings::Profile))
                    // A host as the URL parser prints it (lower-case name,
                    // dotted IPv4, bracketed IPv6).
                    .col(string(CredentialHostBindings::Host))
                    .col(timestamp_with_time_zone(CredentialHostBindings::BoundAt))
                    .col(string(CredentialHostBindings::BoundBy))
                    .primary_key(
                        Index::create()
                            .col(CredentialHostBindings::Profile)
                            .col(CredentialHostBindings::Host),
                    )
                    .to_owned(),
            )
            .await
    }
}

#[derive(DeriveIden)]
enum CredentialHostBindings {
    Table,
    Profile,
    Host,
    BoundAt,
    BoundBy,
}
