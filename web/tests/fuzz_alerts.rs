//! Fuzz (issue 24): Alertmanager notifications of any shape never make the
//! webhook answer 5xx or panic. Cases are run against one in-process app
//! with a real SQLite store, so valid-looking payloads reach the database.

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use orchestrator_db::testing::TestDb;
use orchestrator_types::SystemClock;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use serde_json::{Value, json};
use tower::ServiceExt;
use web::{AlertReceiverConfig, AppState, app};

const TOKEN: &str = "fuzz-alertmanager-token-0123456789";

fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        ".{0,24}",
        Just(String::new()),
        Just("node-1".to_owned()),
        Just("0001-01-01T00:00:00Z".to_owned()),
        Just("2026-12-04T11:59:00.123456789Z".to_owned()),
        Just("firing".to_owned()),
        Just("resolved".to_owned()),
        "[0-9a-f]{16}",
    ]
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        text().prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 24, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
            prop::collection::btree_map(text(), inner, 0..4).prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn alert() -> impl Strategy<Value = Value> {
    (
        text(),
        prop::collection::btree_map(text(), text(), 0..4),
        text(),
        text(),
        text(),
        json_value(),
    )
        .prop_map(|(status, labels, starts, ends, fingerprint, extra)| {
            json!({
                "status": status, "labels": labels, "annotations": {"x": extra.to_string()},
                "startsAt": starts, "endsAt": ends, "generatorURL": "http://p.example",
                "fingerprint": fingerprint,
            })
        })
}

/// A notification Alertmanager itself could send: valid statuses and
/// timestamps, fuzzed label and annotation text. Without this branch the
/// accepting path is reached only by luck (one CI run drew 0 of 256).
fn well_formed() -> impl Strategy<Value = String> {
    let alert = (
        prop::sample::select(vec!["firing", "resolved"]),
        prop::collection::btree_map("[a-z_]{1,12}", text(), 0..4),
        text(),
        "[0-9a-f]{16}",
    )
        .prop_map(|(status, mut labels, summary, fingerprint)| {
            labels.insert("alertname".to_owned(), "GpuXidStorm".to_owned());
            json!({
                "status": status, "labels": labels, "annotations": {"summary": summary},
                "startsAt": "2026-12-04T11:59:00Z", "endsAt": "0001-01-01T00:00:00Z",
                "generatorURL": "http://prometheus.example/graph", "fingerprint": fingerprint,
            })
        });
    (
        prop::sample::select(vec!["firing", "resolved"]),
        prop::collection::vec(alert, 0..6),
    )
        .prop_map(|(status, alerts)| {
            json!({
                "version": "4", "groupKey": "{}:{}", "truncatedAlerts": 0, "status": status,
                "receiver": "waveguard", "groupLabels": {}, "commonLabels": {}, "commonAnnotations": {},
                "externalURL": "http://am.example", "alerts": alerts,
            })
            .to_string()
        })
}

/// Notifications: well-formed, well-formed around fuzzed alerts, any JSON at
/// all, or a valid notification with one field replaced by anything.
fn notification() -> impl Strategy<Value = String> {
    let shaped =
        (prop::collection::vec(alert(), 0..6), text(), any::<i64>()).prop_map(|(alerts, status, truncated)| {
            json!({
                "version": "4", "groupKey": "{}:{}", "truncatedAlerts": truncated, "status": status,
                "receiver": "waveguard", "groupLabels": {}, "commonLabels": {}, "commonAnnotations": {},
                "externalURL": "http://am.example", "alerts": alerts,
            })
            .to_string()
        });
    let replaced = (
        prop::sample::select(vec!["version", "alerts", "status", "truncatedAlerts", "groupKey"]),
        json_value(),
    )
        .prop_map(|(field, value)| {
            let mut base = json!({
                "version": "4", "groupKey": "{}", "truncatedAlerts": 0, "status": "firing", "receiver": "w",
                "groupLabels": {}, "commonLabels": {}, "commonAnnotations": {}, "externalURL": "http://am.example",
                "alerts": [],
            });
            base[field] = value;
            base.to_string()
        });
    prop_oneof![
        well_formed(),
        shaped,
        replaced,
        json_value().prop_map(|v| v.to_string()),
        ".{0,200}"
    ]
}

#[test]
fn alertmanager_payloads_never_cause_a_5xx() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let (test_db, router): (TestDb, Router) = runtime.block_on(async {
        let test_db = TestDb::sqlite(Arc::new(SystemClock)).await;
        let state = AppState::new(test_db.db.clone()).with_alert_receiver(AlertReceiverConfig::new(TOKEN).unwrap());
        let router = app(state);
        (test_db, router)
    });
    let cases = 256;
    let mut runner = TestRunner::new(Config {
        cases,
        ..Config::default()
    });
    let statuses = std::cell::RefCell::new(std::collections::BTreeMap::<u16, u32>::new());
    runner
        .run(&notification(), |body| {
            let status = runtime.block_on(async {
                let request = Request::post("/api/v1/alerts/alertmanager")
                    .header(header::AUTHORIZATION, format!("Bearer {TOKEN}"))
                    .header(header::CONTENT_TYPE, "application/json")
                    .body(Body::from(body.clone()))
                    .unwrap();
                router.clone().oneshot(request).await.unwrap().status()
            });
            *statuses.borrow_mut().entry(status.as_u16()).or_default() += 1;
            prop_assert!(!status.is_server_error(), "{status} for {body}");
            prop_assert!(
                status == StatusCode::OK || status.is_client_error(),
                "{status} for {body}"
            );
            Ok(())
        })
        .unwrap();
    // The generator must reach both the accepting and the refusing paths.
    let statuses = statuses.into_inner();
    eprintln!("{cases} cases by status: {statuses:?}");
    assert!(statuses.keys().any(|s| *s == 200), "{statuses:?}");
    assert!(statuses.keys().any(|s| *s >= 400), "{statuses:?}");
    drop(test_db);
}
