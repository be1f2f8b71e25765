//! Policy versions and the policy in force, on every backend (SQLite always,
//! PostgreSQL when `WAVEGUARD_TEST_POSTGRES_URL` is set). The records here
//! are what a git sync produces; the sync against a real repository is
//! tested end to end in `orchestrator/tests/policy_cli.rs`.

use std::sync::Arc;

use chrono::{Duration, TimeZone, Utc};
use orchestrator_db::model::{NewRelease, NewRollout};
use orchestrator_db::policies::{PolicySync, RejectedPolicyFile, SyncedPolicy};
use orchestrator_db::testing::TestDb;
use orchestrator_db::{AuditFilter, DbError};
use orchestrator_types::{ComponentKind, ManualClock};

const SOURCE: &str = "/srv/policies@main";

fn id(c: char) -> String {
    c.to_string().repeat(40)
}

fn policy(name: &str, commit: char, blob: char, content: &str) -> SyncedPolicy {
    SyncedPolicy {
        name: name.into(),
        path: format!("policies/{name}.yaml"),
        commit_id: id(commit),
        blob_id: id(blob),
        content: content.into(),
    }
}

fn sync(commit: char, in_force: Vec<SyncedPolicy>, changed: &[&str]) -> PolicySync {
    PolicySync {
        source: SOURCE.into(),
        commit_id: id(commit),
        in_force,
        changed: changed.iter().map(|s| (*s).to_owned()).collect(),
        removed: Vec::new(),
        rejected: Vec::new(),
        warnings: Vec::new(),
    }
}

fn release() -> NewRelease {
    NewRelease {
        component_kind: ComponentKind::Bmc,
        version: "24.04.1".parse().unwrap(),
        image_uri: "https://images.example/bmc/24.04.1.fw".into(),
        sha256: "ab".repeat(32),
        size_bytes: 1 << 20,
        platforms: vec!["hgx-h100-8gpu".into()],
        release_notes: String::new(),
    }
}

async fn policy_syncs(t: &TestDb) -> Vec<serde_json::Value> {
    t.db.audit_entries(&AuditFilter {
        action: Some("policy.sync".into()),
        ..AuditFilter::default()
    })
    .await
    .unwrap()
    .into_iter()
    .map(|e| e.details)
    .collect()
}

#[tokio::test]
async fn a_running_rollout_keeps_its_version_while_a_newer_one_comes_into_force() {
    for t in TestDb::all_backends().await {
        let backend = t.backend();
        let first = policy("bmc-firmware", 'a', '1', "name: bmc-firmware # v1\n");
        t.db.record_policy_sync(&sync('a', vec![first.clone()], &["bmc-firmware"]), "test")
            .await
            .unwrap();
        let in_force = t.db.policy_in_force("bmc-firmware").await.unwrap();
        assert_eq!(in_force.version.commit_id, id('a'), "{backend:?}");
        assert_eq!(in_force.version.content, first.content);

        let r = t.db.add_release(&release(), "test").await.unwrap();
        let rollout =
            t.db.create_rollout(
                &NewRollout {
                    release_id: r.id,
                    policy_name: "bmc-firmware".into(),
                    policy_commit: in_force.version.commit_id.clone(),
                    policy_blob: in_force.version.blob_id.clone(),
                    seed: 1,
                },
                "user:alice",
            )
            .await
            .unwrap();

        let second = policy("bmc-firmware", 'b', '2', "name: bmc-firmware # v2\n");
        t.db.record_policy_sync(&sync('b', vec![second.clone()], &["bmc-firmware"]), "test")
            .await
            .unwrap();
        assert_eq!(
            t.db.policy_in_force("bmc-firmware").await.unwrap().version.content,
            second.content
        );
        let pinned = t.db.rollout(rollout.id).await.unwrap();
        let loaded =
            t.db.policy_version(&pinned.policy_commit, &pinned.policy_blob)
                .await
                .unwrap();
        assert_eq!(loaded.content, first.content, "{backend:?}");
        assert_eq!(loaded.name, "bmc-firmware");

        // Both syncs are in the audit log, newest first, with what changed.
        let audits = policy_syncs(&t).await;
        assert_eq!(audits.len(), 2);
        assert_eq!(audits[0]["commit"], id('b'));
        assert_eq!(audits[0]["changed"][0]["blob"], id('2'));
    }
}

#[tokio::test]
async fn a_rejected_newer_file_is_recorded_and_cleared_once_fixed() {
    for t in TestDb::all_backends().await {
        let good = policy("gpu", 'a', '1', "v1");
        t.db.record_policy_sync(&sync('a', vec![good.clone()], &["gpu"]), "test")
            .await
            .unwrap();

        let mut bad = sync('b', vec![good.clone()], &[]);
        bad.rejected.push(RejectedPolicyFile {
            path: "policies/gpu.yaml".into(),
            blob_id: id('9'),
            diagnostics: vec!["policies/gpu.yaml:12:10: wave \"canary\" bake: invalid duration".into()],
            kept: Some("gpu".into()),
        });
        // A brand-new file that never validated has no version to keep.
        bad.rejected.push(RejectedPolicyFile {
            path: "policies/new.yaml".into(),
            blob_id: id('8'),
            diagnostics: vec!["policies/new.yaml:1:1: unknown key `nme`".into()],
            kept: None,
        });
        let recorded = t.db.record_policy_sync(&bad, "test").await.unwrap();
        assert!(recorded.audited);

        let in_force = t.db.policy_in_force("gpu").await.unwrap();
        assert_eq!(in_force.version.commit_id, id('a'), "the last good version stays");
        assert_eq!(in_force.last_sync_commit, id('b'));
        let error = in_force.last_error.expect("the refusal is recorded");
        assert_eq!(error.commit_id, id('b'));
        assert_eq!(error.blob_id, id('9'));
        assert!(error.diagnostics[0].starts_with("policies/gpu.yaml:12:10: "));

        let audit = &policy_syncs(&t).await[0];
        let rejected = audit["rejected"].as_array().unwrap();
        assert_eq!(rejected.len(), 2);
        assert_eq!(rejected[0]["kept"]["commit"], id('a'));
        assert!(rejected[1]["kept"].is_null());
        assert_eq!(
            rejected[1]["diagnostics"][0],
            "policies/new.yaml:1:1: unknown key `nme`"
        );

        let fixed = policy("gpu", 'c', '3', "v3");
        t.db.record_policy_sync(&sync('c', vec![fixed], &["gpu"]), "test")
            .await
            .unwrap();
        let in_force = t.db.policy_in_force("gpu").await.unwrap();
        assert_eq!(in_force.version.blob_id, id('3'));
        assert_eq!(in_force.last_error, None);
    }
}

#[tokio::test]
async fn idle_syncs_are_not_audited_and_removed_policies_leave_but_stay_loadable() {
    let clock = Arc::new(ManualClock::new(Utc.with_ymd_and_hms(2025, 1, 1, 0, 0, 0).unwrap()));
    for t in TestDb::all_backends_with_clock(clock.clone()).await {
        let a = policy("a", 'a', '1', "a");
        let b = policy("b", 'a', '2', "b");
        let first = sync('a', vec![a.clone(), b.clone()], &["a", "b"]);
        assert!(t.db.record_policy_sync(&first, "serve").await.unwrap().audited);
        let state = t.db.policy_sync_state().await.unwrap().unwrap();

        clock.advance(Duration::seconds(60));
        let again = sync('a', vec![a.clone(), b.clone()], &[]);
        assert!(!t.db.record_policy_sync(&again, "serve").await.unwrap().audited);
        let later = t.db.policy_sync_state().await.unwrap().unwrap();
        assert_eq!(later.synced_at, state.synced_at + Duration::seconds(60));
        assert_eq!(later.changed_at, state.changed_at);
        assert_eq!(later.source, SOURCE);
        assert_eq!(policy_syncs(&t).await.len(), 1);

        // A new commit that changes nothing is still audited once.
        let unrelated = sync('c', vec![a.clone(), b.clone()], &[]);
        assert!(t.db.record_policy_sync(&unrelated, "serve").await.unwrap().audited);

        let mut gone = sync('d', vec![a.clone()], &[]);
        gone.removed.push("b".into());
        t.db.record_policy_sync(&gone, "serve").await.unwrap();
        let names: Vec<String> =
            t.db.policies_in_force()
                .await
                .unwrap()
                .into_iter()
                .map(|p| p.version.name)
                .collect();
        assert_eq!(names, ["a"]);
        assert!(matches!(
            t.db.policy_in_force("b").await,
            Err(DbError::NotFound { what: "policy", .. })
        ));
        assert_eq!(t.db.policy_version(&id('a'), &id('2')).await.unwrap().content, "b");

        // Everything gone: the in-force table empties.
        let mut empty = sync('e', vec![], &[]);
        empty.removed.push("a".into());
        t.db.record_policy_sync(&empty, "serve").await.unwrap();
        assert!(t.db.policies_in_force().await.unwrap().is_empty());
        assert_eq!(policy_syncs(&t).await.len(), 4);
    }
}

#[tokio::test]
async fn impossible_sync_records_are_refused_without_writing() {
    for t in TestDb::all_backends().await {
        let a = policy("a", 'a', '1', "a");
        let cases = [
            ("duplicate name", sync('a', vec![a.clone(), a.clone()], &[])),
            ("changed but not in force", sync('a', vec![a.clone()], &["zzz"])),
            (
                "bad commit",
                PolicySync {
                    commit_id: "HEAD".into(),
                    ..sync('a', vec![a.clone()], &[])
                },
            ),
            (
                "bad blob",
                sync(
                    'a',
                    vec![SyncedPolicy {
                        blob_id: "not-hex".into(),
                        ..a.clone()
                    }],
                    &[],
                ),
            ),
        ];
        for (what, record) in cases {
            let err = t.db.record_policy_sync(&record, "test").await.unwrap_err();
            assert!(matches!(err, DbError::Invalid { .. }), "{what}: {err:?}");
            assert!(err.is_caller_error());
        }
        assert!(t.db.policies_in_force().await.unwrap().is_empty());
        assert_eq!(t.db.policy_sync_state().await.unwrap(), None);
        assert!(policy_syncs(&t).await.is_empty());
        assert!(matches!(
            t.db.policy_version(&id('a'), &id('1')).await,
            Err(DbError::NotFound { .. })
        ));

        // The same path at the same commit cannot name two different blobs.
        t.db.record_policy_sync(&sync('a', vec![a.clone()], &["a"]), "test")
            .await
            .unwrap();
        let conflicting = policy("a", 'a', '7', "other");
        let err =
            t.db.record_policy_sync(&sync('a', vec![conflicting], &["a"]), "test")
                .await
                .unwrap_err();
        assert!(matches!(err, DbError::Invalid { .. }), "{err:?}");
        assert_eq!(t.db.policy_in_force("a").await.unwrap().version.blob_id, id('1'));
    }
}
