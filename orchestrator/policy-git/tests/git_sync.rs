//! End to end against a real repository created in the test: commit a
//! policy, sync, change it in a new commit, sync again; a rollout pinned
//! after the first sync still reads the first version, and a broken commit
//! keeps the last good one in force.
//!
//! The repository is built with the `git` CLI (test only; the code under
//! test uses gix). Without `git` the test is skipped loudly, or fails when
//! WAVEGUARD_REQUIRE_ALL=1.

// The kit's git helpers, by path: they need only std, and the kit as a dev-dependency would
// build the whole controller for these tests.
#[path = "../../../integration-tests/src/git.rs"]
mod git_repo;

use std::collections::BTreeMap;
use std::path::Path;

use git_repo::{git, git_available};
use orchestrator_policy::{FailureBudget, parse_policy};
use orchestrator_policy_git::{GitPolicySource, InForce, RepoLocation, plan_criteria, plan_sync, read_blob};

const POLICY: &str = include_str!("../../../policies/bmc-firmware.yaml");
const RMA_CRITERIA: &str = include_str!("../../../policies/rma/nvidia-gpu.yaml");

fn commit_policy(dir: &Path, text: &str, message: &str) {
    std::fs::create_dir_all(dir.join("policies")).unwrap();
    std::fs::write(dir.join("policies/bmc-firmware.yaml"), text).unwrap();
    std::fs::write(dir.join("README.md"), "not a policy\n").unwrap();
    // RMA criteria share the repository but are not rollout policies.
    std::fs::create_dir_all(dir.join("policies/rma")).unwrap();
    std::fs::write(dir.join("policies/rma/nvidia-gpu.yaml"), RMA_CRITERIA).unwrap();
    git(dir, &["add", "-A"]);
    git(dir, &["commit", "-q", "-m", message]);
}

/// What the db stores on a rollout: the pin.
struct Rollout {
    policy_commit: String,
    policy_blob: String,
}

#[test]
fn rollout_stays_pinned_across_policy_changes() {
    if !git_available("git sync test") {
        return;
    }
    let repo_dir = tempfile::tempdir().unwrap();
    git(repo_dir.path(), &["init", "-q", "-b", "main"]);
    commit_policy(repo_dir.path(), POLICY, "first policy");

    let source = GitPolicySource {
        location: RepoLocation::Local(repo_dir.path().to_owned()),
        git_ref: "main".into(),
        subdir: Some("policies".into()),
        cache_dir: repo_dir.path().join("unused-cache"),
    };
    let first = plan_sync(&BTreeMap::new(), &source.read().unwrap());
    assert_eq!(first.changed, vec!["bmc-firmware"]);
    let in_force: &InForce = &first.in_force["bmc-firmware"];
    assert_eq!(in_force.path, "policies/bmc-firmware.yaml");
    assert_eq!(in_force.commit_id.len(), 40);

    // A rollout starts now and pins what is in force.
    let rollout = Rollout {
        policy_commit: in_force.commit_id.clone(),
        policy_blob: in_force.blob_id.clone(),
    };

    // The policy changes in git.
    commit_policy(
        repo_dir.path(),
        &POLICY.replace("max_failed: 0", "max_failed: 3"),
        "loosen budget",
    );
    let second = plan_sync(&first.in_force, &source.read().unwrap());
    assert_eq!(second.changed, vec!["bmc-firmware"]);
    let now = &second.in_force["bmc-firmware"];
    assert_ne!(now.commit_id, rollout.policy_commit);
    assert_ne!(now.blob_id, rollout.policy_blob);
    assert_eq!(
        parse_policy(&now.source).unwrap().failure_budget,
        FailureBudget::Count(3)
    );

    // The running rollout still reads its pinned version, from git itself.
    let repo = gix::open(repo_dir.path()).unwrap();
    let pinned = String::from_utf8(read_blob(&repo, &rollout.policy_blob).unwrap()).unwrap();
    assert_eq!(parse_policy(&pinned).unwrap().failure_budget, FailureBudget::Count(0));
    assert_eq!(pinned, first.in_force["bmc-firmware"].source);

    // A broken commit is reported and the last good version stays in force.
    commit_policy(repo_dir.path(), &POLICY.replace("bake: 6h", "bake: soon"), "typo");
    let third = plan_sync(&second.in_force, &source.read().unwrap());
    assert!(third.changed.is_empty());
    assert_eq!(third.rejected.len(), 1);
    assert!(
        third.rejected[0].diagnostics[0].starts_with("policies/bmc-firmware.yaml:"),
        "{:?}",
        third.rejected[0].diagnostics
    );
    assert_eq!(third.in_force["bmc-firmware"], second.in_force["bmc-firmware"]);
}

#[test]
fn clones_a_url_and_resolves_refs() {
    if !git_available("git sync test") {
        return;
    }
    let repo_dir = tempfile::tempdir().unwrap();
    git(repo_dir.path(), &["init", "-q", "-b", "main"]);
    commit_policy(repo_dir.path(), POLICY, "first policy");
    git(repo_dir.path(), &["tag", "v1"]);
    commit_policy(
        repo_dir.path(),
        &POLICY.replace("max_failed: 0", "max_failed: 2"),
        "second",
    );

    let cache = tempfile::tempdir().unwrap();
    let url = format!("file://{}", repo_dir.path().display());
    let mut source = GitPolicySource {
        location: RepoLocation::parse(&url),
        git_ref: "main".into(),
        subdir: None,
        cache_dir: cache.path().to_owned(),
    };
    let head = source.read().unwrap();
    assert_eq!(
        head.files.len(),
        1,
        "README.md and rma/ are not policies: {:?}",
        head.files
    );
    assert!(String::from_utf8_lossy(&head.files[0].content).contains("max_failed: 2"));

    source.git_ref = "v1".into();
    let tagged = source.read().unwrap();
    assert_ne!(tagged.commit_id, head.commit_id);
    assert!(String::from_utf8_lossy(&tagged.files[0].content).contains("max_failed: 0"));

    // Each read clones into its own directory and removes it afterwards.
    let left: Vec<_> = std::fs::read_dir(cache.path()).unwrap().collect();
    assert!(left.is_empty(), "clones left behind: {left:?}");

    source.git_ref = "no-such-branch".into();
    let err = source.read().unwrap_err();
    assert!(err.to_string().contains("no-such-branch"), "{err}");
}

/// RMA criteria ride in the same repository: pinned to their commit, linted with `file:line:col`,
/// and a broken edit keeps the last good version of that file in force.
#[test]
fn rma_criteria_sync_pinned_and_a_broken_edit_keeps_the_last_good() {
    if !git_available("git sync test (rma criteria)") {
        return;
    }
    let repo_dir = tempfile::tempdir().unwrap();
    git(repo_dir.path(), &["init", "-q", "-b", "main"]);
    commit_policy(repo_dir.path(), POLICY, "policies and criteria");
    let source = GitPolicySource {
        location: RepoLocation::Local(repo_dir.path().to_owned()),
        git_ref: "main".into(),
        subdir: Some("policies".into()),
        cache_dir: repo_dir.path().join("unused-cache"),
    };
    let snapshot = source.read().unwrap();
    let first = plan_criteria(&[], &snapshot.criteria_candidates());
    assert!(first.changed && first.rejected.is_empty(), "{:?}", first.rejected);
    assert_eq!(first.in_force.len(), 1);
    assert_eq!(first.in_force[0].path, "policies/rma/nvidia-gpu.yaml");
    assert_eq!(first.in_force[0].commit_id, snapshot.commit_id);
    assert!(orchestrator_rma::parse_criteria(&first.in_force[0].source).is_ok());

    // The same commit again changes nothing.
    let again = plan_criteria(&first.in_force, &snapshot.criteria_candidates());
    assert!(!again.changed);

    std::fs::write(
        repo_dir.path().join("policies/rma/nvidia-gpu.yaml"),
        format!("{RMA_CRITERIA}\nsurprise_key: 1\n"),
    )
    .unwrap();
    git(repo_dir.path(), &["commit", "-q", "-am", "typo in criteria"]);
    let broken = plan_criteria(&first.in_force, &source.read().unwrap().criteria_candidates());
    assert!(!broken.changed, "the last good version stays");
    assert_eq!(broken.in_force, first.in_force);
    assert_eq!(broken.rejected.len(), 1, "{:?}", broken.rejected);
    let line = RMA_CRITERIA.lines().count() + 2;
    assert!(
        broken.rejected[0].starts_with(&format!("policies/rma/nvidia-gpu.yaml:{line}:1:")),
        "{:?}",
        broken.rejected
    );
}
