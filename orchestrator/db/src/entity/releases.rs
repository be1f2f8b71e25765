use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, DeriveEntityModel)]
#[sea_orm(table_name = "releases")]
pub struct Model {
    #[sea_orm(primary_key)]
    pub id: i64,
    pub component_kind: String,
    pub version: String,
    pub image_uri: String,
    pub sha256: String,
    pub size_bytes: i64,
    pub platforms: Json,
    pub release_notes: String,
    pub qualification_state: String,
    pub state_reason: Option<String>,
    pub downgrade_forbidden: Option<String>,
    pub rollback_floor: Option<String>,
    pub created_by: String,
    pub created_at: DateTimeUtc,
    pub updated_at: DateTimeUtc,
    pub fleet_proven_by: Option<i64>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
