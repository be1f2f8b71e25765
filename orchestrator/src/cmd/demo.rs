//! `waveguard demo`: the whole product on one laptop, no setup.
//!
//! A controller with an embedded SQLite database, a simulated fleet (bmc-sim
//! in-process, real Redfish over loopback HTTP), the example policies from
//! this repository's `policies/` read from git, a demo user, and the web UI.
//! Then a story a visitor can watch on an accelerated clock:
//!
//! 1. a qualified BMC firmware rolls canary → 10% → rest, with one manual
//!    approval (the visitor gives it in the UI; after a while the demo gives
//!    it on their behalf so the story always ends);
//! 2. a bad GPU firmware (3x the XID error rate) starts at the same time, is
//!    caught in its canary by the detector against the control cohort, rolled
//!    back automatically, and its release is blocked.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration as StdDuration;

use anyhow::Context as _;
use bmc_sim::Scenario;
use orchestrator_db::Db;
use orchestrator_policy_git::{GitPolicySource, RepoLocation};
use orchestrator_sim::demo::{BMC_TO, DEMO_AUTHOR, DEMO_AUTOPILOT, DEMO_SCENARIO, GPU_BAD, GPU_GOOD, Story};
use orchestrator_sim::{SimWorld, judge_for};
use orchestrator_types::{Clock, Role, WallClock};
use rand::Rng as _;
use tokio::net::TcpListener;

use super::BadInput;
use crate::Context;
use orchestrator_policy_git::service::{SyncSettings, sync_once};

/// The visitor's account.
const DEMO_USER: &str = "demo";

/// Options of `waveguard demo`.
#[derive(Debug, clap::Args)]
pub struct DemoArgs {
    /// Address for the web UI and API.
    #[arg(long, default_value = "127.0.0.1:8080", value_name = "ADDR")]
    listen: SocketAddr,
    /// Simulated nodes (BMCs).
    #[arg(long, default_value_t = 300, value_name = "N")]
    nodes: usize,
    /// Simulated seconds per real second.
    #[arg(long, default_value_t = 1200.0, value_name = "N")]
    speedup: f64,
    /// Real seconds a wave waits for your approval before the demo gives it
    /// for you (0: wait for you forever).
    #[arg(long, default_value_t = 180, value_name = "SECONDS")]
    approve_after: u64,
}

/// `waveguard demo`.
pub async fn run(args: DemoArgs, _context: &Context) -> anyhow::Result<ExitCode> {
    if !(20..=5_000).contains(&args.nodes) {
        return Err(BadInput(format!("--nodes {}: use 20 to 5000", args.nodes)).into());
    }
    if !(args.speedup.is_finite() && args.speedup >= 1.0) {
        return Err(BadInput(format!("--speedup {}: must be a number >= 1", args.speedup)).into());
    }
    let mut scenario = Scenario::from_yaml_str(DEMO_SCENARIO).context("the embedded demo scenario")?;
    scenario.fleet.nodes = args.nodes;
    let listener = TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {} (pass --listen 127.0.0.1:PORT)", args.listen))?;
    let url = format!("http://{}", listener.local_addr().context("listener address")?);
    println!(
        "starting a simulated fleet of {} nodes at {}x ...",
        args.nodes, args.speedup
    );
    // The demo's own temporary database, so its path can be printed for the
    // CLI; removed when the demo stops.
    let db_dir = tempfile::Builder::new()
        .prefix("waveguard-demo-")
        .tempdir()
        .context("creating a temporary directory for the demo database")?;
    let db_path = db_dir.path().join("waveguard.db");
    let db_url = format!("sqlite://{}", db_path.display());
    let world = SimWorld::start(scenario, args.speedup, Some(&db_url)).await?;
    let db = world.db.clone();

    let policy_source = load_policies(&db).await;
    let password = random_password();
    let hash = web::auth::hash_password(&password).context("hashing the demo password")?;
    db.add_user(DEMO_USER, "Demo release manager", Role::Admin, Some(&hash), DEMO_AUTHOR)
        .await
        .context("creating the demo user")?;

    let releases = orchestrator_sim::demo::register_releases(&world).await?;

    let judge = judge_for(&world);
    let engine = world.start_engine("waveguard-demo", judge.judge);
    // Sessions run on real time: on the accelerated rollout clock a 12-hour
    // session would end within a minute, logging the visitor out mid-story.
    let web_db = db.clone().with_session_clock(WallClock::system());
    let state = web::AppState::new(web_db).with_engine_nudge(engine.nudge());
    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    let server = tokio::spawn(web::serve(listener, state, async move {
        let _ = stop_rx.wait_for(|stop| *stop).await;
    }));

    let mut story = Story::start(&db, &releases).await?;
    engine.nudge().nudge();

    println!();
    println!("Waveguard demo is running at {url}");
    println!("  log in as {DEMO_USER:?} with password {password:?}");
    println!("  policies: {policy_source}");
    println!("  database: {} (removed when the demo stops)", db_path.display());
    println!("  read it with the CLI while the demo runs, e.g.:");
    println!("    waveguard --database-url {db_url} rollout list");
    println!(
        "    (read-only commands only: the demo's clock runs {}x, so a command that writes would record the wrong time)",
        args.speedup
    );
    println!();
    println!(
        "What to look at ({}x: one real second is {} simulated minutes):",
        args.speedup,
        args.speedup / 60.0
    );
    for chapter in &story.chapters {
        println!("  {url}/rollouts/{}  {}", chapter.id, chapter.title);
    }
    println!("  - BMC {BMC_TO} rolls canary -> 10% -> rest; before the rest it waits for ONE approval: yours.");
    if args.approve_after > 0 {
        println!(
            "    (after {} real seconds of waiting the demo approves as {DEMO_AUTOPILOT:?} so the story ends)",
            args.approve_after
        );
    }
    println!("  - GPU {GPU_BAD} raises XID errors 3x: the detector compares its canary with a control cohort,");
    println!("    fails the XID gate mid-bake, rolls the canary back and blocks the release ({url}/releases).");
    println!("  - {url}/audit shows every decision and who made it; {url}/ the fleet's versions.");
    println!(
        "  - GPU {GPU_GOOD} is registered and qualified: start a rollout of it yourself from its page under \
         {url}/releases (\"Start a rollout\", policy gpu-fast-canary)."
    );
    println!("Press Ctrl-C to stop.");
    println!();

    let started = world.clock.now();
    let approve_after = (args.approve_after > 0).then(|| StdDuration::from_secs(args.approve_after));
    let interrupted = tokio::signal::ctrl_c();
    tokio::pin!(interrupted);
    let mut told_done = false;
    loop {
        tokio::select! {
            result = &mut interrupted => {
                if let Err(err) = result {
                    tracing::error!(error = %err, "cannot listen for Ctrl-C");
                }
                break;
            }
            () = tokio::time::sleep(StdDuration::from_millis(100)) => {}
        }
        match story
            .tell(&world, started, approve_after, &mut |line| println!("{line}"))
            .await
        {
            Ok(all_done) if all_done && !told_done => {
                told_done = true;
                println!();
                println!("The story is over; the controller keeps running at {url} until Ctrl-C.");
            }
            Ok(_) => {}
            Err(err) => tracing::warn!(error = %orchestrator_types::error_chain(&err), "demo narration"),
        }
    }
    println!("stopping ...");
    let _ = stop_tx.send(true);
    engine.shutdown().await;
    match server.await {
        Ok(Ok(())) => {}
        Ok(Err(err)) => tracing::warn!(error = %err, "web server"),
        Err(err) => tracing::warn!(error = %err, "web server task"),
    }
    world.shutdown().await;
    // Only now: the controller and its database connections are gone.
    drop(db_dir);
    Ok(ExitCode::SUCCESS)
}

/// A password for the demo user, printed once.
fn random_password() -> String {
    rand::rng()
        .sample_iter(rand::distr::Alphanumeric)
        .take(16)
        .map(char::from)
        .collect()
}

/// Syncs `policies/` of this repository (at HEAD) into the database, as a
/// configured git source would. Says where the policies came from.
async fn load_policies(db: &Db) -> String {
    let root: PathBuf = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default();
    if !(root.join(".git").exists() && root.join("policies").is_dir()) {
        return "embedded copies (this repository's policies/ is not here)".into();
    }
    let repo = root.display().to_string();
    let settings = SyncSettings {
        source: GitPolicySource {
            location: RepoLocation::parse(&repo),
            git_ref: "HEAD".into(),
            subdir: Some("policies".into()),
            cache_dir: std::env::temp_dir().join("waveguard-policy-clones"),
        },
        label: format!("{repo}@HEAD:policies"),
    };
    match sync_once(db, &settings, DEMO_AUTHOR).await {
        Ok(_) => format!("git {}", settings.label),
        Err(err) => {
            tracing::warn!(error = %orchestrator_types::error_chain(&err), "policy sync failed; using embedded policies");
            "embedded copies (the git sync failed; see the log)".into()
        }
    }
}
