//! Fuzz (issue 24): whatever a hostile or broken BMC answers, the Redfish
//! client returns a result (usually an error) and never panics. Every GET
//! of a loopback fake answers the case's body, so the service root, the
//! inventory collection, its members and the task list all read it.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use orchestrator_bmc::{AuthMode, Bmc, BmcEndpoint, Credentials, HttpClients, RedfishBmc, RetryPolicy, Timeouts};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use serde_json::{Value, json};

type Body = Arc<Mutex<String>>;

async fn answer(State(body): State<Body>) -> Response {
    let text = body.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
    (StatusCode::OK, [(header::CONTENT_TYPE, "application/json")], text).into_response()
}

fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("@odata.id".to_owned()),
        Just("Members".to_owned()),
        Just("Members@odata.nextLink".to_owned()),
        Just("Members@odata.count".to_owned()),
        Just("Id".to_owned()),
        Just("Name".to_owned()),
        Just("Version".to_owned()),
        Just("Updateable".to_owned()),
        Just("SoftwareId".to_owned()),
        Just("Status".to_owned()),
        Just("Health".to_owned()),
        Just("RedfishVersion".to_owned()),
        Just("UpdateService".to_owned()),
        Just("TaskService".to_owned()),
        Just("Tasks".to_owned()),
        Just("LowestSupportedVersion".to_owned()),
        "[A-Za-z@.]{0,12}",
    ]
}

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        Just(json!("/redfish/v1/UpdateService/FirmwareInventory")),
        Just(json!("/redfish/v1/x?page=2")),
        Just(json!("http://elsewhere.example/redfish/v1")),
        Just(json!("96.00.61.00.01")),
        ".{0,16}".prop_map(Value::from),
    ]
}

fn redfish_value() -> impl Strategy<Value = Value> {
    leaf().prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::from),
            prop::collection::btree_map(key(), inner, 0..6).prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn body() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => redfish_value().prop_map(|v| v.to_string()),
        1 => ".{0,64}",
        1 => prop::collection::vec(any::<u8>(), 0..64).prop_map(|b| String::from_utf8_lossy(&b).into_owned()),
    ]
}

#[test]
fn hostile_redfish_bodies_never_panic_the_client() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let shared: Body = Arc::new(Mutex::new(String::new()));
    let addr: SocketAddr = runtime.block_on(async {
        let app = Router::new().fallback(answer).with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        addr
    });
    let endpoint = BmcEndpoint::new(
        format!("http://{addr}").parse().unwrap(),
        Credentials::new("root", "pw"),
    )
    .with_auth(AuthMode::Basic)
    .with_retry(RetryPolicy {
        max_retries: 0,
        base_delay: Duration::from_millis(1),
        max_delay: Duration::from_millis(1),
        max_retry_after: Duration::from_millis(1),
        deadline: Duration::from_secs(5),
    })
    .with_timeouts(Timeouts {
        connect: Duration::from_secs(2),
        request: Duration::from_secs(2),
        upload: Duration::from_secs(2),
        probe: Duration::from_secs(2),
    });
    let bmc = RedfishBmc::new(&endpoint, &HttpClients::new()).unwrap();
    let cases = 128;
    let outcomes = std::cell::RefCell::new([0u32; 2]);
    let mut runner = TestRunner::new(Config {
        cases,
        ..Config::default()
    });
    runner
        .run(&body(), |text| {
            *shared.lock().unwrap() = text;
            runtime.block_on(async {
                for result in [
                    bmc.probe().await.map(|_| ()),
                    bmc.firmware_inventory().await.map(|_| ()),
                    bmc.list_tasks().await.map(|_| ()),
                ] {
                    outcomes.borrow_mut()[usize::from(result.is_err())] += 1;
                }
            });
            Ok(())
        })
        .unwrap();
    let [ok, err] = outcomes.into_inner();
    eprintln!("{cases} bodies x 3 reads: {ok} parsed, {err} refused with an error");
    assert!(err > 0, "the generator should produce malformed bodies");
}
