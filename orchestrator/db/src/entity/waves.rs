use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, DeriveEntityModel)]
#[sea_orm(table_name = "waves")]
pub struct Model {
    #[sea_orm(primary_key)]
    pub id: i64,
    pub rollout_id: i64,
    pub position: i32,
    pub name: String,
    pub state: String,
    pub node_count: i32,
    pub bake_seconds: i64,
    pub approvals_required: i32,
    pub started_at: Option<DateTimeUtc>,
    pub bake_started_at: Option<DateTimeUtc>,
    pub ended_at: Option<DateTimeUtc>,
    pub decision: Option<String>,
    pub kind: String,
    pub state_reason: Option<String>,
    pub blockers: Option<Json>,
    pub gates: Option<Json>,
    pub control_nodes: Option<Json>,
    pub verdict: Option<Json>,
    pub scope: Option<Json>,
    pub max_in_flight: i32,
    pub role: Option<String>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
