//! Reading policies from an HTTP git remote (smart protocol), served in the
//! test by `git http-backend` behind a small axum CGI bridge on loopback.
//! HTTPS uses the same transport with rustls on top.
//!
//! Needs the `git` program (with `http-backend`); without it the test is
//! skipped loudly, or fails when WAVEGUARD_REQUIRE_ALL=1.

// The kit's git helpers, by path: they need only std, and the kit as a dev-dependency would
// build the whole controller for these tests.
#[path = "../../../integration-tests/src/git.rs"]
#[allow(dead_code)] // `git_available` probes less than this test needs
mod git_repo;

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use git_repo::git;
use orchestrator_policy_git::{GitPolicySource, RepoLocation};

const POLICY: &str = include_str!("../../../policies/bmc-firmware.yaml");

fn git_available() -> bool {
    let ok = Command::new("git")
        .args(["http-backend", "--help"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok();
    if !ok {
        assert!(
            std::env::var("WAVEGUARD_REQUIRE_ALL").as_deref() != Ok("1"),
            "git is required (WAVEGUARD_REQUIRE_ALL=1) but not found"
        );
        eprintln!("!!! SKIPPING HTTP git test: the `git` program is not installed !!!");
    }
    ok
}

/// Runs `git http-backend` as CGI for one request.
async fn cgi(State(root): State<PathBuf>, method: Method, uri: Uri, headers: HeaderMap, body: Bytes) -> Response {
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    };
    let (content_type, protocol) = (header("content-type"), header("git-protocol"));
    let output = tokio::task::spawn_blocking(move || {
        let mut child = Command::new("git")
            .arg("http-backend")
            .env("GIT_PROJECT_ROOT", &root)
            .env("GIT_HTTP_EXPORT_ALL", "1")
            .env("REQUEST_METHOD", method.as_str())
            .env("PATH_INFO", uri.path())
            .env("QUERY_STRING", uri.query().unwrap_or_default())
            .env("CONTENT_TYPE", content_type)
            .env("CONTENT_LENGTH", body.len().to_string())
            .env("GIT_PROTOCOL", protocol)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            // "Not a git repository" for the 404 case is expected noise.
            .stderr(Stdio::null())
            .spawn()
            .expect("git http-backend starts");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(&body)
            .expect("request body");
        child.wait_with_output().expect("git http-backend runs")
    })
    .await
    .expect("CGI thread");
    // CGI output: headers, a blank line, the body.
    let raw = output.stdout;
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| (i, i + 4))
        .or_else(|| raw.windows(2).position(|w| w == b"\n\n").map(|i| (i, i + 2)))
        .expect("CGI headers end");
    let mut response = Bytes::copy_from_slice(&raw[split.1..]).into_response();
    for line in String::from_utf8_lossy(&raw[..split.0]).lines() {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        if name.eq_ignore_ascii_case("status") {
            let code = value.split_whitespace().next().and_then(|c| c.parse().ok());
            *response.status_mut() = code.and_then(|c| StatusCode::from_u16(c).ok()).expect("CGI status");
        } else if let (Ok(name), Ok(value)) = (
            axum::http::HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(value),
        ) {
            response.headers_mut().insert(name, value);
        }
    }
    response
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_policies_from_an_http_remote() {
    if !git_available() {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("src");
    std::fs::create_dir_all(src.join("policies")).unwrap();
    git(&src, &["init", "-q", "-b", "main"]);
    std::fs::write(src.join("policies/bmc-firmware.yaml"), POLICY).unwrap();
    git(&src, &["add", "-A"]);
    git(&src, &["commit", "-q", "-m", "first"]);
    let root = work.path().join("served");
    std::fs::create_dir_all(&root).unwrap();
    git(work.path(), &["clone", "-q", "--bare", "src", "served/policies.git"]);

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = axum::Router::new().fallback(cgi).with_state(root);
    let server = tokio::spawn(async move { axum::serve(listener, app).await });

    let cache = tempfile::tempdir().unwrap();
    let source = GitPolicySource {
        location: RepoLocation::parse(&format!("http://{addr}/policies.git")),
        git_ref: "main".into(),
        subdir: Some("policies".into()),
        cache_dir: cache.path().to_owned(),
    };
    let read = source.clone();
    let snapshot = tokio::task::spawn_blocking(move || read.read())
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("HTTP read failed: {:?}", anyhow_chain(&e)));
    assert_eq!(snapshot.files.len(), 1);
    assert_eq!(snapshot.files[0].path, "policies/bmc-firmware.yaml");
    assert_eq!(snapshot.files[0].content, POLICY.as_bytes());

    // A repository the server does not have is an error, not a panic.
    let mut missing = source;
    missing.location = RepoLocation::parse(&format!("http://{addr}/nope.git"));
    let err = tokio::task::spawn_blocking(move || missing.read())
        .await
        .unwrap()
        .unwrap_err();
    assert!(err.to_string().contains("nope.git"), "{err}");
    server.abort();
}

fn anyhow_chain(err: &dyn std::error::Error) -> Vec<String> {
    orchestrator_types::error_sources(err)
        .map(ToString::to_string)
        .collect()
}
