//! The Alertmanager webhook in-process (`oneshot`): authentication, payload
//! validation, idempotency, and what each alert does to a rollout, as
//! tables of cases over a small stored rollout.

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::http::{HeaderValue, Method, Request, StatusCode, header};
use chrono::{DateTime, Duration, Utc};
use http_body_util::BodyExt;
use orchestrator_db::AuditFilter;
use orchestrator_db::Db;
use orchestrator_db::alerts::{AlertStatus, NewAlert};
use orchestrator_db::execution::{
    NewPlan, NewStep, NewWave, RolloutState, StepChange, StepFilter, StepState, WaveKind,
};
use orchestrator_db::model::{NewNode, NewRelease, NewRollout, NodeLabels};
use orchestrator_db::testing::TestDb;
use orchestrator_types::{Clock, ComponentKind, FirmwareVersion, ManualClock, NodeId, RolloutId, WaveId};
use serde_json::{Value, json};
use tower::ServiceExt;
use web::{AlertReceiverConfig, AppState, app};

const TOKEN: &str = "test-alertmanager-token-0123456789";
const URI: &str = "/api/v1/alerts/alertmanager";

fn policy(automatic: bool, scope: &str) -> String {
    format!(
        r#"
name: alerts-test
target:
  component: gpu
  platforms: [hgx-h100-8gpu]
versions:
  allow_downgrade: false
qualification:
  required_gates: []
waves:
  - name: canary
    count: 2
    bake: 1h
    max_in_flight: 2
  - name: rest
    rest: true
    bake: 1h
    max_in_flight: 2
concurrency:
  max_in_flight: 4
failure_budget:
  max_failed: 1
health:
  alerts:
    - matchers: ['severity="critical"']
      action: pause
    - matchers: ['alertname=~"GpuXid(Storm|79)"']
      action: rollback
rollback:
  automatic: {automatic}
  scope: {scope}
"#
    )
}

/// A stored rollout: canary = node-a (flash succeeded just now) and node-b
/// (flashing); rest = node-c (pending). node-d is in no rollout.
struct Fixture {
    app: Router,
    db: Db,
    clock: Arc<ManualClock>,
    rollout: RolloutId,
    canary: WaveId,
    _test_db: TestDb,
}

async fn fixture_on(test_db: TestDb, clock: Arc<ManualClock>, policy_source: &str) -> Fixture {
    let db = test_db.db.clone();
    let nodes: Vec<NewNode> = ["node-a", "node-b", "node-c", "node-d"]
        .iter()
        .map(|name| NewNode {
            name: (*name).into(),
            bmc_url: format!("https://{name}.bmc.example"),
            credential_ref: "lab".into(),
            platform_sku: "hgx-h100-8gpu".into(),
            labels: NodeLabels {
                region: "r1".into(),
                cluster: "c1".into(),
                rack: "rack-1".into(),
                nvlink_domain: "nvl-1".into(),
            },
        })
        .collect();
    db.import_nodes(&nodes, "test").await.expect("import");
    let id = |name: &str| {
        let db = db.clone();
        let name = name.to_owned();
        async move { db.node_by_name(&name).await.expect("node").id }
    };
    let (a, b, c) = (id("node-a").await, id("node-b").await, id("node-c").await);
    let release = db
        .add_release(
            &NewRelease {
                component_kind: ComponentKind::Gpu,
                version: FirmwareVersion::parse("96.00.61.00.01").expect("version"),
                image_uri: "https://images.example/gpu.fw".into(),
                sha256: "ab".repeat(32),
                size_bytes: 1024,
                platforms: vec!["hgx-h100-8gpu".into()],
                release_notes: String::new(),
            },
            "alice",
        )
        .await
        .expect("release");
    let step = |node: NodeId| NewStep {
        node_id: node,
        inventory_id: "HGX_FW_GPU_*".into(),
        expected_from_version: "96.00.5E.00.01".into(),
    };
    let wave = |name: &str, steps: Vec<NewStep>| NewWave {
        name: name.into(),
        bake_seconds: 3600,
        approvals_required: 0,
        max_in_flight: 2,
        gates: vec![],
        control_nodes: vec![],
        role: None,
        steps,
    };
    let rollout = db
        .start_rollout(
            &NewRollout {
                release_id: release.id,
                policy_name: "alerts-test".into(),
                policy_commit: "c0ffee".into(),
                policy_blob: "b10b".into(),
                seed: 1,
            },
            policy_source,
            &NewPlan {
                waves: vec![wave("canary", vec![step(a), step(b)]), wave("rest", vec![step(c)])],
                rollback_assessment: json!({ "possible": true }),
            },
            "alice",
        )
        .await
        .expect("rollout");
    let fence = db
        .acquire_lease("executor", "test", Duration::hours(1))
        .await
        .expect("lease")
        .expect("lease free");
    let steps = db
        .steps(&StepFilter {
            rollout_id: Some(rollout.id),
            ..Default::default()
        })
        .await
        .expect("steps");
    let now = clock.now();
    for s in &steps {
        let to = if s.node_id == a {
            StepState::Succeeded
        } else if s.node_id == b {
            StepState::Flashing
        } else {
            continue;
        };
        let change = StepChange {
            state: Some(to),
            started_at: Some(now),
            finished_at: (to == StepState::Succeeded).then_some(now),
            ..Default::default()
        };
        db.transition_step(&fence, s.id, StepState::Pending, &change, json!({}))
            .await
            .expect("step moves");
    }
    db.release_lease(&fence).await.expect("lease released");
    let canary = db.rollout_waves(rollout.id).await.expect("waves")[0].id;
    let config = AlertReceiverConfig::new(TOKEN).expect("config");
    Fixture {
        app: app(AppState::new(db.clone()).with_alert_receiver(config)),
        db,
        clock,
        rollout: rollout.id,
        canary,
        _test_db: test_db,
    }
}

fn start_time() -> DateTime<Utc> {
    "2026-03-03T10:00:00Z".parse().expect("time")
}

async fn fixture(policy_source: &str) -> Fixture {
    let clock = Arc::new(ManualClock::new(start_time()));
    fixture_on(TestDb::sqlite(clock.clone()).await, clock, policy_source).await
}

async fn post(app: &Router, auth: Option<&str>, content_type: Option<&str>, body: String) -> (StatusCode, Value) {
    let mut request = Request::builder().method(Method::POST).uri(URI);
    if let Some(ct) = content_type {
        request = request.header(header::CONTENT_TYPE, ct);
    }
    if let Some(auth) = auth {
        request = request.header(header::AUTHORIZATION, HeaderValue::from_str(auth).expect("header"));
    }
    let response = app
        .clone()
        .oneshot(request.body(Body::from(body)).expect("request"))
        .await
        .expect("response");
    let status = response.status();
    let www = response.headers().get(header::WWW_AUTHENTICATE).cloned();
    let bytes = response.into_body().collect().await.expect("body").to_bytes();
    let mut value =
        serde_json::from_slice(&bytes).unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into()));
    if let (Some(www), Some(obj)) = (www, value.as_object_mut()) {
        obj.insert("www-authenticate".into(), www.to_str().unwrap_or("").into());
    }
    (status, value)
}

async fn deliver(app: &Router, payload: &Value) -> (StatusCode, Value) {
    post(
        app,
        Some(&format!("Bearer {TOKEN}")),
        Some("application/json"),
        payload.to_string(),
    )
    .await
}

/// One alert as Alertmanager 0.25 writes it.
fn alert(status: &str, fingerprint: &str, labels: Value) -> Value {
    json!({
        "status": status,
        "labels": labels,
        "annotations": { "summary": "XID errors on the canary" },
        "startsAt": "2026-03-03T09:59:00.123Z",
        "endsAt": if status == "resolved" { "2026-03-03T10:05:00Z" } else { "0001-01-01T00:00:00Z" },
        "generatorURL": "http://prometheus.example/graph?g0.expr=xid",
        "fingerprint": fingerprint,
    })
}

fn notification(alerts: Vec<Value>) -> Value {
    json!({
        "version": "4",
        "groupKey": "{}:{alertname=\"GpuXidStorm\"}",
        "truncatedAlerts": 0,
        "status": alerts.first().and_then(|a| a["status"].as_str()).unwrap_or("firing"),
        "receiver": "waveguard",
        "groupLabels": { "alertname": "GpuXidStorm" },
        "commonLabels": {},
        "commonAnnotations": {},
        "externalURL": "http://alertmanager.example",
        "alerts": alerts,
    })
}

async fn audit(db: &Db, action: &str) -> Vec<Value> {
    db.audit_entries(&AuditFilter {
        action: Some(action.into()),
        ..Default::default()
    })
    .await
    .expect("audit")
    .into_iter()
    .map(|e| e.details)
    .collect()
}

/// (authorization header, content type, body, expected status, message fragment)
type RefusalCase<'a> = (Option<&'a str>, Option<&'a str>, String, StatusCode, &'a str);

#[tokio::test]
async fn refuses_callers_without_the_token_and_bad_payloads_without_storing_anything() {
    let f = fixture(&policy(true, "wave")).await;
    let good = notification(vec![alert(
        "firing",
        "a1b2c3d4e5f60718",
        json!({"alertname": "GpuXidStorm", "node": "node-a"}),
    )])
    .to_string();
    let bearer = format!("Bearer {TOKEN}");
    let bearer_longer = format!("Bearer {TOKEN}x");
    let basic = format!("Basic {TOKEN}");
    let json_ct = Some("application/json");
    let mut bad_version = notification(vec![]);
    bad_version["version"] = json!("3");
    let mut no_fingerprint = notification(vec![alert("firing", "x", json!({"node": "node-a"}))]);
    no_fingerprint["alerts"][0]
        .as_object_mut()
        .expect("object")
        .remove("fingerprint");
    let mut bad_start = notification(vec![alert("firing", "abc", json!({"node": "node-a"}))]);
    bad_start["alerts"][0]["startsAt"] = json!("yesterday");
    let bad_status = notification(vec![alert("pending", "abc", json!({"node": "node-a"}))]);
    let bad_fingerprint = notification(vec![alert("firing", "abc def", json!({"node": "node-a"}))]);
    let too_many = notification(
        (0..1001)
            .map(|i| alert("firing", &format!("f{i}"), json!({"node": "node-a"})))
            .collect(),
    );
    let cases: Vec<RefusalCase> = vec![
        (None, json_ct, good.clone(), StatusCode::UNAUTHORIZED, "bearer token"),
        (
            Some("Bearer wrong-token-wrong-token"),
            json_ct,
            good.clone(),
            StatusCode::UNAUTHORIZED,
            "bearer token",
        ),
        (
            Some(&bearer_longer),
            json_ct,
            good.clone(),
            StatusCode::UNAUTHORIZED,
            "bearer token",
        ),
        (
            Some(&basic),
            json_ct,
            good.clone(),
            StatusCode::UNAUTHORIZED,
            "bearer token",
        ),
        (
            Some(TOKEN),
            json_ct,
            good.clone(),
            StatusCode::UNAUTHORIZED,
            "bearer token",
        ),
        // Unauthenticated garbage is refused before it is parsed.
        (
            None,
            json_ct,
            "{not json".into(),
            StatusCode::UNAUTHORIZED,
            "bearer token",
        ),
        (
            Some(&bearer),
            Some("text/plain"),
            good.clone(),
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "application/json",
        ),
        (
            Some(&bearer),
            None,
            good.clone(),
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "application/json",
        ),
        (
            Some(&bearer),
            json_ct,
            "{not json".into(),
            StatusCode::BAD_REQUEST,
            "line 1 column 2",
        ),
        (
            Some(&bearer),
            json_ct,
            "{}".into(),
            StatusCode::UNPROCESSABLE_ENTITY,
            "missing field `version`",
        ),
        (
            Some(&bearer),
            json_ct,
            bad_version.to_string(),
            StatusCode::UNPROCESSABLE_ENTITY,
            "version \"3\"",
        ),
        (
            Some(&bearer),
            json_ct,
            no_fingerprint.to_string(),
            StatusCode::UNPROCESSABLE_ENTITY,
            "alerts[0]: missing fingerprint",
        ),
        (
            Some(&bearer),
            json_ct,
            bad_start.to_string(),
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid",
        ),
        (
            Some(&bearer),
            json_ct,
            bad_status.to_string(),
            StatusCode::UNPROCESSABLE_ENTITY,
            "unknown alert status \"pending\"",
        ),
        (
            Some(&bearer),
            json_ct,
            bad_fingerprint.to_string(),
            StatusCode::UNPROCESSABLE_ENTITY,
            "alerts[0]: fingerprint",
        ),
        (
            Some(&bearer),
            json_ct,
            too_many.to_string(),
            StatusCode::UNPROCESSABLE_ENTITY,
            "1001 alerts",
        ),
    ];
    for (i, (auth, ct, body, status, fragment)) in cases.into_iter().enumerate() {
        let (got, value) = post(&f.app, auth, ct, body).await;
        assert_eq!(got, status, "case {i}: {value}");
        let message = value["error"]["message"].as_str().unwrap_or_default();
        assert!(message.contains(fragment), "case {i}: {message:?} lacks {fragment:?}");
        assert!(
            !value.to_string().contains(TOKEN),
            "case {i}: the token leaked: {value}"
        );
        if got == StatusCode::UNAUTHORIZED {
            assert_eq!(value["error"]["code"], "unauthorized");
            assert_eq!(value["www-authenticate"], "Bearer", "case {i}");
        }
    }
    assert!(f.db.alerts(&Default::default()).await.expect("alerts").is_empty());
    assert!(audit(&f.db, "alert.receive").await.is_empty());
    assert_eq!(
        f.db.exec_rollout(f.rollout).await.expect("rollout").state,
        RolloutState::Running
    );

    // A controller without a token configured accepts nothing.
    let unconfigured = app(AppState::new(f.db.clone()));
    let (status, value) = post(&unconfigured, Some(&bearer), json_ct, good).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{value}");
    assert!(f.db.alerts(&Default::default()).await.expect("alerts").is_empty());
}

/// What one firing alert does to the fixture's rollout.
struct Case {
    name: &'static str,
    policy: String,
    labels: Value,
    status: &'static str,
    /// Advance the clock before delivering (to age node-a's flash).
    after: Duration,
    rollout_state: RolloutState,
    /// (requested, result) for the one rollout, or None when no rollout is concerned.
    action: Option<(&'static str, &'static str)>,
    note: Option<&'static str>,
}

#[tokio::test]
async fn each_alert_does_what_the_rollouts_policy_says() {
    let storm_on = |node: &str| json!({"alertname": "GpuXidStorm", "node": node, "severity": "warning"});
    let critical_on = |node: &str| json!({"alertname": "NodeHot", "node": node, "severity": "critical"});
    let cases = vec![
        Case {
            name: "rollback rule on a node updated just now rolls back",
            policy: policy(true, "wave"),
            labels: storm_on("node-a"),
            status: "firing",
            after: Duration::zero(),
            rollout_state: RolloutState::RollingBack,
            action: Some(("rollback", "rollback_started")),
            note: None,
        },
        Case {
            name: "rollback rule on a node being flashed rolls back",
            policy: policy(true, "rollout"),
            labels: storm_on("node-b"),
            status: "firing",
            after: Duration::zero(),
            rollout_state: RolloutState::RollingBack,
            action: Some(("rollback", "rollback_started")),
            note: None,
        },
        Case {
            name: "rollback and pause both match: the worst wins",
            policy: policy(true, "wave"),
            labels: json!({"alertname": "GpuXid79", "node": "node-a", "severity": "critical"}),
            status: "firing",
            after: Duration::zero(),
            rollout_state: RolloutState::RollingBack,
            action: Some(("rollback", "rollback_started")),
            note: None,
        },
        Case {
            name: "no automatic rollback in the policy: paused for a human",
            policy: policy(false, "wave"),
            labels: storm_on("node-a"),
            status: "firing",
            after: Duration::zero(),
            rollout_state: RolloutState::Paused,
            action: Some(("rollback", "paused")),
            note: None,
        },
        Case {
            name: "pause rule pauses",
            policy: policy(true, "wave"),
            labels: critical_on("node-b"),
            status: "firing",
            after: Duration::zero(),
            rollout_state: RolloutState::Paused,
            action: Some(("pause", "paused")),
            note: None,
        },
        Case {
            name: "no rule matches: recorded, nothing done",
            policy: policy(true, "wave"),
            labels: json!({"alertname": "DiskFull", "node": "node-a", "severity": "warning"}),
            status: "firing",
            after: Duration::zero(),
            rollout_state: RolloutState::Running,
            action: Some(("none", "unchanged")),
            note: None,
        },
        Case {
            name: "a node whose step has not started is not concerned",
            policy: policy(true, "wave"),
            labels: storm_on("node-c"),
            status: "firing",
            after: Duration::zero(),
            rollout_state: RolloutState::Running,
            action: None,
            note: Some("not in flight nor recently updated"),
        },
        Case {
            name: "a node in no rollout is not concerned",
            policy: policy(true, "wave"),
            labels: storm_on("node-d"),
            status: "firing",
            after: Duration::zero(),
            rollout_state: RolloutState::Running,
            action: None,
            note: Some("not in flight nor recently updated"),
        },
        Case {
            name: "an unknown node is not concerned",
            policy: policy(true, "wave"),
            labels: storm_on("node-zz"),
            status: "firing",
            after: Duration::zero(),
            rollout_state: RolloutState::Running,
            action: None,
            note: Some("not in flight nor recently updated"),
        },
        Case {
            name: "an update long ago is not recent",
            policy: policy(true, "wave"),
            labels: storm_on("node-a"),
            status: "firing",
            after: Duration::hours(AlertReceiverConfig::DEFAULT_RECENT_HOURS + 1),
            rollout_state: RolloutState::Running,
            action: None,
            note: Some("not in flight nor recently updated"),
        },
        Case {
            name: "an alert without the node label concerns no node",
            policy: policy(true, "wave"),
            labels: json!({"alertname": "GpuXidStorm", "instance": "node-a:9100"}),
            status: "firing",
            after: Duration::zero(),
            rollout_state: RolloutState::Running,
            action: None,
            note: Some("no \"node\" label"),
        },
        Case {
            name: "a resolved alert triggers nothing",
            policy: policy(true, "wave"),
            labels: storm_on("node-a"),
            status: "resolved",
            after: Duration::zero(),
            rollout_state: RolloutState::Running,
            action: None,
            note: Some("resolved alerts"),
        },
    ];
    for case in cases {
        let f = fixture(&case.policy).await;
        f.clock.advance(case.after);
        let (status, body) = deliver(
            &f.app,
            &notification(vec![alert(case.status, "0f1e2d3c4b5a6978", case.labels)]),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{}: {body}", case.name);
        let report = &body["alerts"][0];
        assert_eq!(report["processed"], true, "{}: {body}", case.name);
        assert_eq!(report["duplicate"], false, "{}", case.name);
        let actions = report["actions"].as_array().expect("actions");
        match case.action {
            Some((requested, result)) => {
                assert_eq!(actions.len(), 1, "{}: {body}", case.name);
                assert_eq!(actions[0]["rollout_id"], f.rollout.0, "{}", case.name);
                assert_eq!(actions[0]["requested"], requested, "{}: {body}", case.name);
                assert_eq!(actions[0]["result"], result, "{}: {body}", case.name);
            }
            None => assert!(actions.is_empty(), "{}: {body}", case.name),
        }
        if let Some(note) = case.note {
            let got = report["note"].as_str().unwrap_or_default();
            assert!(got.contains(note), "{}: note {got:?} lacks {note:?}", case.name);
        }
        let rollout = f.db.exec_rollout(f.rollout).await.expect("rollout");
        assert_eq!(rollout.state, case.rollout_state, "{}", case.name);

        // Stored, processed, and audited with the alert as evidence.
        let stored = f.db.alerts(&Default::default()).await.expect("alerts");
        assert_eq!(stored.len(), 1, "{}", case.name);
        assert!(stored[0].processed_at.is_some(), "{}", case.name);
        assert_eq!(stored[0].alertname, case_alertname(&stored[0].labels), "{}", case.name);
        assert_eq!(audit(&f.db, "alert.receive").await.len(), 1, "{}", case.name);
        let actions_audited = audit(&f.db, "alert.action").await;
        assert_eq!(
            actions_audited.len(),
            usize::from(case.action.is_some()),
            "{}",
            case.name
        );
        if let Some(entry) = actions_audited.first() {
            assert_eq!(entry["alert"]["fingerprint"], "0f1e2d3c4b5a6978", "{}", case.name);
            assert_eq!(entry["alert"]["annotations"]["summary"], "XID errors on the canary");
            assert!(entry["nodes"][0]["node_name"].is_string(), "{}: {entry}", case.name);
        }
        if rollout.state == RolloutState::RollingBack {
            let waves = f.db.rollout_waves(f.rollout).await.expect("waves");
            let rollback = waves
                .iter()
                .find(|w| w.kind == WaveKind::Rollback)
                .expect("rollback wave");
            let scope = rollback.scope.clone().expect("scope");
            if scope["scope"] == "wave" {
                assert_eq!(scope["waves"], json!([f.canary.0]), "{}", case.name);
            }
            assert!(
                rollout
                    .state_reason
                    .as_deref()
                    .unwrap_or("")
                    .contains("0f1e2d3c4b5a6978"),
                "{}: {:?}",
                case.name,
                rollout.state_reason
            );
            let by = audit(&f.db, "rollout.rolling_back").await;
            assert_eq!(by.len(), 1, "{}", case.name);
        }
    }
}

fn case_alertname(labels: &std::collections::BTreeMap<String, String>) -> String {
    labels.get("alertname").cloned().unwrap_or_default()
}

#[tokio::test]
async fn redeliveries_act_once_and_an_interrupted_alert_is_finished_by_its_redelivery() {
    let clock = Arc::new(ManualClock::new(start_time()));
    for test_db in TestDb::all_backends_with_clock(clock.clone()).await {
        let f = fixture_on(test_db, clock.clone(), &policy(true, "wave")).await;
        let storm = alert(
            "firing",
            "1122334455667788",
            json!({"alertname": "GpuXidStorm", "node": "node-a"}),
        );
        let payload = notification(vec![storm.clone()]);
        let (status, first) = deliver(&f.app, &payload).await;
        assert_eq!(status, StatusCode::OK, "{first}");
        assert_eq!(first["alerts"][0]["actions"][0]["result"], "rollback_started");
        for _ in 0..3 {
            let (status, again) = deliver(&f.app, &payload).await;
            assert_eq!(status, StatusCode::OK, "{again}");
            assert_eq!(again["alerts"][0]["duplicate"], true);
            assert_eq!(again["alerts"][0]["processed"], false);
            assert_eq!(again["alerts"][0]["alert_id"], first["alerts"][0]["alert_id"]);
        }
        let waves = f.db.rollout_waves(f.rollout).await.expect("waves");
        assert_eq!(waves.iter().filter(|w| w.kind == WaveKind::Rollback).count(), 1);
        assert_eq!(audit(&f.db, "alert.receive").await.len(), 1);
        assert_eq!(audit(&f.db, "alert.action").await.len(), 1);

        // Its resolution is a new record that does nothing.
        let (status, resolved) = deliver(
            &f.app,
            &notification(vec![alert(
                "resolved",
                "1122334455667788",
                json!({"alertname": "GpuXidStorm", "node": "node-a"}),
            )]),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{resolved}");
        assert_eq!(resolved["alerts"][0]["duplicate"], false);
        assert_eq!(f.db.alerts(&Default::default()).await.expect("alerts").len(), 2);

        // A controller that stored an alert and crashed before acting: the
        // redelivery finds it unprocessed and acts.
        let g = fixture(&policy(true, "wave")).await;
        let crashed = NewAlert {
            fingerprint: "99aa88bb77cc66dd".into(),
            status: AlertStatus::Firing,
            starts_at: "2026-03-03T09:59:00.123Z".parse().expect("time"),
            ends_at: None,
            labels: [("alertname", "NodeHot"), ("severity", "critical"), ("node", "node-b")]
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            annotations: Default::default(),
            generator_url: None,
            receiver: "waveguard".into(),
            group_key: "{}".into(),
        };
        g.db.record_alert(&crashed, "alertmanager").await.expect("stored");
        let (status, redelivered) = deliver(
            &g.app,
            &notification(vec![alert(
                "firing",
                "99aa88bb77cc66dd",
                json!({"alertname": "NodeHot", "severity": "critical", "node": "node-b"}),
            )]),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{redelivered}");
        assert_eq!(redelivered["alerts"][0]["duplicate"], true);
        assert_eq!(redelivered["alerts"][0]["processed"], true);
        assert_eq!(redelivered["alerts"][0]["actions"][0]["result"], "paused");
        assert_eq!(
            g.db.exec_rollout(g.rollout).await.expect("rollout").state,
            RolloutState::Paused
        );
    }
}

#[tokio::test]
async fn one_notification_with_several_alerts_acts_on_the_rollout_once() {
    let f = fixture(&policy(true, "wave")).await;
    let payload = notification(vec![
        alert(
            "firing",
            "aaaa000000000001",
            json!({"alertname": "GpuXidStorm", "node": "node-a"}),
        ),
        alert(
            "firing",
            "aaaa000000000002",
            json!({"alertname": "GpuXidStorm", "node": "node-b"}),
        ),
        alert(
            "firing",
            "aaaa000000000003",
            json!({"alertname": "NodeHot", "severity": "critical", "node": "node-b"}),
        ),
    ]);
    let (status, body) = deliver(&f.app, &payload).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["received"], 3);
    let results: Vec<&str> = body["alerts"]
        .as_array()
        .expect("alerts")
        .iter()
        .map(|a| a["actions"][0]["result"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(results, ["rollback_started", "unchanged", "unchanged"], "{body}");
    let waves = f.db.rollout_waves(f.rollout).await.expect("waves");
    assert_eq!(waves.iter().filter(|w| w.kind == WaveKind::Rollback).count(), 1);
    assert_eq!(
        f.db.exec_rollout(f.rollout).await.expect("rollout").state,
        RolloutState::RollingBack
    );

    // The listing shows them, newest first, filterable.
    let token = web::auth::provision_api_token(&f.db, "reader", orchestrator_types::Role::Viewer, "t", "test")
        .await
        .expect("token");
    let request = Request::builder()
        .uri("/api/v1/alerts?fingerprint=aaaa000000000002")
        .header(header::AUTHORIZATION, format!("Bearer {token}"))
        .body(Body::empty())
        .expect("request");
    let response = f.app.clone().oneshot(request).await.expect("response");
    assert_eq!(response.status(), StatusCode::OK);
    let bytes = response.into_body().collect().await.expect("body").to_bytes();
    let listed: Value = serde_json::from_slice(&bytes).expect("json");
    assert_eq!(listed.as_array().map(Vec::len), Some(1), "{listed}");
    assert_eq!(listed[0]["labels"]["node"], "node-b");
}
