//! A rollout's evidence package: the tar archive a vendor gets when firmware
//! regresses (and what an RMA claim cites), served by
//! `GET /api/v1/rollouts/{id}/evidence`.
//!
//! | Entry | What |
//! |---|---|
//! | `summary.json` | rollout, release (and whether it is blocked, why), every wave with its decision, verdict and per-cohort totals |
//! | `samples/canary.csv`, `samples/control.csv` | the stored window aggregates, one row per wave, node, metric and window (`1h`, or `1d` for a day already reduced by retention) |
//! | `decision_trace.json` | every evaluated look (gate, look, boundary, p-value, effect) and the audit entries of the rollout and its waves |
//! | `policy.yaml` | the policy the rollout ran under, at its commit (or the inline text) |
//!
//! A finished rollout's package is built once and stored (`rollout_evidence`,
//! with the rollout state it was built in): later downloads serve the stored
//! bytes, so a download is not rebuilt from every sample on every request, and
//! it survives health-sample retention, which reduces a rollout's hourly
//! windows only once its package is stored (`crate::retention`). A rollout
//! that moves again (a completed rollout rolled back later) is built and stored
//! anew when it finishes again. An unfinished rollout's package is built on
//! each request: it still changes.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use chrono::{DateTime, Utc};
use orchestrator_types::{NodeId, RolloutId, RolloutState, WaveId};
use sea_orm::{ActiveModelTrait, ColumnTrait, EntityTrait, QueryFilter, QuerySelect, Set};
use serde_json::{Value, json};

use crate::entity::rollout_evidence;
use crate::error::is_unique_violation;
use crate::health::{Cohort, HealthSample, LevelAgg, SampleScope};
use crate::{AuditFilter, Db, DbError};

/// Most audit entries per subject the trace carries (the audit log's page size).
const AUDIT_PAGE: u64 = 1000;

/// The files of the archive, in the order they are written.
pub const EVIDENCE_FILES: [&str; 5] = [
    "summary.json",
    "samples/canary.csv",
    "samples/control.csv",
    "decision_trace.json",
    "policy.yaml",
];

fn corrupt(err: impl std::fmt::Display) -> DbError {
    DbError::corrupt("rollout evidence", err)
}

/// One cohort's samples as CSV: hourly windows, then reduced days.
fn samples_csv(
    hourly: &[HealthSample],
    daily: &[HealthSample],
    cohort: Cohort,
    waves: &HashMap<WaveId, String>,
    names: &HashMap<NodeId, String>,
) -> Result<Vec<u8>, DbError> {
    let mut writer = csv::Writer::from_writer(Vec::new());
    writer
        .write_record([
            "wave",
            "node",
            "metric",
            "window_start",
            "events",
            "exposure",
            "readings",
            "mean",
            "min",
            "max",
            "units",
            "unit_means",
            "window",
        ])
        .map_err(corrupt)?;
    let opt = |v: Option<f64>| v.map(|v| format!("{v}")).unwrap_or_default();
    let rows = hourly
        .iter()
        .map(|s| (s, "1h"))
        .chain(daily.iter().map(|s| (s, "1d")))
        .filter(|(s, _)| s.cohort == cohort);
    for (s, window) in rows {
        let mean = (s.readings > 0).then(|| s.sum / s.readings as f64);
        let unit_means = s
            .units
            .iter()
            .filter_map(|(unit, agg)| agg.mean().map(|m| format!("{unit}={m:.3}")))
            .collect::<Vec<_>>()
            .join(";");
        writer
            .write_record([
                waves.get(&s.wave_id).cloned().unwrap_or_else(|| s.wave_id.to_string()),
                names.get(&s.node_id).cloned().unwrap_or_default(),
                s.metric.clone(),
                s.window_start.to_rfc3339(),
                s.events.to_string(),
                format!("{}", s.exposure),
                s.readings.to_string(),
                opt(mean),
                opt(s.min),
                opt(s.max),
                s.units.len().to_string(),
                unit_means,
                window.to_owned(),
            ])
            .map_err(corrupt)?;
    }
    writer.into_inner().map_err(|e| corrupt(e.into_error()))
}

/// Per metric and cohort totals of one wave, for the summary.
fn cohort_totals<'a>(samples: impl Iterator<Item = &'a HealthSample> + Clone, wave: WaveId) -> Value {
    let mut out: BTreeMap<String, BTreeMap<&'static str, Value>> = BTreeMap::new();
    for cohort in [Cohort::Canary, Cohort::Control] {
        let mut by_metric: BTreeMap<&str, (u64, f64, LevelAgg, BTreeSet<NodeId>)> = BTreeMap::new();
        for s in samples.clone().filter(|s| s.wave_id == wave && s.cohort == cohort) {
            let entry = by_metric
                .entry(s.metric.as_str())
                .or_insert_with(|| (0, 0.0, LevelAgg::EMPTY, BTreeSet::new()));
            entry.0 += s.events;
            entry.1 += s.exposure;
            for agg in s.units.values() {
                entry.2.merge(agg);
            }
            entry.3.insert(s.node_id);
        }
        for (metric, (events, exposure, level, nodes)) in by_metric {
            let value = if level.n > 0 {
                json!({ "nodes": nodes.len(), "readings": level.n, "mean": level.mean(), "min": level.min, "max": level.max })
            } else {
                json!({
                    "nodes": nodes.len(),
                    "events": events,
                    "exposure": exposure,
                    "rate": (exposure > 0.0).then(|| events as f64 / exposure),
                })
            };
            out.entry(metric.to_owned()).or_default().insert(cohort.as_str(), value);
        }
    }
    json!(out)
}

fn append(builder: &mut tar::Builder<Vec<u8>>, path: &str, bytes: &[u8], mtime: DateTime<Utc>) -> Result<(), DbError> {
    let mut header = tar::Header::new_gnu();
    header.set_size(bytes.len() as u64);
    header.set_mode(0o644);
    header.set_mtime(u64::try_from(mtime.timestamp()).unwrap_or(0));
    header.set_cksum();
    builder.append_data(&mut header, path, bytes).map_err(corrupt)
}

impl Db {
    /// Builds rollout `id`'s evidence archive from the stored records now
    /// (hourly windows and any days already reduced). What
    /// [`Db::rollout_evidence`] stores for a finished rollout.
    pub async fn build_rollout_evidence(&self, id: RolloutId) -> Result<Vec<u8>, DbError> {
        let now = self.clock.now();
        let rollout = self.exec_rollout(id).await?;
        let release = self.release(rollout.release_id).await?;
        let waves = self.rollout_waves(id).await?;
        let history = self.health_history(SampleScope::Rollout(id)).await?;
        let looks = self.health_looks(SampleScope::Rollout(id)).await?;
        let ids: Vec<NodeId> = history
            .all()
            .map(|s| s.node_id)
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let mut known = self.node_names(&ids).await?;
        // A node removed since keeps its id rather than losing its data.
        let names: HashMap<NodeId, String> = ids
            .into_iter()
            .map(|id| (id, known.remove(&id).unwrap_or_else(|| format!("node-id-{id}"))))
            .collect();
        let wave_names: HashMap<WaveId, String> = waves.iter().map(|w| (w.id, w.name.clone())).collect();

        let policy = match self.policy_version(&rollout.policy_commit, &rollout.policy_blob).await {
            Ok(version) => Some(version.content),
            Err(DbError::NotFound { .. }) => rollout.policy_source.clone(),
            Err(err) => return Err(err),
        };

        let mut audit = Vec::new();
        let subjects = std::iter::once(("rollout", id.to_string()))
            .chain(waves.iter().map(|w| ("wave", w.id.to_string())))
            .chain(std::iter::once(("release", release.id.to_string())));
        for (subject_type, subject_id) in subjects {
            let mut entries = self
                .audit_entries(&AuditFilter {
                    subject_type: Some(subject_type.into()),
                    subject_id: Some(subject_id),
                    limit: Some(AUDIT_PAGE),
                    ..Default::default()
                })
                .await?;
            audit.append(&mut entries);
        }
        audit.sort_by_key(|e| e.id);

        let summary = json!({
            "generated_at": now,
            "rollout": {
                "id": rollout.id,
                "state": rollout.state,
                "state_reason": rollout.state_reason,
                "policy": rollout.policy_name,
                "policy_commit": rollout.policy_commit,
                "policy_blob": rollout.policy_blob,
                "created_by": rollout.created_by,
                "created_at": rollout.created_at,
            },
            "release": {
                "id": release.id,
                "component": release.component_kind,
                "version": release.version,
                "sha256": release.sha256,
                "platforms": release.platforms,
                "qualification_state": release.qualification_state,
                "state_reason": release.state_reason,
            },
            "waves": waves.iter().map(|w| json!({
                "name": w.name,
                "kind": w.kind,
                "state": w.state,
                "nodes": w.node_count,
                "control_nodes": w.control_nodes.len(),
                "gates": w.gates,
                "bake_seconds": w.bake_seconds,
                "bake_started_at": w.bake_started_at,
                "ended_at": w.ended_at,
                "decision": w.decision,
                "verdict": w.verdict,
                "cohorts": cohort_totals(history.all(), w.id),
            })).collect::<Vec<_>>(),
            "files": EVIDENCE_FILES,
        });
        let trace = json!({ "looks": looks, "audit": audit });

        let mut builder = tar::Builder::new(Vec::new());
        let pretty = |v: &Value| serde_json::to_vec_pretty(v).map_err(corrupt);
        append(&mut builder, "summary.json", &pretty(&summary)?, now)?;
        for (path, cohort) in [
            ("samples/canary.csv", Cohort::Canary),
            ("samples/control.csv", Cohort::Control),
        ] {
            let csv = samples_csv(&history.hourly, &history.daily, cohort, &wave_names, &names)?;
            append(&mut builder, path, &csv, now)?;
        }
        append(&mut builder, "decision_trace.json", &pretty(&trace)?, now)?;
        let policy_text = policy.unwrap_or_else(|| "# the policy text was not stored with this rollout\n".to_owned());
        append(&mut builder, "policy.yaml", policy_text.as_bytes(), now)?;
        builder.into_inner().map_err(corrupt)
    }

    /// Rollout `id`'s evidence archive: the stored package of a finished
    /// rollout (built and stored on first use), or one built now for an
    /// unfinished rollout. `NotFound` for an unknown rollout.
    pub async fn rollout_evidence(&self, id: RolloutId) -> Result<Vec<u8>, DbError> {
        let rollout = self.exec_rollout(id).await?;
        if !rollout.state.is_finished() {
            return self.build_rollout_evidence(id).await;
        }
        if let Some(row) = rollout_evidence::Entity::find_by_id(id.0).one(&self.reader).await?
            && row.rollout_state == rollout.state.as_str()
        {
            return Ok(row.archive);
        }
        self.snapshot_rollout_evidence(id, rollout.state).await
    }

    /// Builds and stores the evidence package of a rollout that finished in
    /// `state`, replacing one stored in another state; returns what is stored.
    /// Two controllers storing at once keep the first one's bytes.
    pub async fn snapshot_rollout_evidence(&self, id: RolloutId, state: RolloutState) -> Result<Vec<u8>, DbError> {
        let archive = self.build_rollout_evidence(id).await?;
        let now = self.clock.now();
        // A package stored in another state (the rollout moved on since) is stale.
        rollout_evidence::Entity::delete_many()
            .filter(rollout_evidence::Column::RolloutId.eq(id.0))
            .filter(rollout_evidence::Column::RolloutState.ne(state.as_str()))
            .exec(&self.writer)
            .await?;
        let inserted = rollout_evidence::ActiveModel {
            rollout_id: Set(id.0),
            rollout_state: Set(state.as_str().to_owned()),
            sha256: Set(orchestrator_rma::evidence::sha256_hex(&archive)),
            size_bytes: Set(i64::try_from(archive.len()).unwrap_or(i64::MAX)),
            archive: Set(archive.clone()),
            created_at: Set(now),
        }
        .insert(&self.writer)
        .await;
        match inserted {
            Ok(_) => Ok(archive),
            Err(err) if is_unique_violation(&err) => {
                let row = rollout_evidence::Entity::find_by_id(id.0)
                    .one(&self.reader)
                    .await?
                    .ok_or_else(|| DbError::NotFound {
                        what: "rollout evidence",
                        key: id.to_string(),
                    })?;
                Ok(row.archive)
            }
            Err(err) => Err(err.into()),
        }
    }

    /// Finished rollouts whose evidence package is not stored for the state
    /// they finished in, oldest first, at most `limit`: what the retention
    /// job stores before it may reduce their samples.
    pub async fn rollouts_without_evidence(&self, limit: u64) -> Result<Vec<(RolloutId, RolloutState)>, DbError> {
        let stored = self.stored_evidence_states().await?;
        let mut out = Vec::new();
        for (id, state) in self.finished_rollouts().await? {
            if out.len() as u64 >= limit {
                break;
            }
            if stored.get(&id) != Some(&state) {
                out.push((id, state));
            }
        }
        Ok(out)
    }

    /// The state each stored package was built in, by rollout (the archives
    /// themselves are not read).
    pub(crate) async fn stored_evidence_states(&self) -> Result<HashMap<RolloutId, RolloutState>, DbError> {
        let rows: Vec<(i64, String)> = rollout_evidence::Entity::find()
            .select_only()
            .column(rollout_evidence::Column::RolloutId)
            .column(rollout_evidence::Column::RolloutState)
            .into_tuple()
            .all(&self.reader)
            .await?;
        rows.into_iter()
            .map(|(id, state)| {
                Ok((
                    RolloutId(id),
                    state.parse().map_err(|e| DbError::corrupt("rollout state", e))?,
                ))
            })
            .collect()
    }
}
