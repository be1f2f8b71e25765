//! Workload scheduler drains on the API and the pages, in-process
//! (`oneshot`). No engine and no scheduler run: the drain records and step
//! states are written as the engine writes them (under an executor lease),
//! one node per state a release manager should be able to tell apart.

mod common;

use std::collections::HashMap;

use axum::Router;
use axum::http::{Method, StatusCode};
use chrono::Duration;
use common::{authed_app, call, get_page, post_form};
use orchestrator_db::Db;
use orchestrator_db::drains::NewDrain;
use orchestrator_db::execution::{ExecStep, Fence, StepChange, StepFilter, StepState};
use orchestrator_db::testing::TestDb;
use orchestrator_db::testing::fixtures::{PolicyYaml, gpu_nodes, new_rollout, plain_release, plan, steps, wave};
use orchestrator_types::{DrainPhase, Outcome, Role, RolloutId, WaveId, WaveVerdict};
use serde_json::{Value, json};
use web::AppState;
use web::auth::provision_api_token;

/// What a Slurm node reads as, serialized as the engine stores it.
fn reading(name: &str, base: &str, alloc_cpus: u32, tag: &str) -> Value {
    json!({
        "name": name, "base": base, "drain": true, "responding": true, "completing": false,
        "reboot_pending": false, "alloc_cpus": alloc_cpus,
        "reason": { "text": tag, "set_by": "root", "set_at": 1_796_000_000 },
        "boot_time": 1_795_000_000,
    })
}

struct Seeded {
    rollout: RolloutId,
    canary: WaveId,
}

/// Ten 8-GPU nodes in one cluster (80 GPUs); a canary of node-0..6 and a
/// `rest` wave of node-7..9 (3 at a time) under a policy capping capacity
/// out of service at 20%; the canary awaits approval. In the canary:
///
/// | node | drain record | step |
/// |---|---|---|
/// | node-0 | held, 24 CPUs still allocated | pending |
/// | node-1 | held, idle | pending |
/// | node-2 | held | flashing |
/// | node-3 | closed, resumed | succeeded |
/// | node-4 | none (an operator's drain) | deferred |
/// | node-5 | quarantined | failed |
/// | node-6 | resume intended after the drain timeout | deferred |
async fn seed(db: &Db) -> Seeded {
    let nodes = gpu_nodes(10).seed(db).await.unwrap();
    let release = db.add_release(&plain_release(), "rita").await.unwrap();
    let policy = PolicyYaml::two_waves("drained")
        .concurrency(10, &["max_out_of_service_percent: 20"])
        .render();
    let waves = vec![
        wave("canary", 60, 1, 7, steps(&nodes[..7], "GPU_*", "1")),
        wave("rest", 60, 0, 3, steps(&nodes[7..], "GPU_*", "1")),
    ];
    let rollout = db
        .start_rollout(&new_rollout(release.id), &policy, &plan(waves), "rita")
        .await
        .unwrap();
    let canary = db.rollout_waves(rollout.id).await.unwrap()[0].id;
    let all = db
        .steps(&StepFilter {
            rollout_id: Some(rollout.id),
            wave_id: Some(canary),
            ..Default::default()
        })
        .await
        .unwrap();
    let names = db
        .node_names(&all.iter().map(|s| s.node_id).collect::<Vec<_>>())
        .await
        .unwrap();
    let step: HashMap<String, ExecStep> = all.into_iter().map(|s| (names[&s.node_id].clone(), s)).collect();
    let fence = db
        .acquire_lease("executor", "test", Duration::hours(1))
        .await
        .unwrap()
        .unwrap();
    let tag = format!("waveguard rollout={} firmware maintenance", rollout.id);

    let held = |name: &'static str, base: &'static str, cpus: u32| {
        let (step, fence, tag) = (&step[name], &fence, tag.clone());
        async move {
            let row = db
                .record_drain_intent(
                    fence,
                    &NewDrain {
                        rollout_id: step.rollout_id,
                        wave_id: step.wave_id,
                        step_id: step.id,
                        node_id: step.node_id,
                        scheduler_kind: "slurm".into(),
                        scheduler_node: format!("sl-{name}"),
                        reason_text: tag.clone(),
                        observed_before: json!({ "name": format!("sl-{name}"), "base": "mixed", "drain": false }),
                    },
                )
                .await
                .unwrap();
            db.move_drain(fence, row.id, DrainPhase::DrainIntended, DrainPhase::Held, None)
                .await
                .unwrap();
            db.set_drain_seen(fence, row.id, reading(&format!("sl-{name}"), base, cpus, &tag))
                .await
                .unwrap();
            row.id
        }
    };
    let step_to = |name: &'static str, to: StepState, error: Option<&str>| {
        let (step, fence) = (&step[name], &fence);
        let change = StepChange {
            state: Some(to),
            error: error.map(|e| Some(e.to_owned())),
            ..Default::default()
        };
        async move {
            db.transition_step(fence, step.id, StepState::Pending, &change, json!({}))
                .await
                .unwrap();
        }
    };

    held("node-0", "mixed", 24).await;
    held("node-1", "idle", 0).await;
    held("node-2", "idle", 0).await;
    step_to("node-2", StepState::Flashing, None).await;
    let resumed = held("node-3", "idle", 0).await;
    step_to("node-3", StepState::Succeeded, None).await;
    db.move_drain(&fence, resumed, DrainPhase::Held, DrainPhase::ResumeIntended, None)
        .await
        .unwrap();
    db.move_drain(
        &fence,
        resumed,
        DrainPhase::ResumeIntended,
        DrainPhase::Closed,
        Some("resumed"),
    )
    .await
    .unwrap();
    step_to(
        "node-4",
        StepState::Deferred,
        Some("drained by someone else in the workload scheduler: \"rack swap\" (set by bob)"),
    )
    .await;
    let quarantined = held("node-5", "idle", 0).await;
    step_to("node-5", StepState::Failed, Some("GPU 3 missing after flash")).await;
    db.move_drain(
        &fence,
        quarantined,
        DrainPhase::Held,
        DrainPhase::Quarantined,
        Some("GPU 3 missing after flash"),
    )
    .await
    .unwrap();
    let timed_out = held("node-6", "mixed", 8).await;
    db.move_drain(
        &fence,
        timed_out,
        DrainPhase::Held,
        DrainPhase::ResumeIntended,
        Some("drain_timeout"),
    )
    .await
    .unwrap();
    step_to(
        "node-6",
        StepState::Deferred,
        Some(
            "did not empty within the wave's drain_timeout (30 min; waiting on jobs (8 CPUs allocated)): \
             skipped for this wave",
        ),
    )
    .await;
    release_lease(db, fence).await;
    orchestrator_db::testing::await_approval(
        db,
        canary,
        WaveVerdict {
            outcome: Outcome::Pass,
            summary: "healthy".into(),
            evidence: json!({}),
        },
    )
    .await
    .unwrap();
    Seeded {
        rollout: rollout.id,
        canary,
    }
}

async fn release_lease(db: &Db, fence: Fence) {
    db.release_lease(&fence).await.unwrap();
}

fn by_node(rows: &Value) -> HashMap<String, Value> {
    rows.as_array()
        .unwrap()
        .iter()
        .map(|r| (r["scheduler_node"].as_str().unwrap().to_owned(), r.clone()))
        .collect()
}

#[tokio::test]
async fn the_api_lists_a_rollouts_and_a_nodes_drain_records() {
    for t in TestDb::all_backends().await {
        let seeded = seed(&t.db).await;
        let app = authed_app(AppState::new(t.db.clone())).await;
        let id = seeded.rollout.0;

        let (status, rows) = call(&app, Method::GET, &format!("/api/v1/rollouts/{id}/drains"), None).await;
        assert_eq!(status, StatusCode::OK, "{rows}");
        let rows = by_node(&rows);
        let phases: Vec<(&str, &str)> = ["node-0", "node-1", "node-2", "node-3", "node-5", "node-6"]
            .iter()
            .map(|n| (*n, rows[&format!("sl-{n}")]["phase"].as_str().unwrap()))
            .collect();
        assert_eq!(
            phases,
            [
                ("node-0", "held"),
                ("node-1", "held"),
                ("node-2", "held"),
                ("node-3", "closed"),
                ("node-5", "quarantined"),
                ("node-6", "resume_intended"),
            ]
        );
        assert_eq!(rows.len(), 6, "node-4 was deferred without a drain of ours");
        let busy = &rows["sl-node-0"];
        assert_eq!(busy["last_seen"]["alloc_cpus"], 24);
        assert_eq!(busy["observed_before"]["drain"], false);
        assert_eq!(busy["rollout_id"], id);
        assert_eq!(busy["scheduler_kind"], "slurm");
        assert_eq!(
            busy["reason_text"],
            format!("waveguard rollout={id} firmware maintenance")
        );
        assert!(busy["held_at"].is_string() && busy["closed_at"].is_null(), "{busy}");
        assert_eq!(rows["sl-node-3"]["close_reason"], "resumed");
        assert!(rows["sl-node-3"]["closed_at"].is_string());

        let (status, node) = call(&app, Method::GET, "/api/v1/nodes/node-5/drains", None).await;
        assert_eq!(status, StatusCode::OK, "{node}");
        assert_eq!(node.as_array().unwrap().len(), 1);
        assert_eq!(node[0]["phase"], "quarantined");
        assert_eq!(node[0]["close_reason"], "GPU 3 missing after flash");
        let (_, never) = call(&app, Method::GET, "/api/v1/nodes/node-9/drains", None).await;
        assert_eq!(never, json!([]));

        for uri in ["/api/v1/rollouts/999/drains", "/api/v1/nodes/no-such-node/drains"] {
            let (status, body) = call(&app, Method::GET, uri, None).await;
            assert_eq!(status, StatusCode::NOT_FOUND, "{uri}: {body}");
        }
        let (status, _) = call(&app, Method::GET, "/api/v1/rollouts/x/drains", None).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
    }
}

#[tokio::test]
async fn drain_records_are_read_with_the_rollout_readers_role() {
    let t = TestDb::sqlite(std::sync::Arc::new(orchestrator_types::SystemClock)).await;
    let seeded = seed(&t.db).await;
    let viewer = provision_api_token(&t.db, "vic", Role::Viewer, "t", "test")
        .await
        .unwrap();
    let app = web::app(AppState::new(t.db.clone()));
    let uri = format!("/api/v1/rollouts/{}/drains", seeded.rollout);
    let (status, _) = get_page(&app, &viewer, &uri).await;
    assert_eq!(status, StatusCode::OK, "a viewer reads drains as it reads the rollout");
    let (status, _) = call(&app, Method::GET, &uri, None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "nobody reads them anonymously");

    let (_, doc) = call(
        &authed_app(AppState::new(t.db.clone())).await,
        Method::GET,
        "/api/v1/openapi.json",
        None,
    )
    .await;
    for path in ["/api/v1/rollouts/{id}/drains", "/api/v1/nodes/{name}/drains"] {
        assert!(doc["paths"][path]["get"].is_object(), "{path} documented");
    }
    assert!(doc["components"]["schemas"]["DrainRow"].is_object());
}

async fn page(app: &Router, token: &str, uri: &str) -> String {
    let (status, body) = get_page(app, token, uri).await;
    assert_eq!(status, StatusCode::OK, "{uri}: {body}");
    // Nothing of a stored scheduler reading leaks as raw JSON.
    for raw in [
        "alloc_cpus",
        "observed_before",
        "last_seen",
        "reboot_pending",
        "boot_time",
        "set_at",
    ] {
        assert!(!body.contains(raw), "{uri} shows raw {raw:?}");
    }
    body
}

#[tokio::test]
async fn the_rollout_page_says_each_drained_nodes_state_in_words() {
    let t = TestDb::sqlite(std::sync::Arc::new(orchestrator_types::SystemClock)).await;
    let seeded = seed(&t.db).await;
    let sam = provision_api_token(&t.db, "sam", Role::ReleaseManager, "t", "test")
        .await
        .unwrap();
    let app = web::app(AppState::new(t.db.clone()));
    let body = page(&app, &sam, &format!("/rollouts/{}", seeded.rollout)).await;
    let section = body
        .split(r#"id="scheduler""#)
        .nth(1)
        .and_then(|s| s.split("</section>").next())
        .unwrap_or_else(|| panic!("no scheduler section:\n{body}"));
    let row_of = |node: &str| {
        section
            .split("<tr class=\"drain\">")
            .find(|row| row.contains(&format!("href=\"/nodes/{node}\"")))
            .unwrap_or_else(|| panic!("no row for {node}:\n{section}"))
            .to_owned()
    };
    let expect = [
        ("node-0", "draining (24 CPUs still allocated)"),
        ("node-1", "drained, waiting to flash"),
        ("node-2", "flashing"),
        ("node-3", "in service again (resumed)"),
        (
            "node-4",
            "left alone: drained by someone else in the workload scheduler: &quot;rack swap&quot; (set by bob)",
        ),
        ("node-5", "quarantined: GPU 3 missing after flash"),
        ("node-6", "resuming (did not empty in time)"),
    ];
    for (node, words) in expect {
        let row = row_of(node);
        assert!(row.contains(words), "{node} should read {words:?}:\n{row}");
    }
    let tag = format!("waveguard rollout={} firmware maintenance", seeded.rollout);
    let ours = row_of("node-0");
    assert!(ours.contains("sl-node-0") && ours.contains("Waveguard (as root in slurm)") && ours.contains(&tag));
    let operator = row_of("node-4");
    assert!(operator.contains("not drained by Waveguard") && !operator.contains(&tag));
    assert!(
        row_of("node-6").contains("left out of the wave: did not empty within the wave&#x27;s drain_timeout"),
        "{}",
        row_of("node-6")
    );
    assert!(
        !section.contains("node-7"),
        "nodes the rollout did not drain are not listed"
    );
    // Deferred steps keep their reason in the node table too.
    assert!(body.contains("st-deferred") && body.contains("skipped for this wave"));

    // The approval box says what the next wave takes out at once: three
    // 8-GPU nodes may go together, but 20% of 80 GPUs is two of them.
    let capacity = "Approving starts wave rest: 3 node(s), at most 3 at a time. Out of service at once (drained, \
                    draining or flashing), under the policy&#x27;s cap of 20% of a cluster&#x27;s GPUs: at most 16 \
                    of 80 GPUs (20%) in cluster c1.";
    assert!(
        body.contains(&format!(r#"id="capacity-{}">{capacity}"#, seeded.canary)),
        "{body}"
    );
    assert!(
        body.contains(&format!("data-confirm=\"Approve wave canary? {capacity}\"")),
        "the dialog says it too"
    );
    let (status, _, confirm) = post_form(
        &app,
        &sam,
        &format!("/rollouts/{}/approve", seeded.rollout),
        &format!("wave={}", seeded.canary),
        false,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{confirm}");
    assert!(confirm.contains(capacity), "the confirmation page says it:\n{confirm}");
}

#[tokio::test]
async fn the_node_page_lists_its_drains_newest_first() {
    let t = TestDb::sqlite(std::sync::Arc::new(orchestrator_types::SystemClock)).await;
    let seeded = seed(&t.db).await;
    let viewer = provision_api_token(&t.db, "vic", Role::Viewer, "t", "test")
        .await
        .unwrap();
    let app = web::app(AppState::new(t.db.clone()));
    let id = seeded.rollout;

    let resumed = page(&app, &viewer, "/nodes/node-3").await;
    let history = resumed
        .split(r#"id="drain-history""#)
        .nth(1)
        .and_then(|s| s.split("</section>").next())
        .unwrap_or_else(|| panic!("no drain history:\n{resumed}"));
    for want in [
        format!("href=\"/rollouts/{id}\">#{id}</a>"),
        "sl-node-3".to_owned(),
        "in service again (resumed)".to_owned(),
        "Waveguard (as root in slurm)".to_owned(),
        "resumed</span>".to_owned(),
        "<td class=\"small\">resumed</td>".to_owned(),
    ] {
        assert!(
            history.contains(&want),
            "node-3's history should show {want:?}:\n{history}"
        );
    }
    assert_eq!(
        history.matches("UTC").count(),
        3,
        "drained, held and closed at:\n{history}"
    );

    let quarantined = page(&app, &viewer, "/nodes/node-5").await;
    assert!(quarantined.contains(">quarantined</td>") && quarantined.contains("GPU 3 missing after flash"));
    let busy = page(&app, &viewer, "/nodes/node-0").await;
    assert!(busy.contains("draining (24 CPUs still allocated)"), "{busy}");
    let never = page(&app, &viewer, "/nodes/node-9").await;
    assert!(never.contains("Waveguard has never drained this node"));
}

#[tokio::test]
async fn the_newest_drain_of_a_node_comes_first() {
    let t = TestDb::sqlite(std::sync::Arc::new(orchestrator_types::SystemClock)).await;
    let seeded = seed(&t.db).await;
    // A second rollout drains node-3 again after the first resumed it.
    let nodes = t.db.list_nodes(&Default::default()).await.unwrap();
    let release = t.db.list_releases().await.unwrap()[0].id;
    let again = orchestrator_db::testing::fixtures::store_rollout(
        &t.db,
        release,
        vec![wave("again", 60, 0, 1, steps(&nodes[3..4], "GPU_*", "1"))],
        "rita",
    )
    .await
    .unwrap();
    let step =
        t.db.steps(&StepFilter {
            rollout_id: Some(again.id),
            ..Default::default()
        })
        .await
        .unwrap()
        .remove(0);
    let fence =
        t.db.acquire_lease("executor", "test", Duration::hours(1))
            .await
            .unwrap()
            .unwrap();
    t.db.record_drain_intent(
        &fence,
        &NewDrain {
            rollout_id: again.id,
            wave_id: step.wave_id,
            step_id: step.id,
            node_id: step.node_id,
            scheduler_kind: "command".into(),
            scheduler_node: "sl-node-3".into(),
            reason_text: format!("waveguard rollout={} firmware maintenance", again.id),
            observed_before: json!({ "name": "sl-node-3", "base": "idle", "drain": false }),
        },
    )
    .await
    .unwrap();
    release_lease(&t.db, fence).await;
    let viewer = provision_api_token(&t.db, "vic", Role::Viewer, "t", "test")
        .await
        .unwrap();
    let app = web::app(AppState::new(t.db.clone()));
    let body = page(&app, &viewer, "/nodes/node-3").await;
    let newer = body.find(&format!("href=\"/rollouts/{}\">", again.id)).unwrap();
    let older = body.find(&format!("href=\"/rollouts/{}\">", seeded.rollout)).unwrap();
    assert!(newer < older, "newest first");
    assert!(body.contains("drain requested, not yet confirmed"));
}
