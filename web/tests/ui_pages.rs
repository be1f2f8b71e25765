//! The UI in-process (`oneshot`): every page renders for a logged-in user
//! with the data it is about, actions work as plain forms (confirmation
//! page, then redirect) and as scripts (JSON), the two-person rule shows,
//! and the live stream sends the rollout's progress.

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
    let clock = Arc::new(ManualClock::new(Utc.with_ymd_and_hms(2026, 12, 2, 12, 0, 0).unwrap()));
    let t = TestDb::sqlite(clock).await;
    let db = t.db.clone();
    db.import_nodes(&plain_nodes(3), "test").await.unwrap();
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
            vec!["canary", "Approvals 0/1", "node-0", "c0ffee123456", "data-events"],
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

#[tokio::test(flavor = "current_thread")]
async fn the_live_stream_sends_the_rollout_progress() {
    let f = fixture().await;
    let viewer = provision_api_token(&f.db, "vera", Role::Viewer, "t", "test")
        .await
        .unwrap();
    let request = Request::get(format!("/rollouts/{}/events", f.rollout))
        .header(header::AUTHORIZATION, format!("Bearer {viewer}"))
        .body(Body::empty())
        .unwrap();
    let response = f.app.clone().oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()[header::CONTENT_TYPE], "text/event-stream");
    let mut stream = response.into_body().into_data_stream();
    let first = tokio::time::timeout(std::time::Duration::from_secs(10), stream.next())
        .await
        .expect("an event arrives")
        .expect("stream open")
        .unwrap();
    let text = String::from_utf8_lossy(&first);
    assert!(text.starts_with("event: progress\n"), "{text}");
    assert!(
        text.contains("id=\"waves\"") && text.contains("0/3 nodes done"),
        "{text}"
    );
    assert!(!text.contains("approve-"), "a viewer's stream offers no approve button");

    // Then the node table, and its changes as they happen.
    let mut next = async || {
        let chunk = tokio::time::timeout(std::time::Duration::from_secs(10), stream.next())
            .await
            .expect("an event arrives")
            .expect("stream open")
            .unwrap();
        String::from_utf8_lossy(&chunk).into_owned()
    };
    let nodes = next().await;
    assert!(nodes.starts_with("event: nodes\n"), "{nodes}");
    assert!(
        nodes.contains("id=\"nodes\"") && nodes.contains("node-0") && nodes.contains("st-pending"),
        "{nodes}"
    );
    f._t.execute_raw("UPDATE update_steps SET state = 'failed', error = 'BMC said no'")
        .await
        .unwrap();
    let changed = loop {
        let event = next().await;
        if event.starts_with("event: nodes\n") {
            break event;
        }
    };
    assert!(
        changed.contains("st-failed") && changed.contains("BMC said no"),
        "{changed}"
    );
    assert!(!changed.contains("st-pending"), "{changed}");
}

/// The live stream carries the page's node filters.
#[tokio::test(flavor = "current_thread")]
async fn the_live_node_table_keeps_the_page_filters() {
    let f = fixture().await;
    let viewer = provision_api_token(&f.db, "vera", Role::Viewer, "t", "test")
        .await
        .unwrap();
    let (status, page) = get(&f.app, &viewer, &format!("/rollouts/{}?node=node-1&state=", f.rollout)).await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        page.contains(&format!("data-events=\"/rollouts/{}/events?node=node-1\"", f.rollout)),
        "{page}"
    );
    let request = Request::get(format!("/rollouts/{}/events?node=node-1", f.rollout))
        .header(header::AUTHORIZATION, format!("Bearer {viewer}"))
        .body(Body::empty())
        .unwrap();
    let response = f.app.clone().oneshot(request).await.unwrap();
    let mut stream = response.into_body().into_data_stream();
    let mut nodes = String::new();
    for _ in 0..2 {
        let chunk = tokio::time::timeout(std::time::Duration::from_secs(10), stream.next())
            .await
            .expect("an event arrives")
            .expect("stream open")
            .unwrap();
        let text = String::from_utf8_lossy(&chunk).into_owned();
        if text.starts_with("event: nodes\n") {
            nodes = text;
        }
    }
    assert!(
        nodes.contains("node-1") && !nodes.contains("node-0") && !nodes.contains("node-2"),
        "{nodes}"
    );
    let (status, _) = get(&f.app, &viewer, &format!("/rollouts/{}/events?state=bogus", f.rollout)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
}
