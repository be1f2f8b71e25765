//! Authentication and authorization in-process (`oneshot`): every route
//! against every role, sessions and their CSRF tokens, API tokens, login
//! rate limits, and secrets kept out of pages.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::{Method, Request, StatusCode, header};
use chrono::{TimeZone, Utc};
use http_body_util::BodyExt;
use orchestrator_db::Db;
use orchestrator_db::testing::TestDb;
use orchestrator_types::{ManualClock, Role};
use serde_json::Value;
use tower::ServiceExt;
use web::auth::{AuthConfig, hash_password, provision_api_token};
use web::{AppState, app};

const PASSWORD: &str = "correct horse battery staple";

struct Fixture {
    _t: TestDb,
    db: Db,
    clock: Arc<ManualClock>,
    app: Router,
    viewer: String,
    manager: String,
    admin: String,
}

async fn fixture() -> Fixture {
    let clock = Arc::new(ManualClock::new(Utc.with_ymd_and_hms(2026, 12, 2, 12, 0, 0).unwrap()));
    let t = TestDb::sqlite(clock.clone()).await;
    let db = t.db.clone();
    let hash = hash_password(PASSWORD).unwrap();
    for (name, role) in [
        ("vera", Role::Viewer),
        ("rita", Role::ReleaseManager),
        ("ada", Role::Admin),
    ] {
        db.add_user(name, name, role, Some(&hash), "test").await.unwrap();
    }
    let viewer = provision_api_token(&db, "vera", Role::Viewer, "t", "test")
        .await
        .unwrap();
    let manager = provision_api_token(&db, "rita", Role::ReleaseManager, "t", "test")
        .await
        .unwrap();
    let admin = provision_api_token(&db, "ada", Role::Admin, "t", "test").await.unwrap();
    let app = app(AppState::new(db.clone()).with_auth_config(AuthConfig {
        max_failures: 3,
        ..AuthConfig::default()
    }));
    Fixture {
        _t: t,
        db,
        clock,
        app,
        viewer,
        manager,
        admin,
    }
}

struct Reply {
    status: StatusCode,
    headers: axum::http::HeaderMap,
    body: String,
}

async fn send(app: &Router, request: Request<Body>) -> Reply {
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

fn request(method: &Method, uri: &str, token: Option<&str>) -> Request<Body> {
    let mut builder = Request::builder().method(method.clone()).uri(uri);
    if let Some(token) = token {
        builder = builder.header(header::AUTHORIZATION, format!("Bearer {token}"));
    }
    if *method == Method::GET || *method == Method::HEAD {
        builder.body(Body::empty()).unwrap()
    } else if uri.starts_with("/api/") {
        builder
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from("{}"))
            .unwrap()
    } else {
        builder
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body(Body::from("x=1"))
            .unwrap()
    }
}

/// Who may call what. `None` needs no user at all.
fn needed(method: &Method, path: &str) -> Option<Role> {
    if path.starts_with("/api/v1/users") || path.starts_with("/users") {
        Some(Role::Admin)
    } else if *method == Method::GET {
        Some(Role::Viewer)
    } else {
        Some(Role::ReleaseManager)
    }
}

/// Every UI route (the API's come from the OpenAPI document).
const UI_ROUTES: &[(&str, &str)] = &[
    ("GET", "/"),
    ("GET", "/releases"),
    ("GET", "/releases/1"),
    ("POST", "/releases/1/transition"),
    ("POST", "/releases/1/rollouts"),
    ("GET", "/rollouts"),
    ("GET", "/rollouts/1"),
    ("GET", "/rollouts/1/nodes"),
    ("GET", "/events"),
    ("GET", "/events/x/watch"),
    ("POST", "/rollouts/1/approve"),
    ("POST", "/rollouts/1/pause"),
    ("POST", "/rollouts/1/resume"),
    ("POST", "/rollouts/1/abort"),
    ("POST", "/rollouts/1/rollback"),
    ("GET", "/audit"),
    ("GET", "/policies"),
    ("GET", "/users"),
];

async fn api_routes(app: &Router) -> Vec<(Method, String)> {
    let reply = send(
        app,
        request(&Method::GET, "/api/v1/openapi.json", Some(&fixture_token(app).await)),
    )
    .await;
    let doc: Value = serde_json::from_str(&reply.body).unwrap();
    let mut routes = Vec::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        let concrete = path
            .split('/')
            .map(|seg| if seg.starts_with('{') { "1" } else { seg })
            .collect::<Vec<_>>()
            .join("/");
        for method in item.as_object().unwrap().keys() {
            routes.push((method.to_uppercase().parse().unwrap(), concrete.clone()));
        }
    }
    routes
}

// The OpenAPI document itself needs a viewer; the fixture's tokens are
// created per test, so the table test passes its own.
async fn fixture_token(_app: &Router) -> String {
    TOKEN_FOR_DOC.with(|t| t.borrow().clone())
}

thread_local! {
    static TOKEN_FOR_DOC: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
}

#[tokio::test(flavor = "current_thread")]
async fn every_route_checks_the_role() {
    let f = fixture().await;
    TOKEN_FOR_DOC.with(|t| *t.borrow_mut() = f.viewer.clone());
    let mut routes = api_routes(&f.app).await;
    assert!(routes.len() >= 15, "the OpenAPI document lists the API: {routes:?}");
    routes.extend(UI_ROUTES.iter().map(|(m, p)| (m.parse().unwrap(), (*p).to_owned())));
    let roles = [
        (Role::Viewer, f.viewer.as_str()),
        (Role::ReleaseManager, f.manager.as_str()),
        (Role::Admin, f.admin.as_str()),
    ];
    let mut checked = 0;
    for (method, path) in &routes {
        if path == "/api/v1/alerts/alertmanager" {
            // Alertmanager's own bearer token; covered by the alerts tests
            // and `the_alertmanager_webhook_needs_no_user` below.
            continue;
        }
        let need = needed(method, path);
        // Anonymous: refused before the handler runs.
        let reply = send(&f.app, request(method, path, None)).await;
        if path.starts_with("/api/") {
            assert_eq!(
                reply.status,
                StatusCode::UNAUTHORIZED,
                "anonymous {method} {path}: {}",
                reply.body
            );
        } else if *method == Method::GET {
            assert_eq!(reply.status, StatusCode::SEE_OTHER, "anonymous {method} {path}");
            let location = reply.headers[header::LOCATION].to_str().unwrap();
            assert!(location.starts_with("/login?next="), "{location}");
        } else {
            assert_eq!(reply.status, StatusCode::UNAUTHORIZED, "anonymous {method} {path}");
        }
        for (role, token) in roles {
            let allowed = need.is_none_or(|n| role >= n);
            if allowed && path.ends_with("/events") {
                // A live stream never ends; its admission is checked in the UI tests.
                continue;
            }
            let reply = send(&f.app, request(method, path, Some(token))).await;
            if allowed {
                assert!(
                    reply.status != StatusCode::UNAUTHORIZED && reply.status != StatusCode::FORBIDDEN,
                    "{role} {method} {path} should pass authorization, got {}: {}",
                    reply.status,
                    reply.body
                );
            } else {
                assert_eq!(
                    reply.status,
                    StatusCode::FORBIDDEN,
                    "{role} {method} {path}: {}",
                    reply.body
                );
            }
            checked += 1;
        }
    }
    assert!(checked > 60, "checked {checked} route/role pairs");
}

#[tokio::test(flavor = "current_thread")]
async fn the_alertmanager_webhook_needs_no_user() {
    let f = fixture().await;
    let reply = send(&f.app, request(&Method::POST, "/api/v1/alerts/alertmanager", None)).await;
    // No receiver configured: the webhook itself answers (503), not the auth layer.
    assert_ne!(reply.status, StatusCode::UNAUTHORIZED, "{}", reply.body);
    assert_ne!(reply.status, StatusCode::FORBIDDEN, "{}", reply.body);
    // Public routes.
    for path in ["/healthz", "/login", "/static/app.css", "/static/app.js"] {
        let reply = send(&f.app, request(&Method::GET, path, None)).await;
        assert_eq!(reply.status, StatusCode::OK, "{path}");
    }
}

#[tokio::test(flavor = "current_thread")]
async fn bad_revoked_and_disabled_tokens_authenticate_nobody() {
    let f = fixture().await;
    for bad in ["", "wg_nope", "Basic abc"] {
        let reply = send(&f.app, request(&Method::GET, "/api/v1/releases", Some(bad))).await;
        assert_eq!(reply.status, StatusCode::UNAUTHORIZED, "{bad:?}");
        assert_eq!(reply.headers[header::WWW_AUTHENTICATE], "Bearer");
        assert!(!reply.body.contains(bad) || bad.is_empty(), "the token is not echoed");
    }
    let ok = send(&f.app, request(&Method::GET, "/api/v1/releases", Some(&f.viewer))).await;
    assert_eq!(ok.status, StatusCode::OK);
    let tokens = f.db.api_tokens("vera").await.unwrap();
    assert!(tokens[0].last_used_at.is_some(), "use is recorded");
    f.db.revoke_api_token("vera", tokens[0].id, "test").await.unwrap();
    let reply = send(&f.app, request(&Method::GET, "/api/v1/releases", Some(&f.viewer))).await;
    assert_eq!(reply.status, StatusCode::UNAUTHORIZED);

    f.db.update_user("rita", None, None, Some(true), "test").await.unwrap();
    let reply = send(&f.app, request(&Method::GET, "/api/v1/releases", Some(&f.manager))).await;
    assert_eq!(
        reply.status,
        StatusCode::UNAUTHORIZED,
        "a disabled user's token is dead"
    );
    // Tokens are stored hashed.
    let audit = f.db.audit_entries(&Default::default()).await.unwrap();
    let text = serde_json::to_string(&audit).unwrap();
    assert!(
        !text.contains(&f.admin) && !text.contains(&f.manager),
        "no token in the audit log"
    );
}

/// A logged-in browser: its session cookie and CSRF token.
struct Browser {
    cookie: String,
    csrf: String,
}

async fn login_page(app: &Router) -> (String, String) {
    let reply = send(app, request(&Method::GET, "/login", None)).await;
    assert_eq!(reply.status, StatusCode::OK);
    let set = reply.headers[header::SET_COOKIE].to_str().unwrap().to_owned();
    assert!(set.contains("HttpOnly") && set.contains("SameSite=Lax"), "{set}");
    let cookie = set.split(';').next().unwrap().to_owned();
    let csrf = field_value(&reply.body, "csrf");
    (cookie, csrf)
}

fn field_value(html: &str, name: &str) -> String {
    let marker = format!("name=\"{name}\" value=\"");
    let start = html
        .find(&marker)
        .unwrap_or_else(|| panic!("no {name} field in {html}"))
        + marker.len();
    html[start..].split('"').next().unwrap().to_owned()
}

fn login_request(cookie: &str, csrf: &str, username: &str, password: &str, ip: [u8; 4]) -> Request<Body> {
    let body = format!(
        "csrf={csrf}&username={username}&password={}&next=%2Freleases",
        password.replace(' ', "+")
    );
    let mut request = Request::post("/login")
        .header(header::COOKIE, cookie)
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(Body::from(body))
        .unwrap();
    request
        .extensions_mut()
        .insert(ConnectInfo(SocketAddr::from((ip, 40000))));
    request
}

async fn login(app: &Router, username: &str) -> Browser {
    let (cookie, csrf) = login_page(app).await;
    let reply = send(app, login_request(&cookie, &csrf, username, PASSWORD, [10, 0, 0, 1])).await;
    assert_eq!(reply.status, StatusCode::SEE_OTHER, "{}", reply.body);
    assert_eq!(reply.headers[header::LOCATION], "/releases");
    let session = reply
        .headers
        .get_all(header::SET_COOKIE)
        .iter()
        .map(|v| v.to_str().unwrap().to_owned())
        .find(|v| v.starts_with("wg_session="))
        .unwrap();
    assert!(session.contains("HttpOnly") && session.contains("SameSite=Lax") && !session.contains("Secure"));
    let cookie = session.split(';').next().unwrap().to_owned();
    let page = send(
        app,
        Request::get("/")
            .header(header::COOKIE, &cookie)
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    let csrf = field_value(&page.body, "csrf");
    Browser { cookie, csrf }
}

fn form_post(browser: &Browser, uri: &str, body: &str) -> Request<Body> {
    Request::post(uri)
        .header(header::COOKIE, &browser.cookie)
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(Body::from(body.to_owned()))
        .unwrap()
}

#[tokio::test(flavor = "current_thread")]
async fn sessions_need_the_csrf_token_on_every_write() {
    let f = fixture().await;
    let browser = login(&f.app, "rita").await;
    let release = r#"{"component_kind":"gpu","version":"1.2.3","image_uri":"http://x/i.bin","sha256":"0000000000000000000000000000000000000000000000000000000000000000","size_bytes":1,"platforms":["hgx"]}"#;

    // Forms: the csrf field.
    let cases: [(&str, StatusCode); 3] = [
        ("to=qualifying", StatusCode::FORBIDDEN),
        ("to=qualifying&csrf=wrong", StatusCode::FORBIDDEN),
        ("to=qualifying&csrf={csrf}", StatusCode::NOT_FOUND),
    ];
    for (body, want) in cases {
        let body = body.replace("{csrf}", &browser.csrf);
        let reply = send(&f.app, form_post(&browser, "/releases/99/transition", &body)).await;
        assert_eq!(reply.status, want, "{body}: {}", reply.body);
    }
    // Scripts: the header, on the API as well.
    let json_post = |csrf: Option<&str>| {
        let mut b = Request::post("/api/v1/releases")
            .header(header::COOKIE, &browser.cookie)
            .header(header::CONTENT_TYPE, "application/json");
        if let Some(csrf) = csrf {
            b = b.header("x-csrf-token", csrf);
        }
        b.body(Body::from(release)).unwrap()
    };
    assert_eq!(send(&f.app, json_post(None)).await.status, StatusCode::FORBIDDEN);
    assert_eq!(
        send(&f.app, json_post(Some("nope"))).await.status,
        StatusCode::FORBIDDEN
    );
    let created = send(&f.app, json_post(Some(&browser.csrf))).await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.body);
    let audit = f.db.audit_entries(&Default::default()).await.unwrap();
    assert!(
        audit.iter().any(|e| e.action == "release.add" && e.actor == "rita"),
        "attributed to the user"
    );

    // Logout needs the token too, then the session is dead.
    let reply = send(&f.app, form_post(&browser, "/logout", "x=1")).await;
    assert_eq!(reply.status, StatusCode::FORBIDDEN);
    let reply = send(
        &f.app,
        form_post(&browser, "/logout", &format!("csrf={}", browser.csrf)),
    )
    .await;
    assert_eq!(reply.status, StatusCode::SEE_OTHER);
    let after = send(
        &f.app,
        Request::get("/api/v1/releases")
            .header(header::COOKIE, &browser.cookie)
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(after.status, StatusCode::UNAUTHORIZED);
}

#[tokio::test(flavor = "current_thread")]
async fn the_login_form_has_its_own_csrf_and_sessions_expire() {
    let f = fixture().await;
    let (cookie, csrf) = login_page(&f.app).await;
    // Without the cookie set with the form (a cross-site post), refused.
    let reply = send(
        &f.app,
        login_request("wg_login_csrf=forged", &csrf, "rita", PASSWORD, [10, 0, 0, 2]),
    )
    .await;
    assert_eq!(reply.status, StatusCode::FORBIDDEN);
    let reply = send(&f.app, login_request(&cookie, "", "rita", PASSWORD, [10, 0, 0, 2])).await;
    assert_eq!(reply.status, StatusCode::FORBIDDEN);
    // Off-site `next` is ignored.
    let reply = send(&f.app, {
        let body = format!(
            "csrf={csrf}&username=rita&password={}&next=%2F%2Fevil.example",
            PASSWORD.replace(' ', "+")
        );
        Request::post("/login")
            .header(header::COOKIE, &cookie)
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .body(Body::from(body))
            .unwrap()
    })
    .await;
    assert_eq!(reply.status, StatusCode::SEE_OTHER);
    assert_eq!(reply.headers[header::LOCATION], "/");

    let browser = login(&f.app, "vera").await;
    f.clock.advance(chrono::Duration::hours(13));
    let reply = send(
        &f.app,
        Request::get("/")
            .header(header::COOKIE, &browser.cookie)
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(reply.status, StatusCode::SEE_OTHER, "an expired session logs out");
}

/// Issue 24 #7: failures lock the guesser's (account, address) pair only;
/// the account only backs off (seconds, never a lock) and the address is
/// never locked for other accounts. Kept in the database, shown to admins.
#[tokio::test(flavor = "current_thread")]
async fn login_throttling_locks_the_guesser_not_the_account_or_the_address() {
    let f = fixture().await;
    let (cookie, csrf) = login_page(&f.app).await;
    let try_login = |user: &'static str, password: &'static str, ip: [u8; 4]| {
        let app = f.app.clone();
        let (cookie, csrf) = (cookie.clone(), csrf.clone());
        async move { send(&app, login_request(&cookie, &csrf, user, password, ip)).await }
    };
    // Three failures for rita from one address (the fixture allows 3 per pair).
    for _ in 0..3 {
        let reply = try_login("rita", "wrong", [10, 0, 0, 1]).await;
        assert_eq!(reply.status, StatusCode::UNAUTHORIZED);
        assert!(reply.body.contains("Wrong username or password"));
        assert!(!reply.body.contains("wrong\""), "the password is not echoed");
    }
    // That pair is locked, even with the right password...
    let reply = try_login("rita", PASSWORD, [10, 0, 0, 1]).await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(reply.headers.contains_key(header::RETRY_AFTER));
    // ...but rita herself is not locked out from elsewhere,
    let reply = try_login("rita", PASSWORD, [10, 0, 0, 9]).await;
    assert_eq!(reply.status, StatusCode::SEE_OTHER, "{}", reply.body);
    // nor is anyone else behind the guesser's address.
    let reply = try_login("vera", PASSWORD, [10, 0, 0, 1]).await;
    assert_eq!(reply.status, StatusCode::SEE_OTHER, "{}", reply.body);

    // Failures spread over addresses make the account back off (seconds),
    // which slows a distributed guesser without locking the owner out.
    for i in 0..4u8 {
        assert_eq!(
            try_login("ada", "x", [10, 1, 0, i]).await.status,
            StatusCode::UNAUTHORIZED
        );
    }
    let reply = try_login("ada", PASSWORD, [10, 1, 0, 99]).await;
    assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS, "backing off");
    f.clock.advance(chrono::Duration::seconds(2));
    let reply = try_login("ada", PASSWORD, [10, 1, 0, 99]).await;
    assert_eq!(reply.status, StatusCode::SEE_OTHER, "after the backoff: {}", reply.body);

    // Unknown users are throttled the same way (no enumeration by behaviour).
    for _ in 0..3 {
        assert_eq!(
            try_login("nobody", "x", [10, 0, 0, 3]).await.status,
            StatusCode::UNAUTHORIZED
        );
    }
    assert_eq!(
        try_login("nobody", "x", [10, 0, 0, 3]).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );

    // An admin sees who is throttled; others may not look.
    let reply = send(
        &f.app,
        request(&Method::GET, "/api/v1/users/login-throttles", Some(&f.admin)),
    )
    .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.body);
    let rows: Value = serde_json::from_str(&reply.body).unwrap();
    assert!(
        rows.as_array().unwrap().iter().any(|r| r["scope"] == "pair"
            && r["username"] == "rita"
            && r["address"] == "10.0.0.1"
            && !r["blocked_until"].is_null()),
        "{rows}"
    );
    let reply = send(
        &f.app,
        request(&Method::GET, "/api/v1/users/login-throttles", Some(&f.manager)),
    )
    .await;
    assert_eq!(reply.status, StatusCode::FORBIDDEN);

    // The window passes.
    f.clock.advance(chrono::Duration::minutes(16));
    let reply = try_login("rita", PASSWORD, [10, 0, 0, 1]).await;
    assert_eq!(reply.status, StatusCode::SEE_OTHER);
}

#[tokio::test(flavor = "current_thread")]
async fn secure_cookies_when_configured_or_behind_tls() {
    let f = fixture().await;
    let secure_app = app(AppState::new(f.db.clone()).with_auth_config(AuthConfig {
        secure_cookies: true,
        ..AuthConfig::default()
    }));
    let reply = send(&secure_app, request(&Method::GET, "/login", None)).await;
    assert!(reply.headers[header::SET_COOKIE].to_str().unwrap().contains("; Secure"));
    let reply = send(
        &f.app,
        Request::get("/login")
            .header("x-forwarded-proto", "https")
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert!(reply.headers[header::SET_COOKIE].to_str().unwrap().contains("; Secure"));
}
