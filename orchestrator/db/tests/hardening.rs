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
