use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, DeriveEntityModel)]
#[sea_orm(table_name = "parts")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub serial: String,
    pub vendor: String,
    pub part_kind: String,
    pub part_number: String,
    pub model: Option<String>,
    pub node_name: String,
    pub slot: String,
    pub production_date: Option<DateTimeUtc>,
    pub lot: Option<String>,
    pub date_code: Option<String>,
    pub firmware_version: Option<String>,
    pub health: Option<String>,
    pub first_seen: DateTimeUtc,
    pub last_seen: DateTimeUtc,
    pub removed_at: Option<DateTimeUtc>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
