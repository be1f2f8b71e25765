//! What the wave decision reads from the database, on every backend: wave
//! verdicts decoded through their type (old rows of every evidence shape
//! included), approvals bound to the state and verdict they were given
//! under, and an admin's abort of a stuck rollback.

use orchestrator_db::execution::{RolloutState, StepState, WaveState};
use orchestrator_db::testing::fixtures::{plain_nodes, plain_release, steps, store_rollout, wave};
use orchestrator_db::testing::{TestDb, await_approval};
use orchestrator_db::{AuditFilter, Db, DbError};
use orchestrator_types::{Outcome, RolloutId, WaveId, WaveVerdict};
use serde_json::json;

/// A rollout of one wave over two nodes, started by alice.
async fn rollout(db: &Db) -> (RolloutId, WaveId) {
    db.import_nodes(&plain_nodes(2), "test").await.unwrap();
    let nodes = db.list_nodes(&Default::default()).await.unwrap();
    let release = db.add_release(&plain_release(), "alice").await.unwrap();
    let mut canary = wave("canary", 60, 1, 2, steps(&nodes, "GPU_*", "96.00.5E.00.01"));
    canary.gates = vec!["xid".into()];
    let rollout = store_rollout(db, release.id, vec![canary], "alice").await.unwrap();
    let wave = db.rollout_waves(rollout.id).await.unwrap()[0].id;
    (rollout.id, wave)
}

/// Verdicts as every earlier version stored them: the gateless judge's,
/// the detector's watch judge (gates with per-look verdicts), an early
/// failure, and the judge's error shape.
fn old_rows() -> Vec<(serde_json::Value, Outcome)> {
    vec![
        (
            json!({ "outcome": "pass", "summary": "the wave has no health gates", "evidence": { "gates": [] } }),
            Outcome::Pass,
        ),
        (
            json!({ "outcome": "inconclusive", "summary": "no detector is configured for gates xid: a human must approve",
                    "evidence": { "gates": ["xid"] } }),
            Outcome::Inconclusive,
        ),
        (
            json!({ "outcome": "error", "summary": "wave canary has no bake start",
                    "evidence": { "error": "wave canary has no bake start" } }),
            Outcome::Error,
        ),
        (
            json!({ "outcome": "fail", "summary": "xid: canary 14 events vs control 41",
                    "evidence": { "alpha": 0.05, "correction": "bonferroni", "spending": "OBrienFleming",
                                  "bake_seconds": 3600, "bake_started_at": "2026-12-02T12:00:00Z", "control_nodes": 8,
                                  "gates": [{ "gate": "xid", "outcome": "fail", "look": 3, "planned_looks": 12,
                                              "summary": "xid: ...", "verdict": { "outcome": "fail", "evidence": {} } }] } }),
            Outcome::Fail,
        ),
    ]
}

#[tokio::test]
async fn stored_verdicts_of_every_shape_decode_through_the_type() {
    for t in TestDb::all_backends().await {
        let (_, wave) = rollout(&t.db).await;
        assert_eq!(t.db.wave(wave).await.unwrap().verdict, None);
        for (row, outcome) in old_rows() {
            let sql = format!(
                "UPDATE waves SET verdict = '{}' WHERE id = {}",
                row.to_string().replace('\'', "''"),
                wave.0
            );
            t.execute_raw(&sql).await.unwrap();
            let read = t.db.wave(wave).await.unwrap().verdict.expect("a verdict");
            assert_eq!(read.outcome, outcome, "{row}");
            assert_eq!(read.evidence, row["evidence"], "the evidence is kept whole");
            // What the engine writes now reads back the same.
            assert_eq!(serde_json::to_value(&read).unwrap(), row);
        }
        // A row no version wrote is corrupt, not silently "no verdict".
        t.execute_raw(&format!(
            "UPDATE waves SET verdict = '{{\"state\":\"x\"}}' WHERE id = {}",
            wave.0
        ))
        .await
        .unwrap();
        assert!(matches!(t.db.wave(wave).await, Err(DbError::Corrupt { .. })));
    }
}

#[tokio::test]
async fn approvals_are_taken_only_after_the_verdict_and_remember_it() {
    for t in TestDb::all_backends().await {
        let (_, wave) = rollout(&t.db).await;
        // While the wave has not been judged, an approval would be counted
        // for a verdict nobody read: refused, and nothing is kept.
        let early = t.db.approve_wave(wave, "bob", Some("ship it")).await.unwrap_err();
        assert!(matches!(early, DbError::Conflict { .. }), "{early}");
        assert!(early.to_string().contains("after its health verdict"), "{early}");
        assert!(t.db.wave_approvals(wave).await.unwrap().is_empty());

        let verdict = WaveVerdict {
            outcome: Outcome::Inconclusive,
            summary: "xid inconclusive".into(),
            evidence: json!({ "gates": [] }),
        };
        await_approval(&t.db, wave, verdict).await.unwrap();
        let given = t.db.approve_wave(wave, "bob", Some("read it")).await.unwrap();
        assert_eq!(given.len(), 1);
        assert_eq!(given[0].wave_state, Some(WaveState::AwaitingApproval));
        assert_eq!(given[0].verdict_outcome, Some(Outcome::Inconclusive));
        let audit =
            t.db.audit_entries(&AuditFilter {
                action: Some("wave.approve".into()),
                ..Default::default()
            })
            .await
            .unwrap();
        assert_eq!(audit.len(), 1);
        assert_eq!(audit[0].details["verdict"], "inconclusive");
    }
}

#[tokio::test]
async fn a_rollout_that_no_longer_runs_takes_no_approvals() {
    for t in TestDb::all_backends().await {
        // The wave awaits approval after its verdict, then the rollout ends
        // (a user's rollback here; abort, halt and completion alike): an
        // approval would count for nothing, or later for a verdict nobody
        // read, so it is refused with the reason and nothing is kept.
        let (id, wave) = rollout(&t.db).await;
        let verdict = WaveVerdict {
            outcome: Outcome::Pass,
            summary: "every gate passed".into(),
            evidence: json!({ "gates": [] }),
        };
        await_approval(&t.db, wave, verdict).await.unwrap();
        t.db.begin_rollback(None, id, json!({ "scope": "rollout" }), "regression", "carol")
            .await
            .unwrap();
        let refused = t.db.approve_wave(wave, "bob", None).await.unwrap_err();
        assert!(matches!(refused, DbError::Conflict { .. }), "{refused}");
        assert!(
            refused
                .to_string()
                .contains("is rolling_back: a finished, stopped or rolled-back rollout takes no approvals"),
            "{refused}"
        );
        assert!(t.db.wave_approvals(wave).await.unwrap().is_empty());

        // A paused rollout still takes the approval (it counts on resume).
        let (paused, paused_wave) = rollout_of(&t.db, 2).await;
        await_approval(
            &t.db,
            paused_wave,
            WaveVerdict {
                outcome: Outcome::Pass,
                summary: "every gate passed".into(),
                evidence: json!({ "gates": [] }),
            },
        )
        .await
        .unwrap();
        t.db.user_set_rollout_state(paused, &[RolloutState::Running], RolloutState::Paused, None, "carol")
            .await
            .unwrap();
        assert_eq!(t.db.approve_wave(paused_wave, "bob", None).await.unwrap().len(), 1);
    }
}

/// A second rollout of one wave over the nodes already imported.
async fn rollout_of(db: &Db, nodes_wanted: usize) -> (RolloutId, WaveId) {
    let nodes = db.list_nodes(&Default::default()).await.unwrap();
    let nodes = &nodes[..nodes_wanted.min(nodes.len())];
    let release = db.list_releases().await.unwrap()[0].id;
    let canary = wave("canary", 60, 1, 2, steps(nodes, "GPU_*", "96.00.5E.00.01"));
    let rollout = store_rollout(db, release, vec![canary], "alice").await.unwrap();
    let wave = db.rollout_waves(rollout.id).await.unwrap()[0].id;
    (rollout.id, wave)
}

#[tokio::test]
async fn an_admin_aborts_a_stuck_rollback_and_each_node_version_is_recorded() {
    for t in TestDb::all_backends().await {
        let (id, _) = rollout(&t.db).await;
        let refused = t.db.abort_rollback(id, "stuck", "root").await.unwrap_err();
        assert!(
            matches!(refused, DbError::Stale { .. }),
            "only a rollback is aborted this way: {refused}"
        );
        t.db.begin_rollback(None, id, json!({ "scope": "rollout" }), "regression", "bob")
            .await
            .unwrap();
        let (rollout, versions) = t.db.abort_rollback(id, "BMC task never ends", "root").await.unwrap();
        assert_eq!(rollout.state, RolloutState::Aborted);
        assert_eq!(versions.len(), 2);
        for v in &versions {
            // No step ever pushed: the nodes still run what they ran.
            assert_eq!(v.step_state, StepState::Pending);
            assert_eq!(v.last_known_version.as_deref(), Some("96.00.5E.00.01"));
            assert_eq!(v.unconfirmed, None);
            assert!(v.node.starts_with("node-"), "{v:?}");
        }
        let audit =
            t.db.audit_entries(&AuditFilter {
                action: Some("rollout.aborted".into()),
                ..Default::default()
            })
            .await
            .unwrap();
        assert_eq!(audit.len(), 1);
        assert_eq!(audit[0].actor, "root");
        assert_eq!(audit[0].details["from"], "rolling_back");
        assert_eq!(audit[0].details["nodes"][0]["last_known_version"], "96.00.5E.00.01");
    }
}
