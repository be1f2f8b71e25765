//! `waveguard release add --downgrade-forbidden REASON --rollback-floor
//! VERSION` as a user runs it, and what `rollout show` then says: a real
//! process on a real SQLite file (and PostgreSQL when configured).

mod process_harness;

use std::path::Path;
use std::process::Output;
use std::sync::Arc;

use orchestrator_db::testing::TestDb;
use orchestrator_db::testing::fixtures::{PolicyYaml, SKU, gpu_nodes};
use orchestrator_types::SystemClock;
use process_harness::cli::{expect_exit, text, waveguard_as_carol as waveguard};
use serde_json::Value;

const FUSE: &str = "burns anti-rollback fuse SVN 4";

/// `release add` for gpu 96.00.61.00.01 with `extra` arguments.
fn add(dir: &Path, url: &str, extra: &[&str]) -> Output {
    let mut args = vec![
        "release",
        "add",
        "--kind",
        "gpu",
        "--version",
        "96.00.61.00.01",
        "--image-uri",
        "https://images.example/gpu.fw",
        "--sha256",
        "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
        "--size",
        "1024",
        "--platform",
        SKU,
    ];
    args.extend_from_slice(extra);
    waveguard(dir, url, &args)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_rollback_flags_exit_2_and_register_nothing() {
    let t = TestDb::sqlite(Arc::new(SystemClock)).await;
    let dir = tempfile::tempdir().unwrap();
    let (d, url) = (dir.path(), t.url.as_str());
    let cases: [(&[&str], &[&str]); 4] = [
        (
            &["--rollback-floor", "not a version!"],
            &["--rollback-floor", "not a version!"],
        ),
        (&["--rollback-floor", ""], &["--rollback-floor"]),
        (&["--downgrade-forbidden", "   "], &["downgrade_forbidden", "reason"]),
        (
            &["--rollback-floor", "96.00.62.00.00"],
            &["rollback_floor", "above the release's own version"],
        ),
    ];
    for (flags, needles) in cases {
        let out = add(d, url, flags);
        expect_exit(&out, 2, &format!("{flags:?}"));
        let stderr = text(&out.stderr);
        for needle in needles {
            assert!(stderr.contains(needle), "{flags:?}: {stderr}");
        }
    }
    let listed = waveguard(d, url, &["release", "list", "--json"]);
    expect_exit(&listed, 0, "list");
    let releases: Value = serde_json::from_slice(&listed.stdout).unwrap();
    assert_eq!(releases, serde_json::json!([]), "nothing registered");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_that_forbids_downgrades_shows_it_and_its_rollouts_say_rollback_impossible() {
    for t in TestDb::all_backends_with_clock(Arc::new(SystemClock)).await {
        // Two of the four update from below the floor.
        gpu_nodes(4)
            .node_version("node-0", "96.00.50.00.01")
            .node_version("node-1", "96.00.50.00.01")
            .seed(&t.db)
            .await
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let (d, url) = (dir.path(), t.url.as_str());
        let added = add(
            d,
            url,
            &["--downgrade-forbidden", FUSE, "--rollback-floor", "96.00.5A.00.00"],
        );
        expect_exit(&added, 0, "add");
        for to in ["qualifying", "qualified"] {
            expect_exit(&waveguard(d, url, &["release", "transition", "1", "--to", to]), 0, to);
        }
        let shown = waveguard(d, url, &["release", "show", "1"]);
        let out = text(&shown.stdout);
        assert!(out.contains(&format!("downgrade forbidden: {FUSE}")), "{out}");
        assert!(out.contains("rollback floor: 96.00.5A.00.00"), "{out}");
        let json: Value =
            serde_json::from_slice(&waveguard(d, url, &["release", "show", "1", "--json"]).stdout).unwrap();
        assert_eq!(json["release"]["downgrade_forbidden"], FUSE);
        assert_eq!(json["release"]["rollback_floor"], "96.00.5A.00.00");

        std::fs::write(d.join("policy.yaml"), PolicyYaml::two_waves("cli-gpu").render()).unwrap();
        let started = waveguard(
            d,
            url,
            &[
                "rollout",
                "start",
                "--release",
                "1",
                "--policy-file",
                "policy.yaml",
                "--json",
            ],
        );
        expect_exit(&started, 0, "start");
        let summary: Value = serde_json::from_slice(&started.stdout).unwrap();
        assert_eq!(summary["rollback"]["possible"], false, "{summary}");
        let reasons = summary["rollback"]["reasons"].as_array().unwrap();
        assert_eq!(reasons.len(), 2, "{summary}");

        let id = summary["rollout_id"].as_i64().unwrap().to_string();
        let shown = waveguard(d, url, &["rollout", "show", &id]);
        expect_exit(&shown, 0, "show");
        let out = text(&shown.stdout);
        assert!(
            out.contains(&format!(
                "rollback impossible: the release forbids downgrades ({FUSE}); 16 component(s) update from below \
                 the release's rollback floor 96.00.5A.00.00"
            )),
            "{out}"
        );
        let refused = waveguard(d, url, &["rollout", "rollback", &id, "--reason", "try"]);
        expect_exit(&refused, 2, "rollback refused");
        assert!(text(&refused.stderr).contains(FUSE), "{}", text(&refused.stderr));
    }
}
