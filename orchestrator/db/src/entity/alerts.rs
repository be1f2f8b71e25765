use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, DeriveEntityModel)]
#[sea_orm(table_name = "alerts")]
pub struct Model {
    #[sea_orm(primary_key)]
    pub id: i64,
    pub fingerprint: String,
    pub status: String,
    pub starts_at: DateTimeUtc,
    pub ends_at: Option<DateTimeUtc>,
    pub alertname: String,
    pub labels: Json,
    pub annotations: Json,
    pub generator_url: Option<String>,
    pub receiver: String,
    pub group_key: String,
    pub received_at: DateTimeUtc,
    pub processed_at: Option<DateTimeUtc>,
    pub outcome: Option<Json>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
