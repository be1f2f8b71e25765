//! `waveguard rollout ...` as a user runs it: a real process on a real
//! SQLite file; the fleet and release are seeded through the datastore.

mod process_harness;

use std::process::Command;
use std::sync::Arc;

use orchestrator_db::Db;
use orchestrator_db::testing::TestDb;
use orchestrator_db::testing::fixtures::{
    GPU_TO as TO, PolicyYaml, add_qualified_release, gpu_nodes, put_policy_in_force, release,
};
use orchestrator_types::{Role, SystemClock};
use process_harness::cli::{BIN, expect_exit, text, waveguard_as_carol as waveguard};
use serde_json::Value;

/// The policy the rollouts start under (as text: the CLI stores it as given).
fn policy() -> String {
    PolicyYaml::two_waves("cli-gpu").render()
}

/// Six GPU nodes over three racks, a qualified release `TO`, and the users
/// an approval may name: release managers carol (the local admin who starts
/// the rollouts), bob and dave, viewer vic, and erin, a release manager since
/// disabled.
async fn seed(db: &Db) {
    gpu_nodes(6).racks(3).seed(db).await.unwrap();
    add_qualified_release(db, &release(TO), "alice").await.unwrap();
    for (name, role) in [
        ("carol", Role::ReleaseManager),
        ("bob", Role::ReleaseManager),
        ("dave", Role::ReleaseManager),
        ("vic", Role::Viewer),
        ("erin", Role::ReleaseManager),
    ] {
        db.add_user(name, name, role, None, "alice").await.unwrap();
    }
    db.update_user("erin", None, None, Some(true), "alice").await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollout_commands_start_show_approve_and_steer_a_rollout() {
    for t in TestDb::all_backends_with_clock(Arc::new(SystemClock)).await {
        steer(&t).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollout_under_a_policy_in_force_pins_its_commit_and_blob() {
    for t in TestDb::all_backends_with_clock(Arc::new(SystemClock)).await {
        seed(&t.db).await;
        let (commit, blob) = put_policy_in_force(&t.db, "cli-gpu", &policy()).await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let started = waveguard(
            dir.path(),
            &t.url,
            &[
                "rollout",
                "start",
                "--release",
                &format!("gpu@{TO}"),
                "--policy",
                "cli-gpu",
                "--json",
            ],
        );
        expect_exit(&started, 0, "start under a policy in force");
        let summary: Value = serde_json::from_slice(&started.stdout).unwrap();
        assert_eq!(summary["policy"], "cli-gpu");
        assert_eq!(summary["policy_commit"], commit.as_str());
        assert_eq!(summary["planned_nodes"], 6);
        assert_eq!(summary["waves"][0]["nodes"], 2);
        assert_eq!(summary["rollback"]["possible"], true);
        let id = summary["rollout_id"].as_i64().unwrap();
        let rollout = t.db.exec_rollout(orchestrator_types::RolloutId(id)).await.unwrap();
        assert_eq!((rollout.policy_commit, rollout.policy_blob), (commit, blob));
        assert_eq!(rollout.policy_source.as_deref(), Some(policy().as_str()));
    }
}

async fn steer(t: &TestDb) {
    seed(&t.db).await;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let url = t.url.as_str();
    std::fs::write(d.join("good.yaml"), policy()).unwrap();
    std::fs::write(d.join("bad.yaml"), policy().replace("count: 2", "count: zero")).unwrap();
    let release = format!("gpu@{TO}");

    let bad = waveguard(
        d,
        url,
        &["rollout", "start", "--release", &release, "--policy-file", "bad.yaml"],
    );
    expect_exit(&bad, 2, "bad policy");
    assert!(text(&bad.stderr).contains("bad.yaml:12:12:"), "{}", text(&bad.stderr));
    let unknown = waveguard(
        d,
        url,
        &[
            "rollout",
            "start",
            "--release",
            "gpu@1.2.3",
            "--policy-file",
            "good.yaml",
        ],
    );
    expect_exit(&unknown, 2, "unknown release");
    let no_policy = waveguard(d, url, &["rollout", "start", "--release", &release, "--policy", "nope"]);
    expect_exit(&no_policy, 2, "policy not in force");
    assert!(text(&no_policy.stderr).contains("no policy named \"nope\""));

    let started = waveguard(
        d,
        url,
        &[
            "rollout",
            "start",
            "--release",
            &release,
            "--policy-file",
            "good.yaml",
            "--seed",
            "3",
        ],
    );
    expect_exit(&started, 0, "start");
    let out = text(&started.stdout);
    assert!(
        out.contains("started rollout 1 of gpu@96.00.61.00.01 under policy cli-gpu"),
        "{out}"
    );
    assert!(
        out.contains("wave canary") && out.contains("rollback: possible"),
        "{out}"
    );

    let list = waveguard(d, url, &["rollout", "list"]);
    expect_exit(&list, 0, "list");
    assert!(text(&list.stdout).contains("running"), "{}", text(&list.stdout));

    let show = waveguard(d, url, &["rollout", "show", "1", "--json"]);
    expect_exit(&show, 0, "show");
    let detail: Value = serde_json::from_slice(&show.stdout).unwrap();
    assert_eq!(detail["rollout"]["state"], "running");
    assert_eq!(detail["rollout"]["created_by"], "local-admin:carol");
    assert_eq!(detail["waves"][0]["wave"]["name"], "canary");
    assert_eq!(detail["waves"][0]["progress"]["pending"], 2);

    // The local admin is never counted as an approver: the approval must
    // name a person, and naming the author (by name or as the local admin
    // who started the rollout) is the two-person rule's refusal.
    let unnamed = waveguard(d, url, &["rollout", "approve", "1", "--wave", "canary"]);
    expect_exit(&unnamed, 2, "approval without --as");
    assert!(
        text(&unnamed.stderr).contains("--as USER is required") && text(&unnamed.stderr).contains("local-admin:carol"),
        "{}",
        text(&unnamed.stderr)
    );
    let prefixed = waveguard(
        d,
        url,
        &[
            "rollout",
            "approve",
            "1",
            "--wave",
            "canary",
            "--as",
            "local-admin:dave",
        ],
    );
    expect_exit(&prefixed, 2, "approval as an actor prefix");
    assert!(
        text(&prefixed.stderr).contains("name a person"),
        "{}",
        text(&prefixed.stderr)
    );
    let own = waveguard(
        d,
        url,
        &["rollout", "approve", "1", "--wave", "canary", "--as", "carol"],
    );
    expect_exit(&own, 2, "author approves");
    assert!(text(&own.stderr).contains("two-person rule"), "{}", text(&own.stderr));
    // A write whose OS user cannot be named plainly is refused, never
    // recorded under a made-up CLI actor; reads need no OS user.
    let forged = Command::new(BIN)
        .args(["--database-url", url, "rollout", "pause", "1", "--reason", "who?"])
        .current_dir(d)
        .env_remove("WAVEGUARD_CONFIG")
        .env("USER", "local-admin:root")
        .output()
        .unwrap();
    expect_exit(&forged, 2, "write with an implausible OS user");
    assert!(
        text(&forged.stderr).contains("not a plausible user name") && !text(&forged.stderr).contains("cli:unknown"),
        "{}",
        text(&forged.stderr)
    );
    let read = Command::new(BIN)
        .args(["--database-url", url, "rollout", "list"])
        .current_dir(d)
        .env_remove("WAVEGUARD_CONFIG")
        .env("USER", "local-admin:root")
        .output()
        .unwrap();
    expect_exit(&read, 0, "read with an implausible OS user");
    // Before the canary's verdict an approval would be counted for a
    // verdict nobody read: refused, with the reason.
    let early = waveguard(d, url, &["rollout", "approve", "1", "--wave", "0", "--as", "bob"]);
    expect_exit(&early, 2, "bob approves before the verdict");
    assert!(
        text(&early.stderr).contains("after its health verdict"),
        "{}",
        text(&early.stderr)
    );
    let canary = t.db.rollout_waves(orchestrator_types::RolloutId(1)).await.unwrap()[0].id;
    orchestrator_db::testing::await_approval(
        &t.db,
        canary,
        orchestrator_types::WaveVerdict {
            outcome: orchestrator_types::Outcome::Pass,
            summary: "healthy".into(),
            evidence: serde_json::json!({}),
        },
    )
    .await
    .unwrap();
    // Only a user who could approve in the web UI counts: a made-up name, a
    // viewer and a disabled user are refused, and nothing is recorded.
    for (name, why) in [
        ("mallory", "no such user"),
        ("vic", "a viewer cannot approve"),
        ("erin", "the user is disabled"),
    ] {
        let refused = waveguard(d, url, &["rollout", "approve", "1", "--wave", "0", "--as", name]);
        expect_exit(&refused, 2, name);
        assert!(text(&refused.stderr).contains(why), "{name}: {}", text(&refused.stderr));
    }
    assert!(t.db.wave_approvals(canary).await.unwrap().is_empty());
    // With USER and LOGNAME unset the CLI names the local admin by the
    // process's uid or refuses; either way the approval is bob's alone and
    // no CLI actor is ever counted.
    let no_user = Command::new(BIN)
        .args(["--database-url", url, "rollout", "approve", "1", "--wave", "0"])
        .current_dir(d)
        .env_remove("WAVEGUARD_CONFIG")
        .env_remove("USER")
        .env_remove("LOGNAME")
        .output()
        .unwrap();
    expect_exit(&no_user, 2, "approval with no OS user and no --as");
    assert!(
        !text(&no_user.stderr).contains("cli:unknown"),
        "{}",
        text(&no_user.stderr)
    );
    assert!(t.db.wave_approvals(canary).await.unwrap().is_empty());
    let show = waveguard(d, url, &["rollout", "show", "1"]);
    expect_exit(&show, 0, "show awaiting approval");
    let out = text(&show.stdout);
    assert!(
        out.contains("awaiting approval") && out.contains("0 of 1") && out.contains("verdict: pass: healthy"),
        "{out}"
    );
    let bob = waveguard(d, url, &["rollout", "approve", "1", "--wave", "0", "--as", "bob"]);
    expect_exit(&bob, 0, "bob approves");
    assert!(
        text(&bob.stdout).contains("approved by bob (1 of 1 approvals)"),
        "{}",
        text(&bob.stdout)
    );
    let entered =
        t.db.audit_entries(&orchestrator_db::AuditFilter {
            action: Some("wave.approval_entered".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(entered.len(), 1, "{entered:?}");
    assert_eq!(entered[0].actor, "local-admin:carol");
    assert_eq!(entered[0].details["approver"], "bob");
    assert_eq!(entered[0].details["mode"], "local-admin");
    expect_exit(
        &waveguard(d, url, &["rollout", "approve", "1", "--wave", "nope", "--as", "bob"]),
        2,
        "no such wave",
    );
    // The wave has the one approval it needs: a second would be counted for
    // nothing, so it is refused and "2 of 1" cannot be printed.
    let dave = waveguard(d, url, &["rollout", "approve", "1", "--wave", "0", "--as", "dave"]);
    expect_exit(&dave, 2, "dave approves a wave that has its approval");
    assert!(
        text(&dave.stderr).contains("already has the 1 approval(s) it needs (bob)"),
        "{}",
        text(&dave.stderr)
    );
    let show = waveguard(d, url, &["rollout", "show", "1"]);
    expect_exit(&show, 0, "show approved");
    let out = text(&show.stdout);
    assert!(out.contains("1 of 1 (bob)") && !out.contains("2 of 1"), "{out}");
    // In words: no raw JSON anywhere in the text output.
    assert!(!out.contains('{') && !out.contains('"'), "{out}");

    expect_exit(
        &waveguard(d, url, &["rollout", "pause", "1", "--reason", "vendor call"]),
        0,
        "pause",
    );
    expect_exit(&waveguard(d, url, &["rollout", "pause", "1"]), 2, "pause twice");
    expect_exit(&waveguard(d, url, &["rollout", "resume", "1"]), 0, "resume");
    expect_exit(&waveguard(d, url, &["rollout", "abort", "1"]), 0, "abort");
    expect_exit(
        &waveguard(d, url, &["rollout", "rollback", "1", "--reason", " "]),
        2,
        "empty reason",
    );
    expect_exit(
        &waveguard(d, url, &["rollout", "rollback", "1", "--reason", "XIDs"]),
        0,
        "rollback",
    );
    expect_exit(&waveguard(d, url, &["rollout", "show", "999"]), 2, "unknown rollout");

    let show = waveguard(d, url, &["rollout", "show", "1"]);
    expect_exit(&show, 0, "show text");
    let out = text(&show.stdout);
    assert!(
        out.contains("state:   rolling back") && out.contains("reason:  XIDs"),
        "{out}"
    );
    // Rolling back, the rollout asks nobody to approve anything.
    assert!(!out.contains(" of 1") && !out.contains("needed after"), "{out}");

    let rollout = t.db.exec_rollout(orchestrator_types::RolloutId(1)).await.unwrap();
    assert_eq!(rollout.state.as_str(), "rolling_back");
    let audit =
        t.db.audit_entries(&orchestrator_db::AuditFilter {
            subject_type: Some("rollout".into()),
            subject_id: Some("1".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    let actions: Vec<&str> = audit.iter().map(|e| e.action.as_str()).collect();
    assert_eq!(
        actions,
        [
            "rollout.rolling_back",
            "rollout.aborted",
            "rollout.running",
            "rollout.paused",
            "rollout.start"
        ]
    );
    assert!(audit.iter().all(|e| e.actor == "local-admin:carol"), "{audit:?}");
}
