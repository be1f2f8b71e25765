//! Indexes for the fleet's base rates measured over history (issue 22): at every rollout start with
//! a soak, and for `policy power --history`, the control cohorts' events and exposure of the last 30
//! days are summed from the hourly samples and the retention pass's daily aggregates
//! (`Db::control_rate_totals`). Without them each start scans every sample ever kept; with them it
//! reads the recent control rows only. Both backends.

use sea_orm_migration::prelude::*;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let indexes = [
            Index::create()
                .name("idx_health_samples_cohort_window")
                .table(HealthSamples::Table)
                .col(HealthSamples::Cohort)
                .col(HealthSamples::WindowStart)
                .to_owned(),
            Index::create()
                .name("idx_health_daily_cohort_day")
                .table(HealthDaily::Table)
                .col(HealthDaily::Cohort)
                .col(HealthDaily::Day)
                .to_owned(),
        ];
        for index in indexes {
            manager.create_index(index).await?;
        }
        Ok(())
    }
}

#[derive(DeriveIden)]
enum HealthSamples {
    Table,
    Cohort,
    WindowStart,
}

#[derive(DeriveIden)]
enum HealthDaily {
    Table,
    Cohort,
    Day,
}
