use axum::extract::State;
use orchestrator_db::drains::DrainRow;
use orchestrator_db::model::{Component, ImportOptions, ImportSummary, NewNode, Node, NodeFilter};
use orchestrator_types::{NodeState, Role};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::{Actor, ApiJson, ApiPath, ApiQuery};
use crate::AppState;
use crate::auth::Principal;
use crate::error::{ApiError, ErrorBody};

/// Filters for the node list.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct NodeQuery {
    /// `active`, `quarantined` or `maintenance`.
    state: Option<String>,
    platform_sku: Option<String>,
    region: Option<String>,
    cluster: Option<String>,
    rack: Option<String>,
    nvlink_domain: Option<String>,
    /// Substring of the node name.
    name_contains: Option<String>,
    /// 1 to 10,000; default 10,000.
    #[param(minimum = 1, maximum = 10000)]
    limit: Option<u64>,
    /// 0 to 1,000,000,000; default 0.
    #[param(minimum = 0, maximum = 1000000000)]
    offset: Option<u64>,
}

/// Most nodes one page returns (the datastore's page size).
const MAX_NODE_PAGE: u64 = 10_000;

/// Nodes to create or update by name, all or nothing.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ImportRequest {
    nodes: Vec<NewNode>,
}

/// A node with its last firmware inventory.
#[derive(Debug, Serialize, ToSchema)]
pub struct NodeDetail {
    #[serde(flatten)]
    node: Node,
    components: Vec<Component>,
}

#[utoipa::path(get, path = "/api/v1/nodes", tag = "nodes", params(NodeQuery),
    responses((status = 200, body = [Node]), (status = 400, body = ErrorBody)))]
pub(crate) async fn list_nodes(
    State(state): State<AppState>,
    ApiQuery(query): ApiQuery<NodeQuery>,
) -> Result<ApiJson<Vec<Node>>, ApiError> {
    let node_state = query
        .state
        .as_deref()
        .map(str::parse::<NodeState>)
        .transpose()
        .map_err(|e| ApiError::BadRequest(e.to_string()))?;
    let filter = NodeFilter {
        state: node_state,
        platform_sku: query.platform_sku,
        region: query.region,
        cluster: query.cluster,
        rack: query.rack,
        nvlink_domain: query.nvlink_domain,
        name_contains: query.name_contains,
        limit: super::in_range("limit", query.limit, 1, MAX_NODE_PAGE)?,
        offset: super::in_range("offset", query.offset, 0, super::MAX_OFFSET)?,
    };
    Ok(ApiJson(state.db.list_nodes(&filter).await?))
}

/// Creates or updates nodes. Changing an existing node's `bmc_url` needs
/// the admin role (403 otherwise): the new host would receive the fleet's
/// BMC password. A changed node needs discovery before any rollout targets it.
#[utoipa::path(post, path = "/api/v1/nodes", tag = "nodes", request_body = ImportRequest,
    responses((status = 200, body = ImportSummary), (status = 400, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 422, body = ErrorBody)))]
pub(crate) async fn import_nodes(
    State(state): State<AppState>,
    principal: Option<axum::Extension<Principal>>,
    actor: Actor,
    ApiJson(request): ApiJson<ImportRequest>,
) -> Result<ApiJson<ImportSummary>, ApiError> {
    let options = ImportOptions {
        may_change_bmc_address: principal.is_some_and(|p| p.user.role >= Role::Admin),
        known_credential_refs: state.credential_profiles.as_deref().cloned(),
    };
    Ok(ApiJson(
        state.db.import_nodes_with(&request.nodes, &actor.0, &options).await?,
    ))
}

#[utoipa::path(get, path = "/api/v1/nodes/{name}", tag = "nodes",
    params(("name" = String, Path, description = "Node name")),
    responses((status = 200, body = NodeDetail), (status = 404, body = ErrorBody)))]
pub(crate) async fn get_node(
    State(state): State<AppState>,
    ApiPath(name): ApiPath<String>,
) -> Result<ApiJson<NodeDetail>, ApiError> {
    let node = state.db.node_by_name(&name).await?;
    let components = state.db.node_components(node.id).await?;
    Ok(ApiJson(NodeDetail { node, components }))
}

/// The node's drains through its workload scheduler, newest first: every
/// rollout that took it out of service for a flash, and how each ended.
#[utoipa::path(get, path = "/api/v1/nodes/{name}/drains", tag = "nodes",
    params(("name" = String, Path, description = "Node name")),
    responses((status = 200, body = [DrainRow], description = "Newest first; empty when never drained"),
              (status = 404, body = ErrorBody)))]
pub(crate) async fn node_drains(
    State(state): State<AppState>,
    ApiPath(name): ApiPath<String>,
) -> Result<ApiJson<Vec<DrainRow>>, ApiError> {
    let node = state.db.node_by_name(&name).await?;
    Ok(ApiJson(state.db.node_drains(node.id).await?))
}
