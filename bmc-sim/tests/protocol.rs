//! DSP0266 protocol behaviour of a simulated BMC over real loopback HTTP: `Allow`, `Cache-Control`,
//! `Link rel=describedby`, `OData-Version` 412, query parameters (501 / `$top` `$skip`), session
//! expiry, AccountService. DMTF's protocol validator checks the same from outside in
//! `tests/protocol_validator.rs`; these name each rule so a regression says which.

mod common;

use bmc_sim::FleetOptions;
use chrono::Duration as SimDuration;
use common::{Harness, PASS, SMALL, USER, start, start_with};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

fn header(resp: &reqwest::Response, name: &str) -> Option<String> {
    resp.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

/// The methods in an `Allow` header, normalised.
fn allowed(resp: &reqwest::Response) -> Vec<String> {
    let mut v: Vec<String> = header(resp, "allow")
        .unwrap_or_default()
        .split(',')
        .map(|m| m.trim().to_ascii_uppercase())
        .filter(|m| !m.is_empty())
        .collect();
    v.sort();
    v
}

async fn request(h: &Harness, method: Method, path: &str) -> reqwest::Response {
    h.http
        .request(method, h.url(0, path))
        .basic_auth(USER, Some(PASS))
        .send()
        .await
        .expect("request")
}

fn message_id(body: &Value) -> String {
    body["error"]["@Message.ExtendedInfo"][0]["MessageId"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

#[tokio::test]
async fn get_and_head_carry_allow_cache_control_and_a_schema_link() {
    let h = start(SMALL).await;
    for (path, want, schema) in [
        ("/redfish/v1", vec!["GET", "HEAD"], "ServiceRoot.v1_21_0.json"),
        (
            "/redfish/v1/SessionService/Sessions",
            vec!["GET", "HEAD", "POST"],
            "SessionCollection.json",
        ),
        (
            "/redfish/v1/UpdateService",
            vec!["GET", "HEAD", "PATCH"],
            "UpdateService.v1_17_1.json",
        ),
        (
            "/redfish/v1/Systems/1",
            vec!["GET", "HEAD"],
            "ComputerSystem.v1_28_0.json",
        ),
    ] {
        for method in [Method::GET, Method::HEAD] {
            let resp = request(&h, method.clone(), path).await;
            assert_eq!(resp.status(), StatusCode::OK, "{method} {path}");
            assert_eq!(allowed(&resp), want, "{method} {path}");
            assert_eq!(
                header(&resp, "cache-control").as_deref(),
                Some("no-cache"),
                "{method} {path}"
            );
            let link = header(&resp, "link").unwrap_or_default();
            assert!(
                link.contains(schema) && link.contains("rel=describedby"),
                "{method} {path}: Link {link}"
            );
            assert_eq!(header(&resp, "odata-version").as_deref(), Some("4.0"));
            let body = resp.bytes().await.expect("body");
            assert_eq!(body.is_empty(), method == Method::HEAD, "{method} {path}");
        }
    }
    h.fleet.shutdown().await;
}

#[tokio::test]
async fn method_not_allowed_says_what_is_allowed_with_an_extended_error() {
    let h = start(SMALL).await;
    for (method, path, want) in [
        (Method::DELETE, "/redfish/v1", vec!["GET", "HEAD"]),
        (Method::PATCH, "/redfish/v1/Systems/1", vec!["GET", "HEAD"]),
        (
            Method::GET,
            "/redfish/v1/Systems/1/Actions/ComputerSystem.Reset",
            vec!["POST"],
        ),
        (
            Method::PATCH,
            "/redfish/v1/AccountService/Accounts/1",
            vec!["GET", "HEAD"],
        ),
    ] {
        let resp = request(&h, method.clone(), path).await;
        assert_eq!(resp.status(), StatusCode::METHOD_NOT_ALLOWED, "{method} {path}");
        assert_eq!(allowed(&resp), want, "{method} {path}");
        let body: Value = resp.json().await.expect("extended error body");
        assert!(message_id(&body).ends_with(".OperationNotAllowed"), "{body}");
    }
    h.fleet.shutdown().await;
}

#[tokio::test]
async fn unsupported_dollar_queries_get_501_and_others_are_ignored() {
    let h = start(SMALL).await;
    let root = h.get_json(0, "/redfish/v1").await;
    let features = &root["ProtocolFeaturesSupported"];
    assert_eq!(features["ExpandQuery"]["ExpandAll"], false, "{root}");
    assert_eq!(features["SelectQuery"], false);
    assert_eq!(features["FilterQuery"], false);
    assert_eq!(features["TopSkipQuery"], true);

    for q in [
        "$expand=*",
        "$expand=.($levels=1)",
        "$select=Id",
        "$filter=Id%20eq%201",
        "$levels=2",
    ] {
        let resp = h.get(0, &format!("/redfish/v1/Systems?{q}")).await;
        assert_eq!(resp.status(), StatusCode::NOT_IMPLEMENTED, "{q}");
        let body: Value = resp.json().await.expect("extended error");
        assert!(
            message_id(&body).starts_with("Base.") && message_id(&body).ends_with(".QueryNotSupported"),
            "{body}"
        );
        let name = q.split('=').next().unwrap_or(q);
        assert!(
            body["error"]["message"].as_str().unwrap_or_default().contains(name),
            "{body}"
        );
    }
    // Without `$`, an unsupported parameter is ignored (DSP0266).
    for q in ["only", "excerpt", "includeoriginofcondition=true", "rpvunknown"] {
        let resp = h.get(0, &format!("/redfish/v1/Systems?{q}")).await;
        assert_eq!(resp.status(), StatusCode::OK, "{q}");
    }
    // A malformed value of a supported parameter is the client's error.
    let bad = h.get(0, "/redfish/v1/Systems?$top=many").await;
    assert_eq!(bad.status(), StatusCode::BAD_REQUEST);
    h.fleet.shutdown().await;
}

#[tokio::test]
async fn top_and_skip_page_any_collection() {
    let h = start(SMALL).await;
    let all = h.get_json(0, "/redfish/v1/UpdateService/FirmwareInventory").await;
    let members = all["Members"].as_array().expect("members").clone();
    assert_eq!(members.len(), 10, "BMC, 8 GPUs, BIOS");
    let page = h
        .get_json(0, "/redfish/v1/UpdateService/FirmwareInventory?$skip=2&$top=3")
        .await;
    assert_eq!(page["Members"].as_array().expect("page"), &members[2..5].to_vec());
    assert_eq!(page["Members@odata.count"], 10);
    let next = page["Members@odata.nextLink"].as_str().expect("nextLink").to_owned();
    let last = h.get_json(0, &next.replace("$skip=5", "$skip=8")).await;
    assert_eq!(last["Members"].as_array().expect("last"), &members[8..].to_vec());
    assert!(last.get("Members@odata.nextLink").is_none(), "{last}");
    // The event log pages itself; the layer leaves its pages alone.
    h.advance(SimDuration::hours(12));
    let log = h
        .get_json(0, "/redfish/v1/Systems/1/LogServices/EventLog/Entries?$top=2")
        .await;
    assert_eq!(log["Members"].as_array().map(Vec::len), Some(2), "{log}");
    h.fleet.shutdown().await;
}

#[tokio::test]
async fn unsupported_odata_version_is_412() {
    let h = start(SMALL).await;
    let send = |v: &'static str| {
        h.http
            .get(h.url(0, "/redfish/v1/Systems"))
            .basic_auth(USER, Some(PASS))
            .header("OData-Version", v)
            .send()
    };
    assert_eq!(send("4.0").await.expect("4.0").status(), StatusCode::OK);
    for v in ["4.01", "4.1", "3.0"] {
        let resp = send(v).await.expect("request");
        assert_eq!(resp.status(), StatusCode::PRECONDITION_FAILED, "{v}");
        let body: Value = resp.json().await.expect("extended error");
        assert!(message_id(&body).ends_with(".HeaderInvalid"), "{body}");
    }
    h.fleet.shutdown().await;
}

async fn login(h: &Harness, path: &str) -> (String, String) {
    let resp = h
        .http
        .post(h.url(0, path))
        .json(&json!({"UserName": USER, "Password": PASS}))
        .send()
        .await
        .expect("login");
    assert_eq!(resp.status(), StatusCode::CREATED, "{path}");
    let token = header(&resp, "x-auth-token").expect("token");
    let location = header(&resp, "location").expect("session location");
    (token, location)
}

async fn with_token(h: &Harness, token: &str, path: &str) -> StatusCode {
    h.http
        .get(h.url(0, path))
        .header("X-Auth-Token", token)
        .send()
        .await
        .expect("request")
        .status()
}

#[tokio::test]
async fn sessions_end_after_session_timeout_without_requests() {
    let h = start(SMALL).await;
    let timeout = h.get_json(0, "/redfish/v1/SessionService").await["SessionTimeout"]
        .as_i64()
        .expect("SessionTimeout");
    assert_eq!(timeout, 1800);
    let (token, location) = login(&h, "/redfish/v1/SessionService/Sessions").await;
    // Every request restarts the timeout: three idle spells just under it keep the session.
    for _ in 0..3 {
        h.advance(SimDuration::seconds(timeout - 60));
        assert_eq!(with_token(&h, &token, "/redfish/v1/Systems").await, StatusCode::OK);
    }
    assert_eq!(h.fleet.open_sessions(&h.name(0)), Some(1));
    h.advance(SimDuration::seconds(timeout));
    assert_eq!(
        with_token(&h, &token, "/redfish/v1/Systems").await,
        StatusCode::UNAUTHORIZED
    );
    // The expired session is gone, not merely refused.
    assert_eq!(h.get(0, &location).await.status(), StatusCode::NOT_FOUND);
    let sessions = h.get_json(0, "/redfish/v1/SessionService/Sessions").await;
    assert_eq!(sessions["Members@odata.count"], 0, "{sessions}");
    assert_eq!(h.fleet.open_sessions(&h.name(0)), Some(0));
    h.fleet.shutdown().await;
}

/// Real BMCs time sessions out in real time, and so does bmc-sim by default: on a sped-up fleet clock
/// (here a million times, so `SessionTimeout` of simulated time is under 2 real milliseconds) a session
/// stays valid across many timeouts' worth of simulated time. Before, it expired on the fleet clock,
/// so at 7,200x a loaded machine's round trip outlasted it and requests got 401 right after a login.
#[tokio::test]
async fn on_a_sped_up_clock_sessions_time_out_in_real_time() {
    let fast: std::sync::Arc<dyn orchestrator_types::Clock> =
        std::sync::Arc::new(orchestrator_types::AcceleratedClock::starting_now(1_000_000.0));
    let h = start_with(SMALL, |o| {
        // The defaults as a sped-up simulation gets them (the shared harness pins sessions to its
        // manual clock).
        let defaults = FleetOptions::new(fast.clone());
        o.clock = defaults.clock;
        o.session_clock = defaults.session_clock;
    })
    .await;
    let (token, _) = login(&h, "/redfish/v1/SessionService/Sessions").await;
    let before = h.fleet.clock().now();
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let passed = h.fleet.clock().now() - before;
    assert!(
        passed > SimDuration::seconds(10 * 1800),
        "the fleet clock ran past many timeouts: {passed}"
    );
    assert_eq!(with_token(&h, &token, "/redfish/v1/Systems").await, StatusCode::OK);
    assert_eq!(h.fleet.open_sessions(&h.name(0)), Some(1));
    h.fleet.shutdown().await;
}

#[tokio::test]
async fn sessions_can_be_created_through_the_members_uri() {
    let h = start(SMALL).await;
    let (token, _) = login(&h, "/redfish/v1/SessionService/Sessions/Members").await;
    assert_eq!(with_token(&h, &token, "/redfish/v1/Systems").await, StatusCode::OK);
    h.fleet.shutdown().await;
}

#[tokio::test]
async fn account_service_lists_the_account_and_the_predefined_roles() {
    let h = start(SMALL).await;
    let root = h.get_json(0, "/redfish/v1").await;
    let service_uri = root["AccountService"]["@odata.id"]
        .as_str()
        .expect("AccountService link");
    let service = h.get_json(0, service_uri).await;
    assert_eq!(service["@odata.type"], "#AccountService.v1_18_1.AccountService");

    let accounts_uri = service["Accounts"]["@odata.id"].as_str().expect("Accounts");
    let accounts = h.get_json(0, accounts_uri).await;
    assert_eq!(accounts["Members@odata.count"], 1);
    let account_uri = accounts["Members"][0]["@odata.id"].as_str().expect("member");
    let resp = h.get(0, account_uri).await;
    assert_eq!(resp.status(), StatusCode::OK);
    let etag = header(&resp, "etag").expect("ManagerAccount carries an ETag");
    let account: Value = resp.json().await.expect("account");
    assert_eq!(account["UserName"], USER);
    assert_eq!(account["RoleId"], "Administrator");
    assert_eq!(account["Password"], Value::Null, "Password is always null when read");
    let again = h.get(0, account_uri).await;
    assert_eq!(
        header(&again, "etag"),
        Some(etag),
        "the ETag is stable while nothing changes"
    );

    let roles_uri = service["Roles"]["@odata.id"].as_str().expect("Roles");
    let roles = h.get_json(0, roles_uri).await;
    let mut ids = Vec::new();
    for m in roles["Members"].as_array().expect("roles") {
        let role = h.get_json(0, m["@odata.id"].as_str().expect("role uri")).await;
        assert_eq!(role["IsPredefined"], true, "{role}");
        assert!(
            role["AssignedPrivileges"]
                .as_array()
                .is_some_and(|p| p.iter().any(|x| x == "Login")),
            "{role}"
        );
        ids.push(role["RoleId"].as_str().unwrap_or_default().to_owned());
    }
    ids.sort();
    assert_eq!(ids, ["Administrator", "Operator", "ReadOnly"]);
    // Read-only: writes are refused with 405 and what is allowed.
    let post = h
        .http
        .post(h.url(0, accounts_uri))
        .basic_auth(USER, Some(PASS))
        .json(&json!({"UserName": "other", "Password": "another-pw", "RoleId": "ReadOnly"}))
        .send()
        .await
        .expect("post");
    assert_eq!(post.status(), StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(allowed(&post), ["GET", "HEAD"]);
    // The account service needs credentials like everything but the service root.
    let anon = h.http.get(h.url(0, service_uri)).send().await.expect("anon");
    assert_eq!(anon.status(), StatusCode::UNAUTHORIZED);
    h.fleet.shutdown().await;
}
