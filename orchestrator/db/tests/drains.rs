//! Waveguard's drain records on every backend: the intent is idempotent per
//! step, a node has at most one owner, phases move only from the phase read,
//! every write is fenced, and every transition is audited.

use chrono::Duration;
use orchestrator_db::drains::NewDrain;
use orchestrator_db::execution::StepFilter;
use orchestrator_db::testing::TestDb;
use orchestrator_db::testing::fixtures::{plain_nodes, plain_release, steps, store_rollout, wave};
use orchestrator_db::{AuditFilter, Db, DbError};
use orchestrator_types::DrainPhase;
use serde_json::json;

async fn two_rollouts(
    db: &Db,
) -> (
    Vec<orchestrator_db::execution::ExecStep>,
    Vec<orchestrator_db::execution::ExecStep>,
) {
    db.import_nodes(&plain_nodes(2), "test").await.unwrap();
    let nodes = db.list_nodes(&Default::default()).await.unwrap();
    let release = db.add_release(&plain_release(), "alice").await.unwrap();
    let mut out = Vec::new();
    for _ in 0..2 {
        let all = wave("all", 60, 1, 2, steps(&nodes, "GPU_*", "96.00.5E.00.01"));
        let rollout = store_rollout(db, release.id, vec![all], "alice").await.unwrap();
        out.push(
            db.steps(&StepFilter {
                rollout_id: Some(rollout.id),
                ..Default::default()
            })
            .await
            .unwrap(),
        );
    }
    let second = out.pop().unwrap();
    (out.pop().unwrap(), second)
}

fn intent(step: &orchestrator_db::execution::ExecStep) -> NewDrain {
    NewDrain {
        rollout_id: step.rollout_id,
        wave_id: step.wave_id,
        step_id: step.id,
        node_id: step.node_id,
        scheduler_kind: "slurm".into(),
        scheduler_node: format!("n{}", step.node_id.0),
        reason_text: format!("waveguard rollout={} firmware maintenance", step.rollout_id),
        observed_before: json!({ "base": "idle", "drain": false }),
    }
}

#[tokio::test]
async fn a_node_has_one_drain_owner_and_each_phase_moves_once_under_the_fence() {
    for t in TestDb::all_backends().await {
        let db = &t.db;
        let (first, second) = two_rollouts(db).await;
        let fence = db
            .acquire_lease("executor", "test", Duration::hours(1))
            .await
            .unwrap()
            .unwrap();
        let row = db.record_drain_intent(&fence, &intent(&first[0])).await.unwrap();
        assert_eq!(row.phase, DrainPhase::DrainIntended);
        // A replayed intent returns the same record.
        let again = db.record_drain_intent(&fence, &intent(&first[0])).await.unwrap();
        assert_eq!(again.id, row.id);
        // Another rollout's step on the same node cannot own its drain too.
        let same_node = second.iter().find(|s| s.node_id == first[0].node_id).unwrap();
        let err = db.record_drain_intent(&fence, &intent(same_node)).await.unwrap_err();
        assert!(matches!(err, DbError::Conflict { .. }), "{err:?}");

        let held = db
            .move_drain(&fence, row.id, DrainPhase::DrainIntended, DrainPhase::Held, None)
            .await
            .unwrap();
        assert!(held.held_at.is_some());
        // A second writer that read the old phase loses.
        let stale = db
            .move_drain(&fence, row.id, DrainPhase::DrainIntended, DrainPhase::Held, None)
            .await
            .unwrap_err();
        assert!(matches!(stale, DbError::Stale { .. }), "{stale:?}");
        db.move_drain(&fence, row.id, DrainPhase::Held, DrainPhase::ResumeIntended, None)
            .await
            .unwrap();
        let closed = db
            .move_drain(
                &fence,
                row.id,
                DrainPhase::ResumeIntended,
                DrainPhase::Closed,
                Some("resumed"),
            )
            .await
            .unwrap();
        assert_eq!(closed.close_reason.as_deref(), Some("resumed"));
        assert!(closed.closed_at.is_some());
        assert!(db.open_drains().await.unwrap().is_empty());
        // Closed, the node may be drained by the other rollout.
        db.record_drain_intent(&fence, &intent(same_node)).await.unwrap();
        assert_eq!(db.node_drains(first[0].node_id).await.unwrap().len(), 2);

        // A controller whose lease was taken over writes nothing.
        db.release_lease(&fence).await.unwrap();
        let successor = db
            .acquire_lease("executor", "other", Duration::hours(1))
            .await
            .unwrap()
            .unwrap();
        let fenced = db.record_drain_intent(&fence, &intent(&first[1])).await.unwrap_err();
        assert!(matches!(fenced, DbError::Fenced { .. }), "{fenced:?}");
        assert!(db.record_drain_intent(&successor, &intent(&first[1])).await.is_ok());

        let audit = db
            .audit_entries(&AuditFilter {
                action: Some("scheduler.drain".into()),
                ..Default::default()
            })
            .await
            .unwrap();
        let to: Vec<&str> = audit.iter().filter_map(|e| e.details["to"].as_str()).collect();
        assert_eq!(to.len(), 6, "one entry per transition: {to:?}");
        assert!(audit.iter().all(|e| e.subject_type == "node"));
    }
}
