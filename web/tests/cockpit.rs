//! The release manager's cockpit in-process (`oneshot`): node pages paged
//! and filtered on the server, the fleet dashboard's compliance against the
//! default release, the rollouts list (current wave, waiting-on, the bar of
//! a rolled-back rollout, "needs my approval"), the policy summary, the
//! token page, plain-language reasons and the blocked release.

mod common;

use std::sync::Arc;

use axum::Router;
use axum::http::StatusCode;
use chrono::{Duration, TimeZone, Utc};
use common::{get_page, post_form};
use orchestrator_db::Db;
use orchestrator_db::execution::{
    ExecStep, NewPlan, NewStep, NewWave, RolloutState, StepChange, StepFilter, StepState, WaveChange, WaveState,
};
use orchestrator_db::model::{ComponentReading, NewNode, NewRelease, NewRollout, NodeLabels};
use orchestrator_db::testing::TestDb;
use orchestrator_types::{
    Clock, ComponentKind, FirmwareVersion, ManualClock, NodeState, QualificationState, ReleaseId, Role, RolloutId,
    TransitionRequest,
};
use serde_json::json;
use web::auth::provision_api_token;
use web::{AppState, app};

const BASELINE: &str = "96.00.5E.00.01";
const BELOW: &str = "96.00.5D.00.00";
const ABOVE: &str = "96.00.61.00.01";
/// 100 nodes at the baseline, 100 below, 40 above, one without inventory.
const NODES: usize = 241;
const EVIL: &str = "x<script>y";
/// The node whose rack label is [`EVIL`]; its name sorts after every `gpu-NNN`.
const EVIL_NODE: &str = "zz-evil";

struct Fixture {
    _t: TestDb,
    db: Db,
    app: Router,
    /// Waits for an approval; authored by rita.
    waiting: RolloutId,
    /// Rolling back, one of two nodes restored.
    rolled_back: RolloutId,
    candidate: ReleaseId,
    blocked: ReleaseId,
}

fn version_of(i: usize) -> &'static str {
    match i {
        0..100 => BASELINE,
        100..200 => BELOW,
        _ => ABOVE,
    }
}

async fn release(db: &Db, version: &str, to: &[(QualificationState, Option<&str>)]) -> ReleaseId {
    let release = db
        .add_release(
            &NewRelease {
                component_kind: ComponentKind::Gpu,
                version: FirmwareVersion::parse(version).unwrap(),
                image_uri: format!("https://images.example/{version}.fw"),
                sha256: "ab".repeat(32),
                size_bytes: 1,
                platforms: vec!["hgx".into()],
                release_notes: String::new(),
            },
            "rita",
        )
        .await
        .unwrap();
    for (state, reason) in to {
        db.transition_release(
            release.id,
            &TransitionRequest {
                to: *state,
                reason: reason.map(str::to_owned),
            },
            "rita",
        )
        .await
        .unwrap();
    }
    release.id
}

async fn rollout(db: &Db, release: ReleaseId, nodes: &[orchestrator_types::NodeId]) -> RolloutId {
    db.start_rollout(
        &NewRollout {
            release_id: release,
            policy_name: "p".into(),
            policy_commit: "c0ffee1234567890".into(),
            policy_blob: "b".into(),
            seed: 1,
        },
        "name: p\n",
        &NewPlan {
            waves: vec![NewWave {
                name: "canary".into(),
                bake_seconds: 60,
                approvals_required: 1,
                max_in_flight: 2,
                gates: vec![],
                control_nodes: vec![],
                role: None,
                steps: nodes
                    .iter()
                    .map(|n| NewStep {
                        node_id: *n,
                        inventory_id: "GPU_*".into(),
                        expected_from_version: BASELINE.into(),
                    })
                    .collect(),
            }],
            rollback_assessment: json!({ "possible": true }),
        },
        "rita",
    )
    .await
    .unwrap()
    .id
}

async fn steps(db: &Db, rollout: RolloutId) -> Vec<ExecStep> {
    db.steps(&StepFilter {
        rollout_id: Some(rollout),
        ..Default::default()
    })
    .await
    .unwrap()
}

async fn fixture() -> Fixture {
    let clock = Arc::new(ManualClock::new(Utc.with_ymd_and_hms(2026, 12, 2, 12, 0, 0).unwrap()));
    let t = TestDb::sqlite(clock.clone()).await;
    let db = t.db.clone();
    let mut new_nodes: Vec<NewNode> = (0..NODES - 1)
        .map(|i| NewNode {
            name: format!("gpu-{i:03}"),
            bmc_url: format!("https://10.0.{}.{}", i / 200, i % 200),
            credential_ref: "default".into(),
            platform_sku: "hgx".into(),
            labels: NodeLabels {
                region: "r".into(),
                cluster: "c".into(),
                rack: format!("k{}", i % 10),
                nvlink_domain: "n".into(),
            },
        })
        .collect();
    // Node names are held to a hostname alphabet on import; labels are free
    // text, so the escaping is checked through a label.
    new_nodes.push(NewNode {
        name: EVIL_NODE.into(),
        bmc_url: "https://10.9.9.9".into(),
        credential_ref: "default".into(),
        platform_sku: "b200".into(),
        labels: NodeLabels {
            rack: EVIL.into(),
            ..new_nodes[0].labels.clone()
        },
    });
    db.import_nodes(&new_nodes, "test").await.unwrap();
    let nodes = db.list_nodes(&Default::default()).await.unwrap();
    for node in &nodes {
        let Some(i) = node.name.strip_prefix("gpu-").and_then(|n| n.parse::<usize>().ok()) else {
            continue;
        };
        let readings: Vec<ComponentReading> = (0..2)
            .map(|g| ComponentReading {
                inventory_id: format!("HGX_FW_GPU_{g}"),
                kind: ComponentKind::Gpu,
                version: FirmwareVersion::parse(version_of(i)).unwrap(),
                updateable: true,
                software_id: None,
                health: Some(if i == 7 && g == 1 { "Critical" } else { "OK" }.into()),
            })
            .collect();
        db.record_inventory(node.id, &readings).await.unwrap();
    }
    let by_name = |name: &str| nodes.iter().find(|n| n.name == name).unwrap().id;

    use QualificationState as Q;
    release(
        &db,
        BASELINE,
        &[(Q::Qualifying, None), (Q::Qualified, None), (Q::Default, None)],
    )
    .await;
    let candidate = release(&db, ABOVE, &[(Q::Qualifying, None), (Q::Qualified, None)]).await;
    let blocked = release(
        &db,
        "97.00.00.00.01",
        &[(
            Q::Blocked,
            Some(r#"rollout 9 wave canary: health verdict failed: XID rate 3.1x the control's; evidence: {"alpha":0.05,"gates":[{"gate":"xid"}]}"#),
        )],
    )
    .await;

    let fence = db
        .acquire_lease("executor", "test", Duration::hours(1))
        .await
        .unwrap()
        .unwrap();
    let now = clock.now();
    let finish = |to: StepState, error: Option<&str>| StepChange {
        state: Some(to),
        started_at: Some(now),
        finished_at: Some(now),
        previous_version: Some(BASELINE.into()),
        error: error.map(|e| Some(e.to_owned())),
        ..Default::default()
    };

    // Rollout 1: one node updated, one failed, one pending; the wave waits
    // for an approval.
    let waiting = rollout(
        &db,
        candidate,
        &[by_name("gpu-000"), by_name("gpu-001"), by_name("gpu-002")],
    )
    .await;
    for step in steps(&db, waiting).await {
        let change = match step.node_id {
            n if n == by_name("gpu-000") => finish(StepState::Succeeded, None),
            n if n == by_name("gpu-001") => finish(StepState::Failed, Some("BMC said <no>")),
            _ => continue,
        };
        db.transition_step(&fence, step.id, StepState::Pending, &change, json!({}))
            .await
            .unwrap();
    }
    let wave = db.rollout_waves(waiting).await.unwrap()[0].id;
    for (from, to) in [
        (WaveState::Planned, WaveState::Running),
        (WaveState::Running, WaveState::Baking),
        (WaveState::Baking, WaveState::AwaitingApproval),
    ] {
        db.transition_wave(
            &fence,
            wave,
            from,
            &WaveChange {
                state: Some(to),
                ..Default::default()
            },
            json!({}),
        )
        .await
        .unwrap();
    }

    // Rollout 2: both nodes updated, then rolled back; one restored.
    let rolled_back = rollout(&db, candidate, &[by_name("gpu-003"), by_name("gpu-004")]).await;
    let updated = steps(&db, rolled_back).await;
    for step in &updated {
        db.transition_step(
            &fence,
            step.id,
            StepState::Pending,
            &finish(StepState::Succeeded, None),
            json!({}),
        )
        .await
        .unwrap();
    }
    let rollback_wave = db
        .begin_rollback(
            None,
            rolled_back,
            json!({ "scope": "rollout" }),
            "temperatures up 6 °C",
            "sam",
        )
        .await
        .unwrap();
    for (i, step) in steps(&db, rolled_back).await.iter().enumerate() {
        let back = db
            .add_rollback_step(
                &fence,
                rollback_wave.id,
                step,
                "https://images.example/old.fw",
                &"cd".repeat(32),
            )
            .await
            .unwrap();
        if i == 0 {
            db.transition_step(
                &fence,
                back.id,
                StepState::Pending,
                &finish(StepState::Succeeded, None),
                json!({}),
            )
            .await
            .unwrap();
        }
    }
    db.release_lease(&fence).await.unwrap();
    db.set_node_state(by_name("gpu-009"), NodeState::Quarantined, Some("fan <failure>"), "ada")
        .await
        .unwrap();

    Fixture {
        _t: t,
        app: app(AppState::new(db.clone())),
        db,
        waiting,
        rolled_back,
        candidate,
        blocked,
    }
}

async fn get(app: &Router, token: &str, uri: &str) -> (StatusCode, String) {
    let (status, body) = get_page(app, token, uri).await;
    // minijinja escapes `/` in attributes; browsers read it back as `/`.
    (status, body.replace("&#x2f;", "/"))
}

async fn post(app: &Router, token: &str, uri: &str, body: &str, json: bool) -> (StatusCode, String) {
    let (status, _, body) = post_form(app, token, uri, body, json).await;
    (status, body)
}

async fn viewer(db: &Db) -> String {
    provision_api_token(db, "vic", Role::Viewer, "t", "test").await.unwrap()
}

/// The rows of the table with `id`, as their HTML.
fn rows<'a>(body: &'a str, id: &str) -> Vec<&'a str> {
    let start = body
        .find(&format!("id=\"{id}\""))
        .unwrap_or_else(|| panic!("no table {id}"));
    let table = &body[start..];
    let table = &table[..table.find("</table>").unwrap()];
    table.split("<tr").skip(2).collect()
}

#[tokio::test(flavor = "current_thread")]
async fn nodes_are_paged_and_filtered_by_the_server() {
    let f = fixture().await;
    let token = viewer(&f.db).await;
    let check = |uri: &'static str, count: &'static str, shown: usize| {
        let app = f.app.clone();
        let token = token.clone();
        async move {
            let (status, body) = get(&app, &token, uri).await;
            assert_eq!(status, StatusCode::OK, "{uri}: {body}");
            assert!(body.contains(count), "{uri} should say {count:?}:\n{body}");
            assert_eq!(rows(&body, "nodes").len(), shown, "{uri}");
            body
        }
    };
    let first = check("/nodes", "Nodes 1–100 of 241", 100).await;
    assert!(first.contains("id=\"next-page\" href=\"?page=2\""), "{first}");
    assert!(!first.contains("prev-page"));
    // Page 3 holds the last 41 nodes; the name sorts after every gpu-NNN.
    let last = check("/nodes?page=3", "Nodes 201–241 of 241", 41).await;
    assert!(last.contains("x&lt;script&gt;y"), "labels are escaped");
    assert!(!last.contains("<script>y"), "never raw");
    assert!(!last.contains("next-page"));
    let above = check("/nodes?version=96.00.61.00.01", "Nodes 1–40 of 40", 40).await;
    assert!(above.contains("gpu-200") && !above.contains("gpu-199"));
    check("/nodes?platform=b200", "Nodes 1–1 of 1", 1).await;
    check("/nodes?state=quarantined", "Nodes 1–1 of 1", 1).await;
    check("/nodes?name=gpu-01&version=96.00.5E.00.01", "Nodes 1–10 of 10", 10).await;
    // Filters are kept by the paging links.
    let paged = check("/nodes?version=96.00.5D.00.00&page=1", "Nodes 1–100 of 100", 100).await;
    assert!(!paged.contains("next-page"));
    let (status, body) = get(&f.app, &token, "/nodes?platform=hgx").await;
    assert_eq!(status, StatusCode::OK);
    assert!(body.contains("href=\"?platform=hgx&amp;page=2\""), "{body}");
    check("/nodes?name=nothing-like-this", "No node matches.", 0).await;
    let (status, _) = get(&f.app, &token, "/nodes?state=sleepy").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
}

#[tokio::test(flavor = "current_thread")]
async fn a_node_page_shows_inventory_history_health_and_quarantine() {
    let f = fixture().await;
    let token = viewer(&f.db).await;
    let (status, body) = get(&f.app, &token, "/nodes/gpu-001").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    for want in [
        "HGX_FW_GPU_0",
        BASELINE,
        "id=\"history\"",
        &format!("/rollouts/{}?node=gpu-001", f.waiting.0),
        "failed",
        "BMC said &lt;no&gt;",
    ] {
        assert!(body.contains(want), "should show {want:?}:\n{body}");
    }
    let (_, unhealthy) = get(&f.app, &token, "/nodes/gpu-007").await;
    assert!(unhealthy.contains("Critical"), "{unhealthy}");
    let (_, quarantined) = get(&f.app, &token, "/nodes/gpu-009").await;
    assert!(quarantined.contains("id=\"quarantine\""), "{quarantined}");
    assert!(quarantined.contains("fan &lt;failure&gt;"));
    assert!(
        quarantined.contains("gpu-009: active → quarantined"),
        "the change is in words:\n{quarantined}"
    );
    let (status, escaped) = get(&f.app, &token, &format!("/nodes/{EVIL_NODE}")).await;
    assert_eq!(status, StatusCode::OK);
    assert!(escaped.contains("x&lt;script&gt;y") && !escaped.contains("x<script>y"));
    let (status, _) = get(&f.app, &token, "/nodes/nope").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test(flavor = "current_thread")]
async fn the_dashboard_measures_compliance_against_the_default_release() {
    let f = fixture().await;
    let token = viewer(&f.db).await;
    let (status, body) = get(&f.app, &token, "/").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let compliance = &body[body.find("id=\"compliance\"").unwrap()..];
    let compliance = &compliance[..compliance.find("</section>").unwrap()];
    // 100 of the 240 inventoried hgx nodes run the default release.
    assert!(
        compliance.contains(&format!(
            "baseline <span class=\"mono\">{BASELINE}</span>: <strong>41%</strong> at baseline, 100 below, 40 above"
        )),
        "{compliance}"
    );
    for (version, status) in [(BASELINE, "at"), (BELOW, "below"), (ABOVE, "above")] {
        let at = compliance
            .find(&format!(">{version}</a>"))
            .unwrap_or_else(|| panic!("{version} listed"));
        assert!(
            compliance[at..].starts_with(&format!(">{version}</a></td><td><span class=\"badge c-{status}\">")),
            "{version} is {status}"
        );
    }
    // Active rollouts say what they wait on; finished work is not listed.
    let active = &body[body.find("id=\"active-rollouts\"").unwrap()..];
    let active = &active[..active.find("</section>").unwrap()];
    assert!(active.contains(&format!("/rollouts/{}", f.waiting.0)), "{active}");
    assert!(active.contains("awaiting_approval"), "{active}");
    // Every release's qualification, the blocked one in words without its JSON.
    let qualification = &body[body.find("id=\"qualification\"").unwrap()..];
    let qualification = &qualification[..qualification.find("</section>").unwrap()];
    assert!(
        qualification.contains("health verdict failed: XID rate 3.1x the control&#x27;s"),
        "{qualification}"
    );
    assert!(!qualification.contains("alpha"), "evidence stays off the dashboard");
    assert!(qualification.contains("q-default") && qualification.contains("q-qualified"));
    // Failure rates per target version: 1 of 4 updates to the candidate failed.
    let trends = &body[body.find("id=\"version-trends\"").unwrap()..];
    assert!(
        trends.contains(&format!(
            "<td class=\"mono\">{ABOVE}</td><td class=\"num\">4</td><td class=\"num\">1 (25.0%)</td>"
        )),
        "{trends}"
    );
    assert!(body.contains("1 quarantined"), "counts come from the aggregate");
}

#[tokio::test(flavor = "current_thread")]
async fn the_rollouts_list_tells_the_truth_and_who_must_approve() {
    let f = fixture().await;
    let sam = provision_api_token(&f.db, "sam", Role::ReleaseManager, "t", "test")
        .await
        .unwrap();
    let rita = provision_api_token(&f.db, "rita", Role::ReleaseManager, "t", "test")
        .await
        .unwrap();
    let (status, body) = get(&f.app, &sam, "/rollouts").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let row = |id: RolloutId| {
        let start = body.find(&format!("id=\"rollout-{}\"", id.0)).unwrap();
        let rest = &body[start..];
        rest[..rest.find("</tr>").unwrap()].to_owned()
    };
    let waiting = row(f.waiting);
    assert!(waiting.contains("needs my approval"), "{waiting}");
    assert!(
        waiting.contains("canary <span class=\"small\">(awaiting_approval)"),
        "{waiting}"
    );
    assert!(waiting.contains("1/3 updated, 1 failed"), "{waiting}");
    let rolled_back = row(f.rolled_back);
    assert!(
        rolled_back.contains("2 updated, then rolled back: 1/2 restored"),
        "{rolled_back}"
    );
    assert!(rolled_back.contains("bar rollback"), "{rolled_back}");
    assert!(
        rolled_back.contains("temperatures up 6 °C"),
        "the reason shows:\n{rolled_back}"
    );
    assert!(!rolled_back.contains("needs my approval"));
    assert!(body.contains("Needing my approval (1)"));
    let (_, mine) = get(&f.app, &sam, "/rollouts?show=mine").await;
    assert_eq!(rows(&mine, "rollouts").len(), 1, "{mine}");
    assert!(mine.contains(&format!("id=\"rollout-{}\"", f.waiting.0)));
    // The author may not approve her own rollout, nor may a viewer.
    let (_, authored) = get(&f.app, &rita, "/rollouts").await;
    assert!(!authored.contains("needs my approval") && authored.contains("Needing my approval (0)"));
    let vic = viewer(&f.db).await;
    let (_, viewed) = get(&f.app, &vic, "/rollouts?show=mine").await;
    assert!(viewed.contains("Nothing waits on your approval."), "{viewed}");
}

#[tokio::test(flavor = "current_thread")]
async fn a_policy_is_summarised_above_its_yaml() {
    use orchestrator_db::policies::{PolicySync, SyncedPolicy};
    let f = fixture().await;
    let content = include_str!("../../policies/bmc-firmware-lab.yaml").to_owned();
    f.db.record_policy_sync(
        &PolicySync {
            source: "https://git.example/policies@main".into(),
            commit_id: "c".repeat(40),
            in_force: vec![SyncedPolicy {
                name: "bmc-firmware-lab".into(),
                path: "bmc-firmware-lab.yaml".into(),
                commit_id: "c".repeat(40),
                blob_id: "b".repeat(40),
                content,
            }],
            changed: vec!["bmc-firmware-lab".into()],
            removed: Vec::new(),
            rejected: Vec::new(),
            warnings: Vec::new(),
        },
        "test",
    )
    .await
    .unwrap();
    let token = viewer(&f.db).await;
    let (status, body) = get(&f.app, &token, "/policies").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let summary = body.find("class=\"summary\"").expect("a summary");
    let yaml = body.find("<details class=\"yaml\">").expect("collapsed YAML");
    assert!(summary < yaml, "the summary comes first");
    for want in [
        "every remaining node",
        "starts after 1 approval of the previous wave",
        "no gate",
        "15 W higher than the control",
        "40 W higher than the control",
        "the first failed update halts the wave and the rollout",
        "a person decides whether to roll back (every node the rollout updated)",
        "32 flashes at once, 2 per rack",
    ] {
        assert!(body.contains(want), "should say {want:?}:\n{body}");
    }
}

#[tokio::test(flavor = "current_thread")]
async fn tokens_are_shown_once_listed_and_revoked_by_their_owner() {
    let f = fixture().await;
    let sam = provision_api_token(&f.db, "sam", Role::ReleaseManager, "first", "test")
        .await
        .unwrap();
    let (status, page) = get(&f.app, &sam, "/tokens").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(rows(&page, "tokens").len(), 1);
    assert!(page.contains("first"));

    let (status, created) = post(&f.app, &sam, "/tokens", "name=ci%20%3Cpipeline%3E", false).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    assert!(created.contains("ci &lt;pipeline&gt;"), "escaped:\n{created}");
    let start = created.find("id=\"token-value\">").unwrap() + "id=\"token-value\">".len();
    let token = &created[start..start + 67];
    assert!(token.starts_with("wg_"), "{token}");
    // It works, and it is never shown again.
    let (status, page) = get(&f.app, token, "/tokens").await;
    assert_eq!(status, StatusCode::OK);
    assert!(!page.contains(token), "shown once");
    assert_eq!(rows(&page, "tokens").len(), 2);

    let id = f.db.api_tokens("sam").await.unwrap()[1].id;
    // Another user cannot revoke it: the owner comes from the session.
    let rita = provision_api_token(&f.db, "rita", Role::ReleaseManager, "t", "test")
        .await
        .unwrap();
    let (status, _) = post(&f.app, &rita, &format!("/tokens/{id}/revoke"), "", true).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, body) = post(&f.app, &sam, &format!("/tokens/{id}/revoke"), "", true).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, _) = get(&f.app, token, "/api/v1/releases").await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "a revoked token authenticates nobody");
    // An empty name is refused with the reason.
    let (status, body) = post(&f.app, &sam, "/tokens", "name=%20", true).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
}

#[tokio::test(flavor = "current_thread")]
async fn a_blocked_release_explains_itself_and_offers_no_start() {
    let f = fixture().await;
    let sam = provision_api_token(&f.db, "sam", Role::ReleaseManager, "t", "test")
        .await
        .unwrap();
    let (status, body) = get(&f.app, &sam, &format!("/releases/{}", f.blocked.0)).await;
    assert_eq!(status, StatusCode::OK);
    assert!(body.contains("id=\"start-refused\""), "{body}");
    assert!(!body.contains("id=\"start-rollout\""), "no start button");
    let reason = &body[body.find("id=\"state-reason\"").unwrap()..];
    let sentence = reason.find("health verdict failed").unwrap();
    let evidence = reason
        .find("<details class=\"evidence\"><summary>Full evidence")
        .unwrap();
    assert!(sentence < evidence, "the sentence first, the evidence one click away");
    assert!(reason.contains("&quot;alpha&quot;: 0.05"), "pretty-printed evidence");
    // The history is in words too.
    assert!(body.contains("qualification registered → blocked"), "{body}");
    // A release that is not blocked still offers the start.
    let (_, candidate) = get(&f.app, &sam, &format!("/releases/{}", f.candidate.0)).await;
    assert!(!candidate.contains("id=\"start-refused\""));
}

#[tokio::test(flavor = "current_thread")]
async fn the_audit_log_names_nodes_and_links_subjects() {
    let f = fixture().await;
    let token = viewer(&f.db).await;
    let (status, body) = get(&f.app, &token, "/audit?action=step.transition").await;
    assert_eq!(status, StatusCode::OK);
    assert!(body.contains("update step on gpu-001: pending → failed"), "{body}");
    assert!(
        body.contains(&format!("href=\"/rollouts/{}?node=gpu-001\"", f.waiting.0)),
        "{body}"
    );
    assert!(
        body.contains("<a href=\"/nodes/gpu-001\">gpu-001</a>"),
        "the node_id field is a linked name"
    );
    assert!(!body.contains("<dt>node_id</dt>"), "{body}");
    let (_, approvals) = get(&f.app, &token, "/audit?action=wave.transition").await;
    assert!(
        approvals.contains("<span class=\"badge warn\">decision</span>"),
        "{approvals}"
    );
    assert!(
        approvals.contains(&format!("wave canary of rollout #{}", f.waiting.0)),
        "{approvals}"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn starting_a_rollout_from_a_release_answers_with_a_message_and_a_link() {
    use orchestrator_db::testing::fixtures::{PolicyYaml, put_policy_in_force};
    let f = fixture().await;
    let content = PolicyYaml::two_waves("api-gpu").platforms(&["hgx"]).render();
    put_policy_in_force(&f.db, "api-gpu", &content).await.unwrap();
    let sam = provision_api_token(&f.db, "sam", Role::ReleaseManager, "t", "test")
        .await
        .unwrap();
    let (_, page) = get(&f.app, &sam, &format!("/releases/{}", f.candidate.0)).await;
    assert!(
        page.contains("id=\"start-rollout\""),
        "a qualified release offers the start"
    );
    let uri = format!("/releases/{}/rollouts", f.candidate.0);
    let (status, body) = post(&f.app, &sam, &uri, "policy=api-gpu&confirmed=yes", true).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let answer: serde_json::Value = serde_json::from_str(&body).unwrap();
    let location = answer["location"].as_str().expect("a link to the new rollout");
    assert!(location.starts_with("/rollouts/"), "{answer}");
    // Nodes are counted as nodes, their two GPUs each as component updates.
    let message = answer["message"].as_str().unwrap();
    assert!(message.contains("planned: 2 wave(s)"), "{answer}");
    let nodes: usize = message
        .split(", ")
        .find_map(|part| part.strip_suffix(" node(s)"))
        .and_then(|n| n.parse().ok())
        .expect("a node count");
    assert!(
        message.contains(&format!("{nodes} node(s), {} component update(s)", nodes * 2)),
        "{answer}"
    );
    let (status, rollout) = get(&f.app, &sam, location).await;
    assert_eq!(status, StatusCode::OK, "the link works:\n{rollout}");
    // The blocked release is refused even when posted to directly.
    let (status, body) = post(
        &f.app,
        &sam,
        &format!("/releases/{}/rollouts", f.blocked.0),
        "policy=api-gpu&confirmed=yes",
        true,
    )
    .await;
    assert!(status.is_client_error(), "{status}: {body}");
}

// ---------------------------------------------------------------------------
// The decision box and the verdict tables.

/// A rollout under a real pinned policy: a 2-node canary watched by an XID
/// rate gate and a temperature level gate against 10 control nodes, then a
/// 40-node wave after one approval, watched by the XID gate against 20.
struct Gated {
    rollout: RolloutId,
    canary: orchestrator_types::WaveId,
}

fn gated_policy() -> String {
    use orchestrator_db::testing::fixtures::{PolicyYaml, WaveSize, WaveYaml, health_section, redfish_gate};
    PolicyYaml::two_waves("gated")
        .platforms(&["hgx"])
        .waves(vec![
            WaveYaml::new("canary", WaveSize::Count(2))
                .bake("2h")
                .line("gates: [xid, temp]"),
            WaveYaml::new("rest", WaveSize::Rest)
                .bake("4h")
                .manual(1)
                .line("gates: [xid]"),
        ])
        .max_failed(2)
        .health(&health_section(
            0.05,
            &[
                redfish_gate("xid", "xid_errors_per_gpu_hour", "rate", "1.5", "1h"),
                redfish_gate("temp", "gpu_temp_c", "level", "3", "30m"),
            ],
        ))
        .render()
}

async fn gated(f: &Fixture, first: usize) -> Gated {
    // The box and the tables read thresholds from this text: it must parse.
    if let Err(err) = orchestrator_policy::parse_policy(&gated_policy()) {
        panic!("{err:?}\n{}", gated_policy());
    }
    let nodes = f.db.list_nodes(&Default::default()).await.unwrap();
    let id = |i: usize| {
        let name = format!("gpu-{i:03}");
        nodes.iter().find(|n| n.name == name).unwrap().id
    };
    let steps = |range: std::ops::Range<usize>| -> Vec<NewStep> {
        range
            .map(|i| NewStep {
                node_id: id(i),
                inventory_id: "HGX_FW_GPU_*".into(),
                expected_from_version: BASELINE.into(),
            })
            .collect()
    };
    let rollout =
        f.db.start_rollout(
            &NewRollout {
                release_id: f.candidate,
                policy_name: "gated".into(),
                policy_commit: "feedface00000000".into(),
                policy_blob: "b".into(),
                seed: 1,
            },
            &gated_policy(),
            &NewPlan {
                waves: vec![
                    NewWave {
                        name: "canary".into(),
                        bake_seconds: 7200,
                        approvals_required: 1,
                        max_in_flight: 2,
                        gates: vec!["xid".into(), "temp".into()],
                        control_nodes: (first + 2..first + 12).map(id).collect(),
                        role: None,
                        steps: steps(first..first + 2),
                    },
                    NewWave {
                        name: "rest".into(),
                        bake_seconds: 14400,
                        approvals_required: 0,
                        max_in_flight: 8,
                        gates: vec!["xid".into()],
                        control_nodes: (first + 52..first + 72).map(id).collect(),
                        role: None,
                        steps: steps(first + 12..first + 52),
                    },
                ],
                rollback_assessment: json!({ "possible": true }),
            },
            "rita",
        )
        .await
        .unwrap();
    let canary = f.db.rollout_waves(rollout.id).await.unwrap()[0].id;
    Gated {
        rollout: rollout.id,
        canary,
    }
}

/// The canary's two nodes updated and the wave baking, with a stale
/// "bake ends" blocker as the engine leaves it.
async fn bake(f: &Fixture, g: &Gated) {
    let fence =
        f.db.acquire_lease("executor", "test", Duration::hours(1))
            .await
            .unwrap()
            .unwrap();
    let now = f.db.clock().now();
    for step in steps(&f.db, g.rollout).await.iter().filter(|s| s.wave_id == g.canary) {
        f.db.transition_step(
            &fence,
            step.id,
            StepState::Pending,
            &StepChange {
                state: Some(StepState::Succeeded),
                started_at: Some(now),
                finished_at: Some(now),
                previous_version: Some(BASELINE.into()),
                ..Default::default()
            },
            json!({}),
        )
        .await
        .unwrap();
    }
    for (from, to) in [
        (WaveState::Planned, WaveState::Running),
        (WaveState::Running, WaveState::Baking),
    ] {
        f.db.transition_wave(
            &fence,
            g.canary,
            from,
            &WaveChange {
                state: Some(to),
                bake_started_at: (to == WaveState::Baking).then_some(now),
                ..Default::default()
            },
            json!({}),
        )
        .await
        .unwrap();
    }
    f.db.set_wave_blockers(
        &fence,
        g.canary,
        &[orchestrator_types::Blocker::BakeEndsAt {
            at: now + Duration::hours(2),
        }],
    )
    .await
    .unwrap();
    f.db.release_lease(&fence).await.unwrap();
}

fn verdict(outcome: orchestrator_types::Outcome, summary: &str) -> orchestrator_types::WaveVerdict {
    orchestrator_types::WaveVerdict {
        outcome,
        summary: summary.into(),
        evidence: json!({}),
    }
}

/// The `<section id="decision">` of a page.
fn decision_box(body: &str) -> &str {
    let start = body.find("id=\"decision\"").expect("a decision box");
    let rest = &body[start..];
    &rest[..rest.find("</section>").unwrap()]
}

async fn api_approve(app: &Router, token: &str, rollout: RolloutId) -> (StatusCode, String) {
    let (status, body) = common::call_as(
        app,
        token,
        axum::http::Method::POST,
        &format!("/api/v1/rollouts/{}/waves/canary/approve", rollout.0),
        None,
    )
    .await;
    (status, body.to_string())
}

#[tokio::test(flavor = "current_thread")]
async fn the_decision_box_asks_for_approval_only_once_the_verdict_is_in() {
    use orchestrator_types::Outcome;
    let f = fixture().await;
    let g = gated(&f, 10).await;
    let sam = provision_api_token(&f.db, "sam", Role::ReleaseManager, "t", "test")
        .await
        .unwrap();
    let rita = provision_api_token(&f.db, "rita", Role::ReleaseManager, "t", "test")
        .await
        .unwrap();
    let page = format!("/rollouts/{}", g.rollout.0);

    // Baking: nothing is asked, no approval offered, and the API refuses one.
    bake(&f, &g).await;
    let (status, body) = get(&f.app, &sam, &page).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let baking = decision_box(&body);
    assert!(baking.contains("data-asks=\"none\""), "{baking}");
    assert!(baking.contains("Wave canary is baking"), "{baking}");
    assert!(
        !body.contains(&format!("approve-{}", g.canary.0)),
        "no approval during the bake"
    );
    let (status, early) = api_approve(&f.app, &sam, g.rollout).await;
    assert_eq!(status, StatusCode::CONFLICT, "{early}");
    assert!(early.contains("the wave is baking"), "{early}");

    // The verdict passed: approval is asked, with what it starts.
    orchestrator_db::testing::await_approval(
        &f.db,
        g.canary,
        verdict(Outcome::Pass, "every gate passed against 10 control nodes"),
    )
    .await
    .unwrap();
    let (_, body) = get(&f.app, &sam, &page).await;
    let asked = decision_box(&body);
    assert!(asked.contains("data-asks=\"approve\""), "{asked}");
    for want in [
        "Wave canary passed its health verdict (every gate passed against 10 control nodes); it waits for 1 more \
         approval before wave rest starts.",
        // 40 of the fleet's 241 nodes.
        "Starts wave rest: 40 nodes (17% of the fleet&#x27;s 241 nodes), at most 8 at a time, bake 4h.",
        "Gate xid: fails when proven worse than 1.5× the control&#x27;s rate; must catch 3× the control&#x27;s rate; \
         the smallest regression it detects with 80% power is ",
        "(default baselines, 20 control nodes)",
        "Failure budget: up to 2 failed updates per wave; one more halts the rollout.",
        "Rollback possible, automatic on a failed gate (every node the rollout updated).",
        "Any release manager except rita, who started this rollout (two-person rule)",
        &format!("id=\"approve-{}\"", g.canary.0),
        &format!("name=\"comment\" id=\"comment-{}\"", g.canary.0),
        &format!("href=\"/api/v1/rollouts/{}/evidence\"", g.rollout.0),
    ] {
        assert!(asked.contains(want), "the box should say {want:?}:\n{asked}");
    }
    // The author sees why she cannot approve, and no button.
    let (_, authored) = get(&f.app, &rita, &page).await;
    let authored = decision_box(&authored);
    assert!(
        authored.contains("two-person") && !authored.contains("approve-"),
        "{authored}"
    );
    // The no-JS confirmation page says what approval starts.
    let (status, confirm) = post(
        &f.app,
        &sam,
        &format!("/rollouts/{}/approve", g.rollout.0),
        &format!("wave={}&comment=ok", g.canary.0),
        false,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{confirm}");
    assert!(confirm.contains("id=\"what-approval-starts\""), "{confirm}");
    assert!(confirm.contains("Starts wave rest: 40 nodes"), "{confirm}");
    assert!(
        confirm.contains("smallest regression it detects with 80% power"),
        "{confirm}"
    );
    let (status, given) = api_approve(&f.app, &sam, g.rollout).await;
    assert_eq!(status, StatusCode::OK, "{given}");
    let (_, body) = get(&f.app, &sam, &page).await;
    assert!(decision_box(&body).contains("You approved this wave."), "{body}");
}

#[tokio::test(flavor = "current_thread")]
async fn a_hold_asks_to_promote_anyway_as_its_own_decision() {
    use orchestrator_types::Outcome;
    let f = fixture().await;
    let g = gated(&f, 10).await;
    bake(&f, &g).await;
    orchestrator_db::testing::await_approval(&f.db, g.canary, verdict(Outcome::Inconclusive, "xid inconclusive"))
        .await
        .unwrap();
    let sam = provision_api_token(&f.db, "sam", Role::ReleaseManager, "t", "test")
        .await
        .unwrap();
    let (_, body) = get(&f.app, &sam, &format!("/rollouts/{}", g.rollout.0)).await;
    let hold = decision_box(&body);
    assert!(hold.contains("data-asks=\"hold\""), "{hold}");
    assert!(
        hold.contains("Wave canary is on hold: its verdict is inconclusive — xid inconclusive."),
        "{hold}"
    );
    assert!(
        hold.contains("Records “promote anyway”: wave canary is promoted over its inconclusive verdict"),
        "{hold}"
    );
    assert!(hold.contains("Promote canary anyway"), "{hold}");
    assert!(
        hold.contains("id=\"choice-rollback\"") && hold.contains("id=\"choice-abort\""),
        "{hold}"
    );
    let (status, body) = api_approve(&f.app, &sam, g.rollout).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    // The approval is kept with the verdict it overrode, so the engine
    // records the promotion as "promote anyway".
    let approvals = f.db.wave_approvals(g.canary).await.unwrap();
    assert_eq!(approvals[0].verdict_outcome, Some(Outcome::Inconclusive));
    let wave = f.db.wave(g.canary).await.unwrap();
    let facts = orchestrator_engine::wave::WaveFacts {
        state: wave.state,
        position: 0,
        node_count: 2,
        now: f.db.clock().now(),
        release: orchestrator_engine::wave::ReleaseStanding::Usable,
        failed_steps: 0,
        unfinished_steps: 0,
        failure_budget: orchestrator_policy::FailureBudget::Count(2),
        bake_ends_at: f.db.clock().now(),
        max_bake_ends_at: f.db.clock().now(),
        verdict: wave.verdict.clone(),
        approvals_required: wave.approvals_required,
        approvals,
        step_deadlines: Vec::new(),
        pre_flash_watch_until: None,
        rollback_automatic: true,
    };
    assert!(matches!(
        orchestrator_engine::wave::decide(&facts),
        orchestrator_engine::wave::WaveAction::Promote {
            decision: orchestrator_engine::wave::Decision::PromoteAnyway,
            ..
        }
    ));
}

#[tokio::test(flavor = "current_thread")]
async fn finished_rollouts_offer_no_approval_and_the_api_refuses_with_the_reason() {
    use orchestrator_types::Outcome;
    let f = fixture().await;
    let sam = provision_api_token(&f.db, "sam", Role::ReleaseManager, "t", "test")
        .await
        .unwrap();
    // Three rollouts whose canary awaits approval, then ended three ways.
    let rolled_back = gated(&f, 10).await;
    let aborted = gated(&f, 85).await;
    let completed = gated(&f, 160).await;
    for g in [&rolled_back, &aborted, &completed] {
        bake(&f, g).await;
        orchestrator_db::testing::await_approval(&f.db, g.canary, verdict(Outcome::Pass, "every gate passed"))
            .await
            .unwrap();
    }
    f.db.begin_rollback(
        None,
        rolled_back.rollout,
        json!({ "scope": "rollout" }),
        "temperatures up",
        "sam",
    )
    .await
    .unwrap();
    f.db.user_set_rollout_state(
        aborted.rollout,
        &[RolloutState::Running],
        RolloutState::Aborted,
        Some("wrong release"),
        "sam",
    )
    .await
    .unwrap();
    let fence =
        f.db.acquire_lease("executor", "test", Duration::hours(1))
            .await
            .unwrap()
            .unwrap();
    f.db.engine_set_rollout_state(
        &fence,
        completed.rollout,
        &[RolloutState::Running],
        RolloutState::Completed,
        None,
        json!({}),
    )
    .await
    .unwrap();
    f.db.release_lease(&fence).await.unwrap();

    for (g, state, says) in [
        (&rolled_back, "rolling_back", "Rolling back (temperatures up)"),
        (&aborted, "aborted", "Aborted: wrong release."),
        (&completed, "completed", "Completed: every wave was promoted."),
    ] {
        let (status, body) = get(&f.app, &sam, &format!("/rollouts/{}", g.rollout.0)).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let d = decision_box(&body);
        assert!(d.contains(says), "{state}: {d}");
        assert!(
            !d.contains("data-asks=\"approve\"") && !d.contains("data-asks=\"hold\""),
            "{d}"
        );
        assert!(
            !body.contains(&format!("approve-{}", g.canary.0)),
            "{state}: no approve button"
        );
        assert!(
            !body.contains("Waiting on: bake ends"),
            "{state}: a stale blocker is no wait:\n{body}"
        );
        // The API and the no-JS form refuse, with the reason.
        let (status, refused) = api_approve(&f.app, &sam, g.rollout).await;
        assert_eq!(status, StatusCode::CONFLICT, "{state}: {refused}");
        assert!(
            refused.contains(&format!(
                "is {state}: a finished, stopped or rolled-back rollout takes no approvals"
            )),
            "{refused}"
        );
        let (status, form) = post(
            &f.app,
            &sam,
            &format!("/rollouts/{}/approve", g.rollout.0),
            &format!("wave={}", g.canary.0),
            true,
        )
        .await;
        assert_eq!(status, StatusCode::CONFLICT, "{state}: {form}");
        assert!(form.contains("takes no approvals"), "{form}");
    }
    assert!(f.db.wave_approvals(aborted.canary).await.unwrap().is_empty());
    // The rollouts list does not claim they wait on anything either.
    let (_, list) = get(&f.app, &sam, "/rollouts").await;
    assert!(!list.contains("bake ends"), "{list}");
}

fn look(number: u32, planned: u32) -> orchestrator_detect::Look {
    orchestrator_detect::Look {
        number,
        planned,
        information_fraction: f64::from(number) / f64::from(planned),
        cumulative_alpha: 0.001,
        z_boundary: Some(3.5),
        nominal_alpha: 0.0002,
        is_final: number == planned,
    }
}

/// The XID gate's evidence at look `number` of 4: 4 canary events over 32
/// GPU-hours against 10 over 160, ratio 2.0 (interval 0.6 to 6.5).
fn xid_evidence(number: u32) -> orchestrator_detect::Evidence {
    use orchestrator_detect::{CohortSummary, Effect, EffectMeasure, Evidence, TestKind};
    Evidence {
        gate: "xid".into(),
        test: TestKind::ConditionalBinomial,
        statistic: 4.0,
        p_value: 0.31,
        effect: Effect {
            measure: EffectMeasure::RateRatio,
            estimate: Some(2.0),
            ci95_lower: Some(0.6),
            ci95_upper: Some(6.5),
            decision_lower_bound: Some(0.45),
            min_effect: 1.5,
        },
        canary: CohortSummary {
            events: Some(4),
            exposure: Some(32.0),
            rate: Some(0.125),
            samples: None,
            median: None,
        },
        control: CohortSummary {
            events: Some(10),
            exposure: Some(160.0),
            rate: Some(0.0625),
            samples: None,
            median: None,
        },
        look: look(number, 4),
    }
}

fn temp_evidence(number: u32) -> orchestrator_detect::Evidence {
    use orchestrator_detect::{CohortSummary, Effect, EffectMeasure, Evidence, TestKind};
    Evidence {
        gate: "temp".into(),
        test: TestKind::MannWhitney {
            method: orchestrator_detect::stats::MwuMethod::Exact,
        },
        statistic: 12.0,
        p_value: 0.4,
        effect: Effect {
            measure: EffectMeasure::Shift,
            estimate: Some(1.1),
            ci95_lower: Some(-0.4),
            ci95_upper: Some(2.6),
            decision_lower_bound: Some(-0.9),
            min_effect: 3.0,
        },
        canary: CohortSummary {
            events: None,
            exposure: None,
            rate: None,
            samples: Some(16),
            median: Some(71.2),
        },
        control: CohortSummary {
            events: None,
            exposure: None,
            rate: None,
            samples: Some(80),
            median: Some(70.1),
        },
        look: look(number, 4),
    }
}

async fn record_look(f: &Fixture, g: &Gated, verdict: &orchestrator_detect::Verdict, number: u32) {
    f.db.record_health_look(
        &orchestrator_db::health::NewHealthLook {
            rollout_id: g.rollout,
            wave_id: g.canary,
            gate: verdict.gate().to_owned(),
            look_number: number,
            planned_looks: 4,
            outcome: verdict.outcome(),
            verdict: serde_json::to_value(verdict).unwrap(),
        },
        "detector",
    )
    .await
    .unwrap();
}

/// The table with `id`, as its HTML.
fn table<'a>(body: &'a str, id: &str) -> &'a str {
    let start = body
        .find(&format!("id=\"{id}\""))
        .unwrap_or_else(|| panic!("no table {id}:\n{body}"));
    let rest = &body[start..];
    &rest[..rest.find("</table>").unwrap()]
}

#[tokio::test(flavor = "current_thread")]
async fn verdict_tables_show_each_gate_in_its_own_terms_during_the_bake_and_after() {
    use orchestrator_detect::{InconclusiveReason, Verdict};
    use orchestrator_types::Outcome;
    let f = fixture().await;
    let g = gated(&f, 10).await;
    bake(&f, &g).await;
    let token = viewer(&f.db).await;
    let page = format!("/rollouts/{}", g.rollout.0);

    // Baking, before any look: one table per gate, saying so.
    let (_, body) = get(&f.app, &token, &page).await;
    let xid_id = format!("verdict-{}-xid", g.canary.0);
    let temp_id = format!("verdict-{}-temp", g.canary.0);
    assert!(table(&body, &xid_id).contains("first look not due yet"), "{body}");
    assert!(table(&body, &temp_id).contains("first look not due yet"), "{body}");

    // Two looks in: the latest one shows, with its numbers and units.
    for n in [1, 2] {
        let verdict = Verdict::Inconclusive {
            gate: "xid".into(),
            reason: InconclusiveReason::BakeInProgress,
            evidence: Some(Box::new(xid_evidence(n))),
        };
        record_look(&f, &g, &verdict, n).await;
    }
    record_look(
        &f,
        &g,
        &Verdict::Inconclusive {
            gate: "temp".into(),
            reason: InconclusiveReason::BakeInProgress,
            evidence: Some(Box::new(temp_evidence(1))),
        },
        1,
    )
    .await;
    let (_, body) = get(&f.app, &token, &page).await;
    let xid = table(&body, &xid_id);
    for want in [
        "inconclusive: no boundary crossed; the bake goes on at look 2 of 4",
        "2× the control&#x27;s rate",
        "0.6× to 6.5×",
        "0.45× (one-sided lower bound at this look&#x27;s level; the gate fails when it is above 1.5×)",
        "ruled out: ≥6.5×",
        "50% of the planned information (look 2 of 4)",
        "4 events over 32 GPU-hours (0.125 per GPU-hour)",
        "10 events over 160 GPU-hours (0.0625 per GPU-hour)",
        "min_effect 1.5× the control&#x27;s rate (smaller is ignored); must_detect 3× the control&#x27;s rate",
        "<th scope=\"row\">Nodes in error</th><td>none</td>",
    ] {
        assert!(xid.contains(want), "the XID table should say {want:?}:\n{xid}");
    }
    let temp = table(&body, &temp_id);
    for want in [
        "+1.1 °C against the control",
        "-0.4 °C to +2.6 °C",
        "ruled out: ≥+2.6 °C",
        "16 GPUs (each its mean over the bake so far), median 71.2 °C",
        "25% of the planned information (look 1 of 4)",
        "min_effect 3 °C higher than the control",
    ] {
        assert!(
            temp.contains(want),
            "the temperature table should say {want:?}:\n{temp}"
        );
    }
    assert!(!body.contains("&quot;outcome&quot;"), "no raw verdict JSON on the page");

    // A pass keeps its tables, and names the node whose health was unreadable.
    for (verdict, n) in [
        (
            Verdict::Pass {
                evidence: xid_evidence(4),
            },
            4,
        ),
        (
            Verdict::Pass {
                evidence: temp_evidence(4),
            },
            4,
        ),
    ] {
        record_look(&f, &g, &verdict, n).await;
    }
    let nodes = f.db.list_nodes(&Default::default()).await.unwrap();
    let gpu_015 = nodes.iter().find(|n| n.name == "gpu-015").unwrap().id;
    let evidence = orchestrator_engine::watch::DetectorEvidence {
        alpha: 0.05,
        correction: "bonferroni".into(),
        spending: "OBrienFleming".into(),
        bake_seconds: 7200,
        bake_started_at: f.db.clock().now(),
        control_nodes: 10,
        gates: Vec::new(),
        poll_errors: vec![orchestrator_engine::watch::PollError {
            node: gpu_015,
            name: "gpu-015".into(),
            cohort: orchestrator_db::health::Cohort::Control,
            error: "BMC <timed> out".into(),
        }],
    };
    orchestrator_db::testing::await_approval(
        &f.db,
        g.canary,
        orchestrator_types::WaveVerdict {
            outcome: Outcome::Pass,
            summary: "every gate passed against 10 control nodes".into(),
            evidence: serde_json::to_value(&evidence).unwrap(),
        },
    )
    .await
    .unwrap();
    let (_, body) = get(&f.app, &token, &page).await;
    let xid = table(&body, &xid_id);
    assert!(
        xid.contains("pass: no regression beyond min_effect at look 4 of 4"),
        "{xid}"
    );
    assert!(
        xid.contains("100% of the planned information (look 4 of 4, the final look)"),
        "{xid}"
    );
    assert!(
        xid.contains("<a href=\"/nodes/gpu-015\">gpu-015</a> (control: BMC &lt;timed&gt; out)"),
        "{xid}"
    );
    assert!(body.contains(&format!("href=\"/api/v1/rollouts/{}/evidence\"", g.rollout.0)));

    // The audit log: the look in words with its numbers, decisions first,
    // no escaped JSON in the listed fields.
    let (_, audit) = get(&f.app, &token, "/audit?action=health.look").await;
    assert!(
        audit.contains(
            "gate xid look 2 of 4: inconclusive (estimate 2×, ruled out ≥6.5×, 50% of the planned information)"
        ),
        "{audit}"
    );
    let fields: Vec<&str> = audit.split("<dl class=\"fields\">").skip(1).collect();
    assert!(!fields.is_empty(), "{audit}");
    for listed in fields {
        let listed = &listed[..listed.find("</dl>").unwrap()];
        assert!(
            !listed.contains("{&quot;") && !listed.contains("[{"),
            "a JSON blob in the fields: {listed}"
        );
    }
    let (_, all) = get(&f.app, &token, "/audit").await;
    let decisions = all.find("id=\"decisions\"").expect("decisions first");
    assert!(
        decisions < all.find("id=\"audit\"").unwrap(),
        "decisions come before the full log"
    );
}
