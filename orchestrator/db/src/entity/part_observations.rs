use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, DeriveEntityModel)]
#[sea_orm(table_name = "part_observations")]
pub struct Model {
    #[sea_orm(primary_key)]
    pub id: i64,
    pub serial: String,
    pub at: DateTimeUtc,
    pub source_id: String,
    pub kind_json: Json,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
