use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, DeriveEntityModel)]
#[sea_orm(table_name = "nodes")]
pub struct Model {
    #[sea_orm(primary_key)]
    pub id: i64,
    #[sea_orm(unique)]
    pub name: String,
    pub bmc_url: String,
    pub credential_ref: String,
    pub platform_sku: String,
    pub region: String,
    pub cluster: String,
    pub rack: String,
    pub nvlink_domain: String,
    pub state: String,
    pub state_reason: Option<String>,
    pub last_discovered_at: Option<DateTimeUtc>,
    pub last_discovery_error: Option<String>,
    pub created_at: DateTimeUtc,
    pub updated_at: DateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
