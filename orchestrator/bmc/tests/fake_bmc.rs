//! Edge cases against a small in-process Redfish fake (axum on a loopback port): session handling,
//! busy and slow BMCs, malformed answers, task polling, events, discovery concurrency.
//!
//! The fake is deliberately dumb and scripted; the realistic flows run against `bmc-sim` in
//! `tests/sim.rs`.

use std::collections::{HashMap, HashSet, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{ConnectInfo, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use orchestrator_bmc::{
    ApplyTime, AuthMode, Bmc, BmcEndpoint, BmcError, Credentials, EventCursor, HttpClients, RedfishBmc, ResetKind,
    ResetTarget, RetryPolicy, SensorKind, TaskHandle, TaskState, Timeouts, UpdateMethod, UpdateRequest,
};
use serde_json::{Value, json};

const PASSWORD: &str = "s3cr3t-Pa55";

/// A scripted answer for one path: status, extra headers, body; consumed front to back, the last
/// one repeats.
#[derive(Clone)]
struct Scripted {
    status: u16,
    headers: Vec<(&'static str, String)>,
    body: String,
    delay: Duration,
}

fn answer(status: u16, body: impl Into<String>) -> Scripted {
    Scripted {
        status,
        headers: vec![],
        body: body.into(),
        delay: Duration::ZERO,
    }
}

#[derive(Default)]
struct FakeState {
    tokens: HashSet<String>,
    logins: usize,
    /// Tokens stop working after this many authenticated requests (simulated session expiry).
    expire_after: Option<usize>,
    /// The first this many sessions issued are dropped before their first use (answered 401), as a
    /// BMC timing sessions out faster than a round trip, rebooting or evicting sessions does.
    drop_fresh_sessions: usize,
    authed_requests: usize,
    scripts: HashMap<String, VecDeque<Scripted>>,
    requests: Vec<(Method, String, HeaderMap, Bytes)>,
    /// Every request's path with its query string, in order.
    targets: Vec<String>,
    /// Client ports seen, one per TCP connection.
    connections: HashSet<SocketAddr>,
    /// A service without a SessionService: session login answers 404.
    no_sessions: bool,
}

#[derive(Clone, Default)]
struct Fake {
    state: Arc<Mutex<FakeState>>,
    in_flight: Arc<AtomicUsize>,
    max_in_flight: Arc<AtomicUsize>,
}

impl Fake {
    fn script(&self, path: &str, answers: Vec<Scripted>) {
        self.state
            .lock()
            .unwrap()
            .scripts
            .insert(path.to_string(), answers.into());
    }

    fn count(&self, method: &Method, path: &str) -> usize {
        let s = self.state.lock().unwrap();
        s.requests
            .iter()
            .filter(|(m, p, _, _)| m == method && p == path)
            .count()
    }

    fn logins(&self) -> usize {
        self.state.lock().unwrap().logins
    }

    fn last_request(&self, method: &Method, path: &str) -> Option<(HeaderMap, Bytes)> {
        let s = self.state.lock().unwrap();
        s.requests
            .iter()
            .rev()
            .find(|(m, p, _, _)| m == method && p == path)
            .map(|(_, _, h, b)| (h.clone(), b.clone()))
    }
}

async fn handle(
    State(fake): State<Fake>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    fake.state.lock().unwrap().connections.insert(peer);
    let now = fake.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    fake.max_in_flight.fetch_max(now, Ordering::SeqCst);
    let response = respond(&fake, method, uri, headers, body).await;
    fake.in_flight.fetch_sub(1, Ordering::SeqCst);
    response
}

async fn respond(fake: &Fake, method: Method, uri: Uri, headers: HeaderMap, body: Bytes) -> Response {
    let path = uri.path().to_string();
    let scripted = {
        let mut s = fake.state.lock().unwrap();
        s.requests
            .push((method.clone(), path.clone(), headers.clone(), body.clone()));
        s.targets.push(
            uri.path_and_query()
                .map_or_else(|| path.clone(), |pq| pq.as_str().to_string()),
        );
        match s.scripts.get_mut(&path) {
            Some(q) if q.len() > 1 => q.pop_front(),
            Some(q) => q.front().cloned(),
            None => None,
        }
    };
    if let Some(sc) = &scripted
        && sc.delay > Duration::ZERO
    {
        tokio::time::sleep(sc.delay).await;
    }

    if path == "/redfish/v1/SessionService/Sessions" && method == Method::POST && fake.state.lock().unwrap().no_sessions
    {
        return (StatusCode::NOT_FOUND, "{}").into_response();
    }
    if path == "/redfish/v1/SessionService/Sessions" && method == Method::POST {
        let req: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        let mut s = fake.state.lock().unwrap();
        s.logins += 1;
        if req["UserName"] == "root" && req["Password"] == PASSWORD {
            let token = format!("tok-{}", s.logins);
            s.tokens.insert(token.clone());
            s.authed_requests = 0;
            return (
                StatusCode::CREATED,
                [
                    ("X-Auth-Token", token.clone()),
                    ("Location", format!("/redfish/v1/SessionService/Sessions/{}", s.logins)),
                ],
                json!({"Id": s.logins.to_string(), "UserName": "root", "Password": null}).to_string(),
            )
                .into_response();
        }
        // Echo the attempted password, as a buggy BMC might: it must never reach our errors.
        return (
            StatusCode::UNAUTHORIZED,
            json!({"error": {"message": format!("bad password {}", PASSWORD)}}).to_string(),
        )
            .into_response();
    }

    // `/images/` plays the release image server: a different service, reached without BMC credentials.
    if path != "/redfish/v1" && path != "/redfish/v1/" && !path.starts_with("/images/") {
        let mut s = fake.state.lock().unwrap();
        let token_ok = headers
            .get("x-auth-token")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|t| s.tokens.contains(t));
        let basic_ok =
            headers.get("authorization").and_then(|v| v.to_str().ok()) == Some("Basic cm9vdDpzM2NyM3QtUGE1NQ=="); // root:s3cr3t-Pa55
        if !(token_ok || basic_ok) {
            return (StatusCode::UNAUTHORIZED, "{}").into_response();
        }
        if token_ok && s.drop_fresh_sessions > 0 {
            s.drop_fresh_sessions -= 1;
            s.tokens.clear();
            return (StatusCode::UNAUTHORIZED, "{}").into_response();
        }
        s.authed_requests += 1;
        if let Some(limit) = s.expire_after
            && s.authed_requests > limit
            && token_ok
        {
            s.tokens.clear();
            return (StatusCode::UNAUTHORIZED, "{}").into_response();
        }
    }

    if let Some(sc) = scripted {
        let mut resp = (StatusCode::from_u16(sc.status).unwrap(), sc.body).into_response();
        for (name, value) in sc.headers {
            resp.headers_mut().insert(name, value.parse().unwrap());
        }
        return resp;
    }
    (
        StatusCode::NOT_FOUND,
        json!({"error": {"code": "Base.1.0.ResourceMissingAtURI"}}).to_string(),
    )
        .into_response()
}

async fn start(fake: &Fake) -> SocketAddr {
    let app = Router::new().fallback(handle).with_state(fake.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>())
            .await
            .unwrap();
    });
    addr
}

fn quick_retry() -> RetryPolicy {
    RetryPolicy {
        max_retries: 3,
        base_delay: Duration::from_millis(20),
        max_delay: Duration::from_millis(100),
        max_retry_after: Duration::from_secs(2),
        deadline: Duration::from_secs(10),
    }
}

fn endpoint(addr: SocketAddr) -> BmcEndpoint {
    BmcEndpoint::new(
        format!("http://{addr}").parse().unwrap(),
        Credentials::new("root", PASSWORD),
    )
    .with_retry(quick_retry())
    .with_timeouts(Timeouts {
        connect: Duration::from_millis(500),
        request: Duration::from_millis(500),
        upload: Duration::from_millis(500),
        probe: Duration::from_millis(500),
    })
}

fn bmc(addr: SocketAddr) -> RedfishBmc {
    RedfishBmc::new(&endpoint(addr), &HttpClients::new()).unwrap()
}

fn inventory_fixture(fake: &Fake) {
    fake.script(
        "/redfish/v1/UpdateService/FirmwareInventory",
        vec![answer(
            200,
            json!({"Members": [
                {"@odata.id": "/redfish/v1/UpdateService/FirmwareInventory/BMC_Firmware"},
                {"@odata.id": "/redfish/v1/UpdateService/FirmwareInventory/HGX_FW_GPU_0"}
            ]})
            .to_string(),
        )],
    );
    fake.script(
        "/redfish/v1/UpdateService/FirmwareInventory/BMC_Firmware",
        vec![answer(
            200,
            json!({"@odata.id": "/redfish/v1/UpdateService/FirmwareInventory/BMC_Firmware", "Id": "BMC_Firmware",
                   "Version": "24.04.1", "Updateable": true, "SoftwareId": "bmc",
                   "Status": {"State": "Enabled", "Health": "OK"}})
            .to_string(),
        )],
    );
    fake.script(
        "/redfish/v1/UpdateService/FirmwareInventory/HGX_FW_GPU_0",
        vec![answer(
            200,
            json!({"@odata.id": "/redfish/v1/UpdateService/FirmwareInventory/HGX_FW_GPU_0", "Id": "HGX_FW_GPU_0",
                   "Version": "96.00.5E.00.01", "SoftwareId": "gpu"})
            .to_string(),
        )],
    );
}

/// Layouts whose inventory ids say nothing: HPE iLO numbers its entries and names them; OpenBMC uses
/// version hashes and links each entry to what it runs on.
#[tokio::test]
async fn ids_that_say_nothing_are_classified_by_name_and_related_item() {
    let fake = Fake::default();
    let entries = [
        json!({"@odata.id": "/redfish/v1/UpdateService/FirmwareInventory/1", "Id": "1", "Name": "iLO 5",
               "Version": "2.72 Sep 04 2022", "Updateable": true}),
        json!({"@odata.id": "/redfish/v1/UpdateService/FirmwareInventory/2", "Id": "2", "Name": "System ROM",
               "Version": "U46 v2.72 (09/04/2022)", "Updateable": true}),
        json!({"@odata.id": "/redfish/v1/UpdateService/FirmwareInventory/a3c4f2d1", "Id": "a3c4f2d1",
               "Name": "Software Inventory", "Version": "2.14.0-dev", "Updateable": true,
               "RelatedItem": [{"@odata.id": "/redfish/v1/Managers/bmc"}]}),
        json!({"@odata.id": "/redfish/v1/UpdateService/FirmwareInventory/77aa01", "Id": "77aa01",
               "Name": "Software Inventory", "Version": "1.0.3", "Updateable": true,
               "RelatedItem": [{"@odata.id": "/redfish/v1/Chassis/HGX_ERoT_GPU_SXM_1"}]}),
    ];
    let members: Vec<_> = entries.iter().map(|e| json!({"@odata.id": e["@odata.id"]})).collect();
    fake.script(
        "/redfish/v1/UpdateService/FirmwareInventory",
        vec![answer(200, json!({ "Members": members }).to_string())],
    );
    for e in &entries {
        fake.script(
            e["@odata.id"].as_str().unwrap_or_default(),
            vec![answer(200, e.to_string())],
        );
    }
    let addr = start(&fake).await;
    let inv = bmc(addr).firmware_inventory().await.unwrap();
    let kinds: Vec<_> = inv.iter().map(|c| (c.id.as_str(), c.kind())).collect();
    use orchestrator_types::ComponentKind::*;
    assert_eq!(
        kinds,
        vec![("1", Bmc), ("2", Bios), ("a3c4f2d1", Bmc), ("77aa01", Other)],
        "{inv:#?}"
    );
    assert_eq!(inv[2].related_items, vec!["/redfish/v1/Managers/bmc".to_owned()]);
}

#[tokio::test]
async fn inventory_over_a_session_with_linked_members() {
    let fake = Fake::default();
    inventory_fixture(&fake);
    let addr = start(&fake).await;
    let bmc = bmc(addr);

    let inv = bmc.firmware_inventory().await.unwrap();
    assert_eq!(inv.len(), 2);
    assert_eq!(inv[0].id, "BMC_Firmware");
    assert_eq!(inv[0].version.as_deref(), Some("24.04.1"));
    assert!(inv[0].updateable);
    assert_eq!(inv[0].health.as_deref(), Some("OK"));
    assert_eq!(inv[1].uri, "/redfish/v1/UpdateService/FirmwareInventory/HGX_FW_GPU_0");
    assert!(!inv[1].updateable, "absent Updateable must read as false");
    assert!(inv[1].parsed_version().is_some());
    assert_eq!(fake.logins(), 1, "one session for all requests");

    // A second read reuses the session.
    bmc.firmware_inventory().await.unwrap();
    assert_eq!(fake.logins(), 1);

    let debug = format!("{bmc:?}");
    assert!(
        !debug.contains(PASSWORD) && !debug.contains("tok-1"),
        "secrets in Debug: {debug}"
    );

    // Members are fetched a few at a time, so the first read may open a few connections; later reads
    // must reuse them rather than open new ones.
    let opened = fake.state.lock().unwrap().connections.len();
    assert!((1..=4).contains(&opened), "{opened} connections");
    for _ in 0..5 {
        bmc.firmware_inventory().await.unwrap();
    }
    assert_eq!(
        fake.state.lock().unwrap().connections.len(),
        opened,
        "connections must be reused"
    );

    bmc.logout().await.unwrap();
    assert_eq!(fake.count(&Method::DELETE, "/redfish/v1/SessionService/Sessions/1"), 1);
}

#[tokio::test]
async fn expired_session_triggers_one_relogin() {
    let fake = Fake::default();
    inventory_fixture(&fake);
    fake.state.lock().unwrap().expire_after = Some(2);
    let addr = start(&fake).await;
    let bmc = bmc(addr);

    let inv = bmc.firmware_inventory().await.unwrap();
    assert_eq!(inv.len(), 2);
    assert_eq!(
        fake.logins(),
        2,
        "session expired after two requests; exactly one re-login"
    );
}

/// A 401 on a session the BMC has just issued is the session's loss, not a wrong password (the login
/// accepted it): the driver logs in again, more than once, and the read succeeds. Before, the second
/// 401 was `AuthFailed`, which fails a step outright.
#[tokio::test]
async fn sessions_dropped_right_after_login_are_renewed() {
    let fake = Fake::default();
    inventory_fixture(&fake);
    fake.state.lock().unwrap().drop_fresh_sessions = 2;
    let addr = start(&fake).await;
    let bmc = bmc(addr);

    let inv = bmc.firmware_inventory().await.unwrap();
    assert_eq!(inv.len(), 2);
    assert_eq!(fake.logins(), 3, "two sessions dropped, the third kept");
}

/// A BMC that drops every session it issues: a bounded number of fresh logins for the request, then
/// `SessionLost`, transient (the step's own backoff tries later), never `AuthFailed`.
#[tokio::test]
async fn a_bmc_dropping_every_session_gives_a_transient_session_lost_after_bounded_logins() {
    let fake = Fake::default();
    inventory_fixture(&fake);
    fake.state.lock().unwrap().drop_fresh_sessions = usize::MAX;
    let addr = start(&fake).await;
    let bmc = bmc(addr);

    let err = bmc.firmware_inventory().await.unwrap_err();
    assert!(matches!(err, BmcError::SessionLost { logins: 3, .. }), "{err:?}");
    assert!(err.is_transient());
    assert_eq!(err.kind(), "session_lost");
    assert!(!format!("{err} {err:?}").contains(PASSWORD));
    assert_eq!(fake.logins(), 4, "the first login and three renewals, no more");
}

#[tokio::test]
async fn wrong_password_is_auth_failed_without_leaking_it() {
    let fake = Fake::default();
    inventory_fixture(&fake);
    let addr = start(&fake).await;
    let ep = BmcEndpoint::new(
        format!("http://{addr}").parse().unwrap(),
        Credentials::new("root", "wrong-pw-123"),
    )
    .with_retry(quick_retry());
    let bmc = RedfishBmc::new(&ep, &HttpClients::new()).unwrap();

    let err = bmc.firmware_inventory().await.unwrap_err();
    assert!(matches!(err, BmcError::AuthFailed { status: 401, .. }), "{err:?}");
    assert!(!err.is_transient());
    let text = format!("{err} {err:?}");
    assert!(!text.contains("wrong-pw-123") && !text.contains(PASSWORD), "{text}");
    assert_eq!(
        fake.logins(),
        1,
        "a rejected login is not retried (it could lock the account)"
    );
}

#[tokio::test]
async fn basic_auth_sends_the_header_and_no_session() {
    let fake = Fake::default();
    inventory_fixture(&fake);
    let addr = start(&fake).await;
    let bmc = RedfishBmc::new(&endpoint(addr).with_auth(AuthMode::Basic), &HttpClients::new()).unwrap();
    assert_eq!(bmc.firmware_inventory().await.unwrap().len(), 2);
    assert_eq!(fake.logins(), 0);
}

#[tokio::test]
async fn busy_bmc_is_retried_honouring_retry_after() {
    let fake = Fake::default();
    inventory_fixture(&fake);
    let busy = Scripted {
        headers: vec![("Retry-After", "1".to_string())],
        ..answer(503, "{}")
    };
    fake.script(
        "/redfish/v1/UpdateService/FirmwareInventory",
        vec![
            busy.clone(),
            answer(
                200,
                json!({"Members": [{"@odata.id": "/redfish/v1/UpdateService/FirmwareInventory/BMC_Firmware"}]})
                    .to_string(),
            ),
        ],
    );
    let addr = start(&fake).await;
    let bmc = bmc(addr);
    let started = Instant::now();
    let inv = bmc.firmware_inventory().await.unwrap();
    assert_eq!(inv.len(), 1);
    assert!(
        started.elapsed() >= Duration::from_millis(950),
        "Retry-After: 1 must be honoured, waited only {:?}",
        started.elapsed()
    );
    assert_eq!(
        fake.count(&Method::GET, "/redfish/v1/UpdateService/FirmwareInventory"),
        2
    );
}

#[tokio::test]
async fn always_busy_bmc_gives_unavailable_after_the_retry_budget() {
    let fake = Fake::default();
    fake.script(
        "/redfish/v1/UpdateService/FirmwareInventory",
        vec![Scripted {
            headers: vec![("Retry-After", "0".to_string())],
            ..answer(503, "busy")
        }],
    );
    let addr = start(&fake).await;
    let err = bmc(addr).firmware_inventory().await.unwrap_err();
    match &err {
        BmcError::Unavailable {
            status,
            attempts,
            retry_after,
            ..
        } => {
            assert_eq!(*status, 503);
            assert_eq!(*attempts, 4, "1 attempt + 3 retries");
            assert_eq!(*retry_after, Some(Duration::ZERO));
        }
        other => panic!("expected Unavailable, got {other:?}"),
    }
    assert!(err.is_transient());
    assert_eq!(
        fake.count(&Method::GET, "/redfish/v1/UpdateService/FirmwareInventory"),
        4
    );
}

#[tokio::test]
async fn retry_after_beyond_the_deadline_stops_at_once() {
    let fake = Fake::default();
    fake.script(
        "/redfish/v1/UpdateService/FirmwareInventory",
        vec![Scripted {
            headers: vec![("Retry-After", "3600".to_string())],
            ..answer(503, "busy")
        }],
    );
    let addr = start(&fake).await;
    let ep = endpoint(addr).with_retry(RetryPolicy {
        max_retry_after: Duration::from_secs(3600),
        deadline: Duration::from_secs(5),
        ..quick_retry()
    });
    let started = Instant::now();
    let err = RedfishBmc::new(&ep, &HttpClients::new())
        .unwrap()
        .firmware_inventory()
        .await
        .unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "must not sleep past the deadline"
    );
    assert!(
        matches!(err, BmcError::Unavailable { retry_after: Some(d), .. } if d == Duration::from_secs(3600)),
        "{err:?}"
    );
}

#[tokio::test]
async fn slow_get_times_out_after_retries() {
    let fake = Fake::default();
    fake.script(
        "/redfish/v1/UpdateService/FirmwareInventory",
        vec![Scripted {
            delay: Duration::from_secs(3),
            ..answer(200, "{}")
        }],
    );
    let addr = start(&fake).await;
    let started = Instant::now();
    let err = bmc(addr).firmware_inventory().await.unwrap_err();
    assert!(matches!(err, BmcError::Timeout { attempts: 4, .. }), "{err:?}");
    assert!(err.is_transient());
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "per-request timeout must apply"
    );
}

#[tokio::test]
async fn slow_update_push_is_outcome_unknown_and_never_resent() {
    let fake = Fake::default();
    fake.script(
        "/redfish/v1/UpdateService",
        vec![answer(
            200,
            json!({"MultipartHttpPushUri": "/redfish/v1/UpdateService/upload"}).to_string(),
        )],
    );
    fake.script(
        "/redfish/v1/UpdateService/Actions/UpdateService.SimpleUpdate",
        vec![Scripted {
            delay: Duration::from_secs(3),
            ..answer(202, "{}")
        }],
    );
    let addr = start(&fake).await;
    let req = UpdateRequest {
        method: UpdateMethod::SimpleUpdate {
            image_uri: "http://images/gpu.fw".into(),
            transfer_protocol: None,
        },
        targets: vec!["/redfish/v1/UpdateService/FirmwareInventory/HGX_FW_GPU_0".into()],
        apply_time: Some(ApplyTime::OnReset),
        force_update: None,
    };
    let err = bmc(addr).start_update(&req).await.unwrap_err();
    assert!(matches!(err, BmcError::OutcomeUnknown { .. }), "{err:?}");
    assert!(!err.is_transient(), "an ambiguous push must not be blindly retried");
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        fake.count(
            &Method::POST,
            "/redfish/v1/UpdateService/Actions/UpdateService.SimpleUpdate"
        ),
        1
    );
}

#[tokio::test]
async fn busy_update_push_is_resent_because_503_means_not_processed() {
    let fake = Fake::default();
    fake.script("/redfish/v1/UpdateService", vec![answer(200, "{}")]);
    fake.script(
        "/redfish/v1/UpdateService/Actions/UpdateService.SimpleUpdate",
        vec![
            answer(503, ""),
            Scripted {
                headers: vec![("Location", "/redfish/v1/TaskService/Tasks/7".into())],
                ..answer(202, "")
            },
        ],
    );
    let addr = start(&fake).await;
    let req = UpdateRequest {
        method: UpdateMethod::SimpleUpdate {
            image_uri: "http://images/gpu.fw".into(),
            transfer_protocol: Some("HTTP".into()),
        },
        targets: vec!["/redfish/v1/UpdateService/FirmwareInventory/HGX_FW_GPU_0".into()],
        apply_time: Some(ApplyTime::OnReset),
        force_update: Some(false),
    };
    let handle = bmc(addr).start_update(&req).await.unwrap();
    assert_eq!(handle.monitor_uri, "/redfish/v1/TaskService/Tasks/7");
    let (_, body) = fake
        .last_request(
            &Method::POST,
            "/redfish/v1/UpdateService/Actions/UpdateService.SimpleUpdate",
        )
        .unwrap();
    let sent: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(sent["ImageURI"], "http://images/gpu.fw");
    assert_eq!(sent["TransferProtocol"], "HTTP");
    assert_eq!(
        sent["Targets"][0],
        "/redfish/v1/UpdateService/FirmwareInventory/HGX_FW_GPU_0"
    );
    assert_eq!(sent["@Redfish.OperationApplyTime"], "OnReset");
    assert_eq!(sent["ForceUpdate"], false);
}

#[tokio::test]
async fn multipart_push_sends_parameters_then_image() {
    let fake = Fake::default();
    fake.script(
        "/redfish/v1/UpdateService",
        vec![answer(
            200,
            json!({"MultipartHttpPushUri": "/redfish/v1/UpdateService/upload"}).to_string(),
        )],
    );
    fake.script(
        "/redfish/v1/UpdateService/upload",
        vec![answer(
            202,
            json!({"@odata.id": "/redfish/v1/TaskService/Tasks/3", "TaskState": "New"}).to_string(),
        )],
    );
    let addr = start(&fake).await;
    let image = bytes::Bytes::from_static(b"WGFW\x00\x01image-payload");
    let req = UpdateRequest {
        method: UpdateMethod::MultipartPush {
            image: image.clone(),
            filename: "gpu.fw".into(),
        },
        targets: vec!["/redfish/v1/UpdateService/FirmwareInventory/HGX_FW_GPU_0".into()],
        apply_time: Some(ApplyTime::Immediate),
        force_update: None,
    };
    let handle = bmc(addr).start_update(&req).await.unwrap();
    assert_eq!(handle.poll_uri(), "/redfish/v1/TaskService/Tasks/3");

    let (headers, body) = fake
        .last_request(&Method::POST, "/redfish/v1/UpdateService/upload")
        .unwrap();
    let ct = headers.get("content-type").unwrap().to_str().unwrap();
    assert!(ct.starts_with("multipart/form-data; boundary="), "{ct}");
    let text = String::from_utf8_lossy(&body);
    let params_at = text.find("name=\"UpdateParameters\"").expect("UpdateParameters part");
    let file_at = text.find("name=\"UpdateFile\"").expect("UpdateFile part");
    assert!(params_at < file_at, "parameters must precede the image");
    assert!(text.contains(r#""@Redfish.OperationApplyTime":"Immediate""#), "{text}");
    assert!(text.contains(r#""Targets":["/redfish/v1/UpdateService/FirmwareInventory/HGX_FW_GPU_0"]"#));
    assert!(text.contains("image-payload"));
}

#[tokio::test]
async fn multipart_push_without_push_uri_is_unsupported() {
    let fake = Fake::default();
    fake.script("/redfish/v1/UpdateService", vec![answer(200, "{}")]);
    let addr = start(&fake).await;
    let req = UpdateRequest {
        method: UpdateMethod::MultipartPush {
            image: bytes::Bytes::from_static(b"x"),
            filename: "x".into(),
        },
        targets: vec![],
        apply_time: None,
        force_update: None,
    };
    let err = bmc(addr).start_update(&req).await.unwrap_err();
    assert!(matches!(err, BmcError::Unsupported { .. }), "{err:?}");
}

#[tokio::test]
async fn accepted_without_task_monitor_is_a_protocol_error() {
    let fake = Fake::default();
    fake.script("/redfish/v1/UpdateService", vec![answer(200, "{}")]);
    fake.script(
        "/redfish/v1/UpdateService/Actions/UpdateService.SimpleUpdate",
        vec![answer(202, "")],
    );
    let addr = start(&fake).await;
    let req = UpdateRequest {
        method: UpdateMethod::SimpleUpdate {
            image_uri: "http://i/x".into(),
            transfer_protocol: None,
        },
        targets: vec![],
        apply_time: None,
        force_update: None,
    };
    let err = bmc(addr).start_update(&req).await.unwrap_err();
    assert!(matches!(err, BmcError::Protocol { status: Some(202), .. }), "{err:?}");
}

#[tokio::test]
async fn task_polling_reports_progress_then_failure_with_messages() {
    let fake = Fake::default();
    fake.script(
        "/redfish/v1/TaskService/Tasks/9",
        vec![
            answer(
                200,
                json!({"Id": "9", "TaskState": "Running", "PercentComplete": 40}).to_string(),
            ),
            answer(
                200,
                json!({"Id": "9", "TaskState": "Exception", "PercentComplete": 100, "Messages": [
                    {"MessageId": "Update.1.0.ApplyFailed", "Message": "flash write failed",
                     "MessageArgs": ["HGX_FW_GPU_0"], "MessageSeverity": "Critical"}]})
                .to_string(),
            ),
        ],
    );
    let addr = start(&fake).await;
    let bmc = bmc(addr);
    let handle = TaskHandle {
        monitor_uri: "/redfish/v1/TaskService/Tasks/9".into(),
        task_uri: None,
    };
    let status = bmc.poll_task(&handle).await.unwrap();
    assert_eq!(status.state, TaskState::Running);
    assert_eq!(status.percent_complete, Some(40));
    let err = bmc.poll_task(&handle).await.unwrap_err();
    match err {
        BmcError::TaskFailed { state, messages, .. } => {
            assert_eq!(state, TaskState::Exception);
            assert_eq!(messages[0].message_id.as_deref(), Some("Update.1.0.ApplyFailed"));
            assert_eq!(messages[0].message_args, vec!["HGX_FW_GPU_0".to_string()]);
            assert_eq!(messages[0].severity.as_deref(), Some("Critical"));
        }
        other => panic!("expected TaskFailed, got {other:?}"),
    }
}

#[tokio::test]
async fn task_monitor_without_body_means_running_then_done() {
    let fake = Fake::default();
    fake.script(
        "/redfish/v1/TaskService/TaskMonitors/4",
        vec![answer(202, ""), answer(204, "")],
    );
    let addr = start(&fake).await;
    let bmc = bmc(addr);
    let handle = TaskHandle {
        monitor_uri: "/redfish/v1/TaskService/TaskMonitors/4".into(),
        task_uri: None,
    };
    assert_eq!(bmc.poll_task(&handle).await.unwrap().state, TaskState::Running);
    assert!(bmc.poll_task(&handle).await.unwrap().is_completed());
}

#[tokio::test]
async fn task_monitor_on_another_host_is_refused() {
    let fake = Fake::default();
    let addr = start(&fake).await;
    let handle = TaskHandle {
        monitor_uri: "http://attacker.example/redfish/v1/TaskService/Tasks/1".into(),
        task_uri: None,
    };
    let err = bmc(addr).poll_task(&handle).await.unwrap_err();
    assert!(matches!(err, BmcError::Protocol { .. }), "{err:?}");
}

#[tokio::test]
async fn malformed_json_is_a_protocol_error_with_a_redacted_snippet() {
    let fake = Fake::default();
    fake.script(
        "/redfish/v1/UpdateService/FirmwareInventory",
        vec![answer(200, format!("{{\"Members\": [ truncated... {PASSWORD}"))],
    );
    let addr = start(&fake).await;
    let err = bmc(addr).firmware_inventory().await.unwrap_err();
    match &err {
        BmcError::Protocol {
            body_snippet, status, ..
        } => {
            assert_eq!(*status, Some(200));
            assert!(body_snippet.contains("truncated"), "{body_snippet}");
            assert!(!body_snippet.contains(PASSWORD), "{body_snippet}");
        }
        other => panic!("expected Protocol, got {other:?}"),
    }
    assert!(!format!("{err:?}").contains(PASSWORD));
}

#[tokio::test]
async fn wrong_shapes_are_protocol_errors_not_panics() {
    for body in [
        json!({"Members": "not-a-list"}).to_string(),
        json!({"Members": [{"@odata.id": 42}]}).to_string(),
        json!({"Members": [{"Version": {"nested": true}, "@odata.id": "/x"}]}).to_string(),
        "null".to_string(),
        String::new(),
    ] {
        let fake = Fake::default();
        fake.script(
            "/redfish/v1/UpdateService/FirmwareInventory",
            vec![answer(200, body.clone())],
        );
        let addr = start(&fake).await;
        let err = bmc(addr).firmware_inventory().await.unwrap_err();
        assert!(matches!(err, BmcError::Protocol { .. }), "{body}: {err:?}");
    }
}

#[tokio::test]
async fn error_status_is_rejected_with_message_ids() {
    let fake = Fake::default();
    fake.script(
        "/redfish/v1/UpdateService/FirmwareInventory",
        vec![answer(
            400,
            json!({"error": {"code": "Base.1.8.GeneralError",
                "@Message.ExtendedInfo": [{"MessageId": "Base.1.8.QueryNotSupported"}]}})
            .to_string(),
        )],
    );
    let addr = start(&fake).await;
    let err = bmc(addr).firmware_inventory().await.unwrap_err();
    assert!(
        matches!(&err, BmcError::Rejected { status: 400, message_ids, .. } if message_ids == &["Base.1.8.QueryNotSupported"]),
        "{err:?}"
    );
    assert!(!err.is_transient());
}

#[tokio::test]
async fn refused_connection_is_unreachable() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let err = bmc(addr).firmware_inventory().await.unwrap_err();
    assert!(matches!(err, BmcError::Unreachable { .. }), "{err:?}");
    assert!(err.is_transient());
    let err = bmc(addr).probe().await.unwrap_err();
    assert!(matches!(err, BmcError::Unreachable { .. }), "{err:?}");
}

#[tokio::test]
async fn probe_reads_the_service_root_anonymously() {
    let fake = Fake::default();
    fake.script(
        "/redfish/v1",
        vec![answer(
            200,
            json!({"RedfishVersion": "1.15.0", "UUID": "abc"}).to_string(),
        )],
    );
    let addr = start(&fake).await;
    let info = bmc(addr).probe().await.unwrap();
    assert_eq!(info.redfish_version, "1.15.0");
    assert_eq!(fake.logins(), 0, "the probe must not create sessions");
}

#[tokio::test]
async fn resets_use_the_advertised_action_target() {
    let fake = Fake::default();
    fake.script(
        "/redfish/v1/Managers",
        vec![answer(
            200,
            json!({"Members": [{"@odata.id": "/redfish/v1/Managers/bmc"}]}).to_string(),
        )],
    );
    fake.script(
        "/redfish/v1/Managers/bmc",
        vec![answer(
            200,
            json!({"Id": "bmc", "Actions": {"#Manager.Reset": {"target": "/redfish/v1/Managers/bmc/Actions/Manager.Reset"}}})
                .to_string(),
        )],
    );
    fake.script("/redfish/v1/Managers/bmc/Actions/Manager.Reset", vec![answer(204, "")]);
    fake.script(
        "/redfish/v1/Systems",
        vec![answer(
            200,
            json!({"Members": [{"@odata.id": "/redfish/v1/Systems/1"}]}).to_string(),
        )],
    );
    fake.script(
        "/redfish/v1/Systems/1",
        vec![answer(200, json!({"Id": "1"}).to_string())],
    );
    fake.script(
        "/redfish/v1/Systems/1/Actions/ComputerSystem.Reset",
        vec![Scripted {
            headers: vec![("Location", "/redfish/v1/TaskService/Tasks/5".into())],
            ..answer(202, "")
        }],
    );
    let addr = start(&fake).await;
    let bmc = bmc(addr);

    assert_eq!(
        bmc.reset(&ResetTarget::Manager(None), ResetKind::GracefulRestart)
            .await
            .unwrap(),
        None
    );
    let (_, body) = fake
        .last_request(&Method::POST, "/redfish/v1/Managers/bmc/Actions/Manager.Reset")
        .unwrap();
    assert_eq!(
        serde_json::from_slice::<Value>(&body).unwrap()["ResetType"],
        "GracefulRestart"
    );

    // No advertised target: the conventional action path is used.
    let task = bmc
        .reset(&ResetTarget::System(Some("1".into())), ResetKind::ForceRestart)
        .await
        .unwrap()
        .expect("202 with Location is a task");
    assert_eq!(task.monitor_uri, "/redfish/v1/TaskService/Tasks/5");
    // The Systems members are read once per BMC (the health reader shares them): a second reset is
    // the POST alone.
    let reads = |fake: &Fake| {
        (
            fake.count(&Method::GET, "/redfish/v1/Systems"),
            fake.count(&Method::GET, "/redfish/v1/Systems/1"),
        )
    };
    let before = reads(&fake);
    bmc.reset(&ResetTarget::System(None), ResetKind::ForceRestart)
        .await
        .unwrap();
    assert_eq!(reads(&fake), before);
    assert_eq!(
        fake.count(&Method::POST, "/redfish/v1/Systems/1/Actions/ComputerSystem.Reset"),
        2
    );
    // A target that is gone (404: the layout changed) is looked up afresh once, from the member.
    fake.script(
        "/redfish/v1/Systems/1/Actions/ComputerSystem.Reset",
        vec![answer(404, ""), answer(204, "")],
    );
    bmc.reset(&ResetTarget::System(None), ResetKind::ForceRestart)
        .await
        .unwrap();
    assert_eq!(reads(&fake), (before.0 + 1, before.1 + 1));
    assert_eq!(
        fake.count(&Method::POST, "/redfish/v1/Systems/1/Actions/ComputerSystem.Reset"),
        4
    );

    let err = bmc
        .reset(&ResetTarget::System(Some("nope".into())), ResetKind::On)
        .await
        .unwrap_err();
    assert!(matches!(err, BmcError::Unsupported { .. }), "{err:?}");
}

#[tokio::test]
async fn sensors_and_events_since_a_cursor() {
    let fake = Fake::default();
    fake.script(
        "/redfish/v1/Chassis",
        vec![answer(
            200,
            json!({"Members": [{"@odata.id": "/redfish/v1/Chassis/HGX"}]}).to_string(),
        )],
    );
    fake.script(
        "/redfish/v1/Chassis/HGX",
        vec![answer(
            200,
            json!({"Id": "HGX", "Sensors": {"@odata.id": "/redfish/v1/Chassis/HGX/Sensors"}}).to_string(),
        )],
    );
    fake.script(
        "/redfish/v1/Chassis/HGX/Sensors",
        vec![answer(
            200,
            json!({"Members": [
                {"@odata.id": "/redfish/v1/Chassis/HGX/Sensors/GPU_0_Temp", "Id": "GPU_0_Temp", "Reading": 63.5,
                 "ReadingType": "Temperature", "ReadingUnits": "Cel", "PhysicalContext": "GPU"},
                {"@odata.id": "/redfish/v1/Chassis/HGX/Sensors/GPU_0_Power"}
            ]})
            .to_string(),
        )],
    );
    fake.script(
        "/redfish/v1/Chassis/HGX/Sensors/GPU_0_Power",
        vec![answer(
            200,
            json!({"@odata.id": "/redfish/v1/Chassis/HGX/Sensors/GPU_0_Power", "Id": "GPU_0_Power", "Reading": 551.0,
                   "ReadingType": "Power", "ReadingUnits": "W", "PhysicalContext": "GPU"})
            .to_string(),
        )],
    );
    fake.script(
        "/redfish/v1/Systems",
        vec![answer(
            200,
            json!({"Members": [{"@odata.id": "/redfish/v1/Systems/1"}]}).to_string(),
        )],
    );
    fake.script(
        "/redfish/v1/Systems/1",
        vec![answer(
            200,
            json!({"Id": "1", "LogServices": {"@odata.id": "/redfish/v1/Systems/1/LogServices"}}).to_string(),
        )],
    );
    fake.script(
        "/redfish/v1/Systems/1/LogServices",
        vec![answer(
            200,
            json!({"Members": [{"@odata.id": "/redfish/v1/Systems/1/LogServices/Dump"},
                               {"@odata.id": "/redfish/v1/Systems/1/LogServices/EventLog"}]})
            .to_string(),
        )],
    );
    fake.script(
        "/redfish/v1/Systems/1/LogServices/EventLog",
        vec![answer(
            200,
            json!({"Id": "EventLog", "Entries": {"@odata.id": "/redfish/v1/Systems/1/LogServices/EventLog/Entries"}})
                .to_string(),
        )],
    );
    let entry = |id: &str, created: &str, msg: &str| {
        json!({"@odata.id": format!("/redfish/v1/Systems/1/LogServices/EventLog/Entries/{id}"), "Id": id,
               "Created": created, "Severity": "Warning", "MessageId": msg, "MessageArgs": ["GPU_0", "79"],
               "EntryType": "Event",
               "Links": {"OriginOfCondition": {"@odata.id": "/redfish/v1/Systems/1/Processors/GPU_0"}}})
    };
    fake.script(
        "/redfish/v1/Systems/1/LogServices/EventLog/Entries",
        vec![
            answer(
                200,
                json!({"Members": [
                    entry("2", "2025-01-01T00:10:00Z", "NvidiaGpu.1.0.Xid"),
                    entry("1", "2025-01-01T00:05:00+00:00", "PCIe.1.0.AER"),
                    {"@odata.id": "/x/3", "Id": "3", "Created": "yesterday"}
                ]})
                .to_string(),
            ),
            answer(
                200,
                json!({"Members": [
                    entry("1", "2025-01-01T00:05:00Z", "PCIe.1.0.AER"),
                    entry("2", "2025-01-01T00:10:00Z", "NvidiaGpu.1.0.Xid"),
                    entry("10", "2025-01-01T00:10:00Z", "NvidiaGpu.1.0.LinkDegraded"),
                ]})
                .to_string(),
            ),
        ],
    );
    let addr = start(&fake).await;
    let bmc = bmc(addr);

    let sensors = bmc.read_sensors().await.unwrap();
    assert_eq!(sensors.len(), 2);
    assert_eq!(sensors[0].kind, SensorKind::Temperature);
    assert_eq!(sensors[0].reading, Some(63.5));
    assert!(sensors[0].is_gpu());
    assert_eq!(sensors[1].kind, SensorKind::Power);
    assert_eq!(sensors[1].reading, Some(551.0));

    let first = bmc.read_events(&EventCursor::default()).await.unwrap();
    let ids: Vec<_> = first.entries.iter().map(|e| e.id.as_str()).collect();
    assert_eq!(ids, ["1", "2"], "oldest first");
    assert_eq!(first.skipped_malformed, 1);
    assert_eq!(
        first.entries[1].message_args,
        vec!["GPU_0".to_string(), "79".to_string()]
    );
    assert_eq!(
        first.entries[1].origin.as_deref(),
        Some("/redfish/v1/Systems/1/Processors/GPU_0")
    );

    // The cursor survives a round trip through storage.
    let stored = serde_json::to_string(&first.cursor).unwrap();
    let cursor: EventCursor = serde_json::from_str(&stored).unwrap();
    let second = bmc.read_events(&cursor).await.unwrap();
    let ids: Vec<_> = second.entries.iter().map(|e| e.id.as_str()).collect();
    assert_eq!(
        ids,
        ["10"],
        "only the entry not seen before, even at the same timestamp"
    );
}

#[tokio::test]
async fn discovery_bounds_concurrency_and_reports_dead_nodes() {
    let fake = Fake::default();
    inventory_fixture(&fake);
    fake.script(
        "/redfish/v1/UpdateService/FirmwareInventory",
        vec![Scripted {
            delay: Duration::from_millis(30),
            ..answer(
                200,
                json!({"Members": [{"@odata.id": "/redfish/v1/UpdateService/FirmwareInventory/BMC_Firmware"}]})
                    .to_string(),
            )
        }],
    );
    let addr = start(&fake).await;
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let nodes: Vec<(usize, BmcEndpoint)> = (0..60)
        .map(|i| {
            let target = if i % 10 == 3 { dead } else { addr };
            let mut ep = endpoint(target);
            ep.retry = RetryPolicy {
                max_retries: 1,
                ..quick_retry()
            };
            (i, ep)
        })
        .collect();
    let clients = HttpClients::new();
    let results = orchestrator_bmc::discover_inventory(&clients, nodes, 8).await;
    assert_eq!(results.len(), 60);
    let mut dead_nodes = Vec::new();
    for r in &results {
        match &r.result {
            Ok(inv) => assert_eq!(inv[0].version.as_deref(), Some("24.04.1")),
            Err(e) => {
                assert!(matches!(e, BmcError::Unreachable { .. }), "{e:?}");
                dead_nodes.push(r.node);
            }
        }
    }
    dead_nodes.sort();
    assert_eq!(dead_nodes, vec![3, 13, 23, 33, 43, 53]);
    let max = fake.max_in_flight.load(Ordering::SeqCst);
    assert!(max <= 8, "at most 8 nodes in flight, saw {max}");
    assert!(max >= 2, "discovery should actually run nodes in parallel, saw {max}");
}

#[tokio::test]
async fn concurrent_first_requests_share_one_login() {
    let fake = Fake::default();
    inventory_fixture(&fake);
    let addr = start(&fake).await;
    let bmc: Arc<dyn Bmc> = Arc::new(bmc(addr));
    let reads: Vec<_> = (0..20)
        .map(|_| {
            let bmc = bmc.clone();
            tokio::spawn(async move { bmc.firmware_inventory().await })
        })
        .collect();
    for r in reads {
        assert_eq!(r.await.unwrap().unwrap().len(), 2);
    }
    assert_eq!(
        fake.logins(),
        1,
        "BMCs allow few sessions; concurrent callers must share one"
    );
}

#[tokio::test]
async fn wait_for_task_rides_out_busy_polls_and_reports_a_stuck_task() {
    let fake = Fake::default();
    fake.script(
        "/redfish/v1/TaskService/Tasks/1",
        vec![
            answer(200, json!({"TaskState": "Running", "PercentComplete": 10}).to_string()),
            answer(503, ""),
            answer(503, ""),
            answer(503, ""),
            answer(503, ""),
            answer(
                200,
                json!({"TaskState": "Completed", "PercentComplete": 100}).to_string(),
            ),
        ],
    );
    fake.script(
        "/redfish/v1/TaskService/Tasks/2",
        vec![answer(
            200,
            json!({"TaskState": "Running", "PercentComplete": 50}).to_string(),
        )],
    );
    let addr = start(&fake).await;
    let ep = endpoint(addr).with_retry(RetryPolicy {
        max_retries: 0,
        ..quick_retry()
    });
    let bmc = RedfishBmc::new(&ep, &HttpClients::new()).unwrap();
    let handle = |n: u32| TaskHandle {
        monitor_uri: format!("/redfish/v1/TaskService/Tasks/{n}"),
        task_uri: None,
    };
    let done = orchestrator_bmc::wait_for_task(&bmc, &handle(1), Duration::from_millis(10), Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(done.percent_complete, Some(100));

    let err = orchestrator_bmc::wait_for_task(&bmc, &handle(2), Duration::from_millis(10), Duration::from_millis(200))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, BmcError::TaskTimeout { last_state, .. } if last_state == "Running"),
        "{err:?}"
    );
    assert!(err.is_transient());
}

// ---------------------------------------------------------------------------------------------------
// Update paths chosen from the service's own description (issue 21), and read bounds (issue 24).

const GPU_TARGET: &str = "/redfish/v1/UpdateService/FirmwareInventory/HGX_FW_GPU_0";

fn root_fixture(fake: &Fake, with_task_service: bool) {
    let mut root = json!({
        "@odata.id": "/redfish/v1",
        "RedfishVersion": "1.17.0",
        "UpdateService": {"@odata.id": "/redfish/v1/UpdateService"},
        "Systems": {"@odata.id": "/redfish/v1/Systems"},
        "Chassis": {"@odata.id": "/redfish/v1/Chassis"},
        "Managers": {"@odata.id": "/redfish/v1/Managers"},
    });
    if with_task_service {
        root["Tasks"] = json!({"@odata.id": "/redfish/v1/TaskService"});
        fake.script(
            "/redfish/v1/TaskService",
            vec![answer(
                200,
                json!({"Tasks": {"@odata.id": "/redfish/v1/TaskService/Tasks"}}).to_string(),
            )],
        );
    }
    fake.script("/redfish/v1", vec![answer(200, root.to_string())]);
}

/// A DGX H100-style UpdateService: SimpleUpdate whose ActionInfo has no `Targets` (and requires
/// `TransferProtocol`), a multipart push that applies immediately only.
fn dgx_update_service(fake: &Fake) {
    fake.script(
        "/redfish/v1/UpdateService",
        vec![answer(
            200,
            json!({
                "@odata.id": "/redfish/v1/UpdateService",
                "FirmwareInventory": {"@odata.id": "/redfish/v1/UpdateService/FirmwareInventory"},
                "MultipartHttpPushUri": "/redfish/v1/UpdateService/update-multipart",
                "MultipartHttpPushUri@Redfish.OperationApplyTimeSupport": {"SupportedValues": ["Immediate"]},
                "Actions": {"#UpdateService.SimpleUpdate": {
                    "target": "/redfish/v1/UpdateService/Actions/UpdateService.SimpleUpdate",
                    "@Redfish.ActionInfo": "/redfish/v1/UpdateService/SimpleUpdateActionInfo"
                }}
            })
            .to_string(),
        )],
    );
    fake.script(
        "/redfish/v1/UpdateService/SimpleUpdateActionInfo",
        vec![answer(
            200,
            json!({"Parameters": [
                {"Name": "ImageURI", "Required": true, "DataType": "String"},
                {"Name": "TransferProtocol", "Required": true, "AllowableValues": ["HTTP", "SCP"]}
            ]})
            .to_string(),
        )],
    );
}

fn gpu_update(apply_time: ApplyTime, addr: SocketAddr) -> UpdateRequest {
    UpdateRequest {
        method: UpdateMethod::FromImageUri {
            image_uri: format!("http://{addr}/images/gpu.fw"),
            forced: None,
            strict_apply_time: false,
        },
        targets: vec![GPU_TARGET.into()],
        apply_time: Some(apply_time),
        force_update: None,
    }
}

#[tokio::test]
async fn targeted_update_on_a_dgx_layout_pushes_multipart_and_never_simple_update() {
    let fake = Fake::default();
    root_fixture(&fake, true);
    dgx_update_service(&fake);
    inventory_fixture(&fake);
    fake.script("/images/gpu.fw", vec![answer(200, "WGFW-gpu-image")]);
    let mut accepted = answer(202, "");
    accepted
        .headers
        .push(("Location", "/redfish/v1/TaskService/TaskMonitors/5".into()));
    fake.script("/redfish/v1/UpdateService/update-multipart", vec![accepted]);
    let addr = start(&fake).await;

    let handle = bmc(addr)
        .start_update(&gpu_update(ApplyTime::OnReset, addr))
        .await
        .unwrap();

    assert_eq!(handle.poll_uri(), "/redfish/v1/TaskService/TaskMonitors/5");
    assert_eq!(
        fake.count(
            &Method::POST,
            "/redfish/v1/UpdateService/Actions/UpdateService.SimpleUpdate"
        ),
        0,
        "SimpleUpdate here cannot restrict targets"
    );
    let (_, body) = fake
        .last_request(&Method::POST, "/redfish/v1/UpdateService/update-multipart")
        .unwrap();
    let text = String::from_utf8_lossy(&body);
    assert!(text.contains(r#""@Redfish.OperationApplyTime":"Immediate""#), "{text}");
    assert!(text.contains(&format!(r#""Targets":["{GPU_TARGET}"]"#)), "{text}");
    assert!(text.contains("WGFW-gpu-image"), "{text}");
    let (image_headers, _) = fake.last_request(&Method::GET, "/images/gpu.fw").unwrap();
    assert!(
        image_headers.get("authorization").is_none() && image_headers.get("x-auth-token").is_none(),
        "BMC credentials must never go to the image server"
    );
}

#[tokio::test]
async fn targeted_update_is_refused_where_no_path_can_restrict_targets() {
    let fake = Fake::default();
    root_fixture(&fake, true);
    dgx_update_service(&fake);
    // The same service without its multipart push: only the untargetable SimpleUpdate is left.
    fake.script(
        "/redfish/v1/UpdateService",
        vec![answer(
            200,
            json!({"Actions": {"#UpdateService.SimpleUpdate": {
                "target": "/redfish/v1/UpdateService/Actions/UpdateService.SimpleUpdate",
                "@Redfish.ActionInfo": "/redfish/v1/UpdateService/SimpleUpdateActionInfo"
            }}})
            .to_string(),
        )],
    );
    inventory_fixture(&fake);
    let addr = start(&fake).await;

    let err = bmc(addr)
        .start_update(&gpu_update(ApplyTime::OnReset, addr))
        .await
        .unwrap_err();

    assert!(matches!(err, BmcError::NoUpdatePath { .. }), "{err:?}");
    let text = err.to_string();
    assert!(text.contains("no Targets parameter"), "{text}");
    assert!(
        text.contains("multipart_push: the UpdateService has no MultipartHttpPushUri"),
        "{text}"
    );
    assert!(!err.is_transient());
    assert_eq!(
        fake.count(
            &Method::POST,
            "/redfish/v1/UpdateService/Actions/UpdateService.SimpleUpdate"
        ),
        0
    );
}

#[tokio::test]
async fn dell_style_inline_annotations_send_the_protocol_and_apply_time() {
    let fake = Fake::default();
    root_fixture(&fake, true);
    fake.script(
        "/redfish/v1/UpdateService",
        vec![answer(
            200,
            json!({"Actions": {"#UpdateService.SimpleUpdate": {
                "target": "/redfish/v1/UpdateService/Actions/UpdateService.SimpleUpdate",
                "TransferProtocol@Redfish.AllowableValues": ["HTTP", "NFS"],
                "@Redfish.OperationApplyTimeSupport": {"SupportedValues": ["Immediate", "OnReset"]}
            }}})
            .to_string(),
        )],
    );
    inventory_fixture(&fake);
    let mut accepted = answer(
        202,
        json!({"@odata.id": "/redfish/v1/TaskService/Tasks/JID_1", "TaskState": "New"}).to_string(),
    );
    accepted
        .headers
        .push(("Location", "/redfish/v1/TaskService/TaskMonitors/JID_1".into()));
    fake.script(
        "/redfish/v1/UpdateService/Actions/UpdateService.SimpleUpdate",
        vec![accepted],
    );
    let addr = start(&fake).await;

    let handle = bmc(addr)
        .start_update(&gpu_update(ApplyTime::OnReset, addr))
        .await
        .unwrap();

    assert_eq!(handle.monitor_uri, "/redfish/v1/TaskService/TaskMonitors/JID_1");
    assert_eq!(handle.poll_uri(), "/redfish/v1/TaskService/Tasks/JID_1");
    let (_, body) = fake
        .last_request(
            &Method::POST,
            "/redfish/v1/UpdateService/Actions/UpdateService.SimpleUpdate",
        )
        .unwrap();
    let sent: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(sent["TransferProtocol"], "HTTP");
    assert_eq!(sent["@Redfish.OperationApplyTime"], "OnReset");
    assert_eq!(sent["Targets"], json!([GPU_TARGET]));
    assert_eq!(
        fake.count(&Method::GET, "/images/gpu.fw"),
        0,
        "a pull never passes through the controller"
    );
}

#[tokio::test]
async fn push_accepted_without_a_task_is_followed_through_the_inventory() {
    let fake = Fake::default();
    root_fixture(&fake, false);
    dgx_update_service(&fake);
    inventory_fixture(&fake);
    fake.script("/images/gpu.fw", vec![answer(200, "img")]);
    fake.script("/redfish/v1/UpdateService/update-multipart", vec![answer(204, "")]);
    let addr = start(&fake).await;
    let driver = bmc(addr);

    let handle = driver
        .start_update(&gpu_update(ApplyTime::Immediate, addr))
        .await
        .unwrap();
    assert!(
        handle.poll_uri().starts_with("urn:waveguard:inventory-watch"),
        "{handle:?}"
    );
    // The engine stores only the poll URI; a fresh driver (a restarted controller) must resume.
    let stored = TaskHandle {
        monitor_uri: handle.poll_uri().to_string(),
        task_uri: None,
    };
    let status = bmc(addr).poll_task(&stored).await.unwrap();
    assert_eq!(status.state, TaskState::Running, "version unchanged: still applying");

    fake.script(
        "/redfish/v1/UpdateService/FirmwareInventory/HGX_FW_GPU_0",
        vec![answer(
            200,
            json!({"@odata.id": GPU_TARGET, "Id": "HGX_FW_GPU_0", "Version": "97.00.01.00.00", "SoftwareId": "gpu"})
                .to_string(),
        )],
    );
    let status = driver.poll_task(&stored).await.unwrap();
    assert!(status.is_completed(), "{status:?}");
    // No TaskService in the root: listing tasks says so instead of failing on a guessed path.
    let err = driver.list_tasks().await.unwrap_err();
    assert!(matches!(err, BmcError::Unsupported { .. }), "{err:?}");
}

#[tokio::test]
async fn http_push_sets_targets_with_if_match_then_posts_the_image() {
    let fake = Fake::default();
    root_fixture(&fake, true);
    let mut svc = answer(
        200,
        json!({
            "HttpPushUri": "/redfish/v1/UpdateService/update",
            "HttpPushUriTargets": [],
            "HttpPushUriTargetsBusy": false
        })
        .to_string(),
    );
    svc.headers.push(("ETag", "W/\"svc-1\"".into()));
    fake.script("/redfish/v1/UpdateService", vec![svc]);
    inventory_fixture(&fake);
    fake.script("/images/gpu.fw", vec![answer(200, "raw-image")]);
    let mut accepted = answer(202, "");
    accepted
        .headers
        .push(("Location", "/redfish/v1/TaskService/Tasks/8".into()));
    fake.script("/redfish/v1/UpdateService/update", vec![accepted]);
    let addr = start(&fake).await;

    let handle = bmc(addr)
        .start_update(&gpu_update(ApplyTime::OnReset, addr))
        .await
        .unwrap();
    assert_eq!(handle.poll_uri(), "/redfish/v1/TaskService/Tasks/8");

    let patches: Vec<(HeaderMap, Bytes)> = {
        let s = fake.state.lock().unwrap();
        s.requests
            .iter()
            .filter(|(m, p, _, _)| m == Method::PATCH && p == "/redfish/v1/UpdateService")
            .map(|(_, _, h, b)| (h.clone(), b.clone()))
            .collect()
    };
    assert_eq!(patches.len(), 2, "reserve the targets, then release them");
    assert_eq!(patches[0].0.get("if-match").unwrap(), "W/\"svc-1\"");
    let reserve: Value = serde_json::from_slice(&patches[0].1).unwrap();
    assert_eq!(reserve["HttpPushUriTargets"], json!([GPU_TARGET]));
    assert_eq!(reserve["HttpPushUriTargetsBusy"], true);
    let release: Value = serde_json::from_slice(&patches[1].1).unwrap();
    assert_eq!(release["HttpPushUriTargetsBusy"], false);
    let (headers, body) = fake
        .last_request(&Method::POST, "/redfish/v1/UpdateService/update")
        .unwrap();
    assert_eq!(headers.get("content-type").unwrap(), "application/octet-stream");
    assert_eq!(&body[..], b"raw-image");
}

#[tokio::test]
async fn http_push_targets_held_by_another_client_are_not_raced() {
    let fake = Fake::default();
    root_fixture(&fake, true);
    fake.script(
        "/redfish/v1/UpdateService",
        vec![answer(
            200,
            json!({"HttpPushUri": "/redfish/v1/UpdateService/update", "HttpPushUriTargets": ["/x"],
                   "HttpPushUriTargetsBusy": true})
            .to_string(),
        )],
    );
    inventory_fixture(&fake);
    fake.script("/images/gpu.fw", vec![answer(200, "raw-image")]);
    let addr = start(&fake).await;
    let err = bmc(addr)
        .start_update(&gpu_update(ApplyTime::OnReset, addr))
        .await
        .unwrap_err();
    assert!(err.is_transient(), "busy targets clear up: {err:?}");
    assert_eq!(fake.count(&Method::PATCH, "/redfish/v1/UpdateService"), 0);
    assert_eq!(fake.count(&Method::POST, "/redfish/v1/UpdateService/update"), 0);
}

#[tokio::test]
async fn looping_next_link_ends_at_its_first_repeat_with_an_error() {
    let fake = Fake::default();
    fake.script(
        "/redfish/v1/UpdateService/FirmwareInventory",
        vec![answer(
            200,
            json!({"Members": [], "Members@odata.nextLink": "/redfish/v1/UpdateService/FirmwareInventory?page=2"})
                .to_string(),
        )],
    );
    let addr = start(&fake).await;
    let err = bmc(addr).firmware_inventory().await.unwrap_err();
    // The fake ignores the query, so page 2 links to itself.
    assert!(err.to_string().contains("repeats page"), "{err}");
    assert_eq!(
        fake.count(&Method::GET, "/redfish/v1/UpdateService/FirmwareInventory"),
        2,
        "page 1 and page 2, then the repeat is caught without a request"
    );
}

#[tokio::test]
async fn oversized_response_is_refused_not_truncated() {
    let fake = Fake::default();
    let huge = format!(
        r#"{{"Members": [], "Pad": "{}"}}"#,
        "x".repeat(orchestrator_bmc::limits::MAX_RESPONSE_BYTES)
    );
    fake.script("/redfish/v1/UpdateService/FirmwareInventory", vec![answer(200, huge)]);
    let addr = start(&fake).await;
    let err = bmc(addr).firmware_inventory().await.unwrap_err();
    assert!(
        matches!(
            err,
            BmcError::ReadLimit {
                limit: "response_bytes",
                ..
            }
        ),
        "{err:?}"
    );
    assert!(!err.is_transient());
}

#[tokio::test]
async fn a_service_without_session_login_says_so_instead_of_blaming_the_credentials() {
    let fake = Fake::default();
    fake.state.lock().unwrap().no_sessions = true;
    inventory_fixture(&fake);
    let addr = start(&fake).await;
    let err = bmc(addr).firmware_inventory().await.unwrap_err();
    assert!(matches!(err, BmcError::Unsupported { .. }), "{err:?}");
    let text = err.to_string();
    assert!(text.contains("session login") && text.contains("basic"), "{text}");
    assert!(!text.contains("rejected the credentials"), "{text}");
    // With Basic auth the same service works.
    let basic = RedfishBmc::new(&endpoint(addr).with_auth(AuthMode::Basic), &HttpClients::new()).unwrap();
    assert_eq!(basic.firmware_inventory().await.unwrap().len(), 2);
}

/// Where the service advertises `$expand`, the firmware inventory (read before and after every
/// flash) is one request with its entries inline, and the chassis are walked once: a later sensor
/// read asks only for the sensor collections. A service that ignores `$expand` and lists links still
/// has each entry read.
#[tokio::test]
async fn inventory_is_read_expanded_and_the_chassis_are_walked_once() {
    let fake = Fake::default();
    fake.script(
        "/redfish/v1",
        vec![answer(
            200,
            json!({"Chassis": {"@odata.id": "/redfish/v1/Chassis"},
                   "UpdateService": {"@odata.id": "/redfish/v1/UpdateService"},
                   "ProtocolFeaturesSupported": {"ExpandQuery": {"NoLinks": true, "Levels": true, "MaxLevels": 1}}})
            .to_string(),
        )],
    );
    let entry = |id: &str, version: &str| {
        json!({"@odata.id": format!("/redfish/v1/UpdateService/FirmwareInventory/{id}"), "Id": id,
               "Version": version, "Updateable": true})
    };
    fake.script(
        "/redfish/v1/UpdateService/FirmwareInventory",
        vec![
            answer(
                200,
                json!({"Members": [entry("BMC_Firmware", "24.04.1"), entry("HGX_FW_GPU_0", "96.00.5E.00.01")]})
                    .to_string(),
            ),
            // Advertised but ignored: links only.
            answer(
                200,
                json!({"Members": [{"@odata.id": "/redfish/v1/UpdateService/FirmwareInventory/BMC_Firmware"}]})
                    .to_string(),
            ),
        ],
    );
    fake.script(
        "/redfish/v1/UpdateService/FirmwareInventory/BMC_Firmware",
        vec![answer(200, entry("BMC_Firmware", "24.04.2").to_string())],
    );
    fake.script(
        "/redfish/v1/Chassis",
        vec![answer(
            200,
            json!({"Members": [{"@odata.id": "/redfish/v1/Chassis/1"}]}).to_string(),
        )],
    );
    fake.script(
        "/redfish/v1/Chassis/1",
        vec![answer(
            200,
            json!({"Id": "1", "Sensors": {"@odata.id": "/redfish/v1/Chassis/1/Sensors"}}).to_string(),
        )],
    );
    fake.script(
        "/redfish/v1/Chassis/1/Sensors",
        vec![answer(
            200,
            json!({"Members": [{"@odata.id": "/redfish/v1/Chassis/1/Sensors/GPU_0_Temp", "Id": "GPU_0_Temp",
                                "Reading": 61.0, "ReadingType": "Temperature", "PhysicalContext": "GPU"}]})
            .to_string(),
        )],
    );
    let addr = start(&fake).await;
    let bmc = bmc(addr);

    let inventory = bmc.firmware_inventory().await.unwrap();
    let versions: Vec<_> = inventory
        .iter()
        .map(|c| (c.id.as_str(), c.version.as_deref().unwrap_or_default()))
        .collect();
    assert_eq!(
        versions,
        [("BMC_Firmware", "24.04.1"), ("HGX_FW_GPU_0", "96.00.5E.00.01")]
    );
    assert_eq!(
        fake.count(&Method::GET, "/redfish/v1/UpdateService/FirmwareInventory/BMC_Firmware"),
        0
    );
    let ignored = bmc.firmware_inventory().await.unwrap();
    assert_eq!(
        ignored[0].version.as_deref(),
        Some("24.04.2"),
        "an entry listed as a link is read"
    );

    for _ in 0..3 {
        let sensors = bmc.read_sensors().await.unwrap();
        assert_eq!(sensors.len(), 1);
        assert_eq!(sensors[0].reading, Some(61.0));
    }
    assert_eq!(
        fake.count(&Method::GET, "/redfish/v1/Chassis"),
        1,
        "the chassis are listed once"
    );
    assert_eq!(fake.count(&Method::GET, "/redfish/v1/Chassis/1"), 1);
    assert_eq!(fake.count(&Method::GET, "/redfish/v1/Chassis/1/Sensors"), 3);
    let targets = fake.state.lock().unwrap().targets.clone();
    assert!(
        targets.contains(&"/redfish/v1/UpdateService/FirmwareInventory?$expand=.($levels=1)".to_owned()),
        "{targets:?}"
    );
}

/// A service that advertises `$expand` (`ProtocolFeaturesSupported.ExpandQuery`) gets its sensor
/// collections read with `$expand=.($levels=1)`: one request where the members come back inline. One
/// that advertises it but then refuses it (501) is read without, member by member.
#[tokio::test]
async fn sensors_are_read_with_expand_where_the_service_advertises_it() {
    let fake = Fake::default();
    fake.script(
        "/redfish/v1",
        vec![answer(
            200,
            json!({"Chassis": {"@odata.id": "/redfish/v1/Chassis"},
                   "ProtocolFeaturesSupported": {"ExpandQuery": {"NoLinks": true, "Levels": true, "MaxLevels": 6}}})
            .to_string(),
        )],
    );
    fake.script(
        "/redfish/v1/Chassis",
        vec![answer(
            200,
            json!({"Members": [{"@odata.id": "/redfish/v1/Chassis/HGX_GPU_SXM_1"},
                               {"@odata.id": "/redfish/v1/Chassis/HGX_GPU_SXM_2"}]})
            .to_string(),
        )],
    );
    let sensor = |n: u32| {
        json!({"@odata.id": format!("/redfish/v1/Chassis/HGX_GPU_SXM_{n}/Sensors/HGX_GPU_SXM_{n}_TEMP_0"),
               "Id": format!("HGX_GPU_SXM_{n}_TEMP_0"), "Reading": 60.0 + f64::from(n), "ReadingType": "Temperature",
               "PhysicalContext": "GPU",
               "RelatedItem": [{"@odata.id": format!("/redfish/v1/Systems/HGX_Baseboard_0/Processors/GPU_SXM_{n}")}]})
    };
    for n in [1, 2] {
        fake.script(
            &format!("/redfish/v1/Chassis/HGX_GPU_SXM_{n}"),
            vec![answer(
                200,
                json!({"Id": format!("HGX_GPU_SXM_{n}"),
                       "Sensors": {"@odata.id": format!("/redfish/v1/Chassis/HGX_GPU_SXM_{n}/Sensors")}})
                .to_string(),
            )],
        );
    }
    // GPU 1 honours $expand; GPU 2 advertises it but answers 501, then lists links.
    fake.script(
        "/redfish/v1/Chassis/HGX_GPU_SXM_1/Sensors",
        vec![answer(200, json!({"Members": [sensor(1)]}).to_string())],
    );
    fake.script(
        "/redfish/v1/Chassis/HGX_GPU_SXM_2/Sensors",
        vec![
            answer(
                501,
                json!({"error": {"code": "Base.1.18.QueryNotSupported"}}).to_string(),
            ),
            answer(
                200,
                json!({"Members": [{"@odata.id": "/redfish/v1/Chassis/HGX_GPU_SXM_2/Sensors/HGX_GPU_SXM_2_TEMP_0"}]})
                    .to_string(),
            ),
        ],
    );
    fake.script(
        "/redfish/v1/Chassis/HGX_GPU_SXM_2/Sensors/HGX_GPU_SXM_2_TEMP_0",
        vec![answer(200, sensor(2).to_string())],
    );
    let addr = start(&fake).await;
    let sensors = bmc(addr).read_sensors().await.unwrap();
    let read: Vec<_> = sensors.iter().map(|s| (s.id.as_str(), s.reading)).collect();
    assert_eq!(
        read,
        [
            ("HGX_GPU_SXM_1_TEMP_0", Some(61.0)),
            ("HGX_GPU_SXM_2_TEMP_0", Some(62.0))
        ]
    );
    assert_eq!(
        sensors[0].related,
        ["/redfish/v1/Systems/HGX_Baseboard_0/Processors/GPU_SXM_1"]
    );
    let targets = fake.state.lock().unwrap().targets.clone();
    let sensor_reads: Vec<&str> = targets
        .iter()
        .map(String::as_str)
        .filter(|t| t.contains("/Sensors"))
        .collect();
    assert_eq!(
        sensor_reads,
        [
            "/redfish/v1/Chassis/HGX_GPU_SXM_1/Sensors?$expand=.($levels=1)",
            "/redfish/v1/Chassis/HGX_GPU_SXM_2/Sensors?$expand=.($levels=1)",
            "/redfish/v1/Chassis/HGX_GPU_SXM_2/Sensors",
            "/redfish/v1/Chassis/HGX_GPU_SXM_2/Sensors/HGX_GPU_SXM_2_TEMP_0",
        ],
        "one request for an expanded collection; a refusal falls back to links"
    );
}
