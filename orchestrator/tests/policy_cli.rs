//! `waveguard policy sync` / `show` / `list` and the periodic sync of
//! `serve`, as a user runs them: real processes, a real git repository made
//! in the test, SQLite and (when `WAVEGUARD_TEST_POSTGRES_URL` is set)
//! PostgreSQL.
//!
//! The repository is built with the `git` CLI (the code under test reads it
//! with gix). Without `git` the tests skip loudly, or fail when
//! `WAVEGUARD_REQUIRE_ALL=1`.

mod process_harness;

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use integration_tests::git::{git, git_available};
use orchestrator_db::model::{NewRelease, NewRollout};
use orchestrator_db::policies::PolicyInForce;
use orchestrator_db::testing::TestDb;
use orchestrator_db::{AuditFilter, Db, DbError};
use orchestrator_types::ComponentKind;
use process_harness::cli::{terminate_and_wait, text};

const BIN: &str = env!("CARGO_BIN_EXE_waveguard");
const POLICY: &str = include_str!("../../policies/bmc-firmware.yaml");
const BAD_BAKE: &str = ": wave \"canary\" bake: invalid duration";

/// A repository with one commit of `policies/bmc-firmware.yaml`.
fn policy_repo() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    git(dir.path(), &["init", "-q", "-b", "main"]);
    std::fs::write(dir.path().join("README.md"), "not a policy\n").unwrap();
    commit(dir.path(), "policies/bmc-firmware.yaml", POLICY, "first policy");
    dir
}

fn commit(repo: &Path, path: &str, text: &str, message: &str) {
    let file = repo.join(path);
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    std::fs::write(file, text).unwrap();
    git(repo, &["add", "-A"]);
    git(repo, &["commit", "-q", "-m", message]);
}

fn waveguard(dir: &Path, database_url: &str, args: &[&str]) -> Output {
    Command::new(BIN)
        .args(["--database-url", database_url])
        .args(args)
        .current_dir(dir)
        .env_remove("WAVEGUARD_DATABASE_URL")
        .env_remove("WAVEGUARD_CONFIG")
        .output()
        .expect("waveguard runs")
}

fn sync(work: &Path, url: &str, repo: &Path) -> String {
    let out = waveguard(
        work,
        url,
        &[
            "policy",
            "sync",
            "--repo",
            repo.to_str().unwrap(),
            "--ref",
            "main",
            "--path",
            "policies",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "sync: {}", text(&out.stderr));
    text(&out.stdout)
}

fn show_json(work: &Path, url: &str, name: &str) -> PolicyInForce {
    let out = waveguard(work, url, &["policy", "show", name, "--json"]);
    assert!(out.status.success(), "show: {}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("show --json prints a PolicyInForce")
}

/// `file:line:col: ...` with numeric line and column.
fn has_position(line: &str, file: &str) -> bool {
    let Some(rest) = line.strip_prefix(&format!("{file}:")) else {
        return false;
    };
    let mut parts = rest.splitn(3, ':');
    let numeric = |p: Option<&str>| p.is_some_and(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
    numeric(parts.next()) && numeric(parts.next())
}

#[tokio::test]
async fn a_running_rollout_stays_pinned_while_git_moves_on_and_bad_commits_are_refused() {
    if !git_available("policy CLI test") {
        return;
    }
    for t in TestDb::all_backends().await {
        let backend = t.backend();
        let repo = policy_repo();
        let work = tempfile::tempdir().unwrap();

        let out = sync(work.path(), &t.url, repo.path());
        assert!(
            out.contains("updated bmc-firmware: policies/bmc-firmware.yaml"),
            "{out}"
        );
        assert!(
            out.contains("1 in force (1 updated, 0 unchanged), 0 removed, 0 file(s) rejected"),
            "{out}"
        );
        let first = show_json(work.path(), &t.url, "bmc-firmware");
        assert_eq!(first.version.content, POLICY, "{backend:?}");
        assert_eq!(first.version.commit_id.len(), 40);

        // A rollout starts and pins the policy in force.
        let release =
            t.db.add_release(
                &NewRelease {
                    component_kind: ComponentKind::Bmc,
                    version: "24.04.1".parse().unwrap(),
                    image_uri: "https://images.example/bmc/24.04.1.fw".into(),
                    sha256: "ab".repeat(32),
                    size_bytes: 1 << 20,
                    platforms: vec!["hgx-h100-8gpu".into()],
                    release_notes: String::new(),
                },
                "test",
            )
            .await
            .unwrap();
        let rollout =
            t.db.create_rollout(
                &NewRollout {
                    release_id: release.id,
                    policy_name: "bmc-firmware".into(),
                    policy_commit: first.version.commit_id.clone(),
                    policy_blob: first.version.blob_id.clone(),
                    seed: 42,
                },
                "user:alice",
            )
            .await
            .unwrap();

        // The policy changes in git and is synced again.
        let loosened = POLICY.replace("max_failed: 0", "max_failed: 3");
        commit(repo.path(), "policies/bmc-firmware.yaml", &loosened, "loosen budget");
        let out = sync(work.path(), &t.url, repo.path());
        assert!(out.contains("updated bmc-firmware"), "{out}");
        let second = t.db.policy_in_force("bmc-firmware").await.unwrap();
        assert_eq!(second.version.content, loosened);
        assert_ne!(second.version.commit_id, first.version.commit_id);

        // The running rollout still loads exactly the first version.
        let pinned = t.db.rollout(rollout.id).await.unwrap();
        let loaded =
            t.db.policy_version(&pinned.policy_commit, &pinned.policy_blob)
                .await
                .unwrap();
        assert_eq!(loaded.content, POLICY, "{backend:?}");

        // A broken commit (and a new file that never validated) is reported
        // with file:line:col, and the last good version stays in force.
        commit(
            repo.path(),
            "policies/bmc-firmware.yaml",
            &loosened.replace("bake: 6h", "bake: soon"),
            "typo",
        );
        commit(repo.path(), "policies/new.yaml", "name: new\ncolour: blue\n", "draft");
        let out = sync(work.path(), &t.url, repo.path());
        assert!(
            out.contains("rejected policies/bmc-firmware.yaml (blob ")
                && out.contains(&format!(
                    "bmc-firmware stays in force at commit {}",
                    second.version.commit_id
                )),
            "{out}"
        );
        let diagnostic = out
            .lines()
            .map(str::trim)
            .find(|l| l.contains(BAD_BAKE))
            .unwrap_or_else(|| panic!("no bake diagnostic in {out}"));
        assert!(has_position(diagnostic, "policies/bmc-firmware.yaml"), "{diagnostic}");
        assert!(out.contains("rejected policies/new.yaml"), "{out}");
        assert!(
            out.lines().any(|l| has_position(l.trim(), "policies/new.yaml")),
            "{out}"
        );

        let kept = show_json(work.path(), &t.url, "bmc-firmware");
        assert_eq!(kept.version, second.version, "{backend:?}");
        let error = kept.last_error.expect("the refusal is recorded");
        assert_ne!(error.commit_id, second.version.commit_id);
        assert!(error.diagnostics.iter().any(|d| d.contains(BAD_BAKE)), "{error:?}");

        let shown = waveguard(work.path(), &t.url, &["policy", "show", "bmc-firmware"]);
        let shown = text(&shown.stdout);
        assert!(
            shown.contains(&format!("commit:    {}", second.version.commit_id)),
            "{shown}"
        );
        assert!(
            shown.contains(&format!("blob:      {}", second.version.blob_id)),
            "{shown}"
        );
        assert!(shown.contains("last sync error: policies/bmc-firmware.yaml"), "{shown}");
        assert!(shown.contains("max_failed: 3"), "the policy text is shown: {shown}");

        let listed = waveguard(work.path(), &t.url, &["policy", "list"]);
        let listed = text(&listed.stdout);
        assert!(listed.contains(&second.version.commit_id[..12]), "{listed}");
        assert!(listed.contains("newer version refused"), "{listed}");

        // Every sync is audited with its commit and its rejections.
        let audits =
            t.db.audit_entries(&AuditFilter {
                action: Some("policy.sync".into()),
                ..AuditFilter::default()
            })
            .await
            .unwrap();
        assert_eq!(audits.len(), 3);
        assert!(audits[0].actor.starts_with("local-admin:"));
        assert_eq!(audits[0].details["rejected"].as_array().map(Vec::len), Some(2));

        // Syncing the same commit again changes nothing and adds no audit entry.
        let out = sync(work.path(), &t.url, repo.path());
        assert!(out.contains("1 in force (0 updated, 1 unchanged)"), "{out}");
        let again =
            t.db.audit_entries(&AuditFilter {
                action: Some("policy.sync".into()),
                ..AuditFilter::default()
            })
            .await
            .unwrap();
        assert_eq!(again.len(), 3);
    }
}

#[test]
fn sync_and_show_exit_codes() {
    if !git_available("policy CLI test") {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", work.path().join("wg.db").display());

    // No repository anywhere: the user must say where.
    let out = waveguard(work.path(), &url, &["policy", "sync"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("--repo"), "{}", text(&out.stderr));

    // A repository that cannot be read.
    let missing = work.path().join("no-such-repo");
    let out = waveguard(
        work.path(),
        &url,
        &["policy", "sync", "--repo", missing.to_str().unwrap()],
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("cannot read policies from"),
        "{}",
        text(&out.stderr)
    );

    // A password in the URL would end up in errors and the audit log.
    let out = waveguard(
        work.path(),
        &url,
        &["policy", "sync", "--repo", "https://bot:hunter2@git.example/p.git"],
    );
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("must not contain a password"));
    assert!(!text(&out.stderr).contains("hunter2") && !text(&out.stdout).contains("hunter2"));

    let repo = policy_repo();
    let out = waveguard(
        work.path(),
        &url,
        &[
            "policy",
            "sync",
            "--repo",
            repo.path().to_str().unwrap(),
            "--ref",
            "nope",
        ],
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("\"nope\""), "{}", text(&out.stderr));

    // A file:// URL is cloned; --json prints the stored record.
    let file_url = format!("file://{}", repo.path().display());
    let out = waveguard(work.path(), &url, &["policy", "sync", "--repo", &file_url, "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let record: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(record["changed"][0], "bmc-firmware");
    assert_eq!(record["source"], format!("{file_url}@main"));

    let out = waveguard(work.path(), &url, &["policy", "show", "no-such-policy"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("policy no-such-policy not found"));
}

fn start_server(dir: &Path, config: &Path) -> Child {
    Command::new(BIN)
        .args(["--config", config.to_str().unwrap(), "serve", "--listen", "127.0.0.1:0"])
        .current_dir(dir)
        .env_remove("WAVEGUARD_DATABASE_URL")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("waveguard serve starts")
}

/// Polls until `name`'s policy in force satisfies `done`.
async fn wait_for(db: &Db, name: &str, what: &str, done: impl Fn(&PolicyInForce) -> bool) -> PolicyInForce {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match db.policy_in_force(name).await {
            Ok(p) if done(&p) => return p,
            Ok(_) | Err(DbError::NotFound { .. }) => {}
            Err(err) => panic!("reading the policy in force: {err:?}"),
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn serve_syncs_periodically_keeps_running_through_errors_and_stops_on_sigterm() {
    if !git_available("policy CLI test") {
        return;
    }
    for t in TestDb::all_backends().await {
        let repo = policy_repo();
        let work = tempfile::tempdir().unwrap();
        let config = work.path().join("waveguard.toml");
        std::fs::write(
            &config,
            format!(
                "database_url = {:?}\n[policy]\nrepo = {:?}\nref = \"main\"\npath = \"policies\"\nsync_interval = \"1s\"\n",
                t.url,
                repo.path().display().to_string()
            ),
        )
        .unwrap();
        let server = start_server(work.path(), &config);

        let first = wait_for(&t.db, "bmc-firmware", "the first sync", |_| true).await;
        assert_eq!(first.version.content, POLICY);

        // The repository vanishes for a while: syncs fail, serve keeps going.
        let hidden = work.path().join("hidden-repo");
        std::fs::rename(repo.path(), &hidden).unwrap();
        tokio::time::sleep(Duration::from_millis(2500)).await;
        std::fs::rename(&hidden, repo.path()).unwrap();

        let changed = POLICY.replace("max_failed: 0", "max_failed: 2");
        commit(repo.path(), "policies/bmc-firmware.yaml", &changed, "second");
        let second = wait_for(&t.db, "bmc-firmware", "the second commit", |p| {
            p.version.commit_id != first.version.commit_id
        })
        .await;
        assert_eq!(second.version.content, changed);
        let audits =
            t.db.audit_entries(&AuditFilter {
                action: Some("policy.sync".into()),
                ..AuditFilter::default()
            })
            .await
            .unwrap();
        assert_eq!(audits.len(), 2, "idle syncs are not audited: {audits:?}");
        assert_eq!(audits[0].actor, "serve:policy-sync");

        terminate_and_wait(server);
    }
}

#[test]
fn serve_refuses_a_bad_sync_interval() {
    let work = tempfile::tempdir().unwrap();
    let config = work.path().join("waveguard.toml");
    std::fs::write(
        &config,
        format!(
            "database_url = \"sqlite://{}\"\n[policy]\nrepo = \"/nowhere\"\nsync_interval = \"soon\"\n",
            work.path().join("wg.db").display()
        ),
    )
    .unwrap();
    let out = Command::new(BIN)
        .args(["--config", config.to_str().unwrap(), "serve", "--listen", "127.0.0.1:0"])
        .current_dir(work.path())
        .env_remove("WAVEGUARD_DATABASE_URL")
        .output()
        .expect("waveguard runs");
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("sync_interval \"soon\""),
        "{}",
        text(&out.stderr)
    );
}
