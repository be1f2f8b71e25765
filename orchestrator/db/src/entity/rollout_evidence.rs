use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, DeriveEntityModel)]
#[sea_orm(table_name = "rollout_evidence")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub rollout_id: i64,
    pub rollout_state: String,
    pub sha256: String,
    pub size_bytes: i64,
    pub archive: Vec<u8>,
    pub created_at: DateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
