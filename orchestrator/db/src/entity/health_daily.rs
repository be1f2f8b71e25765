use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, DeriveEntityModel)]
#[sea_orm(table_name = "health_daily")]
pub struct Model {
    #[sea_orm(primary_key)]
    pub id: i64,
    pub rollout_id: i64,
    pub wave_id: i64,
    pub node_id: i64,
    pub cohort: String,
    pub metric: String,
    pub day: DateTimeUtc,
    pub windows: i64,
    pub events: i64,
    pub exposure: f64,
    pub readings: i64,
    pub sum: f64,
    pub min: Option<f64>,
    pub max: Option<f64>,
    pub units: Option<Json>,
    pub updated_at: DateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
