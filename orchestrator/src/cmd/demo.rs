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
    // Before the path is printed: the CLI refuses to write here (its real
    // clock would disagree with this one) and says why.
    db.mark_accelerated_clock(DEMO_AUTHOR, args.speedup)
        .await
        .context("marking the demo database's clock")?;

    let policy_source = load_policies(&db).await;
    let password = random_password();
    let hash = web::auth::hash_password(&password).context("hashing the demo password")?;
    db.add_user(DEMO_USER, "Demo release manager", Role::Admin, Some(&hash), DEMO_AUTHOR)
        .await
        .context("creating the demo user")?;

    let releases = orchestrator_sim::demo::register_releases(&world).await?;

    let scheduler_dir = db_dir.path().join("scheduler");
    let workload = demo_workload(&db, &scheduler_dir, args.speedup).await?;
    let judge = judge_for(&world);
    let mut config = world.engine_config("waveguard-demo");
    config.scheduler = Some(workload);
    let engine = orchestrator_engine::Engine::start(db.clone(), config, world.connector(), judge.judge);
    // GPUs that fail in the simulated fleet become RMA candidates and cases, as under `serve`.
    let (rma_stop, mut rma_stopped) = tokio::sync::watch::channel(false);
    tokio::spawn(world.rma_monitor().run(engine.lease(), async move {
        let _ = rma_stopped.wait_for(|stop| *stop).await;
    }));
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
    // The binary's own path, so the line works as printed under `cargo run` too.
    let program = std::env::current_exe().map_or_else(|_| "waveguard".into(), |p| p.display().to_string());
    println!("    {program} --database-url {db_url} rollout show 1");
    println!(
        "    (read-only commands only: the demo's clock runs {}x, so the CLI refuses commands that write here; act in the web UI)",
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
    // SIGTERM too: the temporary database is removed on the way out, however the demo is stopped.
    let interrupted = super::serve::shutdown_signal();
    tokio::pin!(interrupted);
    let mut told_done = false;
    let mut drains = DrainNarrator::default();
    loop {
        tokio::select! {
            () = &mut interrupted => break,
            () = tokio::time::sleep(StdDuration::from_millis(100)) => {}
        }
        let at = world.clock.now() - started;
        if let Err(err) = drains.tell(&db, &story, at, &mut |line| println!("{line}")).await {
            tracing::warn!(error = %orchestrator_types::error_chain(&err), "demo narration");
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
    let _ = rma_stop.send(true);
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
pub(super) async fn load_policies(db: &Db) -> String {
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

/// The demo fleet's node that an operator has taken out (the controller
/// must leave it alone), and how busy the others are.
const OPERATOR_DRAINED: usize = 7;
const OPERATOR_REASON: &str = "hardware ticket 4411: PCIe retimer swap";
/// A node whose job outlasts any wave's `drain_timeout`.
const ENDLESS_JOB: usize = 13;

/// Seeds the demo's workload scheduler (one file per node; see
/// `demo_scheduler`) and returns the command adapter the controller drains
/// through: every tenth node runs jobs that take one to three simulated
/// hours to finish once drained, one runs a two-day job (skipped after the
/// wave's drain timeout and returned), and one is drained by an operator.
pub(super) async fn demo_workload(
    db: &Db,
    dir: &Path,
    speedup: f64,
) -> anyhow::Result<orchestrator_engine::WorkloadScheduler> {
    use super::demo_scheduler::{DemoNode, write_node};
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let real_seconds = |sim_hours: f64| (sim_hours * 3600.0 / speedup).ceil().max(1.0) as u64;
    let nodes = db.all_nodes().await?;
    for (i, node) in nodes.iter().enumerate() {
        let mut state = DemoNode::default();
        if i == OPERATOR_DRAINED {
            state.drain = true;
            state.reason = Some(OPERATOR_REASON.into());
            state.reason_set_by = Some("alice".into());
        } else if i == ENDLESS_JOB {
            state.busy_for_seconds = Some(real_seconds(48.0));
        } else if i % 10 == 3 {
            state.busy_for_seconds = Some(real_seconds(1.0 + (i % 3) as f64));
        }
        write_node(dir, &node.name, &state)?;
    }
    let program = std::env::current_exe().context("locating the waveguard binary")?;
    let argv = |op: &[&str]| -> Vec<String> {
        let mut v = vec![
            program.display().to_string(),
            "demo-scheduler".to_owned(),
            "--dir".to_owned(),
            dir.display().to_string(),
        ];
        v.extend(op.iter().map(|s| (*s).to_owned()));
        v
    };
    let scheduler =
        orchestrator_scheduler::command::CommandScheduler::new(orchestrator_scheduler::command::CommandConfig {
            state: argv(&["state", "{node}"]),
            drain: argv(&["drain", "{node}", "{reason}"]),
            resume: argv(&["resume", "{node}"]),
            list: Some(argv(&["list"])),
            unknown_node_exit_code: 3,
            timeout_seconds: 10,
        })
        .context("the demo scheduler's commands")?;
    Ok(orchestrator_engine::WorkloadScheduler {
        scheduler: std::sync::Arc::new(scheduler),
        names: orchestrator_scheduler::NameMapping::default(),
    })
}

/// Narrates what the workload scheduler side does that a visitor should
/// see: a node drained and waiting for its job, a node given back after
/// its drain timeout, a node left alone because an operator holds it.
#[derive(Debug, Default)]
struct DrainNarrator {
    told: std::collections::HashSet<(i64, &'static str)>,
    polls: u64,
}

impl DrainNarrator {
    async fn tell(
        &mut self,
        db: &Db,
        story: &Story,
        at: chrono::Duration,
        say: &mut dyn FnMut(String),
    ) -> Result<(), orchestrator_db::DbError> {
        self.polls += 1;
        // Every second of real time is plenty for a narration.
        if self.polls % 10 != 1 {
            return Ok(());
        }
        let stamp = format!("[+{:02}h{:02}m]", at.num_hours(), at.num_minutes() % 60);
        for chapter in &story.chapters {
            for drain in db.rollout_drains(chapter.id).await? {
                let busy = drain
                    .last_seen
                    .as_ref()
                    .and_then(|s| s["alloc_cpus"].as_u64())
                    .is_some_and(|n| n > 0);
                // The first few tell the story; a whole wave of them would drown it.
                let waiting_told = self.told.iter().filter(|(_, what)| *what == "waiting").count();
                if drain.phase == orchestrator_types::DrainPhase::Held
                    && busy
                    && waiting_told < 4
                    && self.told.insert((drain.id, "waiting"))
                {
                    say(format!(
                        "{stamp} {}: {} is drained in its scheduler and waits for its job to end before the flash",
                        chapter.title, drain.scheduler_node
                    ));
                }
                if drain
                    .close_reason
                    .as_deref()
                    .is_some_and(|r| r.starts_with("drain_timeout"))
                    && self.told.insert((drain.id, "timeout"))
                {
                    say(format!(
                        "{stamp} {}: {} did not empty within the wave's drain_timeout: skipped for this wave and returned to service",
                        chapter.title, drain.scheduler_node
                    ));
                }
            }
            let deferred = db
                .steps(&orchestrator_db::execution::StepFilter {
                    rollout_id: Some(chapter.id),
                    state: Some(orchestrator_db::execution::StepState::Deferred),
                    ..Default::default()
                })
                .await?;
            for step in deferred {
                let why = step.error.as_deref().unwrap_or_default();
                if why.contains(OPERATOR_REASON) && self.told.insert((step.id.0, "operator")) {
                    let node = db.node(step.node_id).await?;
                    say(format!(
                        "{stamp} {}: {} left alone: {why} (never a failure; a later rollout picks it up)",
                        chapter.title, node.name
                    ));
                }
            }
        }
        Ok(())
    }
}
