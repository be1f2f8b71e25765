//! Step transitions committed in groups (issue 23): many concurrent callers
//! share transactions, yet each gets exactly its own outcome, a stale step
//! fails alone, every move is audited once, and a lost fence refuses the
//! whole group. On every backend.

use std::sync::Arc;

use chrono::{Duration, TimeZone, Utc};
use orchestrator_db::AuditFilter;
use orchestrator_db::DbError;
use orchestrator_db::execution::{NewStep, StepChange, StepFilter, StepState};
use orchestrator_db::model::{NewNode, NodeLabels};
use orchestrator_db::testing::TestDb;
use orchestrator_db::testing::fixtures::{GPU_FROM, GPU_TO, release, store_rollout, wave};
use orchestrator_types::{ManualClock, StepId};
use tokio::task::JoinSet;

const NODES: usize = 40;

fn node(i: usize) -> NewNode {
    NewNode {
        name: format!("n{i:03}"),
        bmc_url: format!("https://10.0.{}.{}", i / 200, i % 200 + 1),
        credential_ref: "lab".into(),
        platform_sku: "hgx-h100-8gpu".into(),
        labels: NodeLabels {
            region: "us-east-1".into(),
            cluster: "c1".into(),
            rack: format!("r{}", i / 10),
            nvlink_domain: format!("d{}", i / 10),
        },
    }
}

async fn steps_of(db: &orchestrator_db::Db) -> Vec<StepId> {
    db.import_nodes(&(0..NODES).map(node).collect::<Vec<_>>(), "test")
        .await
        .unwrap();
    let release = db.add_release(&release(GPU_TO), "alice").await.unwrap();
    let mut steps = Vec::new();
    for i in 0..NODES {
        steps.push(NewStep {
            node_id: db.node_by_name(&format!("n{i:03}")).await.unwrap().id,
            inventory_id: "HGX_FW_GPU_*".into(),
            expected_from_version: GPU_FROM.into(),
        });
    }
    let rollout = store_rollout(db, release.id, vec![wave("all", 60, 0, 100, steps)], "alice")
        .await
        .unwrap();
    db.steps(&StepFilter {
        rollout_id: Some(rollout.id),
        ..Default::default()
    })
    .await
    .unwrap()
    .into_iter()
    .map(|s| s.id)
    .collect()
}

fn precheck() -> StepChange {
    StepChange {
        state: Some(StepState::Prechecked),
        attempts: Some(0),
        error: Some(None),
        previous_version: Some(GPU_FROM.into()),
        ..Default::default()
    }
}

/// The executor's lease, held for the whole test.
async fn executor_fence(db: &orchestrator_db::Db) -> orchestrator_db::execution::Fence {
    db.acquire_lease("executor", "test", Duration::hours(1))
        .await
        .unwrap()
        .unwrap()
}

async fn step_transitions(db: &orchestrator_db::Db) -> usize {
    db.audit_entries(&AuditFilter {
        action: Some("step.transition".into()),
        limit: Some(1000),
        ..Default::default()
    })
    .await
    .unwrap()
    .len()
}

#[tokio::test]
async fn concurrent_transitions_each_get_their_own_outcome() {
    let clock = Arc::new(ManualClock::new(Utc.with_ymd_and_hms(2026, 12, 6, 12, 0, 0).unwrap()));
    for t in TestDb::all_backends_with_clock(clock.clone()).await {
        let db = t.db.clone();
        let ids = steps_of(&db).await;
        let fence = executor_fence(&db).await;
        // Every step moved once, and the first ten twice from the same state:
        // of each such pair exactly one wins, however the calls are grouped.
        let mut calls = JoinSet::new();
        for (n, id) in ids.iter().chain(ids.iter().take(10)).enumerate() {
            let (db, fence, id) = (db.clone(), fence.clone(), *id);
            calls.spawn(async move {
                let details = serde_json::json!({ "call": n });
                (
                    id,
                    db.transition_step(&fence, id, StepState::Pending, &precheck(), details)
                        .await,
                )
            });
        }
        let mut moved = std::collections::HashMap::new();
        let mut stale = 0;
        while let Some(joined) = calls.join_next().await {
            match joined.unwrap() {
                (id, Ok(step)) => {
                    assert_eq!(step.id, id, "a caller got another step's row");
                    assert_eq!(step.state, StepState::Prechecked);
                    assert_eq!(step.previous_version.as_deref(), Some(GPU_FROM));
                    assert!(moved.insert(id, step).is_none(), "step {id} moved twice");
                }
                (_, Err(DbError::Stale { .. })) => stale += 1,
                (id, Err(err)) => panic!("step {id}: {err}"),
            }
        }
        assert_eq!(moved.len(), NODES);
        assert_eq!(stale, 10);
        // What each caller got back is what was stored.
        for id in &ids {
            assert_eq!(&db.step(*id).await.unwrap(), &moved[id]);
        }
        assert_eq!(step_transitions(&db).await, NODES, "one audit entry per move");
    }
}

#[tokio::test]
async fn a_lost_fence_refuses_every_transition_of_the_group() {
    let clock = Arc::new(ManualClock::new(Utc.with_ymd_and_hms(2026, 12, 6, 12, 0, 0).unwrap()));
    for t in TestDb::all_backends_with_clock(clock.clone()).await {
        let db = t.db.clone();
        let ids = steps_of(&db).await;
        let old = db
            .acquire_lease("executor", "old", Duration::minutes(1))
            .await
            .unwrap()
            .unwrap();
        clock.advance(Duration::minutes(2));
        let new = db
            .acquire_lease("executor", "new", Duration::minutes(1))
            .await
            .unwrap()
            .unwrap();
        assert!(new.token > old.token);
        let mut calls = JoinSet::new();
        for id in ids.clone() {
            let (db, old) = (db.clone(), old.clone());
            calls.spawn(async move {
                db.transition_step(&old, id, StepState::Pending, &precheck(), serde_json::json!({}))
                    .await
            });
        }
        while let Some(joined) = calls.join_next().await {
            let err = joined.unwrap().unwrap_err();
            assert!(matches!(err, DbError::Fenced { .. }), "{err}");
        }
        for id in &ids {
            assert_eq!(db.step(*id).await.unwrap().state, StepState::Pending);
        }
        assert_eq!(step_transitions(&db).await, 0);
        // The holder's own writes still go through.
        let step = db
            .transition_step(&new, ids[0], StepState::Pending, &precheck(), serde_json::json!({}))
            .await
            .unwrap();
        assert_eq!(step.state, StepState::Prechecked);
        clock.advance(Duration::minutes(-2));
    }
}

#[tokio::test]
async fn a_chain_of_moves_commits_together_with_each_move_audited() {
    let clock = Arc::new(ManualClock::new(Utc.with_ymd_and_hms(2026, 12, 6, 12, 0, 0).unwrap()));
    for t in TestDb::all_backends_with_clock(clock.clone()).await {
        let db = t.db.clone();
        let ids = steps_of(&db).await;
        let fence = executor_fence(&db).await;
        let pushing = StepChange {
            state: Some(StepState::Pushing),
            ..Default::default()
        };
        let chain = || {
            vec![
                (precheck(), serde_json::json!({ "link": 1 })),
                (pushing.clone(), serde_json::json!({ "link": 2 })),
            ]
        };
        let step = db
            .transition_step_chain(&fence, ids[0], StepState::Pending, chain())
            .await
            .unwrap();
        // The row as the last move left it, with what the first one set.
        assert_eq!(step.state, StepState::Pushing);
        assert_eq!(step.previous_version.as_deref(), Some(GPU_FROM));
        assert_eq!(&db.step(ids[0]).await.unwrap(), &step);
        let mut entries = db
            .audit_entries(&AuditFilter {
                action: Some("step.transition".into()),
                subject_id: Some(ids[0].to_string()),
                limit: Some(10),
                ..Default::default()
            })
            .await
            .unwrap();
        entries.reverse();
        let moves: Vec<(String, String, i64)> = entries
            .iter()
            .map(|e| {
                let field = |k: &str| e.details[k].as_str().unwrap_or_default().to_owned();
                (
                    field("from"),
                    field("to"),
                    e.details["link"].as_i64().unwrap_or_default(),
                )
            })
            .collect();
        assert_eq!(
            moves,
            [
                ("pending".to_owned(), "prechecked".to_owned(), 1),
                ("prechecked".to_owned(), "pushing".to_owned(), 2)
            ]
        );
        // A chain whose first move finds the step elsewhere writes nothing at all.
        let stale = db
            .transition_step_chain(&fence, ids[0], StepState::Pending, chain())
            .await;
        assert!(matches!(stale, Err(DbError::Stale { .. })), "{stale:?}");
        assert_eq!(db.step(ids[0]).await.unwrap(), step);
        assert_eq!(step_transitions(&db).await, 2);
    }
}

/// A move decided by an inventory read records the reading as the node's inventory in the same
/// commit (the engine's read-back after a flash): concurrent callers' readings land with their own
/// nodes, and a stale move records nothing.
#[tokio::test]
async fn a_move_with_its_inventory_records_the_reading_only_when_it_applies() {
    use orchestrator_db::model::{ComponentReading, DiscoveredComponent};
    use orchestrator_types::{ComponentKind, FirmwareVersion};
    let clock = Arc::new(ManualClock::new(Utc.with_ymd_and_hms(2026, 12, 6, 12, 0, 0).unwrap()));
    for t in TestDb::all_backends_with_clock(clock.clone()).await {
        let db = t.db.clone();
        let ids = steps_of(&db).await;
        let fence = executor_fence(&db).await;
        let reading = |version: &str| {
            (0..8)
                .map(|gpu| DiscoveredComponent {
                    reading: ComponentReading {
                        inventory_id: format!("HGX_FW_GPU_{gpu}"),
                        kind: ComponentKind::Gpu,
                        version: FirmwareVersion::parse(version).unwrap(),
                        updateable: true,
                        software_id: None,
                        health: Some("OK".into()),
                    },
                    lowest_supported_version: None,
                })
                .collect::<Vec<_>>()
        };
        let mut calls = JoinSet::new();
        for id in ids.clone() {
            let (db, fence, inventory) = (db.clone(), fence.clone(), reading(GPU_TO));
            calls.spawn(async move {
                db.transition_step_chain_with_inventory(
                    &fence,
                    id,
                    StepState::Pending,
                    vec![(precheck(), serde_json::json!({}))],
                    inventory,
                )
                .await
            });
        }
        let mut nodes = Vec::new();
        while let Some(joined) = calls.join_next().await {
            nodes.push(joined.unwrap().unwrap().node_id);
        }
        assert_eq!(nodes.len(), NODES);
        for node in &nodes {
            let components = db.node_components(*node).await.unwrap();
            assert_eq!(components.len(), 8, "{components:?}");
            assert!(
                components.iter().all(|c| c.reading.version.as_str() == GPU_TO),
                "{components:?}"
            );
        }
        // The same move again is stale: its (older) reading is not recorded.
        let stale = db
            .transition_step_chain_with_inventory(
                &fence,
                ids[0],
                StepState::Pending,
                vec![(precheck(), serde_json::json!({}))],
                reading(GPU_FROM),
            )
            .await;
        assert!(matches!(stale, Err(DbError::Stale { .. })), "{stale:?}");
        let node = db.step(ids[0]).await.unwrap().node_id;
        assert!(
            db.node_components(node)
                .await
                .unwrap()
                .iter()
                .all(|c| c.reading.version.as_str() == GPU_TO)
        );
    }
}
