//! Rollback metadata through the web layer: a release registered with
//! `downgrade_forbidden` and `rollback_floor` over the API, the plan of its
//! rollout saying rollback is impossible, the UI banner and the refused
//! roll-back action, and the release page showing both fields.

use axum::Router;
use axum::body::Body;
use axum::http::{Method, Request, StatusCode, header};
use http_body_util::BodyExt;
use orchestrator_db::Db;
use orchestrator_db::testing::TestDb;
use orchestrator_db::testing::fixtures::{GPU_TO as TO, PolicyYaml, SKU, gpu_nodes};
use serde_json::{Value, json};
use tower::ServiceExt;
use web::{AppState, app};

const FUSE: &str = "burns anti-rollback fuse SVN 4";

async fn token(db: &Db) -> String {
    web::auth::provision_api_token(db, "ada", orchestrator_types::Role::Admin, "tests", "test")
        .await
        .unwrap()
}

/// One request with the admin's token; the body is JSON or a form.
async fn call(
    app: &Router,
    token: &str,
    method: Method,
    uri: &str,
    body: Option<(&str, &str)>,
) -> (StatusCode, String) {
    let mut request = Request::builder()
        .method(method)
        .uri(uri)
        .header(header::AUTHORIZATION, format!("Bearer {token}"))
        .header(header::ACCEPT, "application/json");
    if let Some((content_type, _)) = body {
        request = request.header(header::CONTENT_TYPE, content_type);
    }
    let request = request
        .body(body.map_or_else(Body::empty, |(_, b)| Body::from(b.to_owned())))
        .unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&bytes).into_owned())
}

async fn api(app: &Router, token: &str, method: Method, uri: &str, body: Option<&Value>) -> (StatusCode, Value) {
    let text = body.map(Value::to_string);
    let (status, out) = call(
        app,
        token,
        method,
        uri,
        text.as_deref().map(|b| ("application/json", b)),
    )
    .await;
    (status, serde_json::from_str(&out).unwrap_or(Value::String(out)))
}

fn release_body(extra: Value) -> Value {
    let mut body = json!({
        "component_kind": "gpu",
        "version": TO,
        "image_uri": "https://images.example/gpu.fw",
        "sha256": "0123456789abcdef".repeat(4),
        "size_bytes": 1024,
        "platforms": [SKU],
    });
    body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    body
}

async fn seed_fleet(db: &Db) {
    gpu_nodes(4).seed(db).await.unwrap();
}

#[tokio::test]
async fn release_rollback_metadata_is_validated_by_the_api() {
    let t = TestDb::sqlite(std::sync::Arc::new(orchestrator_types::SystemClock)).await;
    let token = token(&t.db).await;
    let app = app(AppState::new(t.db.clone()));
    let cases = [
        (json!({ "rollback_floor": "not a version!" }), "firmware version"),
        (
            json!({ "rollback_floor": "96.00.62.00.00" }),
            "above the release's own version",
        ),
        (json!({ "downgrade_forbidden": "  " }), "downgrade_forbidden"),
    ];
    for (extra, needle) in cases {
        let (status, body) = api(
            &app,
            &token,
            Method::POST,
            "/api/v1/releases",
            Some(&release_body(extra.clone())),
        )
        .await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{extra}: {body}");
        assert!(body.to_string().contains(needle), "{extra}: {body}");
    }
    let (_, list) = api(&app, &token, Method::GET, "/api/v1/releases", None).await;
    assert_eq!(list, json!([]), "nothing registered");

    // The OpenAPI document describes both fields.
    let (_, doc) = api(&app, &token, Method::GET, "/api/v1/openapi.json", None).await;
    let schemas = &doc["components"]["schemas"];
    for field in ["downgrade_forbidden", "rollback_floor"] {
        assert!(
            schemas["Release"]["properties"][field].is_object(),
            "Release.{field}: {schemas}"
        );
        assert!(
            schemas["ReleaseRollback"]["properties"][field].is_object(),
            "ReleaseRollback.{field}: {schemas}"
        );
    }
}

#[tokio::test]
async fn a_rollout_of_a_release_that_forbids_downgrades_says_so_and_refuses_rollback() {
    for t in TestDb::all_backends().await {
        seed_fleet(&t.db).await;
        let token = token(&t.db).await;
        let app = app(AppState::new(t.db.clone()));

        let extra = json!({ "downgrade_forbidden": FUSE, "rollback_floor": "96.00.5A.00.00" });
        let (status, release) = api(
            &app,
            &token,
            Method::POST,
            "/api/v1/releases",
            Some(&release_body(extra)),
        )
        .await;
        assert_eq!(status, StatusCode::CREATED, "{release}");
        assert_eq!(release["downgrade_forbidden"], FUSE);
        assert_eq!(release["rollback_floor"], "96.00.5A.00.00");
        let id = release["id"].as_i64().unwrap();
        let (_, shown) = api(&app, &token, Method::GET, &format!("/api/v1/releases/{id}"), None).await;
        assert_eq!(shown["downgrade_forbidden"], FUSE);
        for to in ["qualifying", "qualified"] {
            let (status, body) = api(
                &app,
                &token,
                Method::POST,
                &format!("/api/v1/releases/{id}/transition"),
                Some(&json!({ "to": to })),
            )
            .await;
            assert_eq!(status, StatusCode::OK, "{body}");
        }

        // The release page shows both fields.
        let (status, page) = call(&app, &token, Method::GET, &format!("/releases/{id}"), None).await;
        assert_eq!(status, StatusCode::OK);
        assert!(page.contains(FUSE) && page.contains("96.00.5A.00.00"), "{page}");

        let start = json!({ "release_id": id, "policy_yaml": PolicyYaml::two_waves("api-gpu").render(), "seed": 7 });
        let (status, plan) = api(&app, &token, Method::POST, "/api/v1/rollouts", Some(&start)).await;
        assert_eq!(status, StatusCode::CREATED, "{plan}");
        assert_eq!(plan["rollback"]["possible"], false, "{plan}");
        assert!(
            plan["rollback"]["reasons"][0].as_str().unwrap().contains(FUSE),
            "{plan}"
        );
        let rollout = plan["rollout"]["id"].as_i64().unwrap();
        let (_, detail) = api(&app, &token, Method::GET, &format!("/api/v1/rollouts/{rollout}"), None).await;
        assert_eq!(detail["rollback_assessment"]["possible"], false, "{detail}");
        assert_eq!(
            detail["rollback_assessment"]["reasons"][0],
            format!("the release forbids downgrades ({FUSE})"),
            "{detail}"
        );

        // The rollout page says so before anything is approved, and the
        // roll-back button is disabled with the reason.
        let (status, page) = call(&app, &token, Method::GET, &format!("/rollouts/{rollout}"), None).await;
        assert_eq!(status, StatusCode::OK);
        let banner = format!("<b>Rollback impossible:</b> the release forbids downgrades ({FUSE})");
        assert!(page.contains(&banner), "{page}");
        let button = page
            .split("id=\"action-rollback\"")
            .nth(1)
            .and_then(|rest| rest.split('>').next())
            .unwrap_or_else(|| panic!("no roll-back button: {page}"));
        assert!(button.contains("disabled"), "{button}");
        assert!(
            !page.contains(&format!("action=\"/rollouts/{rollout}/rollback\"")),
            "no roll-back form"
        );

        // Posting anyway is refused by the UI and the API, with the reason.
        let (status, body) = call(
            &app,
            &token,
            Method::POST,
            &format!("/rollouts/{rollout}/rollback"),
            Some(("application/x-www-form-urlencoded", "reason=try&confirmed=yes")),
        )
        .await;
        assert_eq!(status, StatusCode::CONFLICT, "{body}");
        assert!(body.contains(FUSE), "{body}");
        let (status, body) = api(
            &app,
            &token,
            Method::POST,
            &format!("/api/v1/rollouts/{rollout}/rollback"),
            Some(&json!({ "reason": "try" })),
        )
        .await;
        assert_eq!(status, StatusCode::CONFLICT, "{body}");
        assert!(body.to_string().contains(FUSE), "{body}");
        let (_, detail) = api(&app, &token, Method::GET, &format!("/api/v1/rollouts/{rollout}"), None).await;
        assert_eq!(detail["state"], "running", "nothing changed");
    }
}
