//! Sessions, API tokens, user changes and the overview aggregates, on every
//! database backend.

use std::sync::Arc;

use chrono::{Duration, TimeZone, Utc};
use orchestrator_db::model::NewNode;
use orchestrator_db::testing::{TestDb, fixtures};
use orchestrator_types::{ManualClock, Role};

#[tokio::test]
async fn sessions_tokens_and_user_changes() {
    let clock = Arc::new(ManualClock::new(Utc.with_ymd_and_hms(2026, 12, 2, 12, 0, 0).unwrap()));
    for t in TestDb::all_backends_with_clock(clock.clone()).await {
        let db = &t.db;
        let rita = db
            .add_user("rita", "Rita", Role::ReleaseManager, Some("$argon2id$x"), "test")
            .await
            .unwrap();

        let session = db
            .create_session(rita.id, "hash-1", "csrf-1", Duration::hours(1))
            .await
            .unwrap();
        assert!(!format!("{session:?}").contains("csrf-1"), "Debug hides the CSRF token");
        let (found, user) = db.session("hash-1").await.unwrap().expect("live session");
        assert_eq!((found.csrf_token.as_str(), user.username.as_str()), ("csrf-1", "rita"));
        assert!(db.session("other").await.unwrap().is_none());
        clock.advance(Duration::minutes(61));
        assert!(db.session("hash-1").await.unwrap().is_none(), "expired");
        assert_eq!(db.delete_expired_sessions().await.unwrap(), 1);

        db.create_session(rita.id, "hash-2", "csrf-2", Duration::hours(1))
            .await
            .unwrap();
        db.delete_session("hash-2").await.unwrap();
        db.delete_session("hash-2").await.unwrap();
        assert!(db.session("hash-2").await.unwrap().is_none(), "logged out");

        let token = db.add_api_token("rita", "ci", "tok-hash", "admin").await.unwrap();
        assert_eq!(
            db.user_by_api_token("tok-hash").await.unwrap().map(|u| u.id),
            Some(rita.id)
        );
        assert!(db.api_tokens("rita").await.unwrap()[0].last_used_at.is_some());
        assert!(
            db.add_api_token("rita", " ", "h2", "admin").await.is_err(),
            "a token needs a name"
        );
        assert!(db.add_api_token("nobody", "ci", "h3", "admin").await.is_err());

        // A role change ends sessions; disabling kills tokens too.
        db.create_session(rita.id, "hash-3", "csrf-3", Duration::hours(1))
            .await
            .unwrap();
        let changed = db
            .update_user("rita", None, Some(Role::Viewer), None, "admin")
            .await
            .unwrap();
        assert_eq!(changed.role, Role::Viewer);
        assert!(
            db.session("hash-3").await.unwrap().is_none(),
            "sessions end on a role change"
        );
        db.update_user("rita", None, None, Some(true), "admin").await.unwrap();
        assert!(db.user_by_api_token("tok-hash").await.unwrap().is_none());
        db.update_user("rita", None, None, Some(false), "admin").await.unwrap();
        db.revoke_api_token("rita", token.id, "admin").await.unwrap();
        assert!(db.user_by_api_token("tok-hash").await.unwrap().is_none(), "revoked");
        assert!(db.revoke_api_token("rita", 999, "admin").await.is_err());

        let audit = db.audit_entries(&Default::default()).await.unwrap();
        let actions: Vec<&str> = audit.iter().map(|e| e.action.as_str()).collect();
        for want in [
            "user.login",
            "user.logout",
            "user.token.add",
            "user.update",
            "user.token.revoke",
        ] {
            assert!(actions.contains(&want), "{want} audited: {actions:?}");
        }
        let text = serde_json::to_string(&audit).unwrap();
        assert!(!text.contains("tok-hash") && !text.contains("hash-") && !text.contains("csrf-"));
    }
}

#[tokio::test]
async fn the_overview_counts_versions_per_sku_and_kind() {
    for t in TestDb::all_backends().await {
        let db = &t.db;
        let nodes: Vec<NewNode> = (0..3)
            .map(|i| {
                fixtures::node(&format!("n{i}"))
                    .bmc_url(&format!("https://10.0.0.{i}"))
                    .credential("c")
                    .sku(if i < 2 { "hgx" } else { "mi300" })
                    .labels("r", "c", "k", "n")
                    .build()
            })
            .collect();
        db.import_nodes(&nodes, "test").await.unwrap();
        for (i, node) in db.list_nodes(&Default::default()).await.unwrap().iter().enumerate() {
            let version = if i == 0 { "1.0" } else { "2.0" };
            // Two GPUs per node: one node is counted once per version.
            db.record_inventory(node.id, &fixtures::gpus(2, version)).await.unwrap();
        }
        let counts: Vec<(String, String, String, u64)> = db
            .version_distribution()
            .await
            .unwrap()
            .into_iter()
            .map(|c| (c.platform_sku, c.kind, c.version, c.nodes))
            .collect();
        assert_eq!(
            counts,
            [
                ("hgx".into(), "gpu".into(), "1.0".into(), 1),
                ("hgx".into(), "gpu".into(), "2.0".into(), 1),
                ("mi300".into(), "gpu".into(), "2.0".into(), 1),
            ]
        );
        let since = Utc::now() - Duration::days(1);
        assert!(db.daily_step_outcomes(since).await.unwrap().is_empty());
    }
}
