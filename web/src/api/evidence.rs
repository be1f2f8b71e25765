//! `GET /api/v1/rollouts/{id}/evidence`: the evidence package a vendor
//! gets when firmware regresses (and what an RMA claim cites).
//!
//! A tar archive, readable anywhere without our tools:
//!
//! | Entry | What |
//! |---|---|
//! | `summary.json` | rollout, release (and whether it is blocked, why), every wave with its decision, verdict and per-cohort totals |
//! | `samples/canary.csv`, `samples/control.csv` | the stored window aggregates, one row per wave, node, metric and window |
//! | `decision_trace.json` | every evaluated look (gate, look, boundary, p-value, effect) and the audit entries of the rollout and its waves |
//! | `policy.yaml` | the policy the rollout ran under, at its commit (or the inline text) |

use std::collections::{BTreeMap, HashMap};

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use chrono::Utc;
use orchestrator_db::health::{Cohort, HealthSample, LevelAgg, SampleScope};
use orchestrator_db::{AuditFilter, Db, DbError};
use orchestrator_types::{NodeId, RolloutId, WaveId};
use serde_json::{Value, json};

use super::ApiPath;
use crate::AppState;
use crate::error::{ApiError, ErrorBody};

/// Most audit entries per subject the trace carries (the audit log's page size).
const AUDIT_PAGE: u64 = 1000;

/// Node names by id, in one query for every node the samples name.
async fn node_names(db: &Db, samples: &[HealthSample]) -> Result<HashMap<NodeId, String>, DbError> {
    let ids: Vec<NodeId> = samples
        .iter()
        .map(|s| s.node_id)
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    let mut known = db.node_names(&ids).await?;
    Ok(ids
        .into_iter()
        .map(|id| {
            // A node removed since: keep its id rather than drop its data.
            let name = known.remove(&id).unwrap_or_else(|| format!("node-id-{id}"));
            (id, name)
        })
        .collect())
}

fn internal(err: impl std::error::Error + Send + Sync + 'static) -> ApiError {
    ApiError::Internal(Box::new(err))
}

/// One cohort's samples as CSV.
fn samples_csv(
    samples: &[HealthSample],
    cohort: Cohort,
    waves: &HashMap<WaveId, String>,
    names: &HashMap<NodeId, String>,
) -> Result<Vec<u8>, ApiError> {
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
        ])
        .map_err(internal)?;
    let opt = |v: Option<f64>| v.map(|v| format!("{v}")).unwrap_or_default();
    for s in samples.iter().filter(|s| s.cohort == cohort) {
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
            ])
            .map_err(internal)?;
    }
    writer.into_inner().map_err(|e| internal(e.into_error()))
}

/// Per metric and cohort totals of one wave, for the summary.
fn cohort_totals(samples: &[HealthSample], wave: WaveId) -> Value {
    let mut out: BTreeMap<String, BTreeMap<&'static str, Value>> = BTreeMap::new();
    for cohort in [Cohort::Canary, Cohort::Control] {
        let mut by_metric: BTreeMap<&str, (u64, f64, LevelAgg, std::collections::BTreeSet<NodeId>)> = BTreeMap::new();
        for s in samples.iter().filter(|s| s.wave_id == wave && s.cohort == cohort) {
            let entry = by_metric.entry(s.metric.as_str()).or_insert_with(|| {
                (
                    0,
                    0.0,
                    LevelAgg {
                        n: 0,
                        sum: 0.0,
                        min: 0.0,
                        max: 0.0,
                    },
                    Default::default(),
                )
            });
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

fn append(builder: &mut tar::Builder<Vec<u8>>, path: &str, bytes: &[u8]) -> Result<(), ApiError> {
    let mut header = tar::Header::new_gnu();
    header.set_size(bytes.len() as u64);
    header.set_mode(0o644);
    header.set_mtime(u64::try_from(Utc::now().timestamp()).unwrap_or(0));
    header.set_cksum();
    builder.append_data(&mut header, path, bytes).map_err(internal)
}

/// Builds the evidence archive of a rollout.
pub(crate) async fn build_archive(db: &Db, id: RolloutId) -> Result<Vec<u8>, ApiError> {
    let rollout = db.exec_rollout(id).await?;
    let release = db.release(rollout.release_id).await?;
    let waves = db.rollout_waves(id).await?;
    let samples = db.health_samples(SampleScope::Rollout(id)).await?;
    let looks = db.health_looks(SampleScope::Rollout(id)).await?;
    let names = node_names(db, &samples).await?;
    let wave_names: HashMap<WaveId, String> = waves.iter().map(|w| (w.id, w.name.clone())).collect();

    let policy = match db.policy_version(&rollout.policy_commit, &rollout.policy_blob).await {
        Ok(version) => Some(version.content),
        Err(DbError::NotFound { .. }) => rollout.policy_source.clone(),
        Err(err) => return Err(err.into()),
    };

    let mut audit = Vec::new();
    let subjects = std::iter::once(("rollout", id.to_string()))
        .chain(waves.iter().map(|w| ("wave", w.id.to_string())))
        .chain(std::iter::once(("release", release.id.to_string())));
    for (subject_type, subject_id) in subjects {
        let mut entries = db
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
        "generated_at": Utc::now(),
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
            "cohorts": cohort_totals(&samples, w.id),
        })).collect::<Vec<_>>(),
        "files": ["summary.json", "samples/canary.csv", "samples/control.csv", "decision_trace.json", "policy.yaml"],
    });
    let trace = json!({ "looks": looks, "audit": audit });

    let mut builder = tar::Builder::new(Vec::new());
    let pretty = |v: &Value| serde_json::to_vec_pretty(v).unwrap_or_default();
    append(&mut builder, "summary.json", &pretty(&summary))?;
    append(
        &mut builder,
        "samples/canary.csv",
        &samples_csv(&samples, Cohort::Canary, &wave_names, &names)?,
    )?;
    append(
        &mut builder,
        "samples/control.csv",
        &samples_csv(&samples, Cohort::Control, &wave_names, &names)?,
    )?;
    append(&mut builder, "decision_trace.json", &pretty(&trace))?;
    let policy_text = policy.unwrap_or_else(|| "# the policy text was not stored with this rollout\n".to_owned());
    append(&mut builder, "policy.yaml", policy_text.as_bytes())?;
    builder.into_inner().map_err(internal)
}

#[utoipa::path(get, path = "/api/v1/rollouts/{id}/evidence", tag = "rollouts",
    params(("id" = i64, Path, description = "Rollout id")),
    responses((status = 200, description = "A tar archive: summary.json, samples/canary.csv, samples/control.csv, \
        decision_trace.json, policy.yaml", content_type = "application/x-tar"),
        (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub(crate) async fn evidence(State(state): State<AppState>, ApiPath(id): ApiPath<i64>) -> Result<Response, ApiError> {
    let bytes = build_archive(&state.db, RolloutId(id)).await?;
    Ok((
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, "application/x-tar".to_owned()),
            (
                header::CONTENT_DISPOSITION,
                format!("attachment; filename=\"rollout-{id}-evidence.tar\""),
            ),
        ],
        bytes,
    )
        .into_response())
}

#[cfg(test)]
mod tests {
    use std::io::Read;
    use std::sync::Arc;

    use orchestrator_db::health::{HealthCursor, NewHealthLook, NodePoll, WindowDelta, window_start};
    use orchestrator_db::model::{ComponentReading, NewNode, NewRelease, NodeLabels};
    use orchestrator_db::testing::TestDb;
    use orchestrator_engine::{StartRollout, start_rollout};
    use orchestrator_types::{
        Clock, ComponentKind, FirmwareVersion, ManualClock, QualificationState, TransitionRequest,
    };

    use super::*;

    const SKU: &str = "hgx-h100-8gpu";

    fn policy() -> String {
        format!(
            r#"name: evidence-gpu
target:
  component: gpu
  inventory_id: "HGX_FW_GPU_*"
  platforms: [{SKU}]
versions:
  allow_downgrade: false
qualification:
  required_gates: []
waves:
  - name: canary
    count: 2
    bake: 1h
    max_in_flight: 2
  - name: rest
    rest: true
    bake: 1h
    max_in_flight: 10
concurrency:
  max_in_flight: 10
health:
  gates:
    - name: xid_errors
      source: redfish
      metric: xid_errors_per_gpu_hour
      kind: rate
      direction: increase_is_bad
      min_effect: 1.5
      interval: 30m
failure_budget:
  max_failed: 1
rollback:
  automatic: true
  scope: wave
"#
        )
    }

    async fn seeded(db: &Db) -> RolloutId {
        let nodes: Vec<NewNode> = (0..6)
            .map(|i| NewNode {
                name: format!("node-{i}"),
                bmc_url: format!("https://bmc-{i}.example"),
                credential_ref: "lab".into(),
                platform_sku: SKU.into(),
                labels: NodeLabels {
                    region: "r1".into(),
                    cluster: "c1".into(),
                    rack: format!("rack-{}", i % 3),
                    nvlink_domain: format!("nvl-{}", i % 3),
                },
            })
            .collect();
        db.import_nodes(&nodes, "test").await.unwrap();
        for node in db.list_nodes(&Default::default()).await.unwrap() {
            let readings: Vec<ComponentReading> = (0..8)
                .map(|g| ComponentReading {
                    inventory_id: format!("HGX_FW_GPU_{g}"),
                    kind: ComponentKind::Gpu,
                    version: FirmwareVersion::parse("96.00.5E.00.01").unwrap(),
                    updateable: true,
                    software_id: None,
                    health: Some("OK".into()),
                })
                .collect();
            db.record_inventory(node.id, &readings).await.unwrap();
        }
        let release = db
            .add_release(
                &NewRelease {
                    component_kind: ComponentKind::Gpu,
                    version: FirmwareVersion::parse("96.00.61.00.01").unwrap(),
                    image_uri: "https://images.example/gpu.fw".into(),
                    sha256: "0123456789abcdef".repeat(4),
                    size_bytes: 1024,
                    platforms: vec![SKU.into()],
                    release_notes: String::new(),
                },
                "alice",
            )
            .await
            .unwrap();
        for to in [QualificationState::Qualifying, QualificationState::Qualified] {
            db.transition_release(release.id, &TransitionRequest { to, reason: None }, "alice")
                .await
                .unwrap();
        }
        let start = StartRollout {
            release_id: release.id,
            policy_source: policy(),
            policy_commit: None,
            policy_blob: None,
            seed: 3,
        };
        start_rollout(db, &start, "alice").await.unwrap().id
    }

    fn entries(archive: &[u8]) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        let mut archive = tar::Archive::new(archive);
        for entry in archive.entries().unwrap() {
            let mut entry = entry.unwrap();
            let path = entry.path().unwrap().to_string_lossy().into_owned();
            let mut text = String::new();
            entry.read_to_string(&mut text).unwrap();
            out.insert(path, text);
        }
        out
    }

    #[tokio::test]
    async fn the_archive_holds_summary_samples_trace_and_policy() {
        let clock = Arc::new(ManualClock::new(
            chrono::DateTime::parse_from_rfc3339("2026-03-01T10:00:00Z")
                .unwrap()
                .with_timezone(&Utc),
        ));
        let t = TestDb::sqlite(clock.clone()).await;
        let db = &t.db;
        let id = seeded(db).await;
        let waves = db.rollout_waves(id).await.unwrap();
        let canary = &waves[0];
        let now = clock.now();
        let steps = db
            .steps(&orchestrator_db::execution::StepFilter {
                wave_id: Some(canary.id),
                ..Default::default()
            })
            .await
            .unwrap();
        let canary_node = steps[0].node_id;
        let canary_name = db.node(canary_node).await.unwrap().name;
        let mut polls = vec![(canary_node, Cohort::Canary, 7)];
        polls.extend(canary.control_nodes.iter().map(|n| (*n, Cohort::Control, 2)));
        for (node, cohort, events) in polls {
            db.record_health_poll(&NodePoll {
                cursor: HealthCursor {
                    rollout_id: id,
                    wave_id: canary.id,
                    node_id: node,
                    cohort,
                    exposure_start: now,
                    accounted_until: now,
                    event_cursor: None,
                    gpus: 8,
                    polls: 0,
                    last_error: None,
                },
                first: true,
                deltas: vec![WindowDelta {
                    metric: "xid_errors_per_gpu_hour".into(),
                    window_start: window_start(now),
                    events,
                    exposure: 8.0,
                    units: Default::default(),
                }],
            })
            .await
            .unwrap();
        }
        db.record_health_look(
            &NewHealthLook {
                rollout_id: id,
                wave_id: canary.id,
                gate: "xid_errors".into(),
                look_number: 1,
                planned_looks: 2,
                outcome: orchestrator_types::Outcome::Inconclusive,
                verdict: json!({ "outcome": "inconclusive", "gate": "xid_errors", "reason": "bake_in_progress" }),
            },
            "detector",
        )
        .await
        .unwrap();

        let files = entries(&build_archive(db, id).await.unwrap());
        assert_eq!(
            files.keys().map(String::as_str).collect::<Vec<_>>(),
            [
                "decision_trace.json",
                "policy.yaml",
                "samples/canary.csv",
                "samples/control.csv",
                "summary.json"
            ]
        );
        let summary: Value = serde_json::from_str(&files["summary.json"]).unwrap();
        assert_eq!(summary["rollout"]["id"], id.0);
        let xid = &summary["waves"][0]["cohorts"]["xid_errors_per_gpu_hour"];
        assert_eq!(xid["canary"]["events"], 7, "{summary:#}");
        assert_eq!(xid["control"]["nodes"], canary.control_nodes.len(), "{summary:#}");
        let canary_csv: Vec<&str> = files["samples/canary.csv"].lines().collect();
        assert_eq!(canary_csv.len(), 2, "{canary_csv:?}");
        let prefix = format!("canary,{canary_name},xid_errors_per_gpu_hour,");
        assert!(canary_csv[1].starts_with(&prefix), "{}", canary_csv[1]);
        assert_eq!(
            files["samples/control.csv"].lines().count(),
            1 + canary.control_nodes.len()
        );
        let trace: Value = serde_json::from_str(&files["decision_trace.json"]).unwrap();
        assert_eq!(trace["looks"][0]["gate"], "xid_errors");
        assert!(
            trace["audit"]
                .as_array()
                .unwrap()
                .iter()
                .any(|e| e["action"] == "health.look"),
            "{trace:#}"
        );
        assert_eq!(files["policy.yaml"], policy());

        // An unknown rollout is a 404, not an empty archive.
        assert!(matches!(
            build_archive(db, RolloutId(9999)).await,
            Err(ApiError::NotFound(_))
        ));
    }
}
