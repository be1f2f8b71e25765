//! The release manager's cockpit in a real headless Chromium (issue 26): live rollout pages that
//! scale and never get in the way of a decision.
//!
//! - given a simulated fleet of eight GPU nodes (bmc-sim in process, real Redfish over loopback),
//!   a qualified release, a rollout of it whose canary waits for four approvals, the engine
//!   flashing, and the web app on a loopback port;
//! - a typed comment: Sam types a comment in the canary's approval box while three colleagues
//!   approve from elsewhere; each approval reaches his page live (at least three updates applied,
//!   counted by the live part's `data-updated`), and his comment, its focus and its caret survive
//!   them; he then approves with it and the stored approval carries it;
//! - many tabs: eight windows of live rollout pages are open at once (each would hold one of the
//!   browser's six HTTP/1.1 connections per host if each had its own stream); a ninth page still
//!   loads, and live updates keep arriving in the first window, through the one shared stream;
//! - the decision box (`<section id="decision" data-asks=…>`): approve with the context shown (the
//!   next wave's node count and gates), no approve on a finished or rolled-back rollout and 409
//!   from the API, a verdict table (`table.verdict-table`) updating during a bake.
//!
//! Screenshots go to `target/ui-screenshots/cockpit-*.png`. Skips loudly when `chromium` or
//! `chromedriver` is missing; fails instead when `WAVEGUARD_REQUIRE_ALL=1`.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use bmc_sim::Scenario;
use fantoccini::{Client, Locator};
use integration_tests::browser::{
    Browser, UI_WAIT, WebServer, add_users, clear_screenshots, login, programs_or_skip, shot, type_into, wait_until,
    wave_state_is,
};
use integration_tests::fixtures::{
    GPU_FROM, GPU_TO, PolicyYaml, SKU, WaveSize, WaveYaml, health_section, redfish_gate,
};
use integration_tests::{Harness, ScenarioYaml};
use orchestrator_db::execution::WaveState;
use orchestrator_engine::{Engine, GatelessJudge, HealthJudge};
use orchestrator_types::{Outcome, WaveVerdict};
use orchestrator_types::{RolloutId, WaveId};
use serde_json::json;
use web::AppState;

const NODES: usize = 8;
/// Simulated seconds per real second: 1-2 minute flashes take 1-2 s.
const SPEEDUP: f64 = 60.0;
/// Approvals the canary waits for: Sam's and three colleagues'.
const APPROVALS: u32 = 4;
const COLLEAGUES: [&str; 3] = ["ann", "bob", "cat"];
/// How long the canary may take to flash and bake.
const WAVE_WAIT: Duration = Duration::from_secs(60);

fn scenario() -> Scenario {
    ScenarioYaml::hgx(NODES)
        .layout(4, 1)
        .nodes_per_nvlink_domain(2)
        .gpu_firmware(GPU_TO, "{min: 1m, max: 2m}")
        .build()
}

/// A two-node canary, then the rest once four release managers approve.
fn approvals_policy() -> String {
    PolicyYaml::two_waves("cockpit")
        .required_gates(&["burn_in"])
        .waves(vec![
            WaveYaml::new("canary", WaveSize::Count(2))
                .stratify_by(&["rack"])
                .bake("2m")
                .max_in_flight(2),
            WaveYaml::new("rest", WaveSize::Rest)
                .manual(APPROVALS)
                .bake("1m")
                .max_in_flight(2),
        ])
        .concurrency(2, &["per_rack: 2"])
        .automatic_rollback(false)
        .render()
}

/// A two-node canary watched by an XID gate over a ten-minute bake (ten
/// real seconds), then the rest once one release manager approves.
fn gated_policy() -> String {
    PolicyYaml::two_waves("cockpit-gated")
        .required_gates(&["burn_in"])
        .waves(vec![
            WaveYaml::new("canary", WaveSize::Count(2))
                .stratify_by(&["rack"])
                .bake("10m")
                .max_in_flight(2)
                .line("gates: [xid]"),
            WaveYaml::new("rest", WaveSize::Rest)
                .manual(1)
                .bake("1m")
                .max_in_flight(2),
        ])
        .concurrency(2, &["per_rack: 2"])
        .automatic_rollback(false)
        .health(&health_section(
            0.05,
            &[redfish_gate("xid", "xid_errors_per_gpu_hour", "rate", "1.5", "1m")],
        ))
        .render()
}

/// Stands in for the detector in the verdict-table flow: the test records
/// the looks itself, and at the bake's end the wave passes.
#[derive(Debug)]
struct PassingJudge;

#[async_trait::async_trait]
impl HealthJudge for PassingJudge {
    async fn judge(
        &self,
        _rollout: &orchestrator_db::execution::ExecRollout,
        _wave: &orchestrator_db::execution::ExecWave,
        _policy: &orchestrator_policy::Policy,
    ) -> WaveVerdict {
        WaveVerdict {
            outcome: Outcome::Pass,
            summary: "no regression at the final look".into(),
            evidence: json!({}),
        }
    }
}

/// The world one flow walks: fleet, engine, web app, browser and a started rollout.
struct Cockpit {
    sim: Harness,
    engine: Engine,
    server: WebServer,
    browser: Browser,
    rollout: RolloutId,
    canary: WaveId,
}

impl Cockpit {
    async fn start(
        chromium: &Path,
        driver: &Path,
        policy: String,
        judge: Arc<dyn HealthJudge>,
    ) -> anyhow::Result<Self> {
        let sim = Harness::builder(scenario())
            .speedup(SPEEDUP)
            .sku(SKU)
            .start()
            .await
            .context("harness")?;
        add_users(&sim.db, &COLLEAGUES).await?;
        // The version the fleet runs, registered so a rollback has its image.
        sim.add_release(GPU_FROM, true).await;
        let release = sim
            .add_qualified_release(GPU_TO, "rita", &[("burn_in", "48 h, 0 XID")])
            .await?;
        let engine = sim.spawn_engine(judge);
        let server = WebServer::start(AppState::new(sim.db.clone()).with_engine_nudge(engine.nudge())).await?;
        let browser = Browser::start(chromium, driver).await?;
        // Started by `alice`, so Sam and the colleagues may all approve.
        let rollout = sim.start_rollout(release, policy, 5).await.id;
        let waves = sim.db.rollout_waves(rollout).await?;
        let canary = match waves.as_slice() {
            [canary, _rest] => canary.id,
            other => bail!("two waves expected: {other:?}"),
        };
        Ok(Self {
            sim,
            engine,
            server,
            browser,
            rollout,
            canary,
        })
    }

    fn client(&self) -> &Client {
        &self.browser.client
    }

    fn rollout_url(&self) -> String {
        format!("{}/rollouts/{}", self.server.base, self.rollout)
    }

    /// Waits, in the database, for the canary to have baked and wait for its approvals.
    async fn canary_awaits_approval(&self) -> anyhow::Result<()> {
        let deadline = Instant::now() + WAVE_WAIT;
        loop {
            let waves = self.sim.db.rollout_waves(self.rollout).await?;
            if waves
                .iter()
                .any(|w| w.id == self.canary && w.state == WaveState::AwaitingApproval)
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("the canary never awaited approval: {waves:?}");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    async fn stop(self) {
        self.browser.close().await;
        self.engine.shutdown().await;
        self.server.stop().await;
        self.sim.shutdown().await;
    }
}

/// Runs `flow` in a fresh cockpit, or skips loudly without Chromium.
async fn walk<F>(test: &str, policy: String, judge: Arc<dyn HealthJudge>, flow: F)
where
    F: for<'a> AsyncFnOnce(&'a Cockpit) -> anyhow::Result<()>,
{
    let Some((chromium, driver)) = programs_or_skip(test) else {
        return;
    };
    let started = Instant::now();
    let cockpit = match Cockpit::start(&chromium, &driver, policy, judge).await {
        Ok(cockpit) => cockpit,
        Err(err) => panic!("{err:?}"),
    };
    let outcome = flow(&cockpit).await;
    cockpit.stop().await;
    eprintln!("{test} took {:?}", started.elapsed());
    if let Err(err) = outcome {
        panic!("{err:?}");
    }
}

/// The number of live updates the page has applied.
async fn updates(client: &Client) -> anyhow::Result<u64> {
    let value = client
        .execute(
            "return Number(document.getElementById('live').getAttribute('data-updated') || 0);",
            vec![],
        )
        .await?;
    value.as_u64().context("data-updated is a count")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_typed_comment_survives_live_updates() {
    clear_screenshots(|name| name.starts_with("cockpit-a-")).unwrap();
    walk(
        "cockpit_browser::a_typed_comment_survives_live_updates",
        approvals_policy(),
        Arc::new(GatelessJudge),
        async |c| {
            let client = c.client();
            login(client, &c.server.base, "sam").await?;
            client.goto(&c.rollout_url()).await?;
            wait_until(
                client,
                "the canary awaiting approval (live)",
                &wave_state_is(c.canary, "awaiting_approval"),
                WAVE_WAIT,
            )
            .await?;
            let comment_id = format!("comment-{}", c.canary);
            wait_until(
                client,
                "the approval box",
                &format!("return !!document.getElementById('{comment_id}');"),
                UI_WAIT,
            )
            .await?;
            let typed = "XID rate flat on both canaries; ok to go";
            type_into(client, &comment_id, typed).await?;
            let before = updates(client).await?;

            // Three colleagues approve from elsewhere while Sam's comment sits
            // unsent in the box: each approval reaches this page live.
            for (n, colleague) in COLLEAGUES.iter().enumerate() {
                c.sim.db.approve_wave(c.canary, colleague, None).await?;
                wait_until(
                    client,
                    &format!("{colleague}'s approval shown live"),
                    &format!(
                        "const w = document.getElementById('wave-{}'); \
                     return !!w && w.textContent.includes('Approvals {}/{APPROVALS}') \
                       && w.textContent.includes('{colleague}');",
                        c.canary,
                        n + 1
                    ),
                    UI_WAIT,
                )
                .await?;
            }
            let applied = updates(client).await? - before;
            ensure!(applied >= 3, "at least three live updates applied, got {applied}");
            let kept = client
                .execute(
                    "const box = document.getElementById(arguments[0]); \
                 return [box.value, document.activeElement === box, box.selectionStart];",
                    vec![json!(comment_id)],
                )
                .await?;
            ensure!(
                kept == json!([typed, true, typed.len()]),
                "the comment, its focus and its caret survive {applied} live updates: {kept}"
            );
            shot(client, "cockpit-a-comment-survived").await?;

            // Typing goes on where it was, and the approval carries the comment.
            type_into(client, &comment_id, " (sam)").await?;
            client
                .find(Locator::Id(&format!("approve-{}", c.canary)))
                .await?
                .click()
                .await?;
            client.accept_alert().await?;
            wait_until(
                client,
                "the canary promoted (live)",
                &wave_state_is(c.canary, "promoted"),
                UI_WAIT,
            )
            .await?;
            let approvals = c.sim.db.wave_approvals(c.canary).await?;
            let sam = approvals.iter().find(|a| a.approver == "sam").context("sam approved")?;
            ensure!(
                sam.comment.as_deref() == Some(&format!("{typed} (sam)")[..]),
                "the stored comment: {approvals:?}"
            );
            shot(client, "cockpit-a-approved").await?;
            Ok(())
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_live_tabs_and_a_ninth_page_load() {
    clear_screenshots(|name| name.starts_with("cockpit-b-")).unwrap();
    walk("cockpit_browser::eight_live_tabs_and_a_ninth_page_load", approvals_policy(), Arc::new(GatelessJudge), async |c| {
        let client = c.client();
        login(client, &c.server.base, "vera").await?;
        // Eight live pages of the rollout, each with its own node filter.
        let first = client.window().await?;
        let mut windows = vec![first.clone()];
        for n in 0..8 {
            if n > 0 {
                let window = client.new_window(false).await?.handle;
                client.switch_to_window(window.clone()).await?;
                windows.push(window);
            }
            let url = format!("{}?node=node-{n:05}", c.rollout_url());
            tokio::time::timeout(UI_WAIT, client.goto(&url))
                .await
                .with_context(|| format!("live page {} never loaded", n + 1))??;
            wait_until(
                client,
                "the live page subscribed",
                "const l = document.getElementById('live'); return !!l && l.getAttribute('data-live') === 'shared-worker';",
                UI_WAIT,
            )
            .await?;
        }
        // A ninth page: with a stream per tab, all six connections to the
        // host would be held by now and it would never load.
        let ninth = client.new_window(false).await?.handle;
        client.switch_to_window(ninth).await?;
        let loading = Instant::now();
        tokio::time::timeout(UI_WAIT, client.goto(&format!("{}/rollouts", c.server.base)))
            .await
            .context("the ninth page never loaded: connections are held by the live tabs")??;
        wait_until(client, "the ninth page", "return document.readyState === 'complete';", UI_WAIT).await?;
        eprintln!("ninth page loaded in {:?} with 8 live tabs open", loading.elapsed());
        ensure!(
            !client.find_all(Locator::Css("table")).await?.is_empty(),
            "the rollouts list rendered"
        );
        shot(client, "cockpit-b-ninth-page").await?;
        // And a tenth, live too.
        client.goto(&format!("{}?node=node-00001", c.rollout_url())).await?;
        wait_until(client, "the tenth page's node table", "return !!document.getElementById('nodes');", UI_WAIT).await?;

        // Live updates keep arriving in the first window, through the one stream.
        client.switch_to_window(first).await?;
        c.canary_awaits_approval().await?;
        wait_until(
            client,
            "the canary awaiting approval in the first window (live)",
            &wave_state_is(c.canary, "awaiting_approval"),
            WAVE_WAIT,
        )
        .await?;
        let before = updates(client).await?;
        c.sim.db.approve_wave(c.canary, "ann", None).await?;
        wait_until(
            client,
            "ann's approval shown live in the first window",
            &format!(
                "const w = document.getElementById('wave-{}'); \
                 return !!w && w.textContent.includes('Approvals 1/{APPROVALS}') && w.textContent.includes('ann');",
                c.canary
            ),
            UI_WAIT,
        )
        .await?;
        ensure!(updates(client).await? > before, "an update was applied");
        let rows = client.find_all(Locator::Css("#nodes tbody tr")).await?;
        ensure!(rows.len() == 1, "the first window keeps its own filter: {} rows", rows.len());
        shot(client, "cockpit-b-first-tab-live").await?;
        Ok(())
    })
    .await;
}

/// One look of the XID gate as the detector records it during the bake:
/// `events` canary events over 32 GPU-hours against 10 over 160.
async fn record_xid_look(c: &Cockpit, number: u32, events: u64) -> anyhow::Result<()> {
    use orchestrator_detect::{CohortSummary, Effect, EffectMeasure, Evidence, InconclusiveReason, Look, TestKind};
    let ratio = (events as f64 / 32.0) / (10.0 / 160.0);
    let evidence = Evidence {
        gate: "xid".into(),
        test: TestKind::ConditionalBinomial,
        statistic: events as f64,
        p_value: 0.3,
        effect: Effect {
            measure: EffectMeasure::RateRatio,
            estimate: Some(ratio),
            ci95_lower: Some(ratio / 3.0),
            ci95_upper: Some(ratio * 3.0),
            decision_lower_bound: Some(ratio / 4.0),
            min_effect: 1.5,
        },
        canary: CohortSummary {
            events: Some(events),
            exposure: Some(32.0),
            rate: Some(events as f64 / 32.0),
            samples: None,
            median: None,
        },
        control: CohortSummary {
            events: Some(10),
            exposure: Some(160.0),
            rate: Some(10.0 / 160.0),
            samples: None,
            median: None,
        },
        look: Look {
            number,
            planned: 4,
            information_fraction: f64::from(number) / 4.0,
            cumulative_alpha: 0.001,
            z_boundary: Some(3.5),
            nominal_alpha: 0.0002,
            is_final: false,
        },
    };
    let verdict = orchestrator_detect::Verdict::Inconclusive {
        gate: "xid".into(),
        reason: InconclusiveReason::BakeInProgress,
        evidence: Some(Box::new(evidence)),
    };
    c.sim
        .db
        .record_health_look(
            &orchestrator_db::health::NewHealthLook {
                rollout_id: c.rollout,
                wave_id: c.canary,
                gate: "xid".into(),
                look_number: number,
                planned_looks: 4,
                outcome: verdict.outcome(),
                verdict: serde_json::to_value(&verdict)?,
            },
            "detector",
        )
        .await?;
    Ok(())
}

/// An approval of the wave named `wave` through the API from the page's
/// session: its status and body.
async fn api_approval(client: &Client, rollout: RolloutId, wave: &str) -> anyhow::Result<(u64, serde_json::Value)> {
    let answer = client
        .execute(
            "const csrf = document.querySelector('meta[name=csrf-token]').content;
             const r = await fetch(arguments[0], {method: 'POST', headers: {'X-CSRF-Token': csrf,
               'Content-Type': 'application/json', 'Accept': 'application/json'}, body: '{}'});
             let body = null;
             try { body = await r.json(); } catch (e) {}
             return [r.status, body];",
            vec![json!(format!("/api/v1/rollouts/{rollout}/waves/{wave}/approve"))],
        )
        .await?;
    Ok((answer[0].as_u64().context("a status")?, answer[1].clone()))
}

/// The decision box's question and text now.
async fn decision(client: &Client) -> anyhow::Result<(String, String)> {
    let found = client.find(Locator::Id("decision")).await?;
    let asks = found.attr("data-asks").await?.unwrap_or_default();
    Ok((asks, found.text().await?))
}

/// Nothing is offered to approve, and the API refuses an approval with 409.
async fn nothing_to_approve(c: &Cockpit, state: &str) -> anyhow::Result<()> {
    let client = c.client();
    wait_until(
        client,
        &format!("the decision box of a {state} rollout (live)"),
        "const d = document.getElementById('decision'); return !!d && d.getAttribute('data-asks') === 'none';",
        UI_WAIT,
    )
    .await?;
    ensure!(
        client.find_all(Locator::Css("button.approve")).await?.is_empty(),
        "no approve button on a {state} rollout"
    );
    for wave in ["canary", "rest"] {
        let (status, body) = api_approval(client, c.rollout, wave).await?;
        ensure!(
            status == 409 && body["error"]["code"] == "conflict",
            "approving wave {wave} of a {state} rollout through the API: {status} {body}"
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decisions_with_their_context_and_a_live_verdict_table() {
    clear_screenshots(|name| name.starts_with("cockpit-c-")).unwrap();
    walk(
        "cockpit_browser::decisions_with_their_context_and_a_live_verdict_table",
        gated_policy(),
        Arc::new(PassingJudge),
        async |c| {
            let client = c.client();
            login(client, &c.server.base, "sam").await?;
            client.goto(&c.rollout_url()).await?;
            client
                .execute("window.__noReload = 'still here'; return true;", vec![])
                .await?;

            // During the bake the gate's verdict table follows each look live.
            wait_until(
                client,
                "the canary baking (live)",
                &wave_state_is(c.canary, "baking"),
                WAVE_WAIT,
            )
            .await?;
            let table = format!("#wave-{} table.verdict-table", c.canary);
            let table_text = format!("const t = document.querySelector('{table}'); return t ? t.textContent : null;");
            wait_until(
                client,
                "the verdict table of the baking canary",
                &format!("return !!document.querySelector('{table}');"),
                UI_WAIT,
            )
            .await?;
            let mut seen = vec![client.execute(&table_text, vec![]).await?];
            for (number, events) in [(1, 2), (2, 4)] {
                record_xid_look(c, number, events).await?;
                let before = seen.last().cloned().unwrap_or_default();
                wait_until(
                    client,
                    &format!("look {number} in the verdict table (live)"),
                    &format!("const t = document.querySelector('{table}'); return !!t && t.textContent !== {before};"),
                    UI_WAIT,
                )
                .await?;
                seen.push(client.execute(&table_text, vec![]).await?);
            }
            ensure!(
                seen[2].as_str().is_some_and(|t| t.contains("2×")),
                "the second look's rate ratio (4/32 against 10/160 is 2×) is shown: {seen:?}"
            );
            shot(client, "cockpit-c-verdict-table-baking").await?;

            // After the verdict the box asks for an approval and says what it starts.
            wait_until(
            client,
            "the decision box asking for an approval (live)",
            "const d = document.getElementById('decision'); return !!d && d.getAttribute('data-asks') === 'approve';",
            WAVE_WAIT,
        )
        .await?;
            let (_, text) = decision(client).await?;
            let rest_nodes = NODES - 2;
            ensure!(
                text.contains(&format!("{rest_nodes} nodes")) && text.to_lowercase().contains("gate"),
                "the box names the next wave's node count and gates: {text}"
            );
            shot(client, "cockpit-c-decision-approve").await?;
            client
                .find(Locator::Id(&format!("approve-{}", c.canary)))
                .await?
                .click()
                .await?;
            let question = client.get_alert_text().await?;
            ensure!(
                question.contains("canary"),
                "the confirmation names the wave: {question}"
            );
            client.accept_alert().await?;
            wait_until(
                client,
                "the canary promoted (live)",
                &wave_state_is(c.canary, "promoted"),
                UI_WAIT,
            )
            .await?;

            // A finished rollout offers nothing to approve, and the API says 409.
            wait_until(
            client,
            "the rollout completed (live)",
            "const s = document.getElementById('rollout-state'); return !!s && s.textContent.trim() === 'completed';",
            WAVE_WAIT,
        )
        .await?;
            nothing_to_approve(c, "completed").await?;
            shot(client, "cockpit-c-completed").await?;

            // Rolled back from the page (every node flashed back to the version
            // it ran): still nothing to approve.
            let form = client.find(Locator::Css("form[action$='/rollback']")).await?;
            form.find(Locator::Css("input[name=reason]"))
                .await?
                .send_keys("cockpit test: undo")
                .await?;
            client.find(Locator::Id("action-rollback")).await?.click().await?;
            client.accept_alert().await?;
            wait_until(
            client,
            "the rollout rolled back (live)",
            "const s = document.getElementById('rollout-state'); return !!s && s.textContent.trim() === 'rolled_back';",
            WAVE_WAIT,
        )
        .await?;
            nothing_to_approve(c, "rolled-back").await?;
            for endpoint in c.sim.fleet.endpoints() {
                let versions = c.sim.fleet.versions(&endpoint.name).context("sim node")?;
                ensure!(
                    versions
                        .iter()
                        .filter(|v| v.id.starts_with("HGX_FW_GPU_"))
                        .all(|v| v.active == GPU_FROM),
                    "{} is back on {GPU_FROM}: {versions:?}",
                    endpoint.name
                );
            }
            let marker = client.execute("return window.__noReload || null;", vec![]).await?;
            ensure!(marker == json!("still here"), "every change arrived live: {marker}");
            shot(client, "cockpit-c-rolled-back").await?;
            Ok(())
        },
    )
    .await;
}
