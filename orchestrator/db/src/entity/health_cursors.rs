use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, DeriveEntityModel)]
#[sea_orm(table_name = "health_cursors")]
pub struct Model {
    #[sea_orm(primary_key)]
    pub id: i64,
    pub rollout_id: i64,
    pub wave_id: i64,
    pub node_id: i64,
    pub cohort: String,
    pub exposure_start: DateTimeUtc,
    pub accounted_until: DateTimeUtc,
    pub event_cursor: Option<Json>,
    pub gpus: i32,
    pub polls: i64,
    pub last_error: Option<String>,
    pub updated_at: DateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
