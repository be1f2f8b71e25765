//! The rollout API in-process (`oneshot`), on every database backend: no
//! engine runs, so every state seen is what the API itself recorded.

mod common;

use axum::Router;
use axum::body::Body;
use axum::http::{Method, Request, StatusCode, header};
use common::{authed_app, call};
use http_body_util::BodyExt;
use orchestrator_db::Db;
use orchestrator_db::testing::TestDb;
use orchestrator_db::testing::fixtures::{self, GPU_TO as TO, PolicyYaml, add_qualified_release, gpu_nodes, release};
use orchestrator_engine::{StartRollout, start_rollout};
use orchestrator_types::{QualificationState, ReleaseId, TransitionRequest};
use serde_json::{Value, json};
use tower::ServiceExt;
use web::AppState;

fn policy_yaml() -> String {
    PolicyYaml::two_waves("api-gpu").render()
}

/// Eight GPU nodes on `GPU_FROM` (one of them quarantined-worthy: unhealthy
/// discovery is not modelled here, so one is left without inventory and is
/// excluded) and a qualified release `TO`.
async fn seed(db: &Db) -> ReleaseId {
    gpu_nodes(8)
        .racks(4)
        .clusters(2)
        .without_inventory("node-7")
        .seed(db)
        .await
        .unwrap();
    add_qualified_release(db, &release(TO), "alice").await.unwrap().id
}

fn start_body(release: ReleaseId) -> String {
    json!({ "release_id": release.0, "policy_yaml": policy_yaml(), "seed": 7 }).to_string()
}

async fn audit_actions(app: &Router, subject_type: &str, subject_id: i64) -> Vec<(String, String)> {
    let (status, audit) = call(
        app,
        Method::GET,
        &format!("/api/v1/audit?subject_type={subject_type}&subject_id={subject_id}"),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{audit}");
    audit
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["action"].as_str().unwrap().to_owned(),
                e["actor"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

#[tokio::test]
async fn a_rollout_from_an_inline_policy_shows_its_plan_waves_and_steps() {
    for t in TestDb::all_backends().await {
        let release = seed(&t.db).await;
        let app = authed_app(AppState::new(t.db.clone())).await;
        let (status, plan) = call(&app, Method::POST, "/api/v1/rollouts", Some(&start_body(release))).await;
        assert_eq!(status, StatusCode::CREATED, "{plan}");
        assert_eq!(plan["fleet_nodes"], 8);
        assert_eq!(plan["planned_nodes"], 7);
        assert_eq!(plan["planned_components"], 56);
        let excluded: u64 = plan["excluded"]
            .as_object()
            .unwrap()
            .values()
            .map(|v| v.as_u64().unwrap())
            .sum();
        assert_eq!(excluded, 1, "{plan}");
        assert_eq!(plan["waves"][0]["name"], "canary");
        assert_eq!(plan["waves"][0]["nodes"], 2);
        assert_eq!(plan["waves"][1]["nodes"], 5);
        assert_eq!(plan["waves"][1]["approvals_required"], 1);
        assert!(plan["waves"][0]["control_cohort"].as_u64().unwrap() > 0, "{plan}");
        assert_eq!(plan["rollback"]["possible"], true);
        assert_eq!(plan["rollback"]["automatic"], true);
        assert_eq!(plan["rollout"]["state"], "running");
        assert!(
            plan["rollout"]["policy_commit"]
                .as_str()
                .unwrap()
                .starts_with("inline:")
        );
        assert!(plan["rollout"].get("policy_source").is_none());
        let id = plan["rollout"]["id"].as_i64().unwrap();

        let (status, list) = call(&app, Method::GET, "/api/v1/rollouts", None).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(list.as_array().unwrap().len(), 1);
        assert_eq!(list[0]["id"], id);

        let (status, detail) = call(&app, Method::GET, &format!("/api/v1/rollouts/{id}"), None).await;
        assert_eq!(status, StatusCode::OK, "{detail}");
        assert_eq!(detail["release"]["version"], TO);
        assert_eq!(detail["policy_name"], "api-gpu");
        assert_eq!(detail["progress"]["pending"], 7);
        assert_eq!(detail["waves"][0]["name"], "canary");
        assert_eq!(detail["waves"][0]["state"], "planned");
        assert_eq!(detail["waves"][0]["progress"]["pending"], 2);
        // Approvals gate promotion out of a wave: the canary needs the
        // approvals the next (manual) wave asks for.
        assert_eq!(detail["waves"][0]["approvals"]["need"], 1);
        assert_eq!(detail["waves"][0]["approvals"]["have"], 0);
        assert_eq!(detail["waves"][0]["bake_ends_at"], Value::Null);

        let steps_uri = format!("/api/v1/rollouts/{id}/steps");
        let (status, page) = call(&app, Method::GET, &format!("{steps_uri}?limit=3"), None).await;
        assert_eq!(status, StatusCode::OK, "{page}");
        assert_eq!(page["total"], 7);
        assert_eq!(page["steps"].as_array().unwrap().len(), 3);
        let (_, page2) = call(&app, Method::GET, &format!("{steps_uri}?limit=3&offset=6"), None).await;
        assert_eq!(page2["steps"].as_array().unwrap().len(), 1);
        let (_, canary) = call(&app, Method::GET, &format!("{steps_uri}?wave=canary"), None).await;
        assert_eq!(canary["total"], 2);
        let (_, by_position) = call(&app, Method::GET, &format!("{steps_uri}?wave=1"), None).await;
        assert_eq!(by_position["total"], 5);
        let node = canary["steps"][0]["node_id"].as_i64().unwrap();
        let (_, one) = call(
            &app,
            Method::GET,
            &format!("{steps_uri}?node={node}&state=pending"),
            None,
        )
        .await;
        assert_eq!(one["total"], 1);
        let (_, none) = call(&app, Method::GET, &format!("{steps_uri}?state=flashing"), None).await;
        assert_eq!(none["total"], 0);
        let (_, by_name) = call(&app, Method::GET, &format!("{steps_uri}?node=node-7"), None).await;
        assert_eq!(by_name["total"], 0, "node-7 was excluded");

        for (uri, want) in [
            (format!("{steps_uri}?state=sideways"), StatusCode::BAD_REQUEST),
            (format!("{steps_uri}?limit=0"), StatusCode::BAD_REQUEST),
            (format!("{steps_uri}?wave=nope"), StatusCode::NOT_FOUND),
            (format!("{steps_uri}?node=no-such-node"), StatusCode::NOT_FOUND),
            (format!("{steps_uri}?colour=red"), StatusCode::BAD_REQUEST),
            ("/api/v1/rollouts/999/steps".to_owned(), StatusCode::NOT_FOUND),
            ("/api/v1/rollouts/999".to_owned(), StatusCode::NOT_FOUND),
            ("/api/v1/rollouts/abc".to_owned(), StatusCode::BAD_REQUEST),
        ] {
            let (status, body) = call(&app, Method::GET, &uri, None).await;
            assert_eq!(status, want, "{uri}: {body}");
            assert!(body["error"]["code"].is_string(), "{uri}: {body}");
        }

        let actions = audit_actions(&app, "rollout", id).await;
        assert!(
            actions.contains(&("rollout.start".to_owned(), "api".to_owned())),
            "{actions:?}"
        );
    }
}

#[tokio::test]
async fn bad_start_requests_get_clear_4xx_errors_and_create_nothing() {
    for t in TestDb::all_backends().await {
        let release = seed(&t.db).await;
        let app = authed_app(AppState::new(t.db.clone())).await;
        let broken_yaml = "name: x\nwaves:\n  - name: [unclosed\n";
        let cases: Vec<(String, StatusCode, &str)> = vec![
            ("{not json".into(), StatusCode::BAD_REQUEST, "line 1 column 2"),
            (
                "{}".into(),
                StatusCode::UNPROCESSABLE_ENTITY,
                "missing field `release_id`",
            ),
            (
                json!({"release_id": release.0, "policy_yaml": broken_yaml}).to_string(),
                StatusCode::UNPROCESSABLE_ENTITY,
                "3:",
            ),
            (
                json!({"release_id": release.0, "policy_yaml": policy_yaml().replace("count: 2", "count: -2")})
                    .to_string(),
                StatusCode::UNPROCESSABLE_ENTITY,
                "policy_yaml: 12:12: wave \"canary\" count must be between 1",
            ),
            (
                json!({"release_id": release.0}).to_string(),
                StatusCode::UNPROCESSABLE_ENTITY,
                "exactly one of",
            ),
            (
                json!({"release_id": release.0, "policy": "api-gpu", "policy_yaml": policy_yaml()}).to_string(),
                StatusCode::UNPROCESSABLE_ENTITY,
                "exactly one of",
            ),
            (
                json!({"release_id": release.0, "policy": "not-synced"}).to_string(),
                StatusCode::UNPROCESSABLE_ENTITY,
                "no policy named \"not-synced\" is in force",
            ),
            (
                json!({"release_id": 999, "policy_yaml": policy_yaml()}).to_string(),
                StatusCode::NOT_FOUND,
                "release 999 not found",
            ),
            (
                json!({"release_id": release.0, "policy_yaml": policy_yaml(), "colour": 1}).to_string(),
                StatusCode::UNPROCESSABLE_ENTITY,
                "unknown field `colour`",
            ),
        ];
        for (body, want_status, want_message) in &cases {
            let (status, response) = call(&app, Method::POST, "/api/v1/rollouts", Some(body)).await;
            assert_eq!(status, *want_status, "{body}: {response}");
            let message = response["error"]["message"].as_str().unwrap_or_default();
            assert!(
                message.contains(want_message),
                "{body}: {message:?} should mention {want_message:?}"
            );
        }
        // A blocked release cannot be planned: a conflict with its state.
        t.db.transition_release(
            release,
            &TransitionRequest {
                to: QualificationState::Blocked,
                reason: Some("XID storm".into()),
            },
            "alice",
        )
        .await
        .unwrap();
        let (status, response) = call(&app, Method::POST, "/api/v1/rollouts", Some(&start_body(release))).await;
        assert_eq!(status, StatusCode::CONFLICT, "{response}");
        let (_, list) = call(&app, Method::GET, "/api/v1/rollouts", None).await;
        assert_eq!(list, json!([]));
    }
}

#[tokio::test]
async fn approvals_follow_the_two_person_rule_and_are_audited() {
    for t in TestDb::all_backends().await {
        let release = seed(&t.db).await;
        let app = authed_app(AppState::new(t.db.clone())).await;
        // Started through the API, so its author is the API's actor.
        let (status, plan) = call(&app, Method::POST, "/api/v1/rollouts", Some(&start_body(release))).await;
        assert_eq!(status, StatusCode::CREATED, "{plan}");
        let own = plan["rollout"]["id"].as_i64().unwrap();
        let (status, refused) = call(
            &app,
            Method::POST,
            &format!("/api/v1/rollouts/{own}/waves/canary/approve"),
            None,
        )
        .await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{refused}");
        assert!(
            refused["error"]["message"]
                .as_str()
                .unwrap()
                .contains("two-person rule"),
            "{refused}"
        );
        t.db.user_set_rollout_state(
            orchestrator_types::RolloutId(own),
            &[orchestrator_db::execution::RolloutState::Running],
            orchestrator_db::execution::RolloutState::Aborted,
            None,
            "test",
        )
        .await
        .unwrap();

        // Started by alice: the API's actor may approve, once.
        let theirs = start_rollout(
            &t.db,
            &StartRollout {
                release_id: release,
                policy_source: policy_yaml(),
                policy_commit: None,
                policy_blob: None,
                seed: 1,
            },
            "alice",
        )
        .await
        .unwrap()
        .id
        .0;
        let approve = format!("/api/v1/rollouts/{theirs}/waves/canary/approve");
        // Before its verdict the wave takes no approval (it would be counted
        // for a verdict nobody read): 409 with the reason, nothing kept.
        let (status, early) = call(&app, Method::POST, &approve, None).await;
        assert_eq!(status, StatusCode::CONFLICT, "{early}");
        assert!(
            early["error"]["message"]
                .as_str()
                .unwrap()
                .contains("after its health verdict"),
            "{early}"
        );
        let canary = t.db.rollout_waves(orchestrator_types::RolloutId(theirs)).await.unwrap()[0].id;
        assert!(t.db.wave_approvals(canary).await.unwrap().is_empty());
        orchestrator_db::testing::await_approval(
            &t.db,
            canary,
            orchestrator_types::WaveVerdict {
                outcome: orchestrator_types::Outcome::Pass,
                summary: "healthy".into(),
                evidence: json!({}),
            },
        )
        .await
        .unwrap();
        let (status, approved) = call(
            &app,
            Method::POST,
            &approve,
            Some(r#"{"comment":"canary looks clean"}"#),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{approved}");
        assert_eq!(approved["have"], 1);
        assert_eq!(approved["need"], 1);
        assert_eq!(approved["given"][0]["approver"], "api");
        assert_eq!(approved["given"][0]["comment"], "canary looks clean");
        let (status, again) = call(&app, Method::POST, &approve, None).await;
        assert_eq!(status, StatusCode::CONFLICT, "{again}");

        let (_, detail) = call(&app, Method::GET, &format!("/api/v1/rollouts/{theirs}"), None).await;
        assert_eq!(detail["waves"][0]["approvals"]["have"], 1);
        let wave_id = detail["waves"][0]["id"].as_i64().unwrap();
        let actions = audit_actions(&app, "wave", wave_id).await;
        let approvals: Vec<_> = actions.iter().filter(|(action, _)| action == "wave.approve").collect();
        assert_eq!(approvals, [&("wave.approve".to_owned(), "api".to_owned())]);

        for (uri, body, want) in [
            (
                format!("/api/v1/rollouts/{theirs}/waves/nope/approve"),
                None,
                StatusCode::NOT_FOUND,
            ),
            (
                "/api/v1/rollouts/999/waves/canary/approve".to_owned(),
                None,
                StatusCode::NOT_FOUND,
            ),
            (
                format!("/api/v1/rollouts/{theirs}/waves/rest/approve"),
                Some("{oops"),
                StatusCode::BAD_REQUEST,
            ),
            (
                format!("/api/v1/rollouts/{theirs}/waves/rest/approve"),
                Some(r#"{"comment": 5}"#),
                StatusCode::UNPROCESSABLE_ENTITY,
            ),
        ] {
            let (status, response) = call(&app, Method::POST, &uri, body).await;
            assert_eq!(status, want, "{uri}: {response}");
        }
    }
}

#[tokio::test]
async fn pause_resume_abort_and_rollback_change_state_and_are_audited() {
    for t in TestDb::all_backends().await {
        let release = seed(&t.db).await;
        let app = authed_app(AppState::new(t.db.clone())).await;
        let (_, plan) = call(&app, Method::POST, "/api/v1/rollouts", Some(&start_body(release))).await;
        let id = plan["rollout"]["id"].as_i64().unwrap();
        let uri = |command: &str| format!("/api/v1/rollouts/{id}/{command}");

        let (status, paused) = call(&app, Method::POST, &uri("pause"), Some(r#"{"reason":"vendor call"}"#)).await;
        assert_eq!(status, StatusCode::OK, "{paused}");
        assert_eq!(paused["state"], "paused");
        assert_eq!(paused["state_reason"], "vendor call");
        let (status, again) = call(&app, Method::POST, &uri("pause"), None).await;
        assert_eq!(status, StatusCode::CONFLICT, "{again}");
        let (status, resumed) = call(&app, Method::POST, &uri("resume"), None).await;
        assert_eq!(status, StatusCode::OK, "{resumed}");
        assert_eq!(resumed["state"], "running");
        let (status, aborted) = call(&app, Method::POST, &uri("abort"), Some(r#"{"reason":"wrong image"}"#)).await;
        assert_eq!(status, StatusCode::OK, "{aborted}");
        assert_eq!(aborted["state"], "aborted");
        let (status, body) = call(&app, Method::POST, &uri("resume"), None).await;
        assert_eq!(status, StatusCode::CONFLICT, "{body}");

        let (status, body) = call(&app, Method::POST, &uri("rollback"), Some(r#"{"reason":"  "}"#)).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
        let (status, body) = call(&app, Method::POST, &uri("rollback"), Some("{}")).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
        let (status, rolling) = call(&app, Method::POST, &uri("rollback"), Some(r#"{"reason":"XIDs"}"#)).await;
        assert_eq!(status, StatusCode::OK, "{rolling}");
        assert_eq!(rolling["state"], "rolling_back");
        let last = rolling["waves"].as_array().unwrap().last().unwrap().clone();
        assert_eq!(last["kind"], "rollback");
        let (status, body) = call(&app, Method::POST, &uri("rollback"), Some(r#"{"reason":"again"}"#)).await;
        assert_eq!(status, StatusCode::CONFLICT, "{body}");

        // A rollback that cannot finish can always be stopped, but only by
        // an admin and with a reason: it leaves nodes between versions.
        let rita = web::auth::provision_api_token(&t.db, "rita", orchestrator_types::Role::ReleaseManager, "t", "test")
            .await
            .unwrap();
        let request = Request::post(uri("abort"))
            .header(header::AUTHORIZATION, format!("Bearer {rita}"))
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(r#"{"reason":"stuck"}"#))
            .unwrap();
        assert_eq!(
            app.clone().oneshot(request).await.unwrap().status(),
            StatusCode::FORBIDDEN
        );
        let (status, body) = call(&app, Method::POST, &uri("abort"), None).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
        let (status, aborted) = call(
            &app,
            Method::POST,
            &uri("abort"),
            Some(r#"{"reason":"BMC task never ends"}"#),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{aborted}");
        assert_eq!(aborted["state"], "aborted");

        let actions = audit_actions(&app, "rollout", id).await;
        let api_actions: Vec<&str> = actions
            .iter()
            .filter(|(_, actor)| actor == "api")
            .map(|(action, _)| action.as_str())
            .collect();
        assert_eq!(
            api_actions,
            [
                "rollout.aborted",
                "rollout.rolling_back",
                "rollout.aborted",
                "rollout.running",
                "rollout.paused",
                "rollout.start"
            ]
        );

        for (uri, body, want) in [
            ("/api/v1/rollouts/999/pause".to_owned(), None, StatusCode::NOT_FOUND),
            (
                "/api/v1/rollouts/999/rollback".to_owned(),
                Some(r#"{"reason":"x"}"#),
                StatusCode::NOT_FOUND,
            ),
            (uri("pause"), Some("{not json"), StatusCode::BAD_REQUEST),
            (uri("abort"), Some(r#"{"why":"x"}"#), StatusCode::UNPROCESSABLE_ENTITY),
            ("/api/v1/rollouts/x/abort".to_owned(), None, StatusCode::BAD_REQUEST),
        ] {
            let (status, response) = call(&app, Method::POST, &uri, body).await;
            assert_eq!(status, want, "{uri}: {response}");
            assert!(response["error"]["message"].is_string(), "{uri}: {response}");
        }
    }
}

#[tokio::test]
async fn the_openapi_document_lists_the_rollout_paths() {
    let t = TestDb::sqlite(std::sync::Arc::new(orchestrator_types::SystemClock)).await;
    let app = authed_app(AppState::new(t.db.clone())).await;
    let (status, doc) = call(&app, Method::GET, "/api/v1/openapi.json", None).await;
    assert_eq!(status, StatusCode::OK);
    for path in [
        "/api/v1/rollouts",
        "/api/v1/rollouts/{id}",
        "/api/v1/rollouts/{id}/steps",
        "/api/v1/rollouts/{id}/waves/{wave}/approve",
        "/api/v1/rollouts/{id}/pause",
        "/api/v1/rollouts/{id}/resume",
        "/api/v1/rollouts/{id}/abort",
        "/api/v1/rollouts/{id}/rollback",
    ] {
        assert!(doc["paths"].get(path).is_some(), "{path} missing");
    }
}

/// Puts `policy_yaml()` in force as `api-gpu`, as a git sync would;
/// returns its (commit, blob).
async fn put_policy_in_force(db: &Db) -> (String, String) {
    fixtures::put_policy_in_force(db, "api-gpu", &policy_yaml())
        .await
        .unwrap()
}

#[tokio::test]
async fn a_rollout_under_a_policy_in_force_pins_its_commit_and_blob() {
    for t in TestDb::all_backends().await {
        let release = seed(&t.db).await;
        let (commit, blob) = put_policy_in_force(&t.db).await;
        let app = authed_app(AppState::new(t.db.clone())).await;
        let body = json!({ "release_id": release.0, "policy": "api-gpu" }).to_string();
        let (status, plan) = call(&app, Method::POST, "/api/v1/rollouts", Some(&body)).await;
        assert_eq!(status, StatusCode::CREATED, "{plan}");
        assert_eq!(plan["rollout"]["policy_commit"], commit.as_str());
        assert_eq!(plan["rollout"]["policy_blob"], blob.as_str());
        let id = plan["rollout"]["id"].as_i64().unwrap();
        let (_, detail) = call(&app, Method::GET, &format!("/api/v1/rollouts/{id}"), None).await;
        assert_eq!(
            detail["policy_source"],
            policy_yaml().as_str(),
            "the detail shows the pinned policy"
        );
    }
}

/// A fleet without BMCs: the nudge test never admits a flash (its only
/// maintenance window is on leap days), so nothing connects.
#[derive(Debug)]
struct NoBmcs;

impl orchestrator_engine::BmcConnector for NoBmcs {
    fn connect(
        &self,
        _step: &orchestrator_db::execution::PlacedStep,
    ) -> Result<std::sync::Arc<dyn orchestrator_bmc::Bmc>, orchestrator_engine::ConnectError> {
        Err("this test has no BMCs".into())
    }
}

/// Polls the datastore until `check` holds, for at most five seconds.
async fn eventually<F, Fut>(what: &str, check: F)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
    while !check().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: the engine was not nudged"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_nudge_the_engine_instead_of_waiting_for_its_next_pass() {
    use orchestrator_db::execution::{Blocker, StepState, WaveState};
    for t in TestDb::all_backends().await {
        let release = seed(&t.db).await;
        // Passes come an hour apart unless something nudges the engine.
        let engine = orchestrator_engine::Engine::start(
            t.db.clone(),
            orchestrator_engine::EngineConfig {
                holder: "nudge-test".into(),
                pass_interval: std::time::Duration::from_secs(3600),
                ..Default::default()
            },
            std::sync::Arc::new(NoBmcs),
            std::sync::Arc::new(orchestrator_engine::GatelessJudge),
        );
        let app = authed_app(AppState::new(t.db.clone()).with_engine_nudge(engine.nudge())).await;
        let closed_window = format!(
            "{}maintenance_windows:\n  - cron: \"0 0 3 29 2 *\"\n    duration: 1h\n    timezone: UTC\n",
            policy_yaml()
        );
        let body = json!({ "release_id": release.0, "policy_yaml": closed_window, "seed": 1 }).to_string();
        let (status, plan) = call(&app, Method::POST, "/api/v1/rollouts", Some(&body)).await;
        assert_eq!(status, StatusCode::CREATED, "{plan}");
        let id = orchestrator_types::RolloutId(plan["rollout"]["id"].as_i64().unwrap());
        let db = t.db.clone();
        eventually("the canary starts after the rollout is created", || {
            let db = db.clone();
            // One pass moves the canary from planned to running; it admits
            // nothing, the window being closed.
            async move { db.rollout_waves(id).await.unwrap()[0].state == WaveState::Running }
        })
        .await;
        let (status, paused) = call(&app, Method::POST, &format!("/api/v1/rollouts/{id}/pause"), None).await;
        let steps = t.db.step_counts(id, None).await.unwrap();
        assert_eq!(
            steps.keys().copied().collect::<Vec<_>>(),
            [StepState::Pending],
            "nothing admitted"
        );
        assert_eq!(status, StatusCode::OK, "{paused}");
        eventually("the engine marks the rollout paused", || {
            let db = db.clone();
            async move { db.exec_rollout(id).await.unwrap().blockers == [Blocker::Paused] }
        })
        .await;
        engine.shutdown().await;
    }
}

/// The release page offers the policies in force for the release's
/// component; its form starts the rollout without JavaScript (redirect to
/// the rollout page) and with it (JSON), and bad input is refused.
#[tokio::test]
async fn a_rollout_starts_from_the_release_page_form() {
    let t = TestDb::sqlite(std::sync::Arc::new(orchestrator_types::SystemClock)).await;
    let release = seed(&t.db).await;
    let app = authed_app(AppState::new(t.db.clone())).await;
    let form = |body: &str, json: bool| {
        let mut request = Request::post(format!("/releases/{}/rollouts", release.0))
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded");
        if json {
            request = request.header(header::ACCEPT, "application/json");
        }
        request.body(Body::from(body.to_owned())).unwrap()
    };

    let (status, page) = call(&app, Method::GET, &format!("/releases/{}", release.0), None).await;
    assert_eq!(status, StatusCode::OK);
    let page = page.as_str().unwrap().to_owned();
    assert!(page.contains("No policy in force targets gpu firmware"), "{page}");
    assert!(!page.contains("id=\"start-rollout\""));

    put_policy_in_force(&t.db).await;
    let (_, page) = call(&app, Method::GET, &format!("/releases/{}", release.0), None).await;
    let page = page.as_str().unwrap().to_owned();
    assert!(page.contains("id=\"start-rollout\""), "{page}");
    assert!(
        page.contains("<option value=\"api-gpu\">api-gpu @ cccccccccccc</option>"),
        "{page}"
    );

    let response = app
        .clone()
        .oneshot(form("policy=api-gpu&seed=seven", false))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let response = app
        .clone()
        .oneshot(form("policy=nope&seed=&confirmed=yes", true))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    assert!(String::from_utf8_lossy(&bytes).contains("no policy named \\\"nope\\\" is in force"));
    assert!(
        t.db.exec_rollouts().await.unwrap().is_empty(),
        "nothing started on bad input"
    );

    // Without JavaScript the first post asks, naming the release and the
    // policy, and starts nothing; the confirmed post starts.
    let response = app.clone().oneshot(form("policy=api-gpu&seed=7", false)).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let asked = String::from_utf8_lossy(&bytes).into_owned();
    assert!(
        asked.contains("Plan and start a rollout of gpu 96.00.61.00.01 under policy api-gpu?")
            && asked.contains("name=\"confirmed\" value=\"yes\"")
            && asked.contains("name=\"seed\" value=\"7\""),
        "{asked}"
    );
    assert!(
        t.db.exec_rollouts().await.unwrap().is_empty(),
        "nothing started before the confirmation"
    );
    let response = app
        .clone()
        .oneshot(form("policy=api-gpu&seed=7&confirmed=yes", false))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    let rollouts = t.db.exec_rollouts().await.unwrap();
    assert_eq!(rollouts.len(), 1);
    let location = response.headers()[header::LOCATION].to_str().unwrap().to_owned();
    assert!(
        location.starts_with(&format!("/rollouts/{}?msg=", rollouts[0].id)),
        "{location}"
    );
    assert_eq!(rollouts[0].seed, 7);
    assert_eq!(rollouts[0].created_by, "api");
    assert_eq!(rollouts[0].policy_commit, "c".repeat(40));
    // Without JavaScript the message arrives on the new rollout's page, and
    // counts nodes as nodes (a GPU node's steps are its components).
    let message = percent_encoding::percent_decode_str(location.split_once("?msg=").unwrap().1)
        .decode_utf8()
        .unwrap()
        .into_owned();
    let steps =
        t.db.steps(&orchestrator_db::execution::StepFilter {
            rollout_id: Some(rollouts[0].id),
            ..Default::default()
        })
        .await
        .unwrap();
    let nodes: std::collections::BTreeSet<_> = steps.iter().map(|s| s.node_id).collect();
    let components: usize = message
        .split(", ")
        .find_map(|part| part.strip_suffix(" component update(s)."))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("a component count: {message}"));
    assert!(
        message.contains(&format!(", {} node(s), ", nodes.len())) && components > nodes.len(),
        "nodes counted as nodes, their GPUs as components: {message}"
    );
    let (status, page) = call(&app, Method::GET, &location, None).await;
    assert_eq!(status, StatusCode::OK);
    let page = page.as_str().unwrap().to_owned();
    assert!(
        page.contains(&format!("Rollout {} planned:", rollouts[0].id)),
        "the message is shown on the rollout's page"
    );
}
