use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, DeriveEntityModel)]
#[sea_orm(table_name = "qualification_results")]
pub struct Model {
    #[sea_orm(primary_key)]
    pub id: i64,
    pub release_id: i64,
    pub gate: String,
    pub passed: bool,
    pub evidence: String,
    pub recorded_by: String,
    pub recorded_at: DateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
