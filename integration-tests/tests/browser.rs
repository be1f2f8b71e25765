//! The release managers' UI in a real headless Chromium, driven over
//! WebDriver (chromedriver + fantoccini), against the real controller:
//!
//! - given a simulated fleet of eight GPU nodes (bmc-sim, in process, real
//!   Redfish over loopback) imported with the inventory its BMCs report, a
//!   qualified release whose image is served with its real sha256, a policy
//!   in force whose canary needs one manual approval before the rest of the
//!   fleet, the rollout engine flashing through the Redfish connector, and
//!   the web app on a loopback port with users of every role;
//! - when the release manager Rita starts the rollout through the API from
//!   her browser session, the viewer Vera looks at it, Rita tries to approve
//!   her own rollout, and the second release manager Sam approves the canary
//!   from the rollout page once it has baked;
//! - then Vera is refused (no button, 403 on the POST, no users page), Rita
//!   is refused by the two-person rule, the page shows the canary promoted and
//!   the next wave's nodes flashing and finishing over server-sent events
//!   without a reload, the rollout completes, and bmc-sim counted exactly one
//!   flash per node. Screenshots of the main pages are saved under
//!   `target/ui-screenshots/` for a reviewer;
//! - then, with RMA cases open on the same fleet (criteria in force, parts
//!   discovered, a defect-cluster scan stored), the dashboard's replacement
//!   pipeline, the `/rma` list (quota, cluster report) and a case page are
//!   read in the browser, the evidence package is built from the case page
//!   and downloaded twice with the same bytes (`rma-*.png` screenshots).
//!
//! Skips loudly when `chromium` or `chromedriver` is missing (install them
//! with `web/ci-setup.sh`); fails instead when `WAVEGUARD_REQUIRE_ALL=1`.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use bmc_sim::Scenario;
use fantoccini::{Client, Locator};
use integration_tests::browser::{
    Browser, UI_WAIT, WebServer, add_users, clear_screenshots, login, logout, programs_or_skip, shot, wait_until,
    wave_state_is,
};
use integration_tests::fixtures::{GPU_TO, PolicyYaml, SKU, WaveSize, WaveYaml};
use integration_tests::{Harness, ScenarioYaml};
use orchestrator_db::Db;
use orchestrator_db::execution::{RolloutState, WaveState};
use orchestrator_db::policies::{PolicySync, SyncedPolicy};
use orchestrator_engine::GatelessJudge;
use orchestrator_types::{ReleaseId, Role, RolloutId, WaveId};
use serde_json::json;
use sha2::{Digest, Sha256};
use web::AppState;

const NODES: usize = 8;
const POLICY_NAME: &str = "hgx-gpu-canary";
/// Simulated seconds per real second: the scenario's 1-3 minute flashes take
/// 1-3 s, slow enough to watch progress arrive; the canary's 5 minute bake
/// takes 5 s.
const SPEEDUP: f64 = 60.0;
/// How long a wave may take to flash and bake (a few seconds expected; the
/// margin is for a loaded CI machine).
const WAVE_WAIT: Duration = Duration::from_secs(90);

fn scenario() -> Scenario {
    ScenarioYaml::hgx(NODES)
        .layout(4, 1)
        .nodes_per_nvlink_domain(2)
        .gpu_firmware(GPU_TO, "{min: 1m, max: 3m}")
        .bmc_faults("{min: 10s, max: 20s}", "{min: 20s, max: 40s}")
        .build()
}

/// A two-node canary, then the rest of the fleet two at a time once a
/// release manager approves (`approval: manual` on the wave after the
/// canary is what holds the canary for a human).
fn policy() -> String {
    PolicyYaml::two_waves(POLICY_NAME)
        .required_gates(&["burn_in", "nccl_allreduce"])
        .waves(vec![
            WaveYaml::new("canary", WaveSize::Count(2))
                .stratify_by(&["rack"])
                .bake("5m")
                .max_in_flight(2),
            WaveYaml::new("rest", WaveSize::Rest)
                .manual(1)
                .bake("1m")
                .max_in_flight(2),
        ])
        .concurrency(2, &["per_rack: 2"])
        .automatic_rollback(false)
        .render()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_manager_approves_a_wave_in_chromium_and_watches_it_advance() {
    let Some((chromium, driver)) = programs_or_skip("browser.rs") else {
        return;
    };
    if let Err(err) = run(&chromium, &driver).await {
        panic!("{err:?}");
    }
}

/// Puts the policy in force as a sync of a git repository would, so the
/// rollout is started by name and pins a commit and blob like in
/// production. The ids are SHA-256 git object ids (the blob's is exactly
/// what git computes for the file's content); no repository is read, the
/// sync's reading of git is tested in `orchestrator-policy-git`.
async fn sync_policy(db: &Db) -> anyhow::Result<()> {
    let content = policy();
    let blob_id = hex::encode(Sha256::digest(format!("blob {}\0{content}", content.len()).as_bytes()));
    let commit_id = hex::encode(Sha256::digest(format!("tree for {blob_id}\n").as_bytes()));
    db.record_policy_sync(
        &PolicySync {
            source: "https://git.example/fleet/policies.git (main)".into(),
            commit_id: commit_id.clone(),
            in_force: vec![SyncedPolicy {
                name: POLICY_NAME.into(),
                path: format!("policies/{POLICY_NAME}.yaml"),
                commit_id,
                blob_id,
                content,
            }],
            changed: vec![POLICY_NAME.into()],
            removed: vec![],
            rejected: vec![],
            warnings: vec![],
        },
        "policy-sync",
    )
    .await?;
    Ok(())
}

/// Posts an approval of `wave` from the page's session, as the page's own
/// script would after the confirmation dialog; returns the status and body.
async fn post_approval(client: &Client, rollout: RolloutId, wave: WaveId) -> anyhow::Result<(u64, serde_json::Value)> {
    let answer = client
        .execute(
            "const csrf = document.querySelector('meta[name=csrf-token]').content;
             const r = await fetch(arguments[0], {method: 'POST', headers: {'X-CSRF-Token': csrf,
               'Content-Type': 'application/x-www-form-urlencoded', 'Accept': 'application/json'},
               body: 'confirmed=yes&wave=' + arguments[1]});
             let body = null;
             try { body = await r.json(); } catch (e) {}
             return [r.status, body];",
            vec![json!(format!("/rollouts/{rollout}/approve")), json!(wave.0)],
        )
        .await?;
    let status = answer[0].as_u64().context("a status")?;
    Ok((status, answer[1].clone()))
}

async fn run(chromium: &Path, driver_bin: &Path) -> anyhow::Result<()> {
    clear_screenshots(|name| !name.starts_with("cockpit-"))?;
    let sim = Harness::builder(scenario())
        .speedup(SPEEDUP)
        .sku(SKU)
        .start()
        .await
        .context("harness")?;
    add_users(&sim.db, &[]).await?;
    sync_policy(&sim.db).await?;
    let release = sim
        .add_qualified_release(
            GPU_TO,
            "rita",
            &[
                ("burn_in", "https://ci.example/burn-in/4711: 48 h, 0 XID"),
                ("nccl_allreduce", "busbw 389 GB/s (baseline 387)"),
            ],
        )
        .await?;
    let engine = sim.spawn_engine(Arc::new(GatelessJudge));

    let state = AppState::new(sim.db.clone()).with_engine_nudge(engine.nudge());
    let server = WebServer::start(state).await?;
    let outcome = async {
        let browser = Browser::start(chromium, driver_bin).await?;
        let client = &browser.client;
        let mut driven = drive(client, &server.base, &sim, release).await;
        if driven.is_ok() {
            driven = drive_rma(client, &server.base, &sim).await;
        }
        browser.close().await;
        driven
    }
    .await;
    engine.shutdown().await;
    server.stop().await;
    sim.shutdown().await;
    outcome
}

async fn drive(client: &Client, base: &str, sim: &Harness, release: ReleaseId) -> anyhow::Result<()> {
    let db = &sim.db;
    let started = Instant::now();

    // Logged out, every page sends you to the login form.
    client.goto(&format!("{base}/rollouts")).await?;
    wait_until(
        client,
        "the login form",
        "return !!document.getElementById('login');",
        UI_WAIT,
    )
    .await?;
    shot(client, "01-login").await?;

    // Rita starts the rollout through the API from her browser session, by
    // the policy's name: the handler plans it from the fleet as imported.
    login(client, base, "rita").await?;
    let answer = client
        .execute(
            "const csrf = document.querySelector('meta[name=csrf-token]').content;
             const r = await fetch('/api/v1/rollouts', {method: 'POST', headers: {'X-CSRF-Token': csrf,
               'Content-Type': 'application/json', 'Accept': 'application/json'},
               body: JSON.stringify({release_id: arguments[0], policy: arguments[1], seed: 5})});
             return [r.status, await r.json()];",
            vec![json!(release.0), json!(POLICY_NAME)],
        )
        .await?;
    ensure!(answer[0] == json!(201), "the rollout starts: {answer}");
    let plan = &answer[1];
    let rollout = RolloutId(plan["rollout"]["id"].as_i64().context("rollout id")?);
    let planned: Vec<(String, u64)> = plan["waves"]
        .as_array()
        .context("waves")?
        .iter()
        .map(|w| {
            (
                w["name"].as_str().unwrap_or_default().to_owned(),
                w["nodes"].as_u64().unwrap_or(0),
            )
        })
        .collect();
    ensure!(
        planned == [("canary".to_owned(), 2), ("rest".to_owned(), NODES as u64 - 2)],
        "planned waves: {plan}"
    );
    let waves = db.rollout_waves(rollout).await?;
    let (canary, rest) = match waves.as_slice() {
        [canary, rest] => (canary.id, rest.id),
        other => bail!("two waves expected: {other:?}"),
    };
    ensure!(
        waves[0].approvals_required == 1,
        "the canary waits for one approval: {waves:?}"
    );
    let rollout_url = format!("{base}/rollouts/{rollout}");

    // The author cannot approve their own rollout (two-person rule): the
    // page says so instead of offering the button, and the server refuses.
    client.goto(&rollout_url).await?;
    wait_until(
        client,
        "the two-person notice",
        "return !!document.querySelector('.two-person');",
        UI_WAIT,
    )
    .await?;
    ensure!(client.find_all(Locator::Css("button.approve")).await?.is_empty());
    let (status, body) = post_approval(client, rollout, canary).await?;
    ensure!(
        status == 403 && body["error"]["code"] == "forbidden" && body.to_string().contains("two-person rule"),
        "the author's approval is refused: {status} {body}"
    );
    logout(client, base).await?;

    // A viewer reads everything, approves nothing.
    login(client, base, "vera").await?;
    client.goto(&rollout_url).await?;
    wait_until(
        client,
        "the rollout page",
        "return !!document.getElementById('waves');",
        UI_WAIT,
    )
    .await?;
    ensure!(
        client.find_all(Locator::Css("button.approve")).await?.is_empty(),
        "a viewer sees no approve button"
    );
    let (status, _) = post_approval(client, rollout, canary).await?;
    ensure!(status == 403, "a viewer's approval is refused with 403, got {status}");
    client.goto(&format!("{base}/users")).await?;
    let title = client.find(Locator::Id("error-title")).await?.text().await?;
    ensure!(title == "Not allowed", "a viewer is refused the users page: {title:?}");
    shot(client, "02-viewer-refused").await?;
    ensure!(db.wave_approvals(canary).await?.is_empty(), "no approval recorded yet");
    logout(client, base).await?;

    // Sam, the second release manager, looks around while the canary runs.
    login(client, base, "sam").await?;
    for (name, path) in [
        ("03-fleet-overview", "/".to_owned()),
        ("04-releases", "/releases".to_owned()),
        ("05-release-qualification", format!("/releases/{release}")),
        ("06-rollouts", "/rollouts".to_owned()),
        ("07-policy", "/policies".to_owned()),
    ] {
        client.goto(&format!("{base}{path}")).await?;
        wait_until(client, name, "return document.readyState === 'complete';", UI_WAIT).await?;
        shot(client, name).await?;
    }

    // From here on the rollout page is loaded once: every change below
    // arrives as a server-sent event. A marker on `window` would be lost
    // with a reload, and a recorder keeps every progress line the rest
    // wave showed, however briefly.
    client.goto(&rollout_url).await?;
    wait_until(
        client,
        "the rollout page",
        "return !!document.getElementById('waves');",
        UI_WAIT,
    )
    .await?;
    client
        .execute(
            "const selector = '#wave-' + arguments[0] + ' .wave-progress';
             window.__noReload = 'still here';
             window.__restProgress = [];
             window.__restRecorder = setInterval(() => {
               const p = document.querySelector(selector);
               const text = p ? p.textContent.trim() : '';
               const seen = window.__restProgress;
               if (text && seen[seen.length - 1] !== text) seen.push(text);
             }, 50);
             return true;",
            vec![json!(rest.0)],
        )
        .await?;
    wait_until(
        client,
        "the canary flashed and baked, awaiting approval (live)",
        &wave_state_is(canary, "awaiting_approval"),
        WAVE_WAIT,
    )
    .await?;
    eprintln!("canary awaiting approval after {:?}", started.elapsed());
    ensure!(
        db.exec_rollout(rollout).await?.state == RolloutState::Running,
        "the rollout runs while the canary waits"
    );
    wait_until(
        client,
        "the approve button",
        &format!("return !!document.getElementById('approve-{canary}');"),
        UI_WAIT,
    )
    .await?;
    shot(client, "08-rollout-awaiting-approval").await?;

    client
        .find(Locator::Id(&format!("approve-{canary}")))
        .await?
        .click()
        .await?;
    // The confirmation dialog.
    client.accept_alert().await?;
    wait_until(
        client,
        "the approval message",
        "const f = document.querySelector('#flash .flash'); \
         return !!f && f.textContent.includes('Approved wave canary');",
        UI_WAIT,
    )
    .await?;
    wait_until(
        client,
        "the canary promoted (live)",
        &wave_state_is(canary, "promoted"),
        UI_WAIT,
    )
    .await?;
    // The next wave's nodes flash, two at a time: wait for the first to finish.
    let rest_nodes = NODES - 2;
    wait_until(
        client,
        "the next wave's first nodes done (live)",
        &format!(
            "const p = document.querySelector('#wave-{rest} .wave-progress'); \
             return !!p && !p.textContent.trim().startsWith('0/{rest_nodes} done');"
        ),
        WAVE_WAIT,
    )
    .await?;
    shot(client, "09-rollout-advancing").await?;
    wait_until(
        client,
        "the rollout completed (live)",
        "const s = document.getElementById('rollout-state'); \
         return !!s && s.textContent.trim() === 'completed';",
        WAVE_WAIT,
    )
    .await?;
    eprintln!("rollout completed after {:?}", started.elapsed());
    let marker = client.execute("return window.__noReload || null;", vec![]).await?;
    ensure!(marker == json!("still here"), "the page was reloaded: {marker}");
    let live = client.find(Locator::Id("live")).await?.attr("data-updated").await?;
    ensure!(live.is_some(), "the live region was updated by an event");
    let seen = client
        .execute(
            "clearInterval(window.__restRecorder); return window.__restProgress;",
            vec![],
        )
        .await?;
    let seen: Vec<String> = serde_json::from_value(seen)?;
    eprintln!("rest wave progress as shown live: {seen:#?}");
    ensure!(
        seen.first()
            .is_some_and(|s| s.starts_with(&format!("0/{rest_nodes} done"))),
        "the rest wave started at 0: {seen:?}"
    );
    ensure!(
        seen.last()
            .is_some_and(|s| s.starts_with(&format!("{rest_nodes}/{rest_nodes} done · {rest_nodes} succeeded"))),
        "the rest wave finished every node: {seen:?}"
    );
    // Some nodes finished while others had not yet: progress arrived in
    // steps, not only as a final state.
    let partial = seen.iter().any(|s| {
        s.split('/')
            .next()
            .and_then(|n| n.parse::<usize>().ok())
            .is_some_and(|done| done > 0 && done < rest_nodes)
    });
    ensure!(partial, "partial progress was shown live: {seen:?}");

    // The node table follows live too, on the same page (no reload).
    wait_until(
        client,
        "every node's row reads succeeded (live)",
        &format!(
            "const cells = Array.from(document.querySelectorAll('#nodes tbody tr td:nth-child(6)')); \
             return cells.length === {NODES} && cells.every(td => td.textContent.trim() === 'succeeded');"
        ),
        WAVE_WAIT,
    )
    .await?;
    let marker = client.execute("return window.__noReload || null;", vec![]).await?;
    ensure!(marker == json!("still here"), "the page was reloaded: {marker}");

    // A fresh load shows every node's row succeeded.
    client.goto(&rollout_url).await?;
    let states: Vec<String> = client
        .execute(
            "return Array.from(document.querySelectorAll('#nodes tbody tr td:nth-child(6)')).map(td => td.textContent.trim());",
            vec![],
        )
        .await
        .map(|v| serde_json::from_value(v).unwrap_or_default())?;
    ensure!(
        states.len() == NODES && states.iter().all(|s| s == "succeeded"),
        "node table: {states:?}"
    );
    shot(client, "10-rollout-completed").await?;

    // The next discovery reads the new version back over Redfish, and the
    // fleet overview shows every GPU on it.
    sim.discover().await?;
    for node in db.list_nodes(&Default::default()).await? {
        let gpus: Vec<String> = db
            .node_components(node.id)
            .await?
            .into_iter()
            .filter(|c| c.reading.inventory_id.starts_with("HGX_FW_GPU_"))
            .map(|c| c.reading.version.to_string())
            .collect();
        ensure!(
            gpus.len() == 8 && gpus.iter().all(|v| v == GPU_TO),
            "{} as discovered: {gpus:?}",
            node.name
        );
    }
    for (name, path) in [
        ("11-audit-log", "/audit"),
        ("12-audit-log-sam", "/audit?actor=sam"),
        ("13-fleet-overview-after", "/"),
        ("14-nodes", "/nodes"),
        ("15-nodes-at-target", "/nodes?version=96.00.61.00.01"),
        ("16-rollouts-list", "/rollouts"),
        ("17-policy-summary", "/policies"),
        ("18-api-tokens", "/tokens"),
    ] {
        client.goto(&format!("{base}{path}")).await?;
        wait_until(client, name, "return document.readyState === 'complete';", UI_WAIT).await?;
        shot(client, name).await?;
    }
    // Every node runs the target now, and the node list says so from the server.
    client.goto(&format!("{base}/nodes?version={GPU_TO}")).await?;
    let count = client.find(Locator::Id("node-count")).await?.text().await?;
    ensure!(count == format!("Nodes 1–{NODES} of {NODES}"), "{count}");

    // The record: Sam's approval, audited, and a completed rollout by Rita.
    let done = db.exec_rollout(rollout).await?;
    ensure!(done.state == RolloutState::Completed, "{done:?}");
    ensure!(done.created_by == "rita", "{done:?}");
    for wave in db.rollout_waves(rollout).await? {
        ensure!(wave.state == WaveState::Promoted, "{wave:?}");
    }
    let approvals = db.wave_approvals(canary).await?;
    ensure!(
        approvals.len() == 1 && approvals[0].approver == "sam",
        "one approval, by sam: {approvals:?}"
    );
    let audit = db
        .audit_entries(&orchestrator_db::AuditFilter {
            action: Some("wave.approve".into()),
            ..Default::default()
        })
        .await?;
    ensure!(
        audit.len() == 1 && audit[0].actor == "sam",
        "the approval is audited: {audit:?}"
    );

    // The fleet: every node flashed exactly once, to the release, and runs it.
    for endpoint in sim.fleet.endpoints() {
        let counts = sim.fleet.flash_counts(&endpoint.name).context("sim node")?;
        ensure!(
            counts == BTreeMap::from([(GPU_TO.to_owned(), 1)]),
            "{}: flash counts {counts:?}",
            endpoint.name
        );
        let versions = sim.fleet.versions(&endpoint.name).context("sim node")?;
        let gpus: Vec<&str> = versions
            .iter()
            .filter(|c| c.id.starts_with("HGX_FW_GPU_"))
            .map(|c| c.active.as_str())
            .collect();
        ensure!(
            gpus.len() == 8 && gpus.iter().all(|v| *v == GPU_TO),
            "{}: {gpus:?}",
            endpoint.name
        );
    }
    eprintln!("browser test done after {:?}", started.elapsed());
    Ok(())
}

/// The RMA pages in the browser, as Sam (a release manager) after the rollout.
async fn drive_rma(client: &Client, base: &str, sim: &Harness) -> anyhow::Result<()> {
    use orchestrator_db::testing::fixtures::{
        put_example_rma_criteria, record_example_parts, rma_candidate, store_example_cluster_scan,
    };
    let db = &sim.db;
    let nodes = db.list_nodes(&Default::default()).await?;
    let (first, second) = match nodes.as_slice() {
        [a, b, ..] => (a.name.clone(), b.name.clone()),
        other => bail!("two nodes expected: {other:?}"),
    };
    put_example_rma_criteria(db).await?;
    let serials = record_example_parts(db, &first, 8).await?;
    record_example_parts(db, &second, 8).await?;
    let now = db.clock().now();
    let mut candidate = rma_candidate(
        &serials[2],
        &first,
        "row_remap_failure",
        orchestrator_rma::Severity::High,
    );
    candidate.began_at = now;
    candidate.samples = vec![orchestrator_rma::Observation {
        at: now,
        source_id: format!("dcgm/{}/row_remap_failure", serials[2]),
        kind: orchestrator_rma::ObservationKind::Flag {
            flag: orchestrator_rma::HealthFlag::RowRemapFailure,
            set: true,
        },
    }];
    let case = db.open_rma_case(&candidate, "detector").await?;
    let other = db
        .open_rma_case(
            &rma_candidate(
                &format!("{second}-GPU5"),
                &second,
                "fallen_off_bus",
                orchestrator_rma::Severity::Medium,
            ),
            "detector",
        )
        .await?;
    db.apply_rma_event(
        &other.id,
        orchestrator_rma::CaseEvent::CollectEvidence {
            manifest_sha256: "ab".repeat(32),
        },
        &orchestrator_rma::Actor {
            name: "ada".into(),
            role: Role::Admin,
        },
    )
    .await?;
    store_example_cluster_scan(db, now - chrono::TimeDelta::days(30)).await?;

    // The dashboard's pipeline panel: open cases per state, quota, days per state, the trend.
    client.goto(&format!("{base}/")).await?;
    wait_until(
        client,
        "the pipeline panel",
        "return !!document.getElementById('rma-pipeline');",
        UI_WAIT,
    )
    .await?;
    let panel = client.find(Locator::Id("rma-pipeline")).await?.text().await?;
    for want in [
        "2 open RMA case(s)",
        "nvidia: 0 of 5 used per week, 5 left, 1 waiting",
        "Days in each state",
        "Weekly trend",
        &case.id,
    ] {
        ensure!(panel.contains(want), "the pipeline panel shows {want:?}: {panel}");
    }
    client
        .execute("document.getElementById('rma-pipeline').scrollIntoView();", vec![])
        .await?;
    shot(client, "rma-dashboard-pipeline").await?;

    // The list: both cases, the quota per vendor, the latest cluster report.
    client.goto(&format!("{base}/rma")).await?;
    wait_until(
        client,
        "the RMA list",
        "return !!document.getElementById('cases');",
        UI_WAIT,
    )
    .await?;
    let rows = client.find_all(Locator::Css("#cases tr.rma-case")).await?;
    ensure!(rows.len() == 2, "two open cases listed, got {}", rows.len());
    let quota = client.find(Locator::Id("quotas")).await?.text().await?;
    ensure!(
        quota.contains("nvidia") && quota.contains(&other.id),
        "quota and queue: {quota}"
    );
    let clusters = client.find(Locator::Id("clusters")).await?.text().await?;
    ensure!(clusters.contains("699-2G520-0200-000/L7"), "the defect lot: {clusters}");
    shot(client, "rma-list").await?;

    // A case page: build the evidence package from it, then download it twice.
    client.find(Locator::LinkText(&case.id)).await?.click().await?;
    wait_until(
        client,
        "the case page",
        "return !!document.getElementById('evidence-files');",
        UI_WAIT,
    )
    .await?;
    let files = client.find_all(Locator::Css("#evidence-files tbody tr")).await?;
    ensure!(files.len() >= 7, "the package's files are listed: {}", files.len());
    client.find(Locator::Id("build-evidence")).await?.click().await?;
    client.accept_alert().await?;
    wait_until(
        client,
        "the case in evidence collected",
        "const s = document.getElementById('case-state'); \
         return !!s && s.textContent.trim() === 'evidence collected';",
        UI_WAIT,
    )
    .await?;
    let submit = client.find(Locator::Id("submit-quota")).await?.text().await?;
    ensure!(
        submit.contains("0 used, 5 left") && submit.contains("number 1 of 2 in the queue"),
        "the submit box: {submit}"
    );
    let downloads = client
        .execute(
            "const link = document.getElementById('evidence-download').getAttribute('href');
             const out = [];
             for (const _ of [1, 2]) {
               const r = await fetch(link);
               const bytes = await r.arrayBuffer();
               const digest = await crypto.subtle.digest('SHA-256', bytes);
               out.push([r.status, r.headers.get('content-type'), r.headers.get('content-disposition'),
                 Array.from(new Uint8Array(digest)).map(b => b.toString(16).padStart(2, '0')).join('')]);
             }
             return out;",
            vec![],
        )
        .await?;
    ensure!(
        downloads[0][0] == json!(200) && downloads[0][1] == json!("application/x-tar"),
        "the archive downloads: {downloads}"
    );
    ensure!(
        downloads[0][2]
            .as_str()
            .is_some_and(|d| d.contains(&format!("{}-evidence.tar", case.id))),
        "named after the case: {downloads}"
    );
    ensure!(
        downloads[0] == downloads[1],
        "two downloads are the same bytes: {downloads}"
    );
    let stored = db.rma_case(&case.id).await?;
    ensure!(
        stored.case.history.last().is_some_and(|t| t.actor == "sam"),
        "recorded as sam: {:?}",
        stored.case.history
    );
    client
        .execute("document.getElementById('evidence').scrollIntoView();", vec![])
        .await?;
    shot(client, "rma-case").await?;
    Ok(())
}
