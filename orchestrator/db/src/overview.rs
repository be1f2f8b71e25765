//! Aggregates for the fleet overview page and the node pages, computed in
//! the database so the pages stay cheap on a fleet of 100,000 nodes: every
//! list is filtered and paged by the query, never by scanning all nodes.

use std::collections::BTreeMap;

use chrono::{DateTime, NaiveDate, Utc};
use orchestrator_types::{NodeId, NodeState};
use sea_orm::sea_query::{Expr, Func, Query};
use sea_orm::{ColumnTrait, EntityTrait, JoinType, PaginatorTrait, QueryFilter, QueryOrder, QuerySelect};
use serde::{Deserialize, Serialize};

use crate::cache::{FinishedByDay, Mark};
use crate::entity::{node_components, nodes, update_steps};
use crate::model::Node;
use crate::nodes::to_node;
use crate::{Backend, Db, DbError};

/// Most nodes one node page shows; more is paging.
pub const MAX_NODE_PAGE_ROWS: u64 = 500;

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

/// Which nodes a node page lists. Every filter is applied by the query.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodePageQuery {
    /// Substring of the node name.
    pub name_contains: Option<String>,
    pub platform_sku: Option<String>,
    pub state: Option<NodeState>,
    /// Nodes with at least one component reading exactly this version text.
    pub version: Option<String>,
    pub offset: u64,
    /// Rows wanted, at most [`MAX_NODE_PAGE_ROWS`].
    pub limit: u64,
}

/// One component kind at one version on a node, with how many of the
/// node's components read it (eight GPUs at one version are one row).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeVersion {
    pub kind: String,
    pub version: String,
    pub components: u64,
}

/// A node with a summary of its firmware, for lists.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeSummary {
    #[serde(flatten)]
    pub node: Node,
    pub versions: Vec<NodeVersion>,
}

/// One page of nodes and how many matched in all.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodePage {
    pub nodes: Vec<NodeSummary>,
    pub total: u64,
}

// In `model`, below the kept aggregates (`cache`) that hold it.
pub use crate::model::NodeCounts;

/// Finished update steps to one firmware version on one day.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VersionDailyOutcomes {
    pub version: String,
    pub day: NaiveDate,
    pub succeeded: u64,
    pub failed: u64,
}

impl Db {
    /// One page of nodes by name, filtered in the database, with the total
    /// that matched and each listed node's versions (one more query for the
    /// page, not one per node).
    pub async fn node_page(&self, query: &NodePageQuery) -> Result<NodePage, DbError> {
        let mut select = nodes::Entity::find();
        if let Some(state) = query.state {
            select = select.filter(nodes::Column::State.eq(state.as_str()));
        }
        if let Some(sku) = &query.platform_sku {
            select = select.filter(nodes::Column::PlatformSku.eq(sku.as_str()));
        }
        if let Some(fragment) = &query.name_contains {
            select = select.filter(nodes::Column::Name.contains(fragment.as_str()));
        }
        if let Some(version) = &query.version {
            select = select.filter(
                nodes::Column::Id.in_subquery(
                    Query::select()
                        .column(node_components::Column::NodeId)
                        .from(node_components::Entity)
                        .and_where(node_components::Column::Version.eq(version.as_str()))
                        .to_owned(),
                ),
            );
        }
        let total = select.clone().count(&self.reader).await?;
        let rows = select
            .order_by_asc(nodes::Column::Name)
            .offset(query.offset)
            .limit(query.limit.clamp(1, MAX_NODE_PAGE_ROWS))
            .all(&self.reader)
            .await?;
        let ids: Vec<i64> = rows.iter().map(|r| r.id).collect();
        let mut versions = self.versions_of(&ids).await?;
        let nodes = rows
            .into_iter()
            .map(|row| {
                let versions = versions.remove(&row.id).unwrap_or_default();
                Ok(NodeSummary {
                    node: to_node(row)?,
                    versions,
                })
            })
            .collect::<Result<Vec<_>, DbError>>()?;
        Ok(NodePage { nodes, total })
    }

    /// Per node id, its component kinds and versions with counts.
    async fn versions_of(&self, ids: &[i64]) -> Result<BTreeMap<i64, Vec<NodeVersion>>, DbError> {
        let mut out: BTreeMap<i64, Vec<NodeVersion>> = BTreeMap::new();
        if ids.is_empty() {
            return Ok(out);
        }
        let rows: Vec<(i64, String, String, i64)> = node_components::Entity::find()
            .select_only()
            .column(node_components::Column::NodeId)
            .column(node_components::Column::Kind)
            .column(node_components::Column::Version)
            .column_as(node_components::Column::Id.count(), "n")
            .filter(node_components::Column::NodeId.is_in(ids.to_vec()))
            .group_by(node_components::Column::NodeId)
            .group_by(node_components::Column::Kind)
            .group_by(node_components::Column::Version)
            .order_by_asc(node_components::Column::Kind)
            .order_by_asc(node_components::Column::Version)
            .into_tuple()
            .all(&self.reader)
            .await?;
        for (node, kind, version, n) in rows {
            out.entry(node).or_default().push(NodeVersion {
                kind,
                version,
                components: u64::try_from(n).unwrap_or(0),
            });
        }
        Ok(out)
    }

    /// Node counts per state and of failed inventory reads: two grouped
    /// counts instead of listing nodes, kept until a node may have changed
    /// (the same mark as [`Db::version_distribution`]): at 100,000 nodes
    /// the discovery errors are a full scan, and the dashboard asks on
    /// every request.
    pub async fn node_counts(&self) -> Result<NodeCounts, DbError> {
        let cache = &self.caches.node_counts;
        let mark = self.fleet_mark(cache.generation()).await?;
        cache.get_or_read((), mark, || self.read_node_counts()).await
    }

    async fn read_node_counts(&self) -> Result<NodeCounts, DbError> {
        let rows: Vec<(String, i64)> = nodes::Entity::find()
            .select_only()
            .column(nodes::Column::State)
            .column_as(nodes::Column::Id.count(), "n")
            .group_by(nodes::Column::State)
            .into_tuple()
            .all(&self.reader)
            .await?;
        let by_state: BTreeMap<String, u64> = rows
            .into_iter()
            .map(|(state, n)| (state, u64::try_from(n).unwrap_or(0)))
            .collect();
        let discovery_errors = nodes::Entity::find()
            .filter(nodes::Column::LastDiscoveryError.is_not_null())
            .count(&self.reader)
            .await?;
        Ok(NodeCounts {
            total: by_state.values().sum(),
            by_state,
            discovery_errors,
        })
    }

    /// Up to `limit` nodes whose last inventory read failed, by name; kept
    /// as [`Db::node_counts`] is (finding them scans every node).
    pub async fn nodes_with_discovery_errors(&self, limit: u64) -> Result<Vec<Node>, DbError> {
        let limit = limit.min(MAX_NODE_PAGE_ROWS);
        let cache = &self.caches.discovery_errors;
        let mark = self.fleet_mark(cache.generation()).await?;
        cache
            .get_or_read(limit, mark, || self.read_nodes_with_discovery_errors(limit))
            .await
    }

    async fn read_nodes_with_discovery_errors(&self, limit: u64) -> Result<Vec<Node>, DbError> {
        nodes::Entity::find()
            .filter(nodes::Column::LastDiscoveryError.is_not_null())
            .order_by_asc(nodes::Column::Name)
            .limit(limit)
            .all(&self.reader)
            .await?
            .into_iter()
            .map(to_node)
            .collect()
    }

    /// Succeeded and failed update steps (not rollbacks) per target version
    /// and day since `since`, by version then day.
    pub async fn daily_outcomes_by_version(&self, since: DateTime<Utc>) -> Result<Vec<VersionDailyOutcomes>, DbError> {
        let mut cells: BTreeMap<(String, NaiveDate), (u64, u64)> = BTreeMap::new();
        for (version, day, failed, n) in self.finished_steps_by_day(since, true).await? {
            let cell = cells.entry((version, day)).or_default();
            if failed {
                cell.1 += n;
            } else {
                cell.0 += n;
            }
        }
        Ok(cells
            .into_iter()
            .map(|((version, day), (succeeded, failed))| VersionDailyOutcomes {
                version,
                day,
                succeeded,
                failed,
            })
            .collect())
    }

    /// Finished steps since `since` counted by the database per target
    /// version, UTC day and outcome (failed or succeeded): a few rows for
    /// the trends, however many steps finished. Update steps only when
    /// `updates_only`. Kept until a step finishes: the newest finish time
    /// (the leading column of an index) or this process's step writes move.
    /// (A finish another controller stamps older than the newest one, its
    /// clock being behind, shows with the next finish.)
    async fn finished_steps_by_day(&self, since: DateTime<Utc>, updates_only: bool) -> Result<FinishedByDay, DbError> {
        let cache = &self.caches.finished_by_day;
        let generation = cache.generation();
        let newest: Option<Option<DateTime<Utc>>> = update_steps::Entity::find()
            .select_only()
            .column_as(update_steps::Column::FinishedAt.max(), "m")
            .into_tuple()
            .one(&self.reader)
            .await?;
        let mark = Mark {
            generation,
            stamps: [newest.flatten(), None],
            max_id: None,
        };
        cache
            .get_or_read((since, updates_only), mark, || {
                self.read_finished_steps_by_day(since, updates_only)
            })
            .await
    }

    async fn read_finished_steps_by_day(
        &self,
        since: DateTime<Utc>,
        updates_only: bool,
    ) -> Result<FinishedByDay, DbError> {
        // The UTC day as `YYYY-MM-DD` text on both backends.
        let day = match self.backend() {
            Backend::Sqlite => "date(finished_at)",
            Backend::Postgres => "to_char(finished_at AT TIME ZONE 'UTC', 'YYYY-MM-DD')",
        };
        let mut query = update_steps::Entity::find()
            .select_only()
            .column(update_steps::Column::TargetVersion)
            .column_as(Expr::cust(day), "day")
            .column(update_steps::Column::State)
            .column_as(update_steps::Column::Id.count(), "n")
            .filter(update_steps::Column::FinishedAt.gte(since))
            .filter(update_steps::Column::State.is_in(["succeeded", "failed"]));
        if updates_only {
            query = query.filter(update_steps::Column::Purpose.eq("update"));
        }
        let rows: Vec<(String, Option<String>, String, i64)> = query
            .group_by(update_steps::Column::TargetVersion)
            .group_by(Expr::cust(day))
            .group_by(update_steps::Column::State)
            .into_tuple()
            .all(&self.reader)
            .await?;
        rows.into_iter()
            .filter_map(|(version, day, state, n)| {
                let day = day?;
                Some(
                    NaiveDate::parse_from_str(&day, "%Y-%m-%d")
                        .map_err(|e| DbError::corrupt("step finish time", e))
                        .map(|day| (version, day, state == "failed", u64::try_from(n).unwrap_or(0))),
                )
            })
            .collect()
    }

    /// Node names by id, for showing names where records keep ids.
    pub async fn node_names(&self, ids: &[NodeId]) -> Result<BTreeMap<NodeId, String>, DbError> {
        let mut out = BTreeMap::new();
        // In chunks: both backends cap the bind parameters of one statement.
        for chunk in ids.chunks(10_000) {
            let rows: Vec<(i64, String)> = nodes::Entity::find()
                .select_only()
                .column(nodes::Column::Id)
                .column(nodes::Column::Name)
                .filter(nodes::Column::Id.is_in(chunk.iter().map(|id| id.0).collect::<Vec<_>>()))
                .into_tuple()
                .all(&self.reader)
                .await?;
            out.extend(rows.into_iter().map(|(id, name)| (NodeId(id), name)));
        }
        Ok(out)
    }

    /// Firmware version distribution per SKU and component kind.
    ///
    /// Counting distinct nodes per version reads every inventory row (nine
    /// per node: 900,000 at 100,000 nodes), so the answer is kept and read
    /// again only when the inventory or the nodes may have changed: when
    /// the newest inventory reading, the newest node change or the highest
    /// node id moved (indexed maxima, cheap on both backends; every write of
    /// inventory or of a node's SKU stamps them, in this process or another
    /// controller's), or when this process wrote inventory or nodes itself
    /// (a manual clock need not move between two writes).
    pub async fn version_distribution(&self) -> Result<Vec<VersionCount>, DbError> {
        let cache = &self.caches.versions;
        let mark = self.fleet_mark(cache.generation()).await?;
        let rows = cache.get_or_read((), mark, || self.read_version_distribution()).await?;
        Ok(rows
            .into_iter()
            .map(|(platform_sku, kind, version, nodes)| VersionCount {
                platform_sku,
                kind,
                version,
                nodes,
            })
            .collect())
    }

    /// The mark of everything kept about the nodes (versions, counts,
    /// failed reads): the newest inventory reading, the newest node change
    /// and the highest node id, with `generation`, read first from the
    /// cache the mark is for.
    async fn fleet_mark(&self, generation: u64) -> Result<Mark, DbError> {
        let last_read: Option<Option<DateTime<Utc>>> = node_components::Entity::find()
            .select_only()
            .column_as(node_components::Column::LastReadAt.max(), "m")
            .into_tuple()
            .one(&self.reader)
            .await?;
        let (node_updated, max_node): (Option<DateTime<Utc>>, Option<i64>) = nodes::Entity::find()
            .select_only()
            .column_as(nodes::Column::UpdatedAt.max(), "u")
            .column_as(nodes::Column::Id.max(), "i")
            .into_tuple()
            .one(&self.reader)
            .await?
            .unwrap_or((None, None));
        Ok(Mark {
            generation,
            stamps: [last_read.flatten(), node_updated],
            max_id: max_node,
        })
    }

    /// Says the inventory or the nodes changed, so the next
    /// [`Db::version_distribution`], [`Db::node_counts`] and
    /// [`Db::nodes_with_discovery_errors`] read them again. Every writer of
    /// nodes or inventory calls it after committing.
    pub(crate) fn nodes_changed(&self) {
        self.caches.versions.changed();
        self.caches.node_counts.changed();
        self.caches.discovery_errors.changed();
    }

    async fn read_version_distribution(&self) -> Result<Vec<(String, String, String, u64)>, DbError> {
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
            .all(&self.reader)
            .await?;
        let mut counts: Vec<(String, String, String, u64)> = rows
            .into_iter()
            .map(|(sku, kind, version, n)| (sku, kind, version, u64::try_from(n).unwrap_or(0)))
            .collect();
        counts.sort();
        Ok(counts)
    }

    /// Succeeded and failed update steps per day since `since`, oldest first.
    pub async fn daily_step_outcomes(&self, since: DateTime<Utc>) -> Result<Vec<DailyOutcomes>, DbError> {
        let mut days: BTreeMap<NaiveDate, DailyOutcomes> = BTreeMap::new();
        for (_, day, failed, n) in self.finished_steps_by_day(since, false).await? {
            let entry = days.entry(day).or_insert(DailyOutcomes {
                day,
                succeeded: 0,
                failed: 0,
            });
            if failed {
                entry.failed += n;
            } else {
                entry.succeeded += n;
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
