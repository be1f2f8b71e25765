//! `waveguard serve` and the Alertmanager webhook as an operator configures
//! them: the token comes from the environment variable the flag (or the
//! config file) names, the webhook needs no user session, a missing token
//! variable stops start-up with exit code 2, and the token never reaches
//! the logs.

mod process_harness;

use std::path::Path;
use std::process::{Child, Command, Stdio};

use process_harness::cli::listening_url;

const BIN: &str = env!("CARGO_BIN_EXE_waveguard");
const TOKEN: &str = "serve-test-token-7c1e4a9b2d";
const EMPTY_NOTIFICATION: &str =
    r#"{"version":"4","status":"firing","receiver":"waveguard","groupKey":"{}","alerts":[]}"#;

/// Kills the server when a test fails half-way.
struct Server {
    child: Child,
    url: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn command(dir: &Path, env: &[(&str, &str)]) -> Command {
    let mut command = Command::new(BIN);
    command
        .args(["serve", "--listen", "127.0.0.1:0"])
        .current_dir(dir)
        .env_remove("WAVEGUARD_DATABASE_URL")
        .env_remove("WAVEGUARD_CONFIG")
        .env_remove("WAVEGUARD_ALERTMANAGER_TOKEN_ENV")
        .env("RUST_LOG", "debug");
    for (k, v) in env {
        command.env(k, v);
    }
    command
}

fn start(dir: &Path, env: &[(&str, &str)]) -> Server {
    let log = std::fs::File::create(dir.join("serve.log")).expect("log file");
    let mut child = command(dir, env)
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .expect("waveguard serve starts");
    let url = listening_url(&mut child);
    Server { child, url }
}

async fn post(url: &str, auth: Option<&str>) -> u16 {
    let mut request = reqwest::Client::new()
        .post(format!("{url}/api/v1/alerts/alertmanager"))
        .header("content-type", "application/json")
        .body(EMPTY_NOTIFICATION);
    if let Some(auth) = auth {
        request = request.header("authorization", auth);
    }
    request.send().await.expect("webhook answers").status().as_u16()
}

#[tokio::test]
async fn the_webhook_takes_its_token_from_the_named_variable_and_needs_no_session() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = start(
        dir.path(),
        &[
            ("WAVEGUARD_ALERTMANAGER_TOKEN_ENV", "WG_TEST_AM_TOKEN"),
            ("WG_TEST_AM_TOKEN", TOKEN),
        ],
    );
    assert_eq!(post(&server.url, Some(&format!("Bearer {TOKEN}"))).await, 200);
    assert_eq!(post(&server.url, Some("Bearer not-the-token-at-all")).await, 401);
    assert_eq!(post(&server.url, None).await, 401);
    drop(server);
    let log = std::fs::read_to_string(dir.path().join("serve.log")).expect("log");
    assert!(log.contains("Alertmanager webhook enabled"), "{log}");
    assert!(!log.contains(TOKEN), "the token reached the log:\n{log}");
}

#[tokio::test]
async fn without_a_token_the_webhook_refuses_everything() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = start(dir.path(), &[]);
    assert_eq!(post(&server.url, Some(&format!("Bearer {TOKEN}"))).await, 503);
}

#[test]
fn a_named_but_unset_token_variable_stops_start_up() {
    let dir = tempfile::tempdir().expect("tempdir");
    let output = command(
        dir.path(),
        &[("WAVEGUARD_ALERTMANAGER_TOKEN_ENV", "WG_TEST_UNSET_TOKEN")],
    )
    .env_remove("WG_TEST_UNSET_TOKEN")
    .output()
    .expect("waveguard runs");
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("WG_TEST_UNSET_TOKEN"), "{stderr}");

    // A token too short to be safe is refused without being echoed.
    let output = command(
        dir.path(),
        &[
            ("WAVEGUARD_ALERTMANAGER_TOKEN_ENV", "WG_TEST_SHORT"),
            ("WG_TEST_SHORT", "hunter2"),
        ],
    )
    .output()
    .expect("waveguard runs");
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("at least 16 characters"), "{stderr}");
    assert!(!stderr.contains("hunter2"), "{stderr}");
}
