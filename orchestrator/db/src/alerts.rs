//! Alerts received from Alertmanager, and which rollouts they concern.
//!
//! Invariant: an alert is identified by (fingerprint, status, startsAt).
//! Alertmanager redelivers a firing alert on every group update and repeat
//! interval, and an HA pair delivers each notification twice; only the
//! first delivery is stored, and an alert acts only until it is marked
//! processed. A delivery that arrives after a crash between "stored" and
//! "processed" is processed again; the actions it takes are conditional on
//! the rollout's state (pause only a running rollout, roll back only one not
//! rolling back already), so repeating them changes nothing.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, Duration, Utc};
use orchestrator_types::{NodeId, RolloutId, StepId, WaveId};
use sea_orm::{
    ActiveModelTrait, ColumnTrait, Condition, EntityTrait, QueryFilter, QueryOrder, QuerySelect, Set, TransactionTrait,
};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::audit;
use crate::entity::{alerts, nodes, rollouts, update_steps};
use crate::error::is_unique_violation;
use crate::execution::{ExecRollout, RolloutState, StepPurpose, StepState};
use crate::{Db, DbError};

#[cfg(feature = "openapi")]
use utoipa::ToSchema;

/// Most node names one exposure lookup takes per query: far below both
/// backends' bind-parameter limits.
const NODE_CHUNK: usize = 500;

/// Most alerts one listing returns.
const MAX_ALERT_PAGE: u64 = 1000;

/// Whether Alertmanager says the alert is still active.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum AlertStatus {
    /// The condition holds.
    Firing,
    /// The condition stopped holding; recorded, acts on nothing.
    Resolved,
}

impl AlertStatus {
    /// The stored and wire spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            AlertStatus::Firing => "firing",
            AlertStatus::Resolved => "resolved",
        }
    }
}

impl fmt::Display for AlertStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for AlertStatus {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "firing" => Ok(AlertStatus::Firing),
            "resolved" => Ok(AlertStatus::Resolved),
            other => Err(format!("unknown alert status {other:?} (firing or resolved)")),
        }
    }
}

/// One alert of a webhook notification, to store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NewAlert {
    /// Alertmanager's hash of the label set.
    pub fingerprint: String,
    /// Firing or resolved.
    pub status: AlertStatus,
    /// When the condition started.
    pub starts_at: DateTime<Utc>,
    /// Only meaningful for resolved alerts.
    pub ends_at: Option<DateTime<Utc>>,
    /// The alert's identity (alertname, node, severity...).
    pub labels: BTreeMap<String, String>,
    /// Free text for humans, kept as evidence.
    pub annotations: BTreeMap<String, String>,
    /// Link to the expression that fired (Prometheus graph URL).
    pub generator_url: Option<String>,
    /// The Alertmanager receiver that sent it.
    pub receiver: String,
    /// Alertmanager's key of the notification group.
    pub group_key: String,
}

impl NewAlert {
    /// The `alertname` label, or empty.
    pub fn alertname(&self) -> &str {
        self.labels.get("alertname").map(String::as_str).unwrap_or("")
    }
}

/// A stored alert.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(ToSchema))]
pub struct StoredAlert {
    pub id: i64,
    pub fingerprint: String,
    pub status: AlertStatus,
    pub starts_at: DateTime<Utc>,
    pub ends_at: Option<DateTime<Utc>>,
    pub alertname: String,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    pub generator_url: Option<String>,
    pub receiver: String,
    pub group_key: String,
    /// When the first delivery arrived.
    pub received_at: DateTime<Utc>,
    /// When every action it triggered was taken; `None` while pending.
    pub processed_at: Option<DateTime<Utc>>,
    /// What it did, per rollout (free-form JSON written by the receiver).
    pub outcome: Option<serde_json::Value>,
}

/// The result of storing one delivered alert.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordedAlert {
    /// The stored row (the earlier one for a redelivery).
    pub alert: StoredAlert,
    /// This delivery repeated one already stored.
    pub duplicate: bool,
}

impl RecordedAlert {
    /// Whether the receiver still has to act on it: new, or stored by a
    /// delivery whose processing did not finish.
    pub fn needs_processing(&self) -> bool {
        self.alert.processed_at.is_none()
    }
}

/// A node an alert names, as a rollout touched it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExposedNode {
    /// The node.
    pub node_id: NodeId,
    /// Its name, as the alert's label gave it.
    pub node_name: String,
    /// The update step that touched the node.
    pub step_id: StepId,
    /// The wave of that step (a wave-scoped rollback undoes it).
    pub wave_id: WaveId,
    /// Where the step stands.
    pub step_state: StepState,
    /// When the step ended (`None` while in flight).
    pub finished_at: Option<DateTime<Utc>>,
}

/// A rollout that an alert concerns, with the nodes through which it does.
#[derive(Debug, Clone, PartialEq)]
pub struct AlertExposure {
    /// The rollout, with its pinned policy.
    pub rollout: ExecRollout,
    /// The alerting nodes it touched, by step id.
    pub nodes: Vec<ExposedNode>,
}

impl AlertExposure {
    /// The waves whose steps touched the alerting nodes, for a wave-scoped
    /// rollback.
    pub fn wave_ids(&self) -> Vec<WaveId> {
        let set: BTreeSet<i64> = self.nodes.iter().map(|n| n.wave_id.0).collect();
        set.into_iter().map(WaveId).collect()
    }
}

/// Which alerts to list; newest first.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AlertFilter {
    /// Only this fingerprint (firing and resolved records alike).
    pub fingerprint: Option<String>,
    /// Only firing or only resolved.
    pub status: Option<AlertStatus>,
    /// At most this many (default 100, at most 1000).
    pub limit: Option<u64>,
}

/// Rollout states in which an alert concerns a rollout: executing, paused
/// by a human, halted by the engine (all three may still be rolled back),
/// and rolling back (nothing more to do, but the alert is evidence for it).
/// Aborted rollouts are left to the human who aborted them; finished ones
/// have nothing left to stop.
const CONCERNED_ROLLOUT_STATES: [RolloutState; 4] = [
    RolloutState::Running,
    RolloutState::Paused,
    RolloutState::Halted,
    RolloutState::RollingBack,
];

fn to_stored(row: alerts::Model) -> Result<StoredAlert, DbError> {
    let map = |what: &'static str, v: serde_json::Value| -> Result<BTreeMap<String, String>, DbError> {
        serde_json::from_value(v).map_err(|e| DbError::corrupt(what, e))
    };
    Ok(StoredAlert {
        id: row.id,
        status: row
            .status
            .parse()
            .map_err(|e: String| DbError::corrupt("alert status", e))?,
        labels: map("alert labels", row.labels)?,
        annotations: map("alert annotations", row.annotations)?,
        fingerprint: row.fingerprint,
        starts_at: row.starts_at,
        ends_at: row.ends_at,
        alertname: row.alertname,
        generator_url: row.generator_url,
        receiver: row.receiver,
        group_key: row.group_key,
        received_at: row.received_at,
        processed_at: row.processed_at,
        outcome: row.outcome,
    })
}

impl Db {
    /// Stores a delivered alert with its audit entry, or finds the one an
    /// earlier delivery stored (same fingerprint, status and start).
    pub async fn record_alert(&self, new: &NewAlert, actor: &str) -> Result<RecordedAlert, DbError> {
        let now = self.clock.now();
        let txn = self.writer.begin().await?;
        let inserted = alerts::ActiveModel {
            fingerprint: Set(new.fingerprint.clone()),
            status: Set(new.status.as_str().to_owned()),
            starts_at: Set(new.starts_at),
            ends_at: Set(new.ends_at),
            alertname: Set(new.alertname().to_owned()),
            labels: Set(json!(new.labels)),
            annotations: Set(json!(new.annotations)),
            generator_url: Set(new.generator_url.clone()),
            receiver: Set(new.receiver.clone()),
            group_key: Set(new.group_key.clone()),
            received_at: Set(now),
            processed_at: Set(None),
            outcome: Set(None),
            ..Default::default()
        }
        .insert(&txn)
        .await;
        match inserted {
            Ok(row) => {
                audit::append(
                    &txn,
                    now,
                    actor,
                    "alert.receive",
                    "alert",
                    &row.id.to_string(),
                    json!({
                        "fingerprint": new.fingerprint, "status": new.status, "starts_at": new.starts_at,
                        "ends_at": new.ends_at, "labels": new.labels, "annotations": new.annotations,
                        "generator_url": new.generator_url, "receiver": new.receiver,
                    }),
                )
                .await?;
                txn.commit().await?;
                Ok(RecordedAlert {
                    alert: to_stored(row)?,
                    duplicate: false,
                })
            }
            Err(err) if is_unique_violation(&err) => {
                // PostgreSQL aborts the transaction on the violation: read
                // the earlier row outside it.
                drop(txn);
                let row = alerts::Entity::find()
                    .filter(alerts::Column::Fingerprint.eq(new.fingerprint.as_str()))
                    .filter(alerts::Column::Status.eq(new.status.as_str()))
                    .filter(alerts::Column::StartsAt.eq(new.starts_at))
                    .one(&self.reader)
                    .await?
                    .ok_or_else(|| DbError::NotFound {
                        what: "alert",
                        key: new.fingerprint.clone(),
                    })?;
                Ok(RecordedAlert {
                    alert: to_stored(row)?,
                    duplicate: true,
                })
            }
            Err(err) => Err(err.into()),
        }
    }

    /// Marks an alert processed with what it did. Writing it again (a
    /// reprocessed redelivery) replaces the outcome.
    pub async fn finish_alert(&self, id: i64, outcome: &serde_json::Value) -> Result<StoredAlert, DbError> {
        let row = alerts::Entity::find_by_id(id)
            .one(&self.reader)
            .await?
            .ok_or_else(|| DbError::NotFound {
                what: "alert",
                key: id.to_string(),
            })?;
        let mut active: alerts::ActiveModel = row.into();
        active.processed_at = Set(Some(self.clock.now()));
        active.outcome = Set(Some(outcome.clone()));
        to_stored(active.update(&self.writer).await?)
    }

    /// One stored alert.
    pub async fn alert(&self, id: i64) -> Result<StoredAlert, DbError> {
        let row = alerts::Entity::find_by_id(id)
            .one(&self.reader)
            .await?
            .ok_or_else(|| DbError::NotFound {
                what: "alert",
                key: id.to_string(),
            })?;
        to_stored(row)
    }

    /// Stored alerts, newest first.
    pub async fn alerts(&self, filter: &AlertFilter) -> Result<Vec<StoredAlert>, DbError> {
        let mut query = alerts::Entity::find();
        if let Some(fp) = &filter.fingerprint {
            query = query.filter(alerts::Column::Fingerprint.eq(fp.as_str()));
        }
        if let Some(status) = filter.status {
            query = query.filter(alerts::Column::Status.eq(status.as_str()));
        }
        query
            .order_by_desc(alerts::Column::Id)
            .limit(filter.limit.unwrap_or(100).min(MAX_ALERT_PAGE))
            .all(&self.reader)
            .await?
            .into_iter()
            .map(to_stored)
            .collect()
    }

    /// The rollouts an alert on these nodes concerns: rollouts not finished
    /// nor aborted (running, paused, halted, rolling back) with an update step on one of the
    /// nodes that is in flight, or that ended (succeeded or failed: a failed
    /// flash may have left the node in any state) less than `recent` ago.
    /// Nodes never touched, or only skipped (nothing flashed), concern none.
    /// Unknown names are ignored. Rollouts by id, nodes by step id.
    pub async fn alert_exposure(&self, node_names: &[String], recent: Duration) -> Result<Vec<AlertExposure>, DbError> {
        let cutoff = self.clock.now() - recent;
        let names: BTreeSet<&str> = node_names.iter().map(String::as_str).collect();
        let names: Vec<&str> = names.into_iter().collect();
        let mut node_names_by_id = BTreeMap::new();
        for chunk in names.chunks(NODE_CHUNK) {
            let rows: Vec<(i64, String)> = nodes::Entity::find()
                .select_only()
                .column(nodes::Column::Id)
                .column(nodes::Column::Name)
                .filter(nodes::Column::Name.is_in(chunk.iter().copied()))
                .into_tuple()
                .all(&self.reader)
                .await?;
            node_names_by_id.extend(rows);
        }
        let ids: Vec<i64> = node_names_by_id.keys().copied().collect();
        let not_in_flight = [
            StepState::Pending.as_str(),
            StepState::Succeeded.as_str(),
            StepState::Failed.as_str(),
            StepState::Skipped.as_str(),
            StepState::Deferred.as_str(),
        ];
        let ended = [StepState::Succeeded.as_str(), StepState::Failed.as_str()];
        let mut steps = Vec::new();
        for chunk in ids.chunks(NODE_CHUNK) {
            let rows = update_steps::Entity::find()
                .filter(update_steps::Column::NodeId.is_in(chunk.iter().copied()))
                .filter(update_steps::Column::Purpose.eq(StepPurpose::Update.as_str()))
                .filter(
                    Condition::any()
                        .add(update_steps::Column::State.is_not_in(not_in_flight))
                        .add(
                            Condition::all()
                                .add(update_steps::Column::State.is_in(ended))
                                .add(update_steps::Column::FinishedAt.gte(cutoff)),
                        ),
                )
                .order_by_asc(update_steps::Column::Id)
                .all(&self.reader)
                .await?;
            steps.extend(rows);
        }
        let rollout_ids: BTreeSet<i64> = steps.iter().map(|s| s.rollout_id).collect();
        if rollout_ids.is_empty() {
            return Ok(Vec::new());
        }
        let concerned: Vec<&str> = CONCERNED_ROLLOUT_STATES.iter().map(|s| s.as_str()).collect();
        let rollouts = rollouts::Entity::find()
            .filter(rollouts::Column::Id.is_in(rollout_ids))
            .filter(rollouts::Column::State.is_in(concerned))
            .order_by_asc(rollouts::Column::Id)
            .all(&self.reader)
            .await?;
        let mut exposures = Vec::new();
        for row in rollouts {
            let rollout_id = row.id;
            let rollout = self.exec_rollout(RolloutId(rollout_id)).await?;
            let mut exposed = Vec::new();
            for step in steps.iter().filter(|s| s.rollout_id == rollout_id) {
                exposed.push(ExposedNode {
                    node_id: NodeId(step.node_id),
                    node_name: node_names_by_id.get(&step.node_id).cloned().unwrap_or_default(),
                    step_id: StepId(step.id),
                    wave_id: WaveId(step.wave_id),
                    step_state: step
                        .state
                        .parse()
                        .map_err(|e: String| DbError::corrupt("step state", e))?,
                    finished_at: step.finished_at,
                });
            }
            exposures.push(AlertExposure {
                rollout,
                nodes: exposed,
            });
        }
        Ok(exposures)
    }
}
