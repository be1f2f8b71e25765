//! `POST /api/v1/alerts/alertmanager`: Alertmanager's webhook (payload
//! version 4), and `GET /api/v1/alerts`, what it received.
//!
//! A firing alert is matched to nodes by one label (`node` by default), the
//! nodes to the rollouts that have them in flight or updated them recently,
//! and each such rollout's pinned policy decides through its alert rules:
//! roll back, pause, or nothing. The worst matching rule wins (rollback over
//! pause). A policy that does not allow automatic rollback gets a pause
//! instead, so a human decides. Resolved alerts are recorded and trigger
//! nothing. Every alert and every action is audited with the alert as
//! evidence.
//!
//! Authentication is a bearer token of its own (Alertmanager's
//! `http_config.authorization`), not a user session: only the SHA-256 of the
//! configured token is kept, and the presented one is compared in constant
//! time. Neither is ever logged.

use std::collections::BTreeMap;
use std::fmt;

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Duration, Utc};
use orchestrator_db::DbError;
use orchestrator_db::alerts::{AlertExposure, AlertFilter, AlertStatus, NewAlert, StoredAlert};
use orchestrator_db::execution::RolloutState;
use orchestrator_policy::{AlertAction, AlertRule, MatchOp, Policy, RollbackScope};
use serde::{Deserialize, Serialize};
use serde_json::json;
use sha2::{Digest, Sha256};
use utoipa::{IntoParams, ToSchema};

use super::{ApiJson, ApiQuery};
use crate::AppState;
use crate::error::{ApiError, ErrorBody, ErrorDetail};

/// The audit actor of everything the receiver does.
pub const ALERTMANAGER_ACTOR: &str = "alertmanager";

/// Alerts one notification may carry. Alertmanager's `max_alerts` is
/// unbounded by default; a group this large means a fleet-wide event that a
/// human must look at, and the bound keeps one request's work finite.
const MAX_ALERTS_PER_NOTIFICATION: usize = 1000;

/// Room for one alert as Alertmanager sends it: its labels, annotations,
/// URLs and timestamps are a few KiB even with long descriptions.
const MAX_ALERT_BYTES: usize = 16 * 1024;

/// Largest notification body accepted: `MAX_ALERTS_PER_NOTIFICATION` alerts
/// of `MAX_ALERT_BYTES` each (16 MiB). A 1,000-alert group of ordinary
/// alerts is about 2 MB, which the default 2 MiB limit used to refuse.
pub(crate) const MAX_NOTIFICATION_BYTES: usize = MAX_ALERTS_PER_NOTIFICATION * MAX_ALERT_BYTES;

/// Alertmanager fingerprints are 16 hex digits; the bound leaves room for
/// other senders without letting a label-sized string into the unique key.
const MAX_FINGERPRINT_LEN: usize = 128;

/// Shortest accepted token: a guessable token would let anyone who reaches
/// the API pause or roll back the fleet's rollouts.
pub const MIN_TOKEN_LEN: usize = 16;

/// Why the receiver could not be configured.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AlertReceiverConfigError {
    /// The token is too short (its value is never shown).
    #[error("the Alertmanager bearer token must be at least {MIN_TOKEN_LEN} characters")]
    TokenTooShort,
    /// The node label is not a Prometheus label name.
    #[error("invalid node label {0:?}: expected [a-zA-Z_][a-zA-Z0-9_]*")]
    BadNodeLabel(String),
    /// The recency window is not positive.
    #[error("the recently-updated window must be positive")]
    BadRecentWindow,
}

/// How the Alertmanager receiver authenticates and matches alerts.
#[derive(Clone)]
pub struct AlertReceiverConfig {
    /// SHA-256 of the bearer token; the token itself is not kept.
    token_digest: [u8; 32],
    node_label: String,
    recent: Duration,
}

impl fmt::Debug for AlertReceiverConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AlertReceiverConfig")
            .field("token", &"<redacted>")
            .field("node_label", &self.node_label)
            .field("recent", &self.recent)
            .finish()
    }
}

impl AlertReceiverConfig {
    /// The label that names the node by default (as bmc-sim and most node
    /// exporters' relabelling write it).
    pub const DEFAULT_NODE_LABEL: &'static str = "node";

    /// How long after its flash ended a node still counts as "recently
    /// updated" by default: the longest canary bake in the example policies.
    pub const DEFAULT_RECENT_HOURS: i64 = 24;

    /// A receiver accepting `token`, with the default node label and window.
    pub fn new(token: &str) -> Result<Self, AlertReceiverConfigError> {
        if token.chars().count() < MIN_TOKEN_LEN {
            return Err(AlertReceiverConfigError::TokenTooShort);
        }
        Ok(Self {
            token_digest: Sha256::digest(token.as_bytes()).into(),
            node_label: Self::DEFAULT_NODE_LABEL.to_owned(),
            recent: Duration::hours(Self::DEFAULT_RECENT_HOURS),
        })
    }

    /// Matches alerts to nodes by this label instead.
    pub fn with_node_label(mut self, label: &str) -> Result<Self, AlertReceiverConfigError> {
        let valid = label
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid {
            return Err(AlertReceiverConfigError::BadNodeLabel(label.to_owned()));
        }
        self.node_label = label.to_owned();
        Ok(self)
    }

    /// Counts a node as recently updated for this long after its flash.
    pub fn with_recent_window(mut self, recent: Duration) -> Result<Self, AlertReceiverConfigError> {
        if recent <= Duration::zero() {
            return Err(AlertReceiverConfigError::BadRecentWindow);
        }
        self.recent = recent;
        Ok(self)
    }

    /// The label alerts name their node with.
    pub fn node_label(&self) -> &str {
        &self.node_label
    }

    /// Whether the request carries `Authorization: Bearer <the token>`.
    fn authorized(&self, headers: &HeaderMap) -> bool {
        let Some(presented) = crate::auth::bearer_token(headers) else {
            return false;
        };
        // Comparing digests hides the token's length, and the fold reads
        // every byte whatever the first difference.
        let digest: [u8; 32] = Sha256::digest(presented).into();
        let diff = digest
            .iter()
            .zip(self.token_digest.iter())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b));
        std::hint::black_box(diff) == 0
    }
}

/// Alertmanager's webhook body, version 4.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct WebhookPayload {
    /// Must be `"4"`.
    pub version: String,
    /// `firing` or `resolved` (for the group).
    pub status: String,
    /// The Alertmanager receiver that sent it (stored with each alert).
    #[serde(default)]
    pub receiver: String,
    /// Alertmanager's key of the notification group (stored with each alert).
    #[serde(default)]
    pub group_key: String,
    /// Alerts Alertmanager left out because of `max_alerts`.
    #[serde(default)]
    pub truncated_alerts: u64,
    /// The alerts; other fields of the payload (group and common labels,
    /// external URL) repeat what the alerts carry and are ignored.
    pub alerts: Vec<WebhookAlert>,
}

/// One alert of a notification.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct WebhookAlert {
    /// `firing` or `resolved`.
    pub status: String,
    /// Identify the alert; one of them (`node` by default) names the node.
    pub labels: BTreeMap<String, String>,
    /// Free text for humans (summary, runbook), kept as evidence.
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
    /// When the condition started; part of the idempotency key.
    pub starts_at: DateTime<Utc>,
    /// `0001-01-01T00:00:00Z` while firing.
    #[serde(default)]
    pub ends_at: Option<DateTime<Utc>>,
    /// Link to the expression that fired.
    #[serde(default, rename = "generatorURL")]
    pub generator_url: Option<String>,
    /// Required: what makes redelivery recognisable.
    #[serde(default)]
    pub fingerprint: Option<String>,
}

/// What the receiver did with a notification.
#[derive(Debug, Serialize, ToSchema)]
pub struct ReceiveReport {
    /// Alerts in the notification.
    pub received: usize,
    /// One report per alert, in the notification's order.
    pub alerts: Vec<AlertReport>,
}

/// What one alert did.
#[derive(Debug, Serialize, ToSchema)]
pub struct AlertReport {
    /// The stored alert (see `GET /api/v1/alerts`).
    pub alert_id: i64,
    /// Alertmanager's fingerprint.
    pub fingerprint: String,
    /// Firing or resolved.
    pub status: AlertStatus,
    /// An earlier delivery was already stored.
    pub duplicate: bool,
    /// Processed by this request (false for a duplicate processed earlier).
    pub processed: bool,
    /// The node the alert names, if it names one.
    pub node: Option<String>,
    /// One entry per rollout the alert concerned.
    pub actions: Vec<ActionReport>,
    /// Why nothing was done, when nothing was.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// What an alert did to one rollout.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ActionReport {
    /// The rollout concerned.
    pub rollout_id: i64,
    /// What the policy's rules asked for: `rollback`, `pause` or `none`.
    pub requested: String,
    /// What was done: `rollback_started`, `paused`, `unchanged`.
    pub result: String,
    /// The deciding rule, as `matcher, matcher -> action` (position in the policy's list).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
    /// Why, for humans.
    pub detail: String,
}

/// Which alerts to list.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
pub struct AlertQuery {
    /// Only this fingerprint.
    fingerprint: Option<String>,
    /// `firing` or `resolved`.
    status: Option<String>,
    /// 1 to 1,000; default 100.
    #[param(minimum = 1, maximum = 1000)]
    limit: Option<u64>,
}

#[utoipa::path(get, path = "/api/v1/alerts", tag = "alerts", params(AlertQuery),
    responses((status = 200, body = [StoredAlert]), (status = 400, body = ErrorBody)))]
pub(crate) async fn list_alerts(
    State(state): State<AppState>,
    ApiQuery(query): ApiQuery<AlertQuery>,
) -> Result<ApiJson<Vec<StoredAlert>>, ApiError> {
    let status = match query.status.as_deref() {
        None => None,
        Some(s) => Some(s.parse().map_err(ApiError::BadRequest)?),
    };
    let filter = AlertFilter {
        fingerprint: query.fingerprint,
        status,
        limit: super::in_range("limit", query.limit, 1, 1000)?,
    };
    Ok(ApiJson(state.db.alerts(&filter).await?))
}

#[utoipa::path(post, path = "/api/v1/alerts/alertmanager", tag = "alerts", request_body = WebhookPayload,
    security(("alertmanager_bearer" = [])),
    responses((status = 200, body = ReceiveReport), (status = 400, body = ErrorBody),
              (status = 401, body = ErrorBody, description = "Missing or wrong bearer token"),
              (status = 422, body = ErrorBody), (status = 503, body = ErrorBody, description = "No token configured")))]
pub(crate) async fn receive(State(state): State<AppState>, headers: HeaderMap, body: Bytes) -> Response {
    // Authentication before the body is even parsed: an unauthenticated
    // caller learns nothing about the payload format.
    let Some(config) = state.alert_receiver.clone() else {
        return plain_error(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "the Alertmanager receiver is not configured on this controller (no bearer token)",
        );
    };
    if !config.authorized(&headers) {
        let mut response = plain_error(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "missing or wrong bearer token",
        );
        response
            .headers_mut()
            .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        return response;
    }
    match receive_authorized(&state, &config, &headers, &body).await {
        Ok(report) => Json(report).into_response(),
        Err(err) => err.into_response(),
    }
}

fn plain_error(status: StatusCode, code: &'static str, message: &str) -> Response {
    (
        status,
        Json(ErrorBody {
            error: ErrorDetail {
                code,
                message: message.to_owned(),
                fields: Vec::new(),
            },
        }),
    )
        .into_response()
}

async fn receive_authorized(
    state: &AppState,
    config: &AlertReceiverConfig,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<ReceiveReport, ApiError> {
    let is_json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("application/json"));
    if !is_json {
        return Err(ApiError::UnsupportedMediaType(
            "expected a request with `Content-Type: application/json`".into(),
        ));
    }
    let payload: WebhookPayload = serde_json::from_slice(body).map_err(|err| {
        let message = format!("invalid Alertmanager webhook payload: {err}");
        if err.is_data() {
            ApiError::InvalidBody(message)
        } else {
            ApiError::BadRequest(message)
        }
    })?;
    let alerts = validate(&payload)?;
    let mut reports = Vec::with_capacity(alerts.len());
    for alert in &alerts {
        reports.push(handle_alert(state, config, alert).await?);
    }
    if reports.iter().any(|r| !r.actions.is_empty()) {
        state.nudge_engine();
    }
    Ok(ReceiveReport {
        received: alerts.len(),
        alerts: reports,
    })
}

/// Checks the whole notification before anything is stored, so a bad alert
/// never leaves the good ones half-applied.
fn validate(payload: &WebhookPayload) -> Result<Vec<NewAlert>, ApiError> {
    if payload.version != "4" {
        return Err(ApiError::InvalidBody(format!(
            "unsupported Alertmanager webhook version {:?}: this receiver understands version \"4\"",
            payload.version
        )));
    }
    payload
        .status
        .parse::<AlertStatus>()
        .map_err(|e| ApiError::InvalidBody(format!("status: {e}")))?;
    if payload.truncated_alerts > 0 {
        // The left-out alerts arrive with a later notification of the group.
        tracing::warn!(truncated = payload.truncated_alerts, group_key = %payload.group_key,
            "Alertmanager truncated a notification; raise max_alerts in its webhook_config");
    }
    if payload.alerts.len() > MAX_ALERTS_PER_NOTIFICATION {
        return Err(ApiError::InvalidBody(format!(
            "{} alerts in one notification; at most {MAX_ALERTS_PER_NOTIFICATION} are accepted \
             (set max_alerts in Alertmanager's webhook_config)",
            payload.alerts.len()
        )));
    }
    payload
        .alerts
        .iter()
        .enumerate()
        .map(|(i, alert)| {
            let invalid = |what: String| ApiError::InvalidBody(format!("alerts[{i}]: {what}"));
            let fingerprint = alert
                .fingerprint
                .as_deref()
                .filter(|f| !f.is_empty())
                .ok_or_else(|| invalid("missing fingerprint (Alertmanager 0.19 or later sends one)".into()))?;
            if fingerprint.len() > MAX_FINGERPRINT_LEN || !fingerprint.chars().all(|c| c.is_ascii_alphanumeric()) {
                return Err(invalid(format!(
                    "fingerprint must be at most {MAX_FINGERPRINT_LEN} letters and digits"
                )));
            }
            let status: AlertStatus = alert.status.parse().map_err(invalid)?;
            // Alertmanager writes the zero time for "not ended".
            let ends_at = alert.ends_at.filter(|end| *end > alert.starts_at);
            Ok(NewAlert {
                fingerprint: fingerprint.to_owned(),
                status,
                starts_at: alert.starts_at,
                ends_at,
                labels: alert.labels.clone(),
                annotations: alert.annotations.clone(),
                generator_url: alert.generator_url.clone().filter(|u| !u.is_empty()),
                receiver: payload.receiver.clone(),
                group_key: payload.group_key.clone(),
            })
        })
        .collect()
}

async fn handle_alert(
    state: &AppState,
    config: &AlertReceiverConfig,
    alert: &NewAlert,
) -> Result<AlertReport, ApiError> {
    let recorded = state.db.record_alert(alert, ALERTMANAGER_ACTOR).await?;
    let node = alert.labels.get(config.node_label()).cloned().filter(|n| !n.is_empty());
    let mut report = AlertReport {
        alert_id: recorded.alert.id,
        fingerprint: alert.fingerprint.clone(),
        status: alert.status,
        duplicate: recorded.duplicate,
        processed: false,
        node: node.clone(),
        actions: Vec::new(),
        note: None,
    };
    if !recorded.needs_processing() {
        report.note = Some("already processed by an earlier delivery".into());
        return Ok(report);
    }
    report.processed = true;
    if alert.status == AlertStatus::Resolved {
        report.note = Some("resolved alerts are recorded and trigger nothing".into());
    } else if let Some(node) = &node {
        let exposures = state
            .db
            .alert_exposure(std::slice::from_ref(node), config.recent)
            .await?;
        if exposures.is_empty() {
            report.note = Some(format!(
                "node {node:?} is not in flight nor recently updated by any active rollout"
            ));
        }
        for exposure in &exposures {
            report
                .actions
                .push(act(state, recorded.alert.id, alert, exposure).await?);
        }
    } else {
        report.note = Some(format!(
            "the alert has no {:?} label, so it concerns no node",
            config.node_label()
        ));
    }
    let outcome = json!({ "node": report.node, "actions": report.actions, "note": report.note });
    state.db.finish_alert(recorded.alert.id, &outcome).await?;
    Ok(report)
}

/// The strongest action the policy's alert rules ask for these labels,
/// with the position of the first rule asking for it.
pub(crate) fn decide(rules: &[AlertRule], labels: &BTreeMap<String, String>) -> Option<(usize, AlertAction)> {
    let severity = |a: AlertAction| match a {
        AlertAction::Pause => 1,
        AlertAction::Rollback => 2,
    };
    rules
        .iter()
        .enumerate()
        .filter(|(_, rule)| rule.matches(labels))
        .map(|(i, rule)| (i, rule.action))
        // max_by_key keeps the last maximum; reversing keeps the first rule.
        .rev()
        .max_by_key(|(_, action)| severity(*action))
}

fn describe_rule(index: usize, rule: &AlertRule) -> String {
    let matchers: Vec<String> = rule
        .matchers
        .iter()
        .map(|m| {
            let op = match m.op {
                MatchOp::Equal => "=",
                MatchOp::NotEqual => "!=",
                MatchOp::Regex => "=~",
                MatchOp::NotRegex => "!~",
            };
            format!("{}{op}{:?}", m.name, m.value)
        })
        .collect();
    let action = match rule.action {
        AlertAction::Pause => "pause",
        AlertAction::Rollback => "rollback",
    };
    format!("alerts[{index}]: {} -> {action}", matchers.join(", "))
}

/// Applies the rollout's policy to one alert and audits the outcome.
async fn act(
    state: &AppState,
    alert_id: i64,
    alert: &NewAlert,
    exposure: &AlertExposure,
) -> Result<ActionReport, ApiError> {
    let rollout = &exposure.rollout;
    let nodes: Vec<&str> = {
        let mut names: Vec<&str> = exposure.nodes.iter().map(|n| n.node_name.as_str()).collect();
        names.dedup();
        names
    };
    let reason = format!(
        "alert {} ({}) on {}",
        if alert.alertname().is_empty() {
            "<unnamed>"
        } else {
            alert.alertname()
        },
        alert.fingerprint,
        nodes.join(", ")
    );
    let policy = match rollout.policy_source.as_deref().map(orchestrator_policy::parse_policy) {
        Some(Ok(policy)) => Ok(policy),
        Some(Err(err)) => {
            tracing::warn!(rollout = %rollout.id, error = %err, "pinned policy of rollout does not parse");
            Err(format!(
                "the rollout's pinned policy does not parse ({err}), so no alert rule applies"
            ))
        }
        None => Err("the rollout has no pinned policy, so no alert rule applies".to_owned()),
    };
    let report = match policy {
        Err(detail) => ActionReport {
            rollout_id: rollout.id.0,
            requested: "none".into(),
            result: "unchanged".into(),
            rule: None,
            detail,
        },
        Ok(policy) => apply_policy(state, &policy, alert, exposure, &reason).await?,
    };
    let details = json!({
        "alert_id": alert_id,
        "alert": {
            "fingerprint": alert.fingerprint, "status": alert.status, "starts_at": alert.starts_at,
            "labels": alert.labels, "annotations": alert.annotations, "generator_url": alert.generator_url,
        },
        "nodes": exposure.nodes,
        "requested": report.requested,
        "result": report.result,
        "rule": report.rule,
        "detail": report.detail,
    });
    state
        .db
        .record_audit(
            ALERTMANAGER_ACTOR,
            "alert.action",
            "rollout",
            &rollout.id.to_string(),
            details,
        )
        .await?;
    tracing::info!(rollout = %rollout.id, fingerprint = %alert.fingerprint, requested = %report.requested,
        result = %report.result, "alert handled");
    Ok(report)
}

async fn apply_policy(
    state: &AppState,
    policy: &Policy,
    alert: &NewAlert,
    exposure: &AlertExposure,
    reason: &str,
) -> Result<ActionReport, ApiError> {
    let rollout = &exposure.rollout;
    let Some((index, action)) = decide(&policy.health.alerts, &alert.labels) else {
        return Ok(ActionReport {
            rollout_id: rollout.id.0,
            requested: "none".into(),
            result: "unchanged".into(),
            rule: None,
            detail: format!("no alert rule of policy {} matches the alert", policy.name),
        });
    };
    let rule = policy.health.alerts.get(index).map(|r| describe_rule(index, r));
    let mut report = ActionReport {
        rollout_id: rollout.id.0,
        requested: match action {
            AlertAction::Pause => "pause".into(),
            AlertAction::Rollback => "rollback".into(),
        },
        result: "unchanged".into(),
        rule,
        detail: String::new(),
    };
    if action == AlertAction::Rollback {
        if !policy.rollback.automatic {
            let why = "the policy does not allow automatic rollback; paused for a human";
            return pause(state, report, &format!("{reason}: {why}"), why).await;
        }
        let scope = match policy.rollback.scope {
            RollbackScope::Wave => json!({ "scope": "wave", "waves": exposure.wave_ids() }),
            RollbackScope::Rollout => json!({ "scope": "rollout" }),
        };
        match state
            .db
            .begin_rollback(None, rollout.id, scope, reason, ALERTMANAGER_ACTOR)
            .await
        {
            Ok(wave) => {
                report.result = "rollback_started".into();
                report.detail = format!("rollback wave {} started: {reason}", wave.id);
                return Ok(report);
            }
            Err(DbError::Stale { .. }) => {
                report.detail = "the rollout is rolling back already".into();
                return Ok(report);
            }
            Err(DbError::Invalid { reason: why, .. }) => {
                // A rollback the planner judged impossible must not leave
                // the rollout running into more nodes.
                let why = format!("rollback refused ({why}); paused for a human");
                return pause(state, report, &format!("{reason}: {why}"), &why).await;
            }
            Err(err) => return Err(err.into()),
        }
    }
    pause(state, report, reason, "paused").await
}

async fn pause(
    state: &AppState,
    mut report: ActionReport,
    reason: &str,
    detail: &str,
) -> Result<ActionReport, ApiError> {
    match state
        .db
        .user_set_rollout_state(
            orchestrator_types::RolloutId(report.rollout_id),
            &[RolloutState::Running],
            RolloutState::Paused,
            Some(reason),
            ALERTMANAGER_ACTOR,
        )
        .await
    {
        Ok(_) => {
            report.result = "paused".into();
            report.detail = detail.to_owned();
        }
        Err(DbError::Stale { .. }) => {
            // Paused, halted or already rolling back: no longer starting flashes.
            report.detail = format!("{detail}: the rollout was not running, left as it was");
        }
        Err(err) => return Err(err.into()),
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    fn rules(yaml_rules: &[(&[&str], AlertAction)]) -> Vec<AlertRule> {
        yaml_rules
            .iter()
            .map(|(matchers, action)| AlertRule {
                matchers: matchers
                    .iter()
                    .map(|m| orchestrator_policy::LabelMatcher::parse(m).expect("matcher"))
                    .collect(),
                action: *action,
            })
            .collect()
    }

    #[test]
    fn the_worst_matching_rule_wins_and_the_first_of_them_is_named() {
        let rules = rules(&[
            (&[r#"severity="critical""#], AlertAction::Pause),
            (&[r#"alertname="GpuXidStorm""#], AlertAction::Rollback),
            (&[r#"alertname=~"Gpu.*""#], AlertAction::Rollback),
        ]);
        let cases = [
            (
                labels(&[("alertname", "GpuXidStorm"), ("severity", "critical")]),
                Some((1, AlertAction::Rollback)),
            ),
            (
                labels(&[("alertname", "GpuHot"), ("severity", "critical")]),
                Some((2, AlertAction::Rollback)),
            ),
            (
                labels(&[("alertname", "NicDown"), ("severity", "critical")]),
                Some((0, AlertAction::Pause)),
            ),
            (labels(&[("alertname", "NicDown"), ("severity", "warning")]), None),
        ];
        for (labels, expected) in cases {
            assert_eq!(decide(&rules, &labels), expected, "{labels:?}");
        }
    }

    #[test]
    fn tokens_are_compared_by_digest() {
        let config = AlertReceiverConfig::new("0123456789abcdef-secret").expect("config");
        let check = |value: Option<&str>| {
            let mut headers = HeaderMap::new();
            if let Some(v) = value {
                headers.insert(header::AUTHORIZATION, HeaderValue::from_str(v).expect("header"));
            }
            config.authorized(&headers)
        };
        assert!(check(Some("Bearer 0123456789abcdef-secret")));
        assert!(check(Some("BEARER 0123456789abcdef-secret")));
        assert!(!check(Some("Bearer 0123456789abcdef-secreT")));
        assert!(!check(Some("Bearer 0123456789abcdef-secret ")));
        assert!(!check(Some("Basic 0123456789abcdef-secret")));
        assert!(!check(Some("0123456789abcdef-secret")));
        assert!(!check(None));
        assert!(!format!("{config:?}").contains("secret"));
        assert_eq!(
            AlertReceiverConfig::new("short").err(),
            Some(AlertReceiverConfigError::TokenTooShort)
        );
        assert!(config.clone().with_node_label("9node").is_err());
        assert!(config.with_node_label("hostname").is_ok());
    }
}
