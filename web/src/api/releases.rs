use axum::extract::State;
use axum::http::StatusCode;
use orchestrator_db::model::{GateResult, NewGateResult, NewRelease, Release, ReleaseRollback};
use orchestrator_types::{ReleaseId, TransitionRequest};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::{Actor, ApiJson, ApiPath};
use crate::AppState;
use crate::error::{ApiError, ErrorBody};

/// A release with its qualification evidence.
#[derive(Debug, Serialize, ToSchema)]
pub struct ReleaseDetail {
    #[serde(flatten)]
    release: Release,
    gate_results: Vec<GateResult>,
}

/// A release to register, with the metadata that decides whether its
/// rollouts can be rolled back (both optional).
#[derive(Debug, Deserialize, ToSchema)]
pub struct NewReleaseBody {
    #[serde(flatten)]
    release: NewRelease,
    #[serde(flatten)]
    rollback: ReleaseRollback,
}

/// A requested qualification transition.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TransitionBody {
    /// `registered`, `qualifying`, `qualified`, `default`, `deprecated` or `blocked` (`fleet-proven` is
    /// refused: only a rollout's passing soak reaches it).
    #[schema(example = "qualifying")]
    to: String,
    /// Required to block and to unblock.
    #[serde(default)]
    reason: Option<String>,
}

#[utoipa::path(get, path = "/api/v1/releases", tag = "releases", responses((status = 200, body = [Release])))]
pub(crate) async fn list_releases(State(state): State<AppState>) -> Result<ApiJson<Vec<Release>>, ApiError> {
    Ok(ApiJson(state.db.list_releases().await?))
}

#[utoipa::path(post, path = "/api/v1/releases", tag = "releases", request_body = NewReleaseBody,
    responses((status = 201, body = Release), (status = 400, body = ErrorBody), (status = 409, body = ErrorBody),
              (status = 422, body = ErrorBody)))]
pub(crate) async fn add_release(
    State(state): State<AppState>,
    actor: Actor,
    ApiJson(NewReleaseBody { release, rollback }): ApiJson<NewReleaseBody>,
) -> Result<(StatusCode, ApiJson<Release>), ApiError> {
    let mut errors = release.validate();
    errors.extend(rollback.validate(&release.version));
    if !errors.is_empty() {
        return Err(ApiError::Invalid(errors));
    }
    Ok((
        StatusCode::CREATED,
        ApiJson(state.db.add_release_with(&release, &rollback, &actor.0).await?),
    ))
}

#[utoipa::path(get, path = "/api/v1/releases/{id}", tag = "releases",
    params(("id" = i64, Path, description = "Release id")),
    responses((status = 200, body = ReleaseDetail), (status = 404, body = ErrorBody)))]
pub(crate) async fn get_release(
    State(state): State<AppState>,
    ApiPath(id): ApiPath<i64>,
) -> Result<ApiJson<ReleaseDetail>, ApiError> {
    let release = state.db.release(ReleaseId(id)).await?;
    let gate_results = state.db.gate_results(release.id).await?;
    Ok(ApiJson(ReleaseDetail { release, gate_results }))
}

#[utoipa::path(post, path = "/api/v1/releases/{id}/transition", tag = "releases",
    params(("id" = i64, Path, description = "Release id")), request_body = TransitionBody,
    responses((status = 200, body = Release), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody),
              (status = 403, body = ErrorBody, description = "Separation of duties: not a qualifier, or the registrant"),
              (status = 409, body = ErrorBody, description = "The state machine does not allow it")))]
pub(crate) async fn transition_release(
    State(state): State<AppState>,
    actor: Actor,
    ApiPath(id): ApiPath<i64>,
    ApiJson(body): ApiJson<TransitionBody>,
) -> Result<ApiJson<Release>, ApiError> {
    let to = body
        .to
        .parse()
        .map_err(|e: orchestrator_types::ParseEnumError| ApiError::BadRequest(e.to_string()))?;
    state
        .duties
        .check_transition(&state.db, ReleaseId(id), to, &actor.0)
        .await?;
    let request = TransitionRequest {
        to,
        reason: body.reason,
    };
    Ok(ApiJson(
        state.db.transition_release(ReleaseId(id), &request, &actor.0).await?,
    ))
}

#[utoipa::path(get, path = "/api/v1/releases/{id}/qualification", tag = "releases",
    params(("id" = i64, Path, description = "Release id")),
    responses((status = 200, body = [GateResult]), (status = 404, body = ErrorBody)))]
pub(crate) async fn list_gate_results(
    State(state): State<AppState>,
    ApiPath(id): ApiPath<i64>,
) -> Result<ApiJson<Vec<GateResult>>, ApiError> {
    let release = state.db.release(ReleaseId(id)).await?;
    Ok(ApiJson(state.db.gate_results(release.id).await?))
}

#[utoipa::path(post, path = "/api/v1/releases/{id}/qualification", tag = "releases",
    params(("id" = i64, Path, description = "Release id")), request_body = NewGateResult,
    responses((status = 201, body = GateResult), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody),
              (status = 422, body = ErrorBody)))]
pub(crate) async fn record_gate_result(
    State(state): State<AppState>,
    actor: Actor,
    ApiPath(id): ApiPath<i64>,
    ApiJson(result): ApiJson<NewGateResult>,
) -> Result<(StatusCode, ApiJson<GateResult>), ApiError> {
    Ok((
        StatusCode::CREATED,
        ApiJson(state.db.record_gate_result(ReleaseId(id), &result, &actor.0).await?),
    ))
}
