//! Issue 24's defects reproduced in-process (`oneshot`), each shown closed:
//! BMC re-addressing (#1), query ranges (#5), body limits (#6), the open
//! redirect, headers and metric labels (#8), and the smaller items (#10).

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::{Method, Request, StatusCode, header};
use chrono::{TimeZone, Utc};
use http_body_util::BodyExt;
use orchestrator_db::testing::TestDb;
use orchestrator_db::{AuditFilter, Db};
use orchestrator_types::{ManualClock, Role};
use serde_json::{Value, json};
use tower::ServiceExt;
use web::auth::{hash_password, provision_api_token};
use web::{AlertReceiverConfig, AppState, app};

const ALERT_TOKEN: &str = "test-alertmanager-token-0123456789";
const PASSWORD: &str = "correct horse battery staple";

struct Fixture {
    _t: TestDb,
    db: Db,
    app: Router,
    manager: String,
    admin: String,
}

async fn fixture(profiles: Option<&[&str]>) -> Fixture {
    let clock = Arc::new(ManualClock::new(Utc.with_ymd_and_hms(2026, 12, 4, 12, 0, 0).unwrap()));
    let t = TestDb::sqlite(clock).await;
    let db = t.db.clone();
    let hash = hash_password(PASSWORD).unwrap();
    db.add_user("rita", "rita", Role::ReleaseManager, Some(&hash), "test")
        .await
        .unwrap();
    db.add_user("ada", "ada", Role::Admin, Some(&hash), "test")
        .await
        .unwrap();
    let manager = provision_api_token(&db, "rita", Role::ReleaseManager, "t", "test")
        .await
        .unwrap();
    let admin = provision_api_token(&db, "ada", Role::Admin, "t", "test").await.unwrap();
    let mut state = AppState::new(db.clone()).with_alert_receiver(AlertReceiverConfig::new(ALERT_TOKEN).unwrap());
    if let Some(profiles) = profiles {
        state = state.with_credential_profiles(profiles.iter().map(|p| (*p).to_owned()).collect());
    }
    Fixture {
        _t: t,
        db,
        app: app(state),
        manager,
        admin,
    }
}

struct Reply {
    status: StatusCode,
    headers: axum::http::HeaderMap,
    body: String,
}

impl Reply {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or(Value::Null)
    }
}

async fn send(app: &Router, mut request: Request<Body>) -> Reply {
    request
        .extensions_mut()
        .insert(ConnectInfo(SocketAddr::from(([10, 0, 0, 1], 40000))));
    let response = app.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    Reply {
        status,
        headers,
        body: String::from_utf8_lossy(&bytes).into_owned(),
    }
}

fn api(method: Method, uri: &str, token: &str, body: Option<Value>) -> Request<Body> {
    let builder = Request::builder()
        .method(method)
        .uri(uri)
        .header(header::AUTHORIZATION, format!("Bearer {token}"));
    match body {
        Some(body) => builder
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(body.to_string()))
            .unwrap(),
        None => builder.body(Body::empty()).unwrap(),
    }
}

fn node(name: &str, bmc_url: &str) -> Value {
    json!({"name": name, "bmc_url": bmc_url, "credential_ref": "lab", "platform_sku": "hgx-h100-8gpu",
           "region": "us-east-1", "cluster": "c1", "rack": "r1", "nvlink_domain": "nvl1"})
}

async fn import(f: &Fixture, token: &str, nodes: Vec<Value>) -> Reply {
    send(
        &f.app,
        api(Method::POST, "/api/v1/nodes", token, Some(json!({ "nodes": nodes }))),
    )
    .await
}

/// #1: a release manager can no longer point a node at another host; an
/// admin can, audited with both addresses, and the node then needs
/// discovery (no inventory, an error the planner treats as unhealthy).
#[tokio::test]
async fn only_an_admin_changes_a_bmc_address_and_the_node_needs_discovery_again() {
    let f = fixture(None).await;
    let reply = import(
        &f,
        &f.manager,
        vec![node("gpu-1", "https://10.20.0.1"), node("gpu-2", "https://10.20.0.2")],
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    let gpu1 = f.db.node_by_name("gpu-1").await.unwrap();
    f.db.record_inventory(
        gpu1.id,
        &[orchestrator_db::model::ComponentReading {
            inventory_id: "GPU_0".into(),
            kind: orchestrator_types::ComponentKind::Gpu,
            version: "96.00.61.00.01".parse().unwrap(),
            updateable: true,
            software_id: None,
            health: None,
        }],
    )
    .await
    .unwrap();

    let stolen = import(&f, &f.manager, vec![node("gpu-1", "https://attacker.example")]).await;
    assert_eq!(stolen.status, StatusCode::FORBIDDEN, "{}", stolen.body);
    assert!(stolen.body.contains("admin"), "{}", stolen.body);
    assert_eq!(f.db.node_by_name("gpu-1").await.unwrap().bmc_url, "https://10.20.0.1");

    // Another node's address is refused whoever asks: one node's rollout
    // would log in to the other's BMC.
    let taken = import(&f, &f.admin, vec![node("gpu-1", "https://10.20.0.2:443/")]).await;
    assert_eq!(taken.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", taken.body);
    assert!(taken.body.contains("gpu-2"), "{}", taken.body);
    let twice = import(
        &f,
        &f.admin,
        vec![node("gpu-3", "https://10.20.0.9"), node("gpu-4", "HTTPS://10.20.0.9")],
    )
    .await;
    assert_eq!(twice.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", twice.body);

    let moved = import(&f, &f.admin, vec![node("gpu-1", "https://10.20.0.7")]).await;
    assert_eq!(moved.status, StatusCode::OK, "{}", moved.body);
    let gpu1 = f.db.node_by_name("gpu-1").await.unwrap();
    assert_eq!(gpu1.bmc_url, "https://10.20.0.7");
    assert!(
        gpu1.last_discovery_error
            .as_deref()
            .is_some_and(|e| e.contains("discovery needed")),
        "{gpu1:?}"
    );
    assert!(
        f.db.node_components(gpu1.id).await.unwrap().is_empty(),
        "old inventory forgotten"
    );
    let audit =
        f.db.audit_entries(&AuditFilter {
            action: Some("node.bmc_address".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(audit.len(), 1);
    assert_eq!(audit[0].actor, "ada");
    assert_eq!(audit[0].details["old_bmc_url"], "https://10.20.0.1");
    assert_eq!(audit[0].details["new_bmc_url"], "https://10.20.0.7");
}

/// #10: unknown credential profiles and path-like node names are refused.
#[tokio::test]
async fn imports_refuse_unknown_profiles_and_path_like_names() {
    let f = fixture(Some(&["lab"])).await;
    let mut other = node("gpu-1", "https://10.20.0.1");
    other["credential_ref"] = json!("fleet-root");
    let reply = import(&f, &f.admin, vec![other]).await;
    assert_eq!(reply.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", reply.body);
    assert!(
        reply.body.contains("not a configured credential profile"),
        "{}",
        reply.body
    );
    for name in ["../../etc/passwd", ".hidden", "a/b", "a..b", "gpu%2F1"] {
        let reply = import(&f, &f.admin, vec![node(name, "https://10.20.0.1")]).await;
        assert_eq!(reply.status, StatusCode::UNPROCESSABLE_ENTITY, "{name}: {}", reply.body);
    }
    let reply = import(&f, &f.admin, vec![node("gpu-1.rack_2", "https://10.20.0.1")]).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
}

/// #5: out-of-range query parameters are a 400 naming the range, never a
/// panic in the database driver.
#[tokio::test]
async fn query_parameters_outside_their_range_are_400_with_the_range() {
    let f = fixture(None).await;
    for (uri, range) in [
        (
            "/api/v1/nodes?offset=9223372036854775808",
            "offset must be between 0 and 1000000000",
        ),
        (
            "/api/v1/nodes?offset=18446744073709551615",
            "offset must be between 0 and 1000000000",
        ),
        ("/api/v1/nodes?limit=0", "limit must be between 1 and 10000"),
        ("/api/v1/nodes?limit=10001", "limit must be between 1 and 10000"),
        ("/api/v1/audit?limit=0", "limit must be between 1 and 1000"),
        ("/api/v1/audit?before_id=-1", "before_id must be between 1 and"),
        ("/api/v1/alerts?limit=5000", "limit must be between 1 and 1000"),
    ] {
        let reply = send(&f.app, api(Method::GET, uri, &f.manager, None)).await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{uri}: {}", reply.body);
        assert!(reply.body.contains(range), "{uri}: {}", reply.body);
    }
    let reply = send(
        &f.app,
        api(
            Method::GET,
            "/api/v1/nodes?offset=1000000000&limit=10000",
            &f.manager,
            None,
        ),
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
}

/// #6: a 1,000-alert notification of over 2 MB (axum's old default limit)
/// is accepted; a body past the webhook's own limit is 413.
#[tokio::test]
async fn a_thousand_alert_notification_is_accepted() {
    let f = fixture(None).await;
    let description = "x".repeat(2000);
    let alerts: Vec<Value> = (0..1000)
        .map(|i| {
            json!({
                "status": "firing",
                "labels": {"alertname": "GpuXidStorm", "node": format!("gpu-{i}")},
                "annotations": {"summary": "XID errors", "description": description},
                "startsAt": "2026-12-04T11:59:00Z",
                "endsAt": "0001-01-01T00:00:00Z",
                "generatorURL": "http://prometheus.example/graph",
                "fingerprint": format!("{i:016x}"),
            })
        })
        .collect();
    let body = json!({
        "version": "4", "groupKey": "{}:{alertname=\"GpuXidStorm\"}", "truncatedAlerts": 0,
        "status": "firing", "receiver": "waveguard", "groupLabels": {"alertname": "GpuXidStorm"},
        "commonLabels": {}, "commonAnnotations": {}, "externalURL": "http://alertmanager.example",
        "alerts": alerts,
    })
    .to_string();
    assert!(body.len() > 2 * 1024 * 1024, "{} bytes", body.len());
    let request = |body: String| {
        Request::post("/api/v1/alerts/alertmanager")
            .header(header::AUTHORIZATION, format!("Bearer {ALERT_TOKEN}"))
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(body))
            .unwrap()
    };
    let reply = send(&f.app, request(body)).await;
    assert_eq!(
        reply.status,
        StatusCode::OK,
        "{}",
        &reply.body[..reply.body.len().min(500)]
    );
    let too_big = format!("{{\"pad\":\"{}\"}}", "y".repeat(17 * 1024 * 1024));
    let reply = send(&f.app, request(too_big)).await;
    assert_eq!(reply.status, StatusCode::PAYLOAD_TOO_LARGE);
    // Other JSON routes keep the 2 MiB default, as a 413 not a 400.
    let reply = send(
        &f.app,
        api(
            Method::POST,
            "/api/v1/releases",
            &f.manager,
            Some(json!({"pad": "z".repeat(3 * 1024 * 1024)})),
        ),
    )
    .await;
    assert_eq!(reply.status, StatusCode::PAYLOAD_TOO_LARGE, "{}", reply.body);
    assert_eq!(reply.json()["error"]["code"], "payload_too_large");
}

/// #8: `next` may only be a same-origin path; `%0A` no longer makes a 500.
#[tokio::test]
async fn login_redirects_only_to_same_origin_paths() {
    let f = fixture(None).await;
    for (next, expected) in [
        ("/%09/evil.example/x", "/"),
        ("/%0A/evil.example", "/"),
        ("//evil.example", "/"),
        ("/%5Cevil.example", "/"),
        ("https://evil.example", "/"),
        ("/%2509/evil.example", "/"),
        ("/rollouts/3?wave=canary", "/rollouts/3?wave=canary"),
    ] {
        let page = send(
            &f.app,
            Request::get(format!("/login?next={next}")).body(Body::empty()).unwrap(),
        )
        .await;
        assert_eq!(page.status, StatusCode::OK, "{next}");
        let cookie = page.headers[header::SET_COOKIE]
            .to_str()
            .unwrap()
            .split(';')
            .next()
            .unwrap()
            .to_owned();
        let csrf = field(&page.body, "csrf");
        let shown = field(&page.body, "next")
            .replace("&#x2f;", "/")
            .replace("&#x3d;", "=")
            .replace("&amp;", "&");
        assert_eq!(shown, expected, "{next}");
        // The form posts `next` back; a forged form gets the same answer.
        let body = format!(
            "csrf={csrf}&username=ada&password={}&next={next}",
            PASSWORD.replace(' ', "+")
        );
        let reply = send(
            &f.app,
            Request::post("/login")
                .header(header::COOKIE, cookie)
                .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
                .body(Body::from(body))
                .unwrap(),
        )
        .await;
        assert_eq!(reply.status, StatusCode::SEE_OTHER, "{next}: {}", reply.body);
        assert_eq!(reply.headers[header::LOCATION], expected, "{next}");
    }
}

fn field(html: &str, name: &str) -> String {
    let marker = format!("name=\"{name}\" value=\"");
    let start = html.find(&marker).unwrap_or_else(|| panic!("no {name} field")) + marker.len();
    html[start..].split('"').next().unwrap().to_owned()
}

/// #8: every response carries the security headers, errors and redirects too.
#[tokio::test]
async fn every_response_has_the_security_headers() {
    let f = fixture(None).await;
    for request in [
        Request::get("/healthz").body(Body::empty()).unwrap(),
        Request::get("/login").body(Body::empty()).unwrap(),
        Request::get("/").body(Body::empty()).unwrap(),
        Request::get("/api/v1/nodes").body(Body::empty()).unwrap(),
        Request::get("/no/such/route").body(Body::empty()).unwrap(),
        api(Method::GET, "/api/v1/nodes", &f.manager, None),
    ] {
        let uri = request.uri().to_string();
        let reply = send(&f.app, request).await;
        let h = |name: &str| {
            reply
                .headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned()
        };
        assert!(h("content-security-policy").contains("frame-ancestors 'none'"), "{uri}");
        assert_eq!(h("x-content-type-options"), "nosniff", "{uri}");
        assert_eq!(h("x-frame-options"), "DENY", "{uri}");
        assert_eq!(h("referrer-policy"), "no-referrer", "{uri}");
        assert_eq!(h("cache-control"), "no-store", "{uri}");
    }
}

/// #8: made-up methods share one `other` label, so /metrics stays bounded.
#[tokio::test]
async fn metrics_method_labels_are_a_closed_set() {
    let f = fixture(None).await;
    for i in 0..20 {
        let method = Method::from_bytes(format!("X{i}").as_bytes()).unwrap();
        send(
            &f.app,
            Request::builder()
                .method(method)
                .uri("/healthz")
                .body(Body::empty())
                .unwrap(),
        )
        .await;
    }
    let metrics = send(&f.app, Request::get("/metrics").body(Body::empty()).unwrap())
        .await
        .body;
    assert!(!metrics.contains("method=\"X1"), "{metrics}");
    assert!(metrics.contains("method=\"other\""), "{metrics}");
}

/// #10: the bearer scheme is case-insensitive on the API as on the webhook.
#[tokio::test]
async fn lowercase_bearer_works_on_the_api() {
    let f = fixture(None).await;
    for scheme in ["bearer", "BEARER", "Bearer"] {
        let request = Request::get("/api/v1/nodes")
            .header(header::AUTHORIZATION, format!("{scheme} {}", f.manager))
            .body(Body::empty())
            .unwrap();
        assert_eq!(send(&f.app, request).await.status, StatusCode::OK, "{scheme}");
    }
}

/// #10: expired sessions are deleted by the sweeper `serve` starts.
#[tokio::test]
async fn the_session_sweeper_deletes_expired_sessions() {
    let clock = Arc::new(ManualClock::new(Utc.with_ymd_and_hms(2026, 12, 4, 12, 0, 0).unwrap()));
    let t = TestDb::sqlite(clock.clone()).await;
    let user = t.db.add_user("ada", "ada", Role::Admin, None, "test").await.unwrap();
    t.db.create_session(user.id, "hash-1", "csrf", chrono::Duration::minutes(5))
        .await
        .unwrap();
    clock.advance(chrono::Duration::minutes(6));
    let sweeper = web::auth::spawn_session_sweeper(t.db.clone(), std::time::Duration::from_millis(20));
    // The token hash is unique: storing it again succeeds only once the
    // sweeper has deleted the expired row.
    let mut gone = false;
    for _ in 0..100 {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        if t.db
            .create_session(user.id, "hash-1", "csrf", chrono::Duration::minutes(5))
            .await
            .is_ok()
        {
            gone = true;
            break;
        }
    }
    sweeper.abort();
    assert!(gone, "expired session still stored");
}

/// #9: under `serve`'s strict duties the registrant cannot qualify their own
/// release, only configured qualifiers can, and inline policies are refused.
#[tokio::test]
async fn separation_of_duties_is_enforced_by_config() {
    let clock = Arc::new(ManualClock::new(Utc.with_ymd_and_hms(2026, 12, 4, 12, 0, 0).unwrap()));
    let t = TestDb::sqlite(clock).await;
    let db = t.db.clone();
    let mut tokens = std::collections::HashMap::new();
    for name in ["rita", "rob", "quinn"] {
        db.add_user(name, name, Role::ReleaseManager, None, "test")
            .await
            .unwrap();
        tokens.insert(
            name,
            provision_api_token(&db, name, Role::ReleaseManager, "t", "test")
                .await
                .unwrap(),
        );
    }
    let mut duties = web::Duties::strict();
    duties.qualifiers = Some(["rita".to_owned(), "quinn".to_owned()].into());
    let app = app(AppState::new(db.clone()).with_duties(duties));
    let release = json!({
        "component_kind": "gpu", "version": "96.00.61.00.01", "image_uri": "https://images.example/gpu.fw",
        "sha256": "0123456789abcdef".repeat(4), "size_bytes": 1024, "platforms": ["hgx-h100-8gpu"],
        "release_notes": "notes"
    });
    let reply = send(
        &app,
        api(Method::POST, "/api/v1/releases", &tokens["rita"], Some(release)),
    )
    .await;
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.body);
    let id = reply.json()["id"].as_i64().unwrap();
    let transition = |who: &str, to: &str| {
        api(
            Method::POST,
            &format!("/api/v1/releases/{id}/transition"),
            &tokens[who],
            Some(json!({ "to": to })),
        )
    };
    assert_eq!(
        send(&app, transition("rita", "qualifying")).await.status,
        StatusCode::OK
    );
    let own = send(&app, transition("rita", "qualified")).await;
    assert_eq!(own.status, StatusCode::FORBIDDEN, "{}", own.body);
    assert!(own.body.contains("second person"), "{}", own.body);
    let not_listed = send(&app, transition("rob", "qualified")).await;
    assert_eq!(not_listed.status, StatusCode::FORBIDDEN, "{}", not_listed.body);
    let reply = send(&app, transition("quinn", "qualified")).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);

    let inline = send(
        &app,
        api(
            Method::POST,
            "/api/v1/rollouts",
            &tokens["rob"],
            Some(json!({ "release_id": id, "policy_yaml": "name: x\n" })),
        ),
    )
    .await;
    assert_eq!(inline.status, StatusCode::FORBIDDEN, "{}", inline.body);
    assert!(inline.body.contains("inline policies are disabled"), "{}", inline.body);
}
