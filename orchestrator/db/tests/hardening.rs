//! Issue 24 in the datastore, on every backend: BMC re-addressing rules and
//! login throttling (m0009).

use std::sync::Arc;

use chrono::{Duration, TimeZone, Utc};
use orchestrator_db::DbError;
use orchestrator_db::model::{ImportOptions, NewNode, NodeLabels};
use orchestrator_db::testing::TestDb;
use orchestrator_db::throttle::{LoginGate, Refusal, ThrottlePolicy};
use orchestrator_types::ManualClock;

fn node(name: &str, bmc_url: &str) -> NewNode {
    NewNode {
        name: name.into(),
        bmc_url: bmc_url.into(),
        credential_ref: "lab".into(),
        platform_sku: "hgx-h100-8gpu".into(),
        labels: NodeLabels {
            region: "us-east-1".into(),
            cluster: "c1".into(),
            rack: "r1".into(),
            nvlink_domain: "nvl1".into(),
        },
    }
}

#[tokio::test]
async fn bmc_addresses_change_only_with_permission_and_stay_unique() {
    for t in TestDb::all_backends().await {
        let db = &t.db;
        db.import_nodes(&[node("a", "https://10.0.0.1"), node("b", "https://10.0.0.2")], "test")
            .await
            .unwrap();
        let err = db
            .import_nodes(&[node("a", "https://evil.example")], "rm")
            .await
            .unwrap_err();
        assert!(matches!(err, DbError::NotPermitted { .. }), "{err}");
        let admin = ImportOptions {
            may_change_bmc_address: true,
            known_credential_refs: None,
        };
        // Swapping two nodes' addresses in one import is allowed.
        let summary = db
            .import_nodes_with(
                &[node("a", "https://10.0.0.2"), node("b", "https://10.0.0.1")],
                "ada",
                &admin,
            )
            .await
            .unwrap();
        assert_eq!(summary.updated, 2);
        let err = db
            .import_nodes_with(&[node("c", "https://10.0.0.1:443")], "ada", &admin)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("already node \"b\""), "{err}");
        let a = db.node_by_name("a").await.unwrap();
        assert!(a.last_discovery_error.is_some());
    }
}

#[tokio::test]
async fn throttles_lock_the_pair_back_off_the_account_and_only_slow_the_address() {
    let clock = Arc::new(ManualClock::new(Utc.with_ymd_and_hms(2026, 12, 4, 12, 0, 0).unwrap()));
    for t in TestDb::all_backends_with_clock(clock.clone()).await {
        let db = &t.db;
        let policy = ThrottlePolicy {
            pair_max_failures: 3,
            account_free_failures: 3,
            address_free_failures: 2,
            ..ThrottlePolicy::default()
        };
        for _ in 0..3 {
            db.record_login_failure("Rita", "10.0.0.1", &policy).await.unwrap();
        }
        assert!(matches!(
            db.login_gate("rita", "10.0.0.1", &policy).await.unwrap(),
            LoginGate::Refused {
                reason: Refusal::PairLocked,
                ..
            }
        ));
        // Not locked from elsewhere; the address is slowed, not refused, for others.
        assert_eq!(
            db.login_gate("rita", "10.0.0.2", &policy).await.unwrap(),
            LoginGate::Allowed {
                slow_down: Duration::zero()
            }
        );
        match db.login_gate("vera", "10.0.0.1", &policy).await.unwrap() {
            LoginGate::Allowed { slow_down } => assert_eq!(slow_down, Duration::milliseconds(250)),
            other => panic!("{other:?}"),
        }
        db.record_login_failure("rita", "10.0.0.3", &policy).await.unwrap();
        assert!(matches!(
            db.login_gate("rita", "10.0.0.2", &policy).await.unwrap(),
            LoginGate::Refused {
                reason: Refusal::AccountBackoff,
                ..
            }
        ));
        assert_eq!(db.login_throttles(Duration::minutes(15)).await.unwrap().len(), 5);
        db.record_login_success("rita", "10.0.0.2").await.unwrap();
        assert!(matches!(
            db.login_gate("rita", "10.0.0.1", &policy).await.unwrap(),
            LoginGate::Refused {
                reason: Refusal::PairLocked,
                ..
            }
        ));
        assert!(matches!(
            db.login_gate("rita", "10.0.0.2", &policy).await.unwrap(),
            LoginGate::Allowed { .. }
        ));
        clock.advance(Duration::minutes(16));
        assert!(matches!(
            db.login_gate("rita", "10.0.0.1", &policy).await.unwrap(),
            LoginGate::Allowed { .. }
        ));
        clock.advance(Duration::minutes(-16));
    }
}

/// The demo runs rollouts on an accelerated clock; a lockout is about a
/// person at a keyboard, so it must last its wall-clock time whatever the
/// rollout clock does.
#[tokio::test]
async fn a_lockout_runs_on_the_session_clock_not_the_rollout_clock() {
    let start = Utc.with_ymd_and_hms(2026, 12, 4, 12, 0, 0).unwrap();
    let rollout_clock = Arc::new(ManualClock::new(start));
    let session_clock = Arc::new(ManualClock::new(start));
    for t in TestDb::all_backends_with_clock(rollout_clock.clone()).await {
        let db = t.db.clone().with_session_clock(session_clock.clone());
        let policy = ThrottlePolicy {
            pair_max_failures: 2,
            ..ThrottlePolicy::default()
        };
        for _ in 0..2 {
            db.record_login_failure("rita", "10.0.0.9", &policy).await.unwrap();
        }
        rollout_clock.advance(Duration::hours(6));
        assert!(
            matches!(
                db.login_gate("rita", "10.0.0.9", &policy).await.unwrap(),
                LoginGate::Refused {
                    reason: Refusal::PairLocked,
                    ..
                }
            ),
            "six rollout-clock hours must not end a wall-clock lockout"
        );
        session_clock.advance(Duration::hours(1));
        assert!(matches!(
            db.login_gate("rita", "10.0.0.9", &policy).await.unwrap(),
            LoginGate::Allowed { .. }
        ));
        session_clock.advance(Duration::hours(-1));
        rollout_clock.advance(Duration::hours(-6));
    }
}

/// A node being flashed keeps its BMC address until its rollout lets go.
#[tokio::test]
async fn a_node_being_flashed_cannot_be_readdressed() {
    use orchestrator_db::execution::{NewStep, StepChange, StepFilter, StepState};
    use orchestrator_db::testing::fixtures::{GPU_FROM, GPU_TO, release, store_rollout, wave};

    for t in TestDb::all_backends().await {
        let db = &t.db;
        db.import_nodes(&[node("a", "https://10.0.0.1")], "test").await.unwrap();
        let a = db.node_by_name("a").await.unwrap().id;
        let release = db.add_release(&release(GPU_TO), "alice").await.unwrap();
        let step = NewStep {
            node_id: a,
            inventory_id: "HGX_FW_GPU_*".into(),
            expected_from_version: GPU_FROM.into(),
        };
        let rollout = store_rollout(db, release.id, vec![wave("canary", 60, 0, 1, vec![step])], "alice")
            .await
            .unwrap();
        let admin = ImportOptions {
            may_change_bmc_address: true,
            known_credential_refs: None,
        };
        let fence = db
            .acquire_lease("executor", "test", Duration::hours(1))
            .await
            .unwrap()
            .unwrap();
        let step = db
            .steps(&StepFilter {
                rollout_id: Some(rollout.id),
                ..Default::default()
            })
            .await
            .unwrap()[0]
            .id;
        let change = StepChange {
            state: Some(StepState::Flashing),
            started_at: Some(Utc::now()),
            ..Default::default()
        };
        db.transition_step(&fence, step, StepState::Pending, &change, serde_json::json!({}))
            .await
            .unwrap();
        let err = db
            .import_nodes_with(&[node("a", "https://10.0.0.9")], "ada", &admin)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("being updated by a rollout"), "{err}");
        assert_eq!(db.node_by_name("a").await.unwrap().bmc_url, "https://10.0.0.1");
    }
}

/// Issue 24 #1, unbound profiles (m0010): the first import names the hosts,
/// later imports never widen them, only an admin's extension does.
#[tokio::test]
async fn a_profile_is_bound_to_the_hosts_of_its_first_import() {
    for t in TestDb::all_backends().await {
        let db = &t.db;
        db.import_nodes(
            &[
                node("a", "https://10.0.0.1"),
                node("b", "https://BMC-B.lab.example:8443"),
            ],
            "ops",
        )
        .await
        .unwrap();
        let bound = db.credential_host_bindings().await.unwrap();
        assert_eq!(bound["lab"], ["10.0.0.1", "bmc-b.lab.example"], "{:?}", t.backend());
        db.import_nodes(&[node("c", "https://10.0.0.3")], "rm").await.unwrap();
        assert_eq!(
            db.credential_host_bindings().await.unwrap(),
            bound,
            "a later import never widens it"
        );
        let err = db
            .extend_credential_binding("lab", &["10.0.0.9/x".into()], "local-admin:ops")
            .await
            .unwrap_err();
        assert!(matches!(err, DbError::Invalid { .. }), "{err}");
        db.extend_credential_binding("lab", &["10.0.0.3".into(), "10.0.0.1".into()], "local-admin:ops")
            .await
            .unwrap();
        assert_eq!(
            db.credential_host_bindings().await.unwrap()["lab"],
            ["10.0.0.1", "10.0.0.3", "bmc-b.lab.example"]
        );
    }
}
