use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, DeriveEntityModel)]
#[sea_orm(table_name = "rma_cluster_scans")]
pub struct Model {
    #[sea_orm(primary_key)]
    pub id: i64,
    pub period_start: DateTimeUtc,
    pub period_end: DateTimeUtc,
    pub scanned_at: DateTimeUtc,
    pub report_json: Json,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
