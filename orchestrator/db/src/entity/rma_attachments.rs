use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, DeriveEntityModel)]
#[sea_orm(table_name = "rma_attachments")]
pub struct Model {
    #[sea_orm(primary_key)]
    pub id: i64,
    pub case_id: String,
    pub name: String,
    pub kind: String,
    pub content: Vec<u8>,
    pub sha256: String,
    pub size_bytes: i64,
    pub added_by: String,
    pub added_at: DateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
