//! Sessions on their own clock: a rollout clock racing ahead (the demo's
//! 1,200x) does not end a session that is young in real time, and the
//! session clock alone decides expiry.

use std::sync::Arc;

use chrono::{Duration, TimeZone, Utc};
use orchestrator_db::testing::TestDb;
use orchestrator_types::{ManualClock, Role};

#[tokio::test]
async fn sessions_expire_by_the_session_clock_only() {
    let start = Utc.with_ymd_and_hms(2026, 12, 2, 12, 0, 0).unwrap();
    let rollout_clock = Arc::new(ManualClock::new(start));
    let wall = Arc::new(ManualClock::new(start));
    let t = TestDb::sqlite(rollout_clock.clone()).await;
    let db = t.db.clone().with_session_clock(wall.clone());
    assert_eq!(db.session_clock().now(), start);
    let rita = db
        .add_user("rita", "Rita", Role::ReleaseManager, Some("$argon2id$x"), "test")
        .await
        .unwrap();
    db.create_session(rita.id, "hash-1", "csrf-1", Duration::hours(12))
        .await
        .unwrap();

    // Two simulated days pass in a few real minutes: still logged in.
    rollout_clock.advance(Duration::days(2));
    wall.advance(Duration::minutes(3));
    assert!(db.session("hash-1").await.unwrap().is_some(), "young in real time");
    assert_eq!(db.delete_expired_sessions().await.unwrap(), 0);
    // The login is audited on the rollout clock, like every other entry.
    let login = db
        .audit_entries(&orchestrator_db::AuditFilter {
            action: Some("user.login".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(login[0].at, start);

    // Twelve real hours end it, whatever the rollout clock says.
    wall.advance(Duration::hours(12));
    assert!(db.session("hash-1").await.unwrap().is_none(), "expired in real time");
    assert_eq!(db.delete_expired_sessions().await.unwrap(), 1);

    // A handle without a session clock of its own uses its one clock.
    let plain = t.db.clone();
    plain
        .create_session(rita.id, "hash-2", "csrf-2", Duration::hours(1))
        .await
        .unwrap();
    rollout_clock.advance(Duration::minutes(61));
    assert!(plain.session("hash-2").await.unwrap().is_none());
}
