use axum::extract::State;
use orchestrator_db::model::{Component, ImportSummary, NewNode, Node, NodeFilter};
use orchestrator_types::NodeState;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::{Actor, ApiJson, ApiPath, ApiQuery};
use crate::AppState;
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
    /// At most 10,000.
    limit: Option<u64>,
    offset: Option<u64>,
}

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
        limit: query.limit,
        offset: query.offset,
    };
    Ok(ApiJson(state.db.list_nodes(&filter).await?))
}

#[utoipa::path(post, path = "/api/v1/nodes", tag = "nodes", request_body = ImportRequest,
    responses((status = 200, body = ImportSummary), (status = 400, body = ErrorBody), (status = 422, body = ErrorBody)))]
pub(crate) async fn import_nodes(
    State(state): State<AppState>,
    actor: Actor,
    ApiJson(request): ApiJson<ImportRequest>,
) -> Result<ApiJson<ImportSummary>, ApiError> {
    Ok(ApiJson(state.db.import_nodes(&request.nodes, &actor.0).await?))
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
