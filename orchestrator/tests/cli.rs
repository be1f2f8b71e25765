//! The `waveguard` binary as a user runs it: real processes, real HTTP on
//! loopback, real SQLite files and PostgreSQL databases.

mod process_harness;

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::Arc;

use orchestrator_db::testing::TestDb;
use orchestrator_types::SystemClock;
use process_harness::cli::{listening_url, terminate_and_wait, text};

const BIN: &str = env!("CARGO_BIN_EXE_waveguard");

fn waveguard(dir: &Path, args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .current_dir(dir)
        .env_remove("WAVEGUARD_DATABASE_URL")
        .env_remove("WAVEGUARD_CONFIG")
        .output()
        .expect("waveguard runs")
}

/// Starts `serve` on an ephemeral port and returns it with its base URL.
fn start_server(dir: &Path, extra: &[&str]) -> (Child, String) {
    let mut child = Command::new(BIN)
        .args(extra)
        .args(["serve", "--listen", "127.0.0.1:0"])
        .current_dir(dir)
        .env_remove("WAVEGUARD_DATABASE_URL")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("waveguard serve starts");
    let url = listening_url(&mut child);
    (child, url)
}

async fn check_serving(url: &str) {
    let client = reqwest::Client::new();
    let health = client
        .get(format!("{url}/healthz"))
        .send()
        .await
        .expect("healthz answers");
    assert_eq!(health.status(), 200);
    let releases = client
        .get(format!("{url}/api/v1/releases"))
        .send()
        .await
        .expect("API answers");
    // The API needs a user (session or `waveguard user token`); the UI's login page does not.
    assert_eq!(releases.status(), 401);
    let login = client.get(format!("{url}/login")).send().await.expect("UI answers");
    assert_eq!(login.status(), 200);
    let metrics = client
        .get(format!("{url}/metrics"))
        .send()
        .await
        .expect("metrics answer");
    assert!(
        metrics
            .text()
            .await
            .expect("body")
            .contains("waveguard_http_requests_total")
    );
}

#[tokio::test]
async fn serve_starts_on_sqlite_with_no_configuration_and_stops_gracefully() {
    let dir = tempfile::tempdir().unwrap();
    let (child, url) = start_server(dir.path(), &[]);
    check_serving(&url).await;
    terminate_and_wait(child);
    assert!(
        dir.path().join("waveguard.db").exists(),
        "default database file created in the working directory"
    );
}

#[tokio::test]
async fn serve_starts_on_postgres_with_database_url() {
    let Some(pg) = TestDb::postgres(Arc::new(SystemClock)).await else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (child, url) = start_server(dir.path(), &["--database-url", &pg.url]);
    check_serving(&url).await;
    terminate_and_wait(child);
    assert!(
        !dir.path().join("waveguard.db").exists(),
        "no SQLite file when PostgreSQL is configured"
    );
}

#[test]
fn bad_import_files_are_rejected_with_line_numbers_and_import_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let header = "name,bmc_url,credential_ref,platform_sku,region,cluster,rack,nvlink_domain\n";
    std::fs::write(
        dir.path().join("bad.csv"),
        format!("{header}n1,http://127.0.0.1:9001,sim,hgx,us,c1,r1,d1\nn2,nowhere,sim,hgx,us,c1,r1,d1\nn1,http://127.0.0.1:9003,sim,hgx,us,c1,r2,d1\n"),
    )
    .unwrap();
    let out = waveguard(dir.path(), &["fleet", "import", "bad.csv"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("bad.csv:3: bmc_url: not a URL"), "{stderr}");
    assert!(
        stderr.contains("bad.csv:4: node \"n1\" already appears on line 2"),
        "{stderr}"
    );
    assert!(stderr.contains("nothing was imported"), "{stderr}");

    std::fs::write(
        dir.path().join("bad.yaml"),
        "- name: n1\n  bmc_url: http://127.0.0.1:1\n  rack: r1\n  colour: blue\n",
    )
    .unwrap();
    let out = waveguard(dir.path(), &["fleet", "import", "bad.yaml"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("bad.yaml:"), "{}", text(&out.stderr));

    let out = waveguard(dir.path(), &["fleet", "list", "--json"]);
    assert!(out.status.success());
    assert_eq!(text(&out.stdout).trim(), "[]", "nothing imported");

    std::fs::write(
        dir.path().join("good.csv"),
        format!("{header}n1,http://127.0.0.1:9001,sim,hgx,us,c1,r1,d1\n"),
    )
    .unwrap();
    let out = waveguard(dir.path(), &["fleet", "import", "good.csv"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("1 created"));
}

#[test]
fn release_commands_walk_the_qualification_state_machine() {
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("gpu.fw");
    std::fs::write(&image, b"firmware bytes").unwrap();
    let out = waveguard(
        dir.path(),
        &[
            "release",
            "add",
            "--kind",
            "gpu",
            "--version",
            "96.00.61.00.01",
            "--image-uri",
            "http://127.0.0.1:1/gpu.fw",
            "--image-file",
            image.to_str().unwrap(),
            "--platform",
            "hgx-h100-8gpu",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let refused = waveguard(
        dir.path(),
        &["release", "transition", "gpu@96.00.61.00.01", "--to", "default"],
    );
    assert_eq!(refused.status.code(), Some(2));
    assert!(text(&refused.stderr).contains("a release cannot go from registered to default"));
    let no_reason = waveguard(dir.path(), &["release", "transition", "1", "--to", "blocked"]);
    assert_eq!(no_reason.status.code(), Some(2));
    for step in [["--to", "qualifying"], ["--to", "qualified"]] {
        let out = waveguard(dir.path(), &["release", "transition", "1", step[0], step[1]]);
        assert!(out.status.success(), "{}", text(&out.stderr));
    }
    let out = waveguard(dir.path(), &["release", "show", "1", "--json"]);
    let shown: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(shown["release"]["qualification_state"], "qualified");
    assert_eq!(shown["release"]["size_bytes"], 14);
    let missing = waveguard(dir.path(), &["release", "show", "gpu@1.2.3"]);
    assert_eq!(missing.status.code(), Some(2));
}

#[test]
fn a_bad_config_file_is_reported_with_its_position() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("wg.toml"), "listen = \"not an address\"\n").unwrap();
    let out = waveguard(dir.path(), &["--config", "wg.toml", "migrate"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("wg.toml"), "{}", text(&out.stderr));
}

#[test]
fn serve_refuses_a_prometheus_token_variable_that_is_not_set() {
    let dir = tempfile::tempdir().unwrap();
    let out = waveguard(
        dir.path(),
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--prometheus-url",
            "http://127.0.0.1:9",
            "--prometheus-token-env",
            "WAVEGUARD_TEST_UNSET_PROMETHEUS_TOKEN",
        ],
    );
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("WAVEGUARD_TEST_UNSET_PROMETHEUS_TOKEN, which is not set or empty"),
        "{}",
        text(&out.stderr)
    );
    let out = waveguard(dir.path(), &["serve", "--prometheus-token-env", "X"]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "the token needs a server: {}",
        text(&out.stderr)
    );
}

/// The lines under `heading` in a `--help` text, up to the next heading.
fn help_section<'a>(help: &'a str, heading: &str) -> Vec<&'a str> {
    help.lines()
        .skip_while(|line| line.trim_end() != format!("{heading}:"))
        .skip(1)
        .take_while(|line| line.starts_with(' ') || line.is_empty())
        .collect()
}

#[test]
fn help_shows_a_commands_own_options_apart_from_the_global_ones() {
    let dir = tempfile::tempdir().unwrap();
    let help = waveguard(dir.path(), &["rollout", "approve", "--help"]);
    assert!(help.status.success(), "{}", text(&help.stderr));
    let help = text(&help.stdout);
    let own = help_section(&help, "Options").join("\n");
    let global = help_section(&help, "Global options").join("\n");
    for option in ["--wave", "--as", "--comment"] {
        assert!(own.contains(option), "{option} under Options:\n{help}");
        assert!(!global.contains(option), "{option} not under Global options:\n{help}");
    }
    for option in ["--database-url", "--config", "--log-format", "--log-level"] {
        assert!(global.contains(option), "{option} under Global options:\n{help}");
        assert!(!own.contains(option), "{option} not under Options:\n{help}");
    }
    // Every command, not only this one: the globals never mix with a command's own.
    for args in [
        &["serve", "--help"][..],
        &["fleet", "import", "--help"][..],
        &["demo", "--help"][..],
        &["rollout", "show", "--help"][..],
    ] {
        let out = text(&waveguard(dir.path(), args).stdout);
        let global = help_section(&out, "Global options").join("\n");
        assert!(global.contains("--database-url"), "{args:?}:\n{out}");
        assert!(
            !help_section(&out, "Options").join("\n").contains("--database-url"),
            "{args:?}:\n{out}"
        );
    }
}
