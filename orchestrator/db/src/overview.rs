//! Aggregates for the fleet overview page, computed in the database so the
//! page stays cheap on a fleet of 100,000 nodes.

use std::collections::BTreeMap;

use chrono::{DateTime, NaiveDate, Utc};
use sea_orm::sea_query::{Expr, Func};
use sea_orm::{ColumnTrait, EntityTrait, JoinType, QueryFilter, QuerySelect};
use serde::{Deserialize, Serialize};

use crate::entity::{node_components, nodes, update_steps};
use crate::{Db, DbError};

/// How many nodes run one firmware version of one component kind on one SKU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VersionCount {
    pub platform_sku: String,
    pub kind: String,
    pub version: String,
    pub nodes: u64,
}

/// Finished update steps on one day.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DailyOutcomes {
    pub day: NaiveDate,
    pub succeeded: u64,
    pub failed: u64,
}

impl Db {
    /// Firmware version distribution per SKU and component kind.
    pub async fn version_distribution(&self) -> Result<Vec<VersionCount>, DbError> {
        let rows: Vec<(String, String, String, i64)> = node_components::Entity::find()
            .select_only()
            .column(nodes::Column::PlatformSku)
            .column(node_components::Column::Kind)
            .column(node_components::Column::Version)
            .column_as(
                Expr::expr(Func::count_distinct(Expr::col((
                    node_components::Entity,
                    node_components::Column::NodeId,
                )))),
                "n",
            )
            .join(JoinType::InnerJoin, component_node_relation())
            .group_by(nodes::Column::PlatformSku)
            .group_by(node_components::Column::Kind)
            .group_by(node_components::Column::Version)
            .into_tuple()
            .all(&self.conn)
            .await?;
        let mut counts: Vec<VersionCount> = rows
            .into_iter()
            .map(|(platform_sku, kind, version, n)| VersionCount {
                platform_sku,
                kind,
                version,
                nodes: u64::try_from(n).unwrap_or(0),
            })
            .collect();
        counts.sort_by(|a, b| (&a.platform_sku, &a.kind, &a.version).cmp(&(&b.platform_sku, &b.kind, &b.version)));
        Ok(counts)
    }

    /// Succeeded and failed update steps per day since `since`, oldest first.
    pub async fn daily_step_outcomes(&self, since: DateTime<Utc>) -> Result<Vec<DailyOutcomes>, DbError> {
        let rows: Vec<(String, Option<DateTime<Utc>>)> = update_steps::Entity::find()
            .select_only()
            .column(update_steps::Column::State)
            .column(update_steps::Column::FinishedAt)
            .filter(update_steps::Column::FinishedAt.gte(since))
            .filter(update_steps::Column::State.is_in(["succeeded", "failed"]))
            .into_tuple()
            .all(&self.conn)
            .await?;
        let mut days: BTreeMap<NaiveDate, DailyOutcomes> = BTreeMap::new();
        for (state, finished) in rows {
            let Some(finished) = finished else { continue };
            let day = finished.date_naive();
            let entry = days.entry(day).or_insert(DailyOutcomes {
                day,
                succeeded: 0,
                failed: 0,
            });
            if state == "failed" {
                entry.failed += 1;
            } else {
                entry.succeeded += 1;
            }
        }
        Ok(days.into_values().collect())
    }
}

fn component_node_relation() -> sea_orm::RelationDef {
    // The entities declare no relations; components and nodes are joined here only.
    node_components::Entity::belongs_to(nodes::Entity)
        .from(node_components::Column::NodeId)
        .to(nodes::Column::Id)
        .into()
}
