//! The release managers' UI in a real headless Chromium, driven over
//! WebDriver (chromedriver + fantoccini).
//!
//! Given a controller serving the UI on loopback, a rollout whose canary
//! wave awaits one approval (rows seeded in the database) and a scripted
//! stand-in for the engine that promotes a wave once its approvals are in
//! and then finishes the next wave's steps one by one;
//! when a viewer logs in, then a release manager who did not start the
//! rollout approves the canary from the rollout page;
//! then the viewer is refused, the approval is recorded, and the page shows
//! the wave promoted and the next wave's progress arriving over server-sent
//! events without a reload. Screenshots of the main pages are saved under
//! `target/ui-screenshots/` for a reviewer.
//!
//! Skips loudly when `chromium` or `chromedriver` is missing (install them
//! with `web/ci-setup.sh`); fails instead when `WAVEGUARD_REQUIRE_ALL=1`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use chrono::Utc;
use fantoccini::{Client, ClientBuilder, Locator};
use orchestrator_db::Db;
use orchestrator_db::execution::{
    Blocker, NewPlan, NewStep, NewWave, StepChange, StepFilter, StepState, WaveChange, WaveState,
};
use orchestrator_db::model::{NewGateResult, NewNode, NewRelease, NewRollout, NodeLabels};
use orchestrator_types::{ComponentKind, FirmwareVersion, QualificationState, Role, SystemClock, TransitionRequest};
use serde_json::json;
use web::AppState;

const REQUIRE_ALL_ENV: &str = "WAVEGUARD_REQUIRE_ALL";
const PASSWORD: &str = "correct horse battery staple";
/// How long the test waits for something to show in the browser.
const UI_WAIT: Duration = Duration::from_secs(20);

fn find_program(names: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    names
        .iter()
        .flat_map(|name| std::env::split_paths(&path).map(move |dir| dir.join(name)))
        .find(|candidate| candidate.is_file())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_manager_approves_a_wave_in_chromium_and_watches_it_advance() {
    let chromium = find_program(&["chromium", "chromium-browser", "google-chrome"]);
    let driver = find_program(&["chromedriver"]);
    let (Some(chromium), Some(driver)) = (chromium, driver) else {
        let require_all = std::env::var(REQUIRE_ALL_ENV).is_ok_and(|v| v == "1");
        assert!(
            !require_all,
            "{REQUIRE_ALL_ENV}=1 but `chromium` and/or `chromedriver` are not on PATH; run web/ci-setup.sh"
        );
        eprintln!(
            "\n\n*** SKIPPED browser test: `chromium` and/or `chromedriver` not on PATH (run web/ci-setup.sh) ***\n\n"
        );
        return;
    };
    if let Err(err) = run(&chromium, &driver).await {
        panic!("{err:?}");
    }
}

struct Seeded {
    rollout: i64,
    canary: i64,
    rest: i64,
    release: i64,
}

async fn seed(db: &Db) -> anyhow::Result<Seeded> {
    let hash = web::auth::hash_password(PASSWORD)?;
    db.add_user("rita", "Rita Manager", Role::ReleaseManager, Some(&hash), "test")
        .await?;
    db.add_user("sam", "Sam Second", Role::ReleaseManager, Some(&hash), "test")
        .await?;
    db.add_user("vera", "Vera Viewer", Role::Viewer, Some(&hash), "test")
        .await?;
    db.add_user("ada", "Ada Admin", Role::Admin, Some(&hash), "test")
        .await?;

    let nodes: Vec<NewNode> = (0..8)
        .map(|i| NewNode {
            name: format!("gpu-node-{i:02}"),
            bmc_url: format!("https://10.0.0.{i}"),
            credential_ref: "default".into(),
            platform_sku: "hgx-h100-8".into(),
            labels: NodeLabels {
                region: "us-east".into(),
                cluster: "c1".into(),
                rack: format!("r{}", i / 2),
                nvlink_domain: format!("nvl{}", i / 4),
            },
        })
        .collect();
    db.import_nodes(&nodes, "test").await?;
    let nodes = db.list_nodes(&Default::default()).await?;
    for (i, node) in nodes.iter().enumerate() {
        let version = if i < 6 { "96.00.5E.00.01" } else { "96.00.61.00.01" };
        let readings: Vec<_> = (0..8)
            .map(|gpu| orchestrator_db::model::ComponentReading {
                inventory_id: format!("HGX_FW_GPU_SXM_{gpu}"),
                kind: ComponentKind::Gpu,
                version: FirmwareVersion::parse(version).unwrap_or_else(|e| panic!("{e}")),
                updateable: true,
                software_id: None,
                health: Some("OK".into()),
            })
            .chain(std::iter::once(orchestrator_db::model::ComponentReading {
                inventory_id: "BMC_0".into(),
                kind: ComponentKind::Bmc,
                version: FirmwareVersion::parse("24.04.1").unwrap_or_else(|e| panic!("{e}")),
                updateable: true,
                software_id: None,
                health: Some("OK".into()),
            }))
            .collect();
        db.record_inventory(node.id, &readings).await?;
    }
    db.record_discovery_error(nodes[7].id, "BMC did not answer: connection timed out")
        .await?;

    let release = db
        .add_release(
            &NewRelease {
                component_kind: ComponentKind::Gpu,
                version: FirmwareVersion::parse("96.00.61.00.01")?,
                image_uri: "https://images.example/gpu-96.00.61.00.01.fw".into(),
                sha256: "ab".repeat(32),
                size_bytes: 1 << 20,
                platforms: vec!["hgx-h100-8".into()],
                release_notes: "Fixes NVLink retraining under thermal stress.".into(),
            },
            "rita",
        )
        .await?;
    db.transition_release(
        release.id,
        &TransitionRequest {
            to: QualificationState::Qualifying,
            reason: None,
        },
        "rita",
    )
    .await?;
    for (gate, passed, evidence) in [
        ("burn-in", true, "https://ci.example/burn-in/4711"),
        ("nccl-allreduce", true, "busbw 389 GB/s (baseline 387)"),
        ("thermal-soak", true, "max 81 C over 8 h"),
    ] {
        db.record_gate_result(
            release.id,
            &NewGateResult {
                gate: gate.into(),
                passed,
                evidence: evidence.into(),
            },
            "qual-bot",
        )
        .await?;
    }
    db.transition_release(
        release.id,
        &TransitionRequest {
            to: QualificationState::Qualified,
            reason: None,
        },
        "rita",
    )
    .await?;

    let step = |i: usize| NewStep {
        node_id: nodes[i].id,
        inventory_id: "HGX_FW_GPU_*".into(),
        expected_from_version: "96.00.5E.00.01".into(),
    };
    let plan = NewPlan {
        waves: vec![
            NewWave {
                name: "canary".into(),
                bake_seconds: 3600,
                approvals_required: 1,
                max_in_flight: 2,
                gates: vec!["xid-rate".into()],
                control_nodes: vec![nodes[4].id, nodes[5].id],
                steps: (0..2).map(step).collect(),
            },
            NewWave {
                name: "rest".into(),
                bake_seconds: 600,
                approvals_required: 0,
                max_in_flight: 2,
                gates: vec![],
                control_nodes: vec![],
                steps: (2..6).map(step).collect(),
            },
        ],
        rollback_assessment: json!({ "possible": true }),
    };
    let rollout = db
        .start_rollout(
            &NewRollout {
                release_id: release.id,
                policy_name: "hgx-gpu".into(),
                policy_commit: "3f2a9c1d0e5b7a8c9d0e1f2a3b4c5d6e7f8a9b0c".into(),
                policy_blob: "9b0c".into(),
                seed: 7,
            },
            "name: hgx-gpu\n",
            &plan,
            "rita",
        )
        .await?;
    let waves = db.rollout_waves(rollout.id).await?;
    let fence = lease(db).await?;
    let now = Utc::now();
    // The canary ran, baked, passed its verdict and waits for one approval.
    for s in db
        .steps(&StepFilter {
            wave_id: Some(waves[0].id),
            ..Default::default()
        })
        .await?
    {
        finish_step(db, &fence, s.id).await?;
    }
    db.transition_wave(
        &fence,
        waves[0].id,
        WaveState::Planned,
        &WaveChange {
            state: Some(WaveState::AwaitingApproval),
            started_at: Some(now - chrono::Duration::hours(2)),
            bake_started_at: Some(now - chrono::Duration::hours(1)),
            verdict: Some(
                json!({ "outcome": "pass", "summary": "xid-rate: canary 0.61 vs control 0.58 per GPU-hour, p=0.71" }),
            ),
            ..Default::default()
        },
        json!({}),
    )
    .await?;
    db.set_wave_blockers(&fence, waves[0].id, &[Blocker::Approvals { have: 0, need: 1 }])
        .await?;
    db.set_wave_blockers(&fence, waves[1].id, &[Blocker::PreviousWave { wave: "canary".into() }])
        .await?;
    Ok(Seeded {
        rollout: rollout.id.0,
        canary: waves[0].id.0,
        rest: waves[1].id.0,
        release: release.id.0,
    })
}

async fn lease(db: &Db) -> anyhow::Result<orchestrator_db::execution::Fence> {
    db.acquire_lease("executor", "browser-test", chrono::Duration::hours(1))
        .await?
        .context("the executor lease is free in a fresh database")
}

async fn finish_step(
    db: &Db,
    fence: &orchestrator_db::execution::Fence,
    step: orchestrator_types::StepId,
) -> anyhow::Result<()> {
    db.transition_step(
        fence,
        step,
        StepState::Pending,
        &StepChange {
            state: Some(StepState::Succeeded),
            previous_version: Some("96.00.5E.00.01".into()),
            started_at: Some(Utc::now()),
            finished_at: Some(Utc::now()),
            ..Default::default()
        },
        json!({}),
    )
    .await?;
    Ok(())
}

/// The engine's part, scripted: promote the canary once approved, then run
/// the next wave one node at a time, slowly enough to watch.
async fn stand_in_engine(db: Db, seeded: &Seeded) -> anyhow::Result<()> {
    let canary = orchestrator_types::WaveId(seeded.canary);
    let rest = orchestrator_types::WaveId(seeded.rest);
    let fence = lease(&db).await?;
    loop {
        let approvals = db.wave_approvals(canary).await?;
        if !approvals.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    db.transition_wave(
        &fence,
        canary,
        WaveState::AwaitingApproval,
        &WaveChange {
            state: Some(WaveState::Promoted),
            ended_at: Some(Utc::now()),
            decision: Some("promote".into()),
            ..Default::default()
        },
        json!({}),
    )
    .await?;
    db.set_wave_blockers(&fence, canary, &[]).await?;
    db.set_wave_blockers(&fence, rest, &[]).await?;
    db.transition_wave(
        &fence,
        rest,
        WaveState::Planned,
        &WaveChange {
            state: Some(WaveState::Running),
            started_at: Some(Utc::now()),
            ..Default::default()
        },
        json!({}),
    )
    .await?;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let steps = db
        .steps(&StepFilter {
            wave_id: Some(rest),
            ..Default::default()
        })
        .await?;
    for s in steps.iter().take(3) {
        finish_step(&db, &fence, s.id).await?;
        tokio::time::sleep(Duration::from_millis(1200)).await;
    }
    Ok(())
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

async fn wait_for_port(port: u16) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_ok() {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bail!("chromedriver did not listen on port {port}")
}

fn screenshot_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join("target"));
    target.join("ui-screenshots")
}

async fn shot(client: &Client, name: &str) -> anyhow::Result<()> {
    let dir = screenshot_dir();
    std::fs::create_dir_all(&dir)?;
    let png = client.screenshot().await?;
    std::fs::write(dir.join(format!("{name}.png")), png)?;
    Ok(())
}

/// Waits until `check` returns true, re-evaluating a script in the page.
async fn wait_until(client: &Client, what: &str, script: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + UI_WAIT;
    loop {
        let value = client.execute(script, vec![]).await?;
        if value.as_bool() == Some(true) {
            return Ok(());
        }
        if Instant::now() > deadline {
            let source = client.source().await.unwrap_or_default();
            bail!("timed out waiting for {what}; page:\n{source}");
        }
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
}

async fn login(client: &Client, base: &str, user: &str) -> anyhow::Result<()> {
    client.goto(&format!("{base}/login")).await?;
    client.find(Locator::Id("username")).await?.send_keys(user).await?;
    client.find(Locator::Id("password")).await?.send_keys(PASSWORD).await?;
    client.find(Locator::Id("login")).await?.click().await?;
    wait_until(
        client,
        "the logged-in page",
        "return !!document.getElementById('whoami');",
    )
    .await?;
    let who = client.find(Locator::Id("whoami")).await?.text().await?;
    anyhow::ensure!(who.contains(user), "logged in as {who:?}, wanted {user}");
    Ok(())
}

async fn logout(client: &Client, base: &str) -> anyhow::Result<()> {
    client.goto(&format!("{base}/")).await?;
    client.find(Locator::Css("form.who button")).await?.click().await?;
    wait_until(client, "the login page", "return !!document.getElementById('login');").await
}

async fn run(chromium: &Path, driver_bin: &Path) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let db = Db::connect_and_migrate(
        &format!("sqlite://{}", dir.path().join("waveguard.db").display()),
        Arc::new(SystemClock),
    )
    .await?;
    let seeded = seed(&db).await?;

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr: SocketAddr = listener.local_addr()?;
    let base = format!("http://{addr}");
    let (stop_web, web_stopped) = tokio::sync::oneshot::channel::<()>();
    let web_task = tokio::spawn(web::serve(listener, AppState::new(db.clone()), async move {
        let _ = web_stopped.await;
    }));

    let port = free_port()?;
    let mut driver = tokio::process::Command::new(driver_bin)
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .context("cannot start chromedriver")?;
    wait_for_port(port).await?;
    let profile = tempfile::tempdir()?;
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".into(),
        json!({
            "binary": chromium.display().to_string(),
            "args": [
                "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--disable-dev-shm-usage", "--window-size=1400,1000",
                format!("--user-data-dir={}", profile.path().display()),
            ],
        }),
    );
    // Both rustls providers are linked in this workspace, so pick one; the
    // WebDriver connection is plain HTTP on loopback anyway.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = ClientBuilder::rustls()?
        .capabilities(caps)
        .connect(&format!("http://127.0.0.1:{port}"))
        .await
        .context("cannot open a WebDriver session")?;

    let outcome = drive(&client, &base, &db, &seeded).await;
    let _ = client.close().await;
    let _ = driver.kill().await;
    let _ = stop_web.send(());
    let _ = web_task.await;
    outcome
}

async fn drive(client: &Client, base: &str, db: &Db, seeded: &Seeded) -> anyhow::Result<()> {
    let rollout_url = format!("{base}/rollouts/{}", seeded.rollout);

    // Logged out, every page sends you to the login form.
    client.goto(&rollout_url).await?;
    wait_until(client, "the login form", "return !!document.getElementById('login');").await?;
    shot(client, "01-login").await?;

    // A viewer reads everything, approves nothing.
    login(client, base, "vera").await?;
    client.goto(&rollout_url).await?;
    wait_until(client, "the rollout page", "return !!document.getElementById('waves');").await?;
    let buttons = client.find_all(Locator::Css("button.approve")).await?;
    anyhow::ensure!(buttons.is_empty(), "a viewer sees no approve button");
    let status = client
        .execute(
            "const csrf = document.querySelector('meta[name=csrf-token]').content;
             const r = await fetch(arguments[0], {method: 'POST', headers: {'X-CSRF-Token': csrf,
               'Content-Type': 'application/x-www-form-urlencoded', 'Accept': 'application/json'},
               body: 'confirmed=yes&wave=' + arguments[1]});
             return r.status;",
            vec![
                json!(format!("/rollouts/{}/approve", seeded.rollout)),
                json!(seeded.canary),
            ],
        )
        .await?;
    anyhow::ensure!(
        status == json!(403),
        "a viewer's approval is refused with 403, got {status}"
    );
    client.goto(&format!("{base}/users")).await?;
    let title = client.find(Locator::Id("error-title")).await?.text().await?;
    anyhow::ensure!(title == "Not allowed", "a viewer is refused the users page: {title:?}");
    shot(client, "02-viewer-refused").await?;
    anyhow::ensure!(
        db.wave_approvals(orchestrator_types::WaveId(seeded.canary))
            .await?
            .is_empty()
    );
    logout(client, base).await?;

    // The author cannot approve their own rollout (two-person rule).
    login(client, base, "rita").await?;
    client.goto(&rollout_url).await?;
    wait_until(
        client,
        "the two-person notice",
        "return !!document.querySelector('.two-person');",
    )
    .await?;
    logout(client, base).await?;

    // A second release manager approves the canary, without a reload.
    let engine_db = db.clone();
    let script_seeded = Seeded { ..*seeded };
    let engine = tokio::spawn(async move { stand_in_engine(engine_db, &script_seeded).await });
    login(client, base, "sam").await?;
    for (name, path) in [
        ("03-fleet-overview", "/".to_owned()),
        ("04-releases", "/releases".to_owned()),
        ("05-release-qualification", format!("/releases/{}", seeded.release)),
        ("06-rollouts", "/rollouts".to_owned()),
        ("07-audit-log", "/audit".to_owned()),
        ("08-policy", "/policies".to_owned()),
    ] {
        client.goto(&format!("{base}{path}")).await?;
        wait_until(client, name, "return document.readyState === 'complete';").await?;
        shot(client, name).await?;
    }
    client.goto(&rollout_url).await?;
    wait_until(
        client,
        "the approve button",
        "return !!document.querySelector('button.approve');",
    )
    .await?;
    shot(client, "09-rollout-awaiting-approval").await?;
    client
        .execute("window.__noReload = 'still here'; return true;", vec![])
        .await?;
    client
        .find(Locator::Id(&format!("approve-{}", seeded.canary)))
        .await?
        .click()
        .await?;
    // The confirmation dialog.
    client.accept_alert().await?;
    wait_until(
        client,
        "the approval message",
        "const f = document.querySelector('#flash .flash'); return !!f && f.textContent.includes('Approved wave canary');",
    )
    .await?;
    // Server-sent events: the canary turns promoted, then the next wave's
    // nodes finish one by one, with no page load in between.
    let canary_promoted = format!(
        "const w = document.querySelector('#wave-{} .wave-state'); return !!w && w.textContent.trim() === 'promoted';",
        seeded.canary
    );
    wait_until(client, "the canary promoted (live)", &canary_promoted).await?;
    let progress = format!(
        "const p = document.querySelector('#wave-{} .wave-progress'); return !!p && p.textContent.startsWith('2/4');",
        seeded.rest
    );
    wait_until(client, "live progress of the next wave", &progress).await?;
    let marker = client.execute("return window.__noReload || null;", vec![]).await?;
    anyhow::ensure!(marker == json!("still here"), "the page was not reloaded: {marker}");
    let live = client.find(Locator::Id("live")).await?.attr("data-updated").await?;
    anyhow::ensure!(live.is_some(), "the live region was updated by an event");
    shot(client, "10-rollout-advancing").await?;

    engine.await.context("stand-in engine task")??;
    let approvals = db.wave_approvals(orchestrator_types::WaveId(seeded.canary)).await?;
    anyhow::ensure!(
        approvals.len() == 1 && approvals[0].approver == "sam",
        "one approval, by sam: {approvals:?}"
    );
    let audit = db
        .audit_entries(&orchestrator_db::AuditFilter {
            action: Some("wave.approve".into()),
            ..Default::default()
        })
        .await?;
    anyhow::ensure!(
        audit.len() == 1 && audit[0].actor == "sam",
        "the approval is audited: {audit:?}"
    );
    Ok(())
}
