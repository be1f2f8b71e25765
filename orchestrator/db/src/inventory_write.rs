//! The one writer of inventory readings: a node's components as a BMC's FirmwareInventory listed
//! them, and its discovery stamp. Discovery records one node at a time (`Db::record_discovered_inventory`,
//! in `nodes`); the engine records the read-back of every flash its group commit verifies, in that
//! commit (`execution::step_batch`). Its own module so that both can call it without `nodes` and
//! `execution` importing each other.

use std::collections::HashSet;

use orchestrator_types::NodeId;
use sea_orm::sea_query::OnConflict;
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter, Set};

use crate::DbError;
use crate::entity::{node_components, nodes};
use crate::model::DiscoveredComponent;

/// Node component rows one statement upserts: 9 columns a row keep it at 4,500 bind parameters.
const COMPONENT_ROWS_PER_STATEMENT: usize = 500;

/// Records inventory readings of several nodes inside the caller's transaction: each component's
/// reading replaces the previous one, and each node's discovery error is cleared. One multi-row
/// upsert per [`COMPONENT_ROWS_PER_STATEMENT`] rows and one update of the nodes, whatever the number
/// of nodes: the engine records the read-back of every step a group commit succeeds this way
/// (`execution::step_batch`), discovery one node at a time. The caller announces the change
/// (`Db::nodes_changed`) once it has committed.
pub(crate) async fn write_inventories<C: sea_orm::ConnectionTrait>(
    txn: &C,
    now: chrono::DateTime<chrono::Utc>,
    readings: &[(NodeId, &[DiscoveredComponent])],
) -> Result<(), DbError> {
    // Within one statement a row may be upserted only once (PostgreSQL refuses a second touch): a row
    // met again starts the next statement, so a component listed twice, or a node twice in
    // `readings`, keeps its last reading, as one-by-one upserts would.
    let mut chunk: Vec<node_components::ActiveModel> = Vec::new();
    let mut in_chunk: HashSet<(i64, &str)> = HashSet::new();
    for (id, components) in readings {
        for component in components.iter() {
            let key = (id.0, component.reading.inventory_id.as_str());
            if chunk.len() == COMPONENT_ROWS_PER_STATEMENT || in_chunk.contains(&key) {
                upsert_components(txn, std::mem::take(&mut chunk)).await?;
                in_chunk.clear();
            }
            in_chunk.insert(key);
            chunk.push(node_components::ActiveModel {
                node_id: Set(id.0),
                inventory_id: Set(component.reading.inventory_id.clone()),
                kind: Set(component.reading.kind.as_str().to_owned()),
                version: Set(component.reading.version.as_str().to_owned()),
                updateable: Set(component.reading.updateable),
                software_id: Set(component.reading.software_id.clone()),
                health: Set(component.reading.health.clone()),
                lowest_supported_version: Set(component.lowest_supported_version.clone()),
                last_read_at: Set(now),
                ..Default::default()
            });
        }
    }
    upsert_components(txn, chunk).await?;
    let ids: Vec<i64> = readings.iter().map(|(id, _)| id.0).collect();
    for ids in ids.chunks(COMPONENT_ROWS_PER_STATEMENT) {
        nodes::Entity::update_many()
            .col_expr(nodes::Column::LastDiscoveredAt, sea_orm::sea_query::Expr::value(now))
            .col_expr(
                nodes::Column::LastDiscoveryError,
                sea_orm::sea_query::Expr::value(Option::<String>::None),
            )
            .filter(nodes::Column::Id.is_in(ids.iter().copied()))
            .exec(txn)
            .await?;
    }
    Ok(())
}

async fn upsert_components<C: sea_orm::ConnectionTrait>(
    txn: &C,
    rows: Vec<node_components::ActiveModel>,
) -> Result<(), DbError> {
    if rows.is_empty() {
        return Ok(());
    }
    node_components::Entity::insert_many(rows)
        .on_conflict(
            OnConflict::columns([node_components::Column::NodeId, node_components::Column::InventoryId])
                .update_columns([
                    node_components::Column::Kind,
                    node_components::Column::Version,
                    node_components::Column::Updateable,
                    node_components::Column::SoftwareId,
                    node_components::Column::Health,
                    node_components::Column::LowestSupportedVersion,
                    node_components::Column::LastReadAt,
                ])
                .to_owned(),
        )
        .exec_without_returning(txn)
        .await?;
    Ok(())
}
