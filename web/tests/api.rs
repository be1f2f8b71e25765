//! The JSON API in-process (`oneshot`), on every database backend.

mod common;

use axum::http::{Method, StatusCode};
use common::{authed_app, call};
use orchestrator_db::testing::TestDb;
use serde_json::{Value, json};
use web::AppState;

fn release_body(version: &str) -> String {
    json!({
        "component_kind": "gpu",
        "version": version,
        "image_uri": "https://images.example/gpu.fw",
        "sha256": "0123456789abcdef".repeat(4),
        "size_bytes": 1024,
        "platforms": ["hgx-h100-8gpu"],
        "release_notes": "fixes XID 79 on link retrain"
    })
    .to_string()
}

#[tokio::test]
async fn release_lifecycle_through_the_api() {
    for t in TestDb::all_backends().await {
        let app = authed_app(AppState::new(t.db.clone())).await;
        let (status, created) = call(
            &app,
            Method::POST,
            "/api/v1/releases",
            Some(&release_body("96.00.61.00.01")),
        )
        .await;
        assert_eq!(status, StatusCode::CREATED, "{created}");
        assert_eq!(created["qualification_state"], "registered");
        let id = created["id"].as_i64().unwrap();

        let (status, body) = call(
            &app,
            Method::POST,
            "/api/v1/releases",
            Some(&release_body("96.00.61.00.01")),
        )
        .await;
        assert_eq!(status, StatusCode::CONFLICT, "{body}");

        let transition = |to: &str, reason: Option<&str>| json!({"to": to, "reason": reason}).to_string();
        let uri = format!("/api/v1/releases/{id}/transition");
        let (status, body) = call(&app, Method::POST, &uri, Some(&transition("qualifying", None))).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let (status, body) = call(&app, Method::POST, &uri, Some(&transition("default", None))).await;
        assert_eq!(status, StatusCode::CONFLICT);
        assert_eq!(
            body["error"]["message"],
            "a release cannot go from qualifying to default"
        );
        let (status, body) = call(&app, Method::POST, &uri, Some(&transition("blocked", None))).await;
        assert_eq!(status, StatusCode::CONFLICT);
        assert_eq!(
            body["error"]["message"],
            "going from qualifying to blocked needs a reason"
        );
        let (status, _) = call(
            &app,
            Method::POST,
            &uri,
            Some(&transition("blocked", Some("XID storm"))),
        )
        .await;
        assert_eq!(status, StatusCode::OK);
        let (status, body) = call(&app, Method::POST, &uri, Some(&transition("sideways", None))).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap()
                .contains("unknown qualification state"),
            "{body}"
        );

        let gate = json!({"gate": "burn-in", "passed": true, "evidence": "https://ci/1"}).to_string();
        let (status, _) = call(
            &app,
            Method::POST,
            &format!("/api/v1/releases/{id}/qualification"),
            Some(&gate),
        )
        .await;
        assert_eq!(status, StatusCode::CREATED);
        let (status, detail) = call(&app, Method::GET, &format!("/api/v1/releases/{id}"), None).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(detail["qualification_state"], "blocked");
        assert_eq!(detail["state_reason"], "XID storm");
        assert_eq!(detail["gate_results"][0]["gate"], "burn-in");

        let (_, audit) = call(
            &app,
            Method::GET,
            &format!("/api/v1/audit?subject_type=release&subject_id={id}"),
            None,
        )
        .await;
        let actions: Vec<&str> = audit
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["action"].as_str().unwrap())
            .collect();
        assert_eq!(
            actions,
            [
                "release.gate_result",
                "release.block",
                "release.transition",
                "release.add"
            ]
        );
    }
}

#[tokio::test]
async fn bad_bodies_get_clear_4xx_errors_and_change_nothing() {
    for t in TestDb::all_backends().await {
        let app = authed_app(AppState::new(t.db.clone())).await;
        let cases: &[(&str, &str, StatusCode, &str)] = &[
            (
                "/api/v1/releases",
                "{not json",
                StatusCode::BAD_REQUEST,
                "line 1 column 2",
            ),
            (
                "/api/v1/releases",
                "{}",
                StatusCode::UNPROCESSABLE_ENTITY,
                "missing field `component_kind`",
            ),
            (
                "/api/v1/releases",
                r#"{"component_kind":"gpu","version":"","image_uri":"x","sha256":"x","size_bytes":1,"platforms":[]}"#,
                StatusCode::UNPROCESSABLE_ENTITY,
                "firmware version is empty",
            ),
            (
                "/api/v1/releases",
                r#"{"component_kind":"fpga","version":"1.0","image_uri":"x","sha256":"x","size_bytes":1,"platforms":[]}"#,
                StatusCode::UNPROCESSABLE_ENTITY,
                "unknown variant `fpga`",
            ),
            (
                "/api/v1/releases",
                r#"{"component_kind":"gpu","version":"1.0","image_uri":"ftp://x","sha256":"x","size_bytes":0,"platforms":[]}"#,
                StatusCode::UNPROCESSABLE_ENTITY,
                "image_uri: must be an http or https URL with a host; sha256: must be 64 hexadecimal characters; size_bytes: must be positive; platforms: must name at least one platform SKU",
            ),
            (
                "/api/v1/nodes",
                r#"{"nodes":[{"name":"n1"}]}"#,
                StatusCode::UNPROCESSABLE_ENTITY,
                "missing field `bmc_url`",
            ),
            (
                "/api/v1/nodes",
                r#"{"nodes":[{"name":"n1","bmc_url":"https://b1","credential_ref":"c","platform_sku":"s","region":"r","cluster":"c","rack":"r","nvlink_domain":"d"},{"name":"n2","bmc_url":"nope","credential_ref":"c","platform_sku":"s","region":"r","cluster":"c","rack":"r","nvlink_domain":"d"}]}"#,
                StatusCode::UNPROCESSABLE_ENTITY,
                "nodes[1].bmc_url: not a URL",
            ),
            (
                "/api/v1/nodes",
                r#"{"nodez":[]}"#,
                StatusCode::UNPROCESSABLE_ENTITY,
                "unknown field `nodez`",
            ),
        ];
        for (uri, body, want_status, want_message) in cases {
            let (status, response) = call(&app, Method::POST, uri, Some(body)).await;
            assert_eq!(status, *want_status, "{uri} {body}: {response}");
            let message = response["error"]["message"].as_str().unwrap_or_default();
            assert!(
                message.contains(want_message),
                "{uri} {body}: {message:?} should mention {want_message:?}"
            );
            assert!(response["error"]["code"].is_string());
        }
        let (_, releases) = call(&app, Method::GET, "/api/v1/releases", None).await;
        assert_eq!(releases, json!([]));
        let (_, nodes) = call(&app, Method::GET, "/api/v1/nodes", None).await;
        assert_eq!(nodes, json!([]));
        let (_, audit) = call(&app, Method::GET, "/api/v1/audit", None).await;
        // Only the provisioning of the test's own user and token.
        let actions: Vec<&str> = audit
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|e| e["action"].as_str())
            .collect();
        assert_eq!(
            actions,
            ["user.token.add", "user.add"],
            "nothing happened, nothing audited"
        );

        let (status, body) = call(&app, Method::GET, "/api/v1/nodes?state=sideways", None).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
        let (status, _) = call(&app, Method::GET, "/api/v1/nodes?limit=-1", None).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        let (status, _) = call(&app, Method::GET, "/api/v1/releases/abc", None).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        let (status, body) = call(&app, Method::GET, "/api/v1/releases/99999", None).await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert_eq!(body["error"]["message"], "release 99999 not found");
        let (status, body) = call(&app, Method::GET, "/api/v1/nope", None).await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert_eq!(body["error"]["code"], "not_found");
    }
}

#[tokio::test]
async fn nodes_import_and_read_back() {
    let t = TestDb::sqlite(std::sync::Arc::new(orchestrator_types::SystemClock)).await;
    let app = authed_app(AppState::new(t.db.clone())).await;
    let nodes: Vec<Value> = (0..3)
        .map(|i| {
            json!({"name": format!("n{i}"), "bmc_url": format!("https://10.0.0.{i}"), "credential_ref": "lab",
                         "platform_sku": "hgx-h100-8gpu", "region": "us-east-1", "cluster": "c1",
                         "rack": format!("r{i}"), "nvlink_domain": "nvl1"})
        })
        .collect();
    let (status, summary) = call(
        &app,
        Method::POST,
        "/api/v1/nodes",
        Some(&json!({"nodes": nodes}).to_string()),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{summary}");
    assert_eq!(summary, json!({"created": 3, "updated": 0, "unchanged": 0}));
    let (_, list) = call(&app, Method::GET, "/api/v1/nodes?rack=r1", None).await;
    assert_eq!(list.as_array().unwrap().len(), 1);
    let (status, node) = call(&app, Method::GET, "/api/v1/nodes/n2", None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(node["state"], "active");
    assert_eq!(node["components"], json!([]));
}

#[tokio::test]
async fn controller_degraded_shows_on_healthz_and_metrics() {
    let t = TestDb::sqlite(std::sync::Arc::new(orchestrator_types::SystemClock)).await;
    let health = std::sync::Arc::new(orchestrator_engine::ControllerHealth::new(
        std::time::Duration::from_secs(60),
    ));
    let nudge = orchestrator_engine::Nudge::for_health(health.clone());
    let app = authed_app(AppState::new(t.db.clone()).with_engine_nudge(nudge)).await;
    let (_, metrics) = call(&app, Method::GET, "/metrics", None).await;
    assert!(
        metrics.as_str().unwrap().contains("waveguard_controller_degraded 0"),
        "{metrics}"
    );

    health.report_fault("controller_resource", chrono::Utc::now());
    let (status, body) = call(&app, Method::GET, "/healthz", None).await;
    // Still 200 (a balancer must not restart it mid-storm), but it says so.
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        body,
        Value::String("degraded: controller_resource; new flashes paused, no node is charged\n".into())
    );
    let (_, metrics) = call(&app, Method::GET, "/metrics", None).await;
    let metrics = metrics.as_str().unwrap();
    assert!(metrics.contains("waveguard_controller_degraded 1"), "{metrics}");
    assert!(metrics.contains("waveguard_controller_faults 1"), "{metrics}");
}

#[tokio::test]
async fn health_metrics_and_openapi() {
    let t = TestDb::sqlite(std::sync::Arc::new(orchestrator_types::SystemClock)).await;
    let app = authed_app(AppState::new(t.db.clone())).await;
    let (status, body) = call(&app, Method::GET, "/healthz", None).await;
    assert_eq!((status, body), (StatusCode::OK, Value::String("ok\n".into())));
    call(&app, Method::GET, "/api/v1/releases", None).await;
    let (status, metrics) = call(&app, Method::GET, "/metrics", None).await;
    assert_eq!(status, StatusCode::OK);
    let metrics = metrics.as_str().unwrap();
    assert!(
        metrics.contains(r#"waveguard_http_requests_total{method="GET",route="/api/v1/releases",status="200"} 1"#),
        "{metrics}"
    );
    assert!(metrics.contains("waveguard_build_info"));
    let (status, doc) = call(&app, Method::GET, "/api/v1/openapi.json", None).await;
    assert_eq!(status, StatusCode::OK);
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
    for path in [
        "/api/v1/nodes",
        "/api/v1/releases/{id}/transition",
        "/api/v1/releases/{id}/qualification",
        "/api/v1/audit",
    ] {
        assert!(doc["paths"][path].is_object(), "{path} documented");
    }
    assert!(doc["components"]["schemas"]["NewRelease"].is_object());
}
