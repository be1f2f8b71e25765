use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, DeriveEntityModel)]
#[sea_orm(table_name = "rollouts")]
pub struct Model {
    #[sea_orm(primary_key)]
    pub id: i64,
    pub release_id: i64,
    pub policy_name: String,
    pub policy_commit: String,
    pub policy_blob: String,
    pub state: String,
    pub state_reason: Option<String>,
    pub seed: i64,
    pub created_by: String,
    pub created_at: DateTimeUtc,
    pub updated_at: DateTimeUtc,
    pub policy_source: Option<String>,
    pub rollback_assessment: Option<Json>,
    pub blockers: Option<Json>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
