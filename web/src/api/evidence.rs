//! `GET /api/v1/rollouts/{id}/evidence`: the evidence package a vendor
//! gets when firmware regresses (and what an RMA claim cites).
//!
//! A tar archive, readable anywhere without our tools; what it holds, and
//! why a finished rollout's package is stored once and served from then on,
//! is in `orchestrator_db::rollout_evidence`.

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use orchestrator_db::Db;
use orchestrator_types::RolloutId;

use super::ApiPath;
use crate::AppState;
use crate::error::{ApiError, ErrorBody};

/// The evidence archive of a rollout (stored once it finished).
pub(crate) async fn build_archive(db: &Db, id: RolloutId) -> Result<Vec<u8>, ApiError> {
    Ok(db.rollout_evidence(id).await?)
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

    use std::collections::BTreeMap;

    use chrono::Utc;
    use orchestrator_db::health::Cohort;
    use serde_json::{Value, json};

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
