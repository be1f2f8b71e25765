use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, DeriveEntityModel)]
#[sea_orm(table_name = "wave_approvals")]
pub struct Model {
    #[sea_orm(primary_key)]
    pub id: i64,
    pub wave_id: i64,
    pub approver: String,
    pub comment: Option<String>,
    pub approved_at: DateTimeUtc,
    pub wave_state: Option<String>,
    pub verdict_outcome: Option<String>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
