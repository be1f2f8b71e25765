use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, DeriveEntityModel)]
#[sea_orm(table_name = "node_components")]
pub struct Model {
    #[sea_orm(primary_key)]
    pub id: i64,
    pub node_id: i64,
    pub inventory_id: String,
    pub kind: String,
    pub version: String,
    pub updateable: bool,
    pub software_id: Option<String>,
    pub health: Option<String>,
    pub lowest_supported_version: Option<String>,
    pub last_read_at: DateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
