//! The executor lease and its fencing token, on SQLite and PostgreSQL: a
//! controller whose lease was taken over can never write execution state
//! again.

use std::sync::Arc;

use chrono::{Duration, Utc};
use orchestrator_db::DbError;
use orchestrator_db::execution::{NewStep, StepChange, StepFilter, StepState};
use orchestrator_db::model::NewRelease;
use orchestrator_db::testing::TestDb;
use orchestrator_db::testing::fixtures::{node, release, store_rollout, wave};
use orchestrator_types::ManualClock;

#[tokio::test]
async fn a_stale_token_cannot_write() {
    let clock = Arc::new(ManualClock::new(Utc::now()));
    for test_db in TestDb::all_backends_with_clock(clock.clone()).await {
        let db = &test_db.db;
        let backend = test_db.backend();
        let a = db
            .acquire_lease("executor", "a", Duration::seconds(30))
            .await
            .unwrap()
            .expect("a takes it");
        assert_eq!(a.token, 1);
        assert!(
            db.acquire_lease("executor", "b", Duration::seconds(30))
                .await
                .unwrap()
                .is_none(),
            "{backend:?}"
        );
        let renewed = db
            .acquire_lease("executor", "a", Duration::seconds(30))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(renewed.token, 1, "renewal keeps the token");

        let n1 = node("n1")
            .bmc_url("http://127.0.0.1:1")
            .credential("x")
            .sku("sku")
            .labels("r", "c", "k", "n");
        db.import_nodes(&[n1.build()], "test").await.unwrap();
        let node = db.node_by_name("n1").await.unwrap();
        let new_release = NewRelease {
            image_uri: "http://images/2.0".into(),
            sha256: "a".repeat(64),
            size_bytes: 1,
            platforms: vec!["sku".into()],
            ..release("2.0")
        };
        let release = db.add_release(&new_release, "alice").await.unwrap();
        let step = NewStep {
            node_id: node.id,
            inventory_id: "GPU_0".into(),
            expected_from_version: "1.0".into(),
        };
        let rollout = store_rollout(db, release.id, vec![wave("w", 0, 0, 1, vec![step])], "alice")
            .await
            .unwrap();
        let step = db
            .steps(&StepFilter {
                rollout_id: Some(rollout.id),
                ..Default::default()
            })
            .await
            .unwrap()[0]
            .clone();
        let to = |state| StepChange {
            state: Some(state),
            ..Default::default()
        };
        db.transition_step(
            &a,
            step.id,
            StepState::Pending,
            &to(StepState::Prechecked),
            serde_json::json!({}),
        )
        .await
        .unwrap();
        // A conditional write from a stale read loses.
        let stale = db
            .transition_step(
                &a,
                step.id,
                StepState::Pending,
                &to(StepState::Skipped),
                serde_json::json!({}),
            )
            .await;
        assert!(matches!(stale, Err(DbError::Stale { .. })), "{backend:?}: {stale:?}");

        // A stops renewing; B takes over after expiry with a higher token.
        clock.advance(Duration::seconds(31));
        let b = db
            .acquire_lease("executor", "b", Duration::seconds(30))
            .await
            .unwrap()
            .expect("b takes over");
        assert_eq!(b.token, 2);
        let fenced = db
            .transition_step(
                &a,
                step.id,
                StepState::Prechecked,
                &to(StepState::Pushing),
                serde_json::json!({}),
            )
            .await;
        assert!(
            matches!(fenced, Err(DbError::Fenced { token: 1, .. })),
            "{backend:?}: {fenced:?}"
        );
        assert_eq!(
            db.step(step.id).await.unwrap().state,
            StepState::Prechecked,
            "the fenced write changed nothing"
        );
        db.transition_step(
            &b,
            step.id,
            StepState::Prechecked,
            &to(StepState::Pushing),
            serde_json::json!({}),
        )
        .await
        .unwrap();
        // A comes back: it cannot take the lease while B holds it.
        assert!(
            db.acquire_lease("executor", "a", Duration::seconds(30))
                .await
                .unwrap()
                .is_none()
        );
        db.release_lease(&b).await.unwrap();
        let again = db
            .acquire_lease("executor", "a", Duration::seconds(30))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(again.token, 3, "a released lease is taken over with a new token");
    }
}

/// A leader frozen inside a fenced write (SIGSTOP, a paused VM) holds the
/// lease row's lock. On PostgreSQL the server ends its idle transaction
/// after the connection's `pg_idle_in_transaction` limit, so once the lease
/// has expired a standby takes over instead of waiting on the lock for as
/// long as the leader stays frozen.
#[tokio::test]
async fn a_leader_frozen_mid_write_does_not_block_the_takeover_on_postgres() {
    let clock = Arc::new(ManualClock::new(Utc::now()));
    let Some(test_db) = TestDb::postgres(clock.clone()).await else {
        return;
    };
    let leader = orchestrator_db::Db::connect_tuned(
        &test_db.url,
        clock.clone(),
        orchestrator_db::ConnectTuning {
            pg_idle_in_transaction: std::time::Duration::from_millis(500),
        },
    )
    .await
    .expect("leader connects");
    let fence = leader
        .acquire_lease("executor", "a", Duration::seconds(30))
        .await
        .expect("lease")
        .expect("free");
    let stalled = leader.stall_in_fenced_write("executor").await.expect("lock the row");
    clock.advance(Duration::seconds(31));

    let standby = &test_db.db;
    let taken = tokio::time::timeout(
        std::time::Duration::from_secs(5),
        standby.acquire_lease("executor", "b", Duration::seconds(30)),
    )
    .await
    .expect("the standby waited on the frozen leader's lock")
    .expect("lease")
    .expect("expired: the standby takes it");
    assert_eq!(taken.token, fence.token + 1);
    drop(stalled);
}
