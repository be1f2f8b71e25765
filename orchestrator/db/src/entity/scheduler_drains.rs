use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, DeriveEntityModel)]
#[sea_orm(table_name = "scheduler_drains")]
pub struct Model {
    #[sea_orm(primary_key)]
    pub id: i64,
    pub rollout_id: i64,
    pub wave_id: i64,
    pub step_id: i64,
    pub node_id: i64,
    pub scheduler_kind: String,
    pub scheduler_node: String,
    pub phase: String,
    pub reason_text: String,
    pub observed_before: Option<Json>,
    pub last_seen: Option<Json>,
    pub drain_started_at: DateTimeUtc,
    pub held_at: Option<DateTimeUtc>,
    pub resume_intended_at: Option<DateTimeUtc>,
    pub closed_at: Option<DateTimeUtc>,
    pub close_reason: Option<String>,
    pub updated_at: DateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
