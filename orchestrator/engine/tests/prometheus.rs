//! The Prometheus collector against a fake Prometheus HTTP API on loopback:
//! what is sent (path, form parameters, bearer token), how results map to
//! nodes, and each typed error. The real Prometheus is exercised by
//! `integration-tests/tests/prometheus_alertmanager.rs`.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::post;
use chrono::{DateTime, TimeZone, Utc};
use orchestrator_engine::prometheus::{NodeIndex, PrometheusClient, PrometheusConfig, PrometheusError, QueryData};
use orchestrator_types::NodeId;
use serde_json::json;

/// One request the fake saw: path, form parameters, Authorization header.
type Seen = (String, BTreeMap<String, String>, Option<String>);

/// What the fake answers (status, body, delay), and what it saw.
#[derive(Clone, Default)]
struct Fake {
    answer: Arc<Mutex<(u16, String, Duration)>>,
    seen: Arc<Mutex<Vec<Seen>>>,
}

async fn handle(
    axum::extract::State(fake): axum::extract::State<Fake>,
    uri: axum::http::Uri,
    headers: HeaderMap,
    body: String,
) -> impl IntoResponse {
    let form: BTreeMap<String, String> = url::form_urlencoded::parse(body.as_bytes()).into_owned().collect();
    let auth = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    fake.seen
        .lock()
        .expect("lock")
        .push((uri.path().to_owned(), form, auth));
    let (status, text, delay) = fake.answer.lock().expect("lock").clone();
    tokio::time::sleep(delay).await;
    (
        StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        [(header::CONTENT_TYPE, "application/json")],
        text,
    )
}

async fn start_fake() -> (Fake, String) {
    let fake = Fake::default();
    let app = Router::new()
        .route("/prom/api/v1/query", post(handle))
        .route("/prom/api/v1/query_range", post(handle))
        .with_state(fake.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (fake, format!("http://{addr}/prom/"))
}

fn client(base: &str, timeout: Duration, token: Option<&str>) -> PrometheusClient {
    let mut config = PrometheusConfig::new(url::Url::parse(base).expect("url"));
    config.timeout = timeout;
    config.bearer_token = token.map(str::to_owned);
    PrometheusClient::new(config).expect("client")
}

fn at() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 3, 3, 10, 0, 0).single().expect("time")
}

fn nodes() -> NodeIndex {
    [(NodeId(1), "node-a".to_owned()), (NodeId(2), "node-b".to_owned())]
        .into_iter()
        .collect()
}

fn set(fake: &Fake, status: u16, body: serde_json::Value) {
    *fake.answer.lock().expect("lock") = (status, body.to_string(), Duration::ZERO);
}

#[tokio::test]
async fn instant_vectors_map_to_nodes_and_keep_the_rest_apart() {
    let (fake, base) = start_fake().await;
    let ts = at().timestamp() as f64 + 0.25;
    set(
        &fake,
        200,
        json!({"status": "success", "data": {"resultType": "vector", "result": [
            {"metric": {"node": "node-a", "gpu": "GPU_0"}, "value": [ts, "1.5"]},
            {"metric": {"node": "node-a", "gpu": "GPU_1"}, "value": [ts, "NaN"]},
            {"metric": {"node": "node-b"}, "value": [ts, "+Inf"]},
            {"metric": {"node": "node-zz"}, "value": [ts, "3"]},
            {"metric": {"instance": "x:9100"}, "value": [ts, "4"]},
        ]}, "warnings": ["partial response"]}),
    );
    let prom = client(&base, Duration::from_secs(5), Some("tok-123"));
    let mapped = prom
        .node_samples("avg by (node) (x)", at(), &nodes())
        .await
        .expect("samples");
    let got: Vec<(i64, Option<&str>, String)> = mapped
        .matched
        .iter()
        .map(|s| {
            (
                s.node.0,
                s.labels.get("gpu").map(String::as_str),
                format!("{}", s.value),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            (1, Some("GPU_0"), "1.5".to_owned()),
            (1, Some("GPU_1"), "NaN".to_owned()),
            (2, None, "inf".to_owned())
        ]
    );
    assert_eq!(mapped.matched[0].at, at() + chrono::Duration::milliseconds(250));
    assert_eq!(mapped.unmatched.len(), 2);
    assert_eq!(mapped.unmatched[0].get("node").map(String::as_str), Some("node-zz"));

    let seen = fake.seen.lock().expect("lock").clone();
    let (path, form, auth) = &seen[0];
    assert_eq!(path, "/prom/api/v1/query");
    assert_eq!(form.get("query").map(String::as_str), Some("avg by (node) (x)"));
    assert_eq!(form.get("time").map(String::as_str), Some("2026-03-03T10:00:00.000Z"));
    assert_eq!(form.get("timeout").map(String::as_str), Some("5000ms"));
    assert_eq!(auth.as_deref(), Some("Bearer tok-123"));
}

#[tokio::test]
async fn range_queries_send_the_range_and_map_series() {
    let (fake, base) = start_fake().await;
    let t0 = at().timestamp() as f64;
    set(
        &fake,
        200,
        json!({"status": "success", "data": {"resultType": "matrix", "result": [
            {"metric": {"node": "node-b"}, "values": [[t0, "1"], [t0 + 60.0, "2"]]},
        ]}}),
    );
    let prom = client(&base, Duration::from_secs(5), None);
    let end = at() + chrono::Duration::minutes(1);
    let mapped = prom
        .node_series("rate(x[5m])", at(), end, Duration::from_secs(60), &nodes())
        .await
        .expect("series");
    assert_eq!(mapped.matched.len(), 1);
    assert_eq!(mapped.matched[0].node, NodeId(2));
    assert_eq!(mapped.matched[0].points, vec![(at(), 1.0), (end, 2.0)]);
    let seen = fake.seen.lock().expect("lock").clone();
    let (path, form, auth) = &seen[0];
    assert_eq!(path, "/prom/api/v1/query_range");
    assert_eq!(form.get("start").map(String::as_str), Some("2026-03-03T10:00:00.000Z"));
    assert_eq!(form.get("end").map(String::as_str), Some("2026-03-03T10:01:00.000Z"));
    assert_eq!(form.get("step").map(String::as_str), Some("60"));
    assert_eq!(auth, &None);

    // Ranges Prometheus would refuse are refused before any request.
    let before = fake.seen.lock().expect("lock").len();
    for (start, end, step) in [
        (end, at(), Duration::from_secs(60)),
        (at(), end, Duration::ZERO),
        (at(), at() + chrono::Duration::days(1), Duration::from_secs(1)),
    ] {
        let err = prom.query_range("x", start, end, step).await.expect_err("refused");
        assert!(matches!(err, PrometheusError::BadRange { .. }), "{err}");
    }
    assert_eq!(fake.seen.lock().expect("lock").len(), before);
}

#[tokio::test]
async fn every_failure_is_a_typed_error() {
    let (fake, base) = start_fake().await;
    let prom = client(&base, Duration::from_millis(300), None);
    let scalar = json!({"status": "success", "data": {"resultType": "scalar", "result": [1.0, "2"]}});
    let cases: Vec<(u16, String, Duration, &str)> = vec![
        (
            400,
            json!({"status": "error", "errorType": "bad_data", "error": "parse error at char 3"}).to_string(),
            Duration::ZERO,
            "api",
        ),
        (
            503,
            json!({"status": "error", "errorType": "unavailable", "error": "too many queries"}).to_string(),
            Duration::ZERO,
            "api",
        ),
        (502, "<html>bad gateway</html>".into(), Duration::ZERO, "http"),
        (
            200,
            "{\"status\": \"success\", \"data\": ".into(),
            Duration::ZERO,
            "decode",
        ),
        (200, scalar.to_string(), Duration::ZERO, "result_type"),
        (
            200,
            json!({"status": "success", "data": {"resultType": "vector", "result": [
                {"metric": {"node": "node-a"}, "value": [1.0, "many"]}]}})
            .to_string(),
            Duration::ZERO,
            "bad_sample",
        ),
        (200, scalar.to_string(), Duration::from_secs(2), "timeout"),
    ];
    for (status, body, delay, expected) in cases {
        *fake.answer.lock().expect("lock") = (status, body.clone(), delay);
        let err = prom.node_samples("up", at(), &nodes()).await.expect_err("fails");
        let kind = match &err {
            PrometheusError::Api { .. } => "api",
            PrometheusError::Http { .. } => "http",
            PrometheusError::Decode { .. } => "decode",
            PrometheusError::ResultType { .. } => "result_type",
            PrometheusError::BadSample { .. } => "bad_sample",
            PrometheusError::Timeout { .. } => "timeout",
            _ => "other",
        };
        assert_eq!(kind, expected, "{status} {body}: {err}");
    }
    // The API's own message reaches the error text.
    *fake.answer.lock().expect("lock") = (
        400,
        json!({"status": "error", "errorType": "bad_data", "error": "parse error at char 3"}).to_string(),
        Duration::ZERO,
    );
    let err = prom.query("up{", at()).await.expect_err("fails");
    assert!(err.to_string().contains("bad_data): parse error at char 3"), "{err}");

    // A scalar is fine for a plain query.
    *fake.answer.lock().expect("lock") = (200, scalar.to_string(), Duration::ZERO);
    assert!(matches!(
        prom.query("1+1", at()).await.expect("scalar"),
        QueryData::Scalar { value, .. } if value == 2.0
    ));

    // Nothing listening.
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.local_addr().expect("addr").port()
    };
    let unreachable = client(&format!("http://127.0.0.1:{closed}"), Duration::from_secs(2), None);
    let err = unreachable.query("up", at()).await.expect_err("fails");
    assert!(matches!(err, PrometheusError::Transport { .. }), "{err}");
}

/// DCGM's windowed XID count through the Prometheus source counts a node's XID episodes, the unit the
/// Redfish path counts: a cascade over four GPUs in one read is one event, not four. Fixture: the
/// range query's answer, one series per GPU read every 5 minutes (the exporter's default window) for
/// an hour.
#[tokio::test]
async fn a_windowed_xid_cascade_over_a_nodes_gpus_counts_as_one_episode() {
    use orchestrator_db::health::Cohort;
    use orchestrator_engine::metric_source::{MetricSource, PrometheusSource, WatchedNode};
    let (fake, base) = start_fake().await;
    let t0 = at().timestamp() as f64;
    // XIDs per GPU in the read ending `minutes` after the start; every other read is 0.
    let series = |node: &str, gpu: &str, xids: &[(i64, u32)]| {
        let values: Vec<serde_json::Value> = (0..=12)
            .map(|k| {
                let minutes = k * 5;
                let v = xids.iter().find(|(m, _)| *m == minutes).map_or(0, |(_, n)| *n);
                json!([t0 + 60.0 * minutes as f64, v.to_string()])
            })
            .collect();
        json!({"metric": {"node": node, "gpu": gpu}, "values": values})
    };
    let mut result = Vec::new();
    for gpu in 0..8 {
        let gpu_name = gpu.to_string();
        // node-a: a cascade over GPUs 0-3 in the read at 10 min; GPU 0 alone again at 30 min.
        let a: &[(i64, u32)] = match gpu {
            0 => &[(10, 1), (30, 1)],
            1..=3 => &[(10, 1)],
            _ => &[],
        };
        // node-b: GPU 1 twice and GPU 2 once in the read at 20 min.
        let b: &[(i64, u32)] = match gpu {
            1 => &[(20, 2)],
            2 => &[(20, 1)],
            _ => &[],
        };
        result.push(series("node-a", &gpu_name, a));
        result.push(series("node-b", &gpu_name, b));
    }
    set(
        &fake,
        200,
        json!({"status": "success", "data": {"resultType": "matrix", "result": result}}),
    );
    let policy = orchestrator_policy::parse_policy(include_str!("../../../policies/hgx-dcgm.yaml")).expect("policy");
    let gate = policy.health.gate("xid_rate").expect("xid_rate gate");
    let watched = |id: i64, name: &str, cohort: Cohort| WatchedNode {
        node: NodeId(id),
        name: name.to_owned(),
        cohort,
        from: at(),
    };
    let nodes = [
        watched(1, "node-a", Cohort::Canary),
        watched(2, "node-b", Cohort::Control),
    ];
    let source = PrometheusSource::new(client(&base, Duration::from_secs(5), None));
    let look = source
        .look(gate, &nodes, at() + chrono::Duration::hours(1))
        .await
        .expect("look");
    let events = |id: i64| look.bins[&NodeId(id)].values().map(|b| b.events).sum::<u64>();
    let xids = |id: i64| {
        look.bins[&NodeId(id)]
            .values()
            .flat_map(|b| b.units.values())
            .sum::<f64>()
    };
    // Episodes: the cascade once and GPU 0's later XID; on node-b the read's largest GPU count.
    assert_eq!((events(1), events(2)), (2, 2), "{look:?}");
    // Each GPU still shows its own XIDs, each counted once.
    assert_eq!((xids(1), xids(2)), (5.0, 3.0), "{look:?}");
    assert_eq!(look.totals(&nodes, Cohort::Canary).0, 2);
    // The exposure is every GPU's: 8 GPUs over the hour.
    let (_, exposure) = look.totals(&nodes, Cohort::Canary);
    assert!((exposure - 8.0).abs() < 1e-9, "{exposure}");
}
