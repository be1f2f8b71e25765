use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, DeriveEntityModel)]
#[sea_orm(table_name = "update_steps")]
pub struct Model {
    #[sea_orm(primary_key)]
    pub id: i64,
    pub rollout_id: i64,
    pub wave_id: i64,
    pub node_id: i64,
    pub inventory_id: String,
    pub purpose: String,
    pub expected_from_version: String,
    pub target_version: String,
    pub image_uri: String,
    pub image_sha256: String,
    pub state: String,
    pub task_uri: Option<String>,
    pub attempts: i32,
    pub next_attempt_at: Option<DateTimeUtc>,
    pub error: Option<String>,
    pub created_at: DateTimeUtc,
    pub updated_at: DateTimeUtc,
    pub targets: Option<Json>,
    pub known_tasks: Option<Json>,
    pub previous_version: Option<String>,
    pub push_started_at: Option<DateTimeUtc>,
    pub reset_issued_at: Option<DateTimeUtc>,
    pub unreachable_since: Option<DateTimeUtc>,
    pub started_at: Option<DateTimeUtc>,
    pub finished_at: Option<DateTimeUtc>,
    pub rollback_of: Option<i64>,
    pub state_entered_at: Option<DateTimeUtc>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
