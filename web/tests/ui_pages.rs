//! The UI in-process (`oneshot`): every page renders for a logged-in user
//! with the data it is about, actions work as plain forms (confirmation
//! page, then redirect) and as scripts (JSON), the two-person rule shows,
//! the live stream sends what changed, and the node table is paged.

mod common;

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use chrono::{TimeZone, Utc};
use common::{get_page as get, post_form as post};
use futures::StreamExt;
use orchestrator_db::Db;
use orchestrator_db::execution::RolloutState;
use orchestrator_db::model::{NewGateResult, NewRollout};
use orchestrator_db::testing::TestDb;
use orchestrator_db::testing::fixtures::{new_rollout, plain_nodes, plain_release, plan, steps, wave};
use orchestrator_types::{ManualClock, Role, RolloutId};
use tower::ServiceExt;
use web::auth::provision_api_token;
use web::{AppState, app};

struct Fixture {
    _t: TestDb,
    db: Db,
    app: Router,
    rollout: i64,
    canary: i64,
}

async fn fixture() -> Fixture {
    fixture_with(3).await
}

async fn fixture_with(node_count: usize) -> Fixture {
    let clock = Arc::new(ManualClock::new(Utc.with_ymd_and_hms(2026, 12, 2, 12, 0, 0).unwrap()));
    let t = TestDb::sqlite(clock).await;
    let db = t.db.clone();
    db.import_nodes(&plain_nodes(node_count), "test").await.unwrap();
    let nodes = db.list_nodes(&Default::default()).await.unwrap();
    let release = db.add_release(&plain_release(), "rita").await.unwrap();
    db.record_gate_result(
        release.id,
        &NewGateResult {
            gate: "burn-in".into(),
            passed: true,
            evidence: "<script>alert(1)</script>".into(),
        },
        "bot",
    )
    .await
    .unwrap();
    let rollout = NewRollout {
        policy_commit: "c0ffee1234567890".into(),
        ..new_rollout(release.id)
    };
    let waves = vec![wave("canary", 60, 1, 1, steps(&nodes, "GPU_*", "1"))];
    let rollout = db
        .start_rollout(&rollout, "name: p\n", &plan(waves), "rita")
        .await
        .unwrap();
    let canary = db.rollout_waves(rollout.id).await.unwrap()[0].id;
    // Approvals are taken only after the verdict: the canary has baked.
    orchestrator_db::testing::await_approval(
        &db,
        canary,
        orchestrator_types::WaveVerdict {
            outcome: orchestrator_types::Outcome::Pass,
            summary: "healthy".into(),
            evidence: serde_json::json!({}),
        },
    )
    .await
    .unwrap();
    let canary = canary.0;
    Fixture {
        _t: t,
        app: app(AppState::new(db.clone())),
        db,
        rollout: rollout.id.0,
        canary,
    }
}

#[tokio::test(flavor = "current_thread")]
async fn every_page_renders_its_data() {
    let f = fixture().await;
    let admin = provision_api_token(&f.db, "ada", Role::Admin, "t", "test")
        .await
        .unwrap();
    let cases: Vec<(String, Vec<&str>)> = vec![
        ("/".into(), vec!["Fleet overview", "Update failure rate", "<svg"]),
        ("/releases".into(), vec!["96.00.61.00.01", "registered", "1/1 passed"]),
        (
            "/releases/1".into(),
            vec!["Qualification board", "burn-in", "&lt;script&gt;alert(1)"],
        ),
        ("/rollouts".into(), vec![&"#1", "0/3"]),
        (
            format!("/rollouts/{}", f.rollout),
            vec![
                "canary",
                "Approvals 0/1",
                "node-0",
                "c0ffee123456",
                "data-nodes=\"&#x2f;rollouts&#x2f;1&#x2f;nodes?page=1\"",
            ],
        ),
        (
            format!("/rollouts/{}?state=pending&node=node-1", f.rollout),
            vec!["node-1"],
        ),
        (
            "/audit?action=rollout.start".into(),
            vec!["rollout started under policy p", "rita", "&quot;seed&quot;: 1"],
        ),
        ("/policies".into(), vec!["No policy synced yet"]),
        ("/users".into(), vec!["ada", "admin"]),
    ];
    for (uri, wants) in cases {
        let (status, body) = get(&f.app, &admin, &uri).await;
        assert_eq!(status, StatusCode::OK, "{uri}: {body}");
        for want in wants {
            assert!(body.contains(want), "{uri} should show {want:?}:\n{body}");
        }
        assert!(!body.contains("<script>alert"), "{uri} escapes stored text");
    }
    let (_, filtered) = get(&f.app, &admin, &format!("/rollouts/{}?node=node-1", f.rollout)).await;
    assert!(!filtered.contains(">node-0<"), "the node filter filters");
    let (status, _) = get(&f.app, &admin, "/rollouts/999").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test(flavor = "current_thread")]
async fn actions_confirm_then_act_and_the_two_person_rule_shows() {
    let f = fixture().await;
    let rita = provision_api_token(&f.db, "rita", Role::ReleaseManager, "t", "test")
        .await
        .unwrap();
    let sam = provision_api_token(&f.db, "sam", Role::ReleaseManager, "t", "test")
        .await
        .unwrap();
    let approve = format!("/rollouts/{}/approve", f.rollout);
    let wave = format!("wave={}", f.canary);

    // The author sees why there is no button, and is refused anyway.
    let (_, page) = get(&f.app, &rita, &format!("/rollouts/{}", f.rollout)).await;
    assert!(page.contains("two-person rule"), "{page}");
    let (status, _, body) = post(&f.app, &rita, &approve, &format!("{wave}&confirmed=yes"), true).await;
    // 403, the same status the API gives (issue 24 #10; it was 422 here).
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert!(body.contains("two-person rule"), "{body}");

    // Without JavaScript: a confirmation page first, nothing done yet.
    let (_, page) = get(&f.app, &sam, &format!("/rollouts/{}", f.rollout)).await;
    assert!(page.contains(&format!("approve-{}", f.canary)), "sam gets the button");
    let (status, _, body) = post(&f.app, &sam, &approve, &format!("{wave}&comment=lgtm"), false).await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        body.contains("Confirm: Approve") && body.contains("name=\"confirmed\" value=\"yes\""),
        "{body}"
    );
    assert!(body.contains("value=\"lgtm\""), "the comment is carried over");
    assert!(
        f.db.wave_approvals(orchestrator_types::WaveId(f.canary))
            .await
            .unwrap()
            .is_empty()
    );
    // Confirmed: done, and back to the page with a message.
    let (status, location, _) = post(
        &f.app,
        &sam,
        &approve,
        &format!("{wave}&comment=lgtm&confirmed=yes"),
        false,
    )
    .await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    let location = location.unwrap();
    assert!(
        location.starts_with(&format!("/rollouts/{}?msg=Approved", f.rollout)),
        "{location}"
    );
    let approvals = f.db.wave_approvals(orchestrator_types::WaveId(f.canary)).await.unwrap();
    assert_eq!(
        (approvals[0].approver.as_str(), approvals[0].comment.as_deref()),
        ("sam", Some("lgtm"))
    );
    let (_, page) = get(&f.app, &sam, &location).await;
    assert!(page.contains("Approved wave canary"), "the message shows");
    // Twice is a conflict, reported to a script as JSON.
    let (status, _, body) = post(&f.app, &sam, &approve, &format!("{wave}&confirmed=yes"), true).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert!(body.contains("\"code\":\"conflict\""), "{body}");

    // Pause, resume, abort; rollback needs a reason.
    for (action, body, want) in [
        ("pause", "confirmed=yes&reason=looking", RolloutState::Paused),
        ("resume", "confirmed=yes", RolloutState::Running),
        ("abort", "confirmed=yes", RolloutState::Aborted),
    ] {
        let (status, _, text) = post(&f.app, &sam, &format!("/rollouts/{}/{action}", f.rollout), body, true).await;
        assert_eq!(status, StatusCode::OK, "{action}: {text}");
        assert_eq!(f.db.exec_rollout(RolloutId(f.rollout)).await.unwrap().state, want);
    }
    let (status, _, _) = post(
        &f.app,
        &sam,
        &format!("/rollouts/{}/resume", f.rollout),
        "confirmed=yes",
        true,
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT, "an aborted rollout does not resume");
    let (status, _, _) = post(
        &f.app,
        &sam,
        &format!("/rollouts/{}/rollback", f.rollout),
        "confirmed=yes",
        true,
    )
    .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "a rollback needs a reason");
    let (status, _, _) = post(
        &f.app,
        &sam,
        &format!("/rollouts/{}/explode", f.rollout),
        "confirmed=yes",
        true,
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let audit = f.db.audit_entries(&Default::default()).await.unwrap();
    for action in ["wave.approve", "rollout.paused", "rollout.running", "rollout.aborted"] {
        assert!(
            audit.iter().any(|e| e.action == action && e.actor == "sam"),
            "{action} is audited as sam"
        );
    }

    // A release transition from its page: without JavaScript the first post
    // asks and changes nothing.
    let (status, _, asked) = post(
        &f.app,
        &sam,
        "/releases/1/transition",
        "to=blocked&reason=xid+storm",
        false,
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert!(asked.contains("Move gpu ") && asked.contains(" to blocked?"), "{asked}");
    assert!(asked.contains("name=\"reason\" value=\"xid storm\""), "{asked}");
    let (status, location, _) = post(
        &f.app,
        &sam,
        "/releases/1/transition",
        "to=blocked&confirmed=yes",
        false,
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT, "blocking needs a reason ({location:?})");
    let (status, location, _) = post(
        &f.app,
        &sam,
        "/releases/1/transition",
        "to=blocked&reason=xid+storm&confirmed=yes",
        false,
    )
    .await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    assert!(location.unwrap().starts_with("/releases/1?msg="));
}

/// The next server-sent event on `stream` as (event name, data); events
/// may arrive split across chunks or several to a chunk.
struct Events<S> {
    stream: S,
    buffer: String,
}

impl<S: futures::Stream<Item = Result<axum::body::Bytes, axum::Error>> + Unpin> Events<S> {
    async fn next(&mut self) -> (String, serde_json::Value) {
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let block: String = self.buffer.drain(..end + 2).collect();
                let mut name = String::new();
                let mut data = String::new();
                for line in block.lines() {
                    if let Some(v) = line.strip_prefix("event: ") {
                        name = v.to_owned();
                    } else if let Some(v) = line.strip_prefix("data: ") {
                        data.push_str(v);
                    }
                }
                if name.is_empty() {
                    continue; // a keep-alive comment
                }
                return (name, serde_json::from_str(&data).unwrap());
            }
            let chunk = tokio::time::timeout(std::time::Duration::from_secs(10), self.stream.next())
                .await
                .expect("an event arrives")
                .expect("stream open")
                .unwrap();
            self.buffer.push_str(&String::from_utf8_lossy(&chunk));
        }
    }
}

async fn open_stream(
    app: &Router,
    token: &str,
    query: &str,
) -> Events<impl futures::Stream<Item = Result<axum::body::Bytes, axum::Error>> + Unpin + use<>> {
    let request = Request::get(format!("/events?{query}"))
        .header(header::AUTHORIZATION, format!("Bearer {token}"))
        .body(Body::empty())
        .unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()[header::CONTENT_TYPE], "text/event-stream");
    Events {
        stream: response.into_body().into_data_stream(),
        buffer: String::new(),
    }
}

#[tokio::test(flavor = "current_thread")]
async fn the_live_stream_sends_only_the_parts_that_changed() {
    let f = fixture().await;
    let viewer = provision_api_token(&f.db, "vera", Role::Viewer, "t", "test")
        .await
        .unwrap();
    let mut events = open_stream(&f.app, &viewer, &format!("rollouts={}", f.rollout)).await;
    let (name, hello) = events.next().await;
    assert_eq!(name, "hello");
    assert!(hello["stream"].as_str().is_some_and(|s| s.len() == 64), "{hello}");

    // First the whole live part, and a word that the node table may be stale.
    let (name, first) = events.next().await;
    assert_eq!(name, "rollout");
    assert_eq!(first["rollout"], f.rollout);
    assert_eq!(first["nodes"], true);
    let full = first["full"].as_str().expect("the whole live part first");
    assert!(
        full.contains("id=\"waves\"") && full.contains("0/3 nodes done"),
        "{full}"
    );
    assert!(!full.contains("approve-"), "a viewer's stream offers no approve button");

    // A step changes: the state card and its wave are sent, nothing else,
    // and the node table is fetched by the page, one page of it.
    // As any writer of steps does, the change moves `updated_at`: kept step counts are read
    // again when it moves (another controller's writes are seen that way).
    f._t.execute_raw(
        "UPDATE update_steps SET state = 'failed', error = 'BMC said no', updated_at = '2026-12-02 13:00:00+00:00'",
    )
    .await
    .unwrap();
    let (name, change) = events.next().await;
    assert_eq!(name, "rollout");
    assert!(change["full"].is_null(), "{change}");
    assert_eq!(change["nodes"], true);
    let mut parts: Vec<&str> = change["fragments"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    parts.sort();
    let wave = format!("wave-{}", f.canary);
    assert_eq!(parts, ["live-head", wave.as_str()], "{change}");
    assert!(
        change["fragments"]["live-head"]
            .as_str()
            .is_some_and(|h| h.contains("3/3 nodes done") && h.starts_with("<section")),
        "{change}"
    );
    let (status, table) = get(&f.app, &viewer, &format!("/rollouts/{}/nodes", f.rollout)).await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        table.contains("st-failed") && table.contains("BMC said no") && !table.contains("st-pending"),
        "{table}"
    );
    assert!(!table.contains("<html"), "a fragment, not a page: {table}");
}

#[tokio::test(flavor = "current_thread")]
async fn one_stream_changes_what_it_watches_without_a_new_connection() {
    let f = fixture().await;
    let viewer = provision_api_token(&f.db, "vera", Role::Viewer, "t", "test")
        .await
        .unwrap();
    let other = provision_api_token(&f.db, "sam", Role::ReleaseManager, "t", "test")
        .await
        .unwrap();
    let mut events = open_stream(&f.app, &viewer, "rollouts=").await;
    let (_, hello) = events.next().await;
    let stream = hello["stream"].as_str().unwrap().to_owned();

    // Only the user who opened it may change what it watches.
    let watch = format!("/events/{stream}/watch?rollouts={}", f.rollout);
    let (status, _) = get(&f.app, &other, &watch).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = get(&f.app, &viewer, &watch).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (name, first) = events.next().await;
    assert_eq!(name, "rollout");
    assert_eq!(first["rollout"], f.rollout);
    assert!(first["full"].as_str().is_some_and(|h| h.contains("id=\"waves\"")));

    let (status, _) = get(&f.app, &viewer, "/events/no-such-stream/watch?rollouts=1").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, body) = get(&f.app, &viewer, &format!("/events/{stream}/watch?rollouts=1,x")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(body.contains("rollout ids"), "{body}");
    let many: Vec<String> = (1..=33).map(|n| n.to_string()).collect();
    let (status, body) = get(&f.app, &viewer, &format!("/events?rollouts={}", many.join(","))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(body.contains("at most 32"), "{body}");

    // Once the browser goes away, its stream is forgotten.
    drop(events);
    let (status, _) = get(&f.app, &viewer, &watch).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

/// The node table reads one page from the database, under the page's
/// filters, and the live page refreshes the same page with the same filters.
#[tokio::test(flavor = "current_thread")]
async fn the_node_table_is_paged_and_filtered_on_the_server() {
    let f = fixture_with(205).await;
    let viewer = provision_api_token(&f.db, "vera", Role::Viewer, "t", "test")
        .await
        .unwrap();
    let (status, page) = get(&f.app, &viewer, &format!("/rollouts/{}?node=node-1&state=", f.rollout)).await;
    assert_eq!(status, StatusCode::OK);
    // As the browser reads the attributes.
    let page = page.replace("&#x2f;", "/").replace("&amp;", "&");
    assert!(
        page.contains(&format!(
            "data-nodes=\"/rollouts/{}/nodes?node=node-1&page=1\"",
            f.rollout
        )),
        "{page}"
    );
    // node-1, node-10..19, node-100..199: 111 of them, so two pages.
    assert!(page.contains("Nodes 1–100"), "{page}");
    assert!(page.contains(&format!("href=\"/rollouts/{}?node=node-1&page=2\"", f.rollout)));

    let (status, table) = get(&f.app, &viewer, &format!("/rollouts/{}/nodes?page=3", f.rollout)).await;
    assert_eq!(status, StatusCode::OK);
    assert!(table.contains("Nodes 201–205"), "{table}");
    assert_eq!(table.matches("<tr><td class=\"mono\">").count(), 5, "{table}");
    assert!(table.contains("id=\"nodes-prev\"") && !table.contains("id=\"nodes-next\""));

    let (status, table) = get(
        &f.app,
        &viewer,
        &format!("/rollouts/{}/nodes?node=node-20&state=pending", f.rollout),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        table.contains("Nodes 1–6") && !table.contains("nodes-next"),
        "node-20, node-200..204: {table}"
    );
    assert_eq!(table.matches("<tr><td class=\"mono\">").count(), 6, "{table}");

    for bad in ["page=0", "page=x", "state=bogus", "wave=w"] {
        let (status, _) = get(&f.app, &viewer, &format!("/rollouts/{}/nodes?{bad}", f.rollout)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}");
    }
    let (status, _) = get(&f.app, &viewer, "/rollouts/999/nodes").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

/// `/releases` is filtered by qualification state and paged on the server.
#[tokio::test(flavor = "current_thread")]
async fn the_release_list_is_filtered_and_paged() {
    let f = fixture().await;
    let viewer = provision_api_token(&f.db, "vera", Role::Viewer, "t", "test")
        .await
        .unwrap();
    let release = f.db.list_releases().await.unwrap().remove(0);
    let state = release.qualification_state.as_str();
    let (status, page) = get(&f.app, &viewer, &format!("/releases?state={state}")).await;
    assert_eq!(status, StatusCode::OK);
    assert!(page.contains(&format!("/releases/{}", release.id)), "{page}");
    let other = if state == "blocked" { "qualified" } else { "blocked" };
    let (status, page) = get(&f.app, &viewer, &format!("/releases?state={other}")).await;
    assert_eq!(status, StatusCode::OK);
    assert!(page.contains("No releases registered.") && !page.contains(&format!("/releases/{}\"", release.id)));
    let (status, page) = get(&f.app, &viewer, "/releases?page=2").await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        !page.contains(&format!("/releases/{}\"", release.id)),
        "page 2 is past the only release"
    );
    for bad in ["state=bogus", "page=0", "page=x"] {
        let (status, _) = get(&f.app, &viewer, &format!("/releases?{bad}")).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}");
    }
}
