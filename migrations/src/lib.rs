//! Schema migrations, written once for SQLite and PostgreSQL.
//!
//! Invariant: a migration that has landed on `main` is never edited; change
//! the schema with a new migration. Backend-specific SQL (triggers) is chosen
//! inside a migration from `manager.get_database_backend()`, so there is still
//! one ordered list of migrations for both backends.

pub use sea_orm_migration::prelude::*;

mod m0001_foundation;
mod m0002_policies;
mod m0003_execution;
mod m0004_health;
mod m0005_alerts;
mod m0006_auth;
mod m0007_release_rollback;
mod m0008_wave_decisions;
mod m0009_hardening;
mod m0010_credential_bindings;
mod m0011_scheduler_drains;
mod m0012_rma_cases;
mod m0013_rma_parts;
mod m0014_page_indexes;
mod m0015_health_retention;
mod m0016_soak;
mod m0017_control_rate_indexes;

/// Every migration, oldest first.
#[derive(Debug)]
pub struct Migrator;

#[async_trait::async_trait]
impl MigratorTrait for Migrator {
    fn migrations() -> Vec<Box<dyn MigrationTrait>> {
        vec![
            Box::new(m0001_foundation::Migration),
            Box::new(m0002_policies::Migration),
            Box::new(m0003_execution::Migration),
            Box::new(m0004_health::Migration),
            Box::new(m0005_alerts::Migration),
            Box::new(m0006_auth::Migration),
            Box::new(m0007_release_rollback::Migration),
            Box::new(m0008_wave_decisions::Migration),
            Box::new(m0009_hardening::Migration),
            Box::new(m0010_credential_bindings::Migration),
            Box::new(m0011_scheduler_drains::Migration),
            Box::new(m0012_rma_cases::Migration),
            Box::new(m0013_rma_parts::Migration),
            Box::new(m0014_page_indexes::Migration),
            Box::new(m0015_health_retention::Migration),
            Box::new(m0016_soak::Migration),
            Box::new(m0017_control_rate_indexes::Migration),
        ]
    }
}
