use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, DeriveEntityModel)]
#[sea_orm(table_name = "credential_host_bindings")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub profile: String,
    #[sea_orm(primary_key, auto_increment = false)]
    pub host: String,
    pub bound_at: DateTimeUtc,
    pub bound_by: String,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
