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

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration as StdDuration, Instant};

use anyhow::Context as _;
use bmc_sim::Scenario;
use chrono::{DateTime, Utc};
use orchestrator_db::Db;
use orchestrator_db::execution::{ExecRollout, RolloutState, WaveKind, WaveState};
use orchestrator_engine::StartRollout;
use orchestrator_policy_git::{GitPolicySource, RepoLocation};
use orchestrator_types::{Clock, ComponentKind, FirmwareVersion, Role, RolloutId, SystemClock, WaveId};
use rand::Rng as _;
use tokio::net::TcpListener;

use super::BadInput;
use super::policy::{SyncSettings, sync_once};
use crate::Context;
use orchestrator_sim::{SimWorld, idle_until, judge_for};

/// The simulated fleet (its node count is set by `--nodes`).
const DEMO_SCENARIO: &str = include_str!("../../../bmc-sim/scenarios/simulate-1000.yaml");

/// The story's policies, embedded for when the repository is not there to
/// read them from git (a binary run elsewhere).
const EMBEDDED_POLICIES: [(&str, &str); 2] = [
    (
        "bmc-firmware-lab",
        include_str!("../../../policies/bmc-firmware-lab.yaml"),
    ),
    (
        "gpu-fast-canary",
        include_str!("../../../policies/gpu-fast-canary.yaml"),
    ),
];

/// The story's releases.
const BMC_FROM: &str = "24.04.1";
const BMC_TO: &str = "24.04.2";
const GPU_FROM: &str = "96.00.5E.00.01";
const GPU_BAD: &str = "96.00.66.00.01";
const GPU_GOOD: &str = "96.00.61.00.01";

/// Who starts the story's rollouts, in the audit log.
const DEMO_AUTHOR: &str = "waveguard-demo";
/// Who approves when the visitor does not.
const DEMO_AUTOPILOT: &str = "demo-autopilot";
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

/// A rollout of the story and what was last said about it.
#[derive(Debug)]
struct Chapter {
    title: String,
    id: RolloutId,
    last_rollout_state: Option<RolloutState>,
    last_wave_states: BTreeMap<WaveId, WaveState>,
    waiting_since: BTreeMap<WaveId, Instant>,
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

    let bmc_gates = required_gates(&db, "bmc-firmware-lab").await;
    let gpu_gates = required_gates(&db, "gpu-fast-canary").await;
    let version = |v: &str| FirmwareVersion::parse(v).with_context(|| format!("version {v}"));
    let bmc = world
        .register_release(
            ComponentKind::Bmc,
            &version(BMC_TO)?,
            Some(&bmc_gates),
            "BMC 24.04.2: Redfish session fixes",
        )
        .await
        .context("registering the BMC release")?;
    let bmc_current = world
        .register_release(
            ComponentKind::Bmc,
            &version(BMC_FROM)?,
            None,
            "the fleet's BMC firmware",
        )
        .await
        .context("registering the current BMC release")?;
    let gpu_bad = world
        .register_release(
            ComponentKind::Gpu,
            &version(GPU_BAD)?,
            Some(&gpu_gates),
            "GPU 96.00.66: passed lab qualification; regresses XID errors in the fleet",
        )
        .await
        .context("registering the GPU release")?;
    let gpu_current = world
        .register_release(
            ComponentKind::Gpu,
            &version(GPU_FROM)?,
            None,
            "the fleet's GPU firmware",
        )
        .await
        .context("registering the current GPU release")?;
    // What the fleet runs is its baseline: the fleet page measures
    // compliance against the default release of each SKU and component.
    for release in [&bmc_current, &gpu_current] {
        make_default(&db, release.id).await?;
    }
    world
        .register_release(
            ComponentKind::Gpu,
            &version(GPU_GOOD)?,
            Some(&gpu_gates),
            "GPU 96.00.61: a good build, for you to roll out",
        )
        .await
        .context("registering the good GPU release")?;

    let judge = judge_for(&world);
    let engine = world.start_engine("waveguard-demo", judge.judge);
    // Sessions run on real time: on the accelerated rollout clock a 12-hour
    // session would end within a minute, logging the visitor out mid-story.
    let web_db = db.clone().with_session_clock(Arc::new(SystemClock));
    let state = web::AppState::new(web_db).with_engine_nudge(engine.nudge());
    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    let server = tokio::spawn(web::serve(listener, state, async move {
        let _ = stop_rx.wait_for(|stop| *stop).await;
    }));

    let mut chapters = Vec::new();
    for (title, release, policy) in [
        (format!("BMC {BMC_TO}"), &bmc, "bmc-firmware-lab"),
        (format!("GPU {GPU_BAD}"), &gpu_bad, "gpu-fast-canary"),
    ] {
        let rollout = start(&db, release.id, policy).await?;
        chapters.push(Chapter {
            title,
            id: rollout.id,
            last_rollout_state: None,
            last_wave_states: BTreeMap::new(),
            waiting_since: BTreeMap::new(),
        });
    }
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
    for chapter in &chapters {
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
        match tell(&world, &db, &mut chapters, started, approve_after).await {
            Ok(all_done) if all_done && !told_done => {
                told_done = true;
                println!();
                println!("The story is over; the controller keeps running at {url} until Ctrl-C.");
            }
            Ok(_) => {}
            Err(err) => tracing::warn!(error = %format!("{err:#}"), "demo narration"),
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

/// Takes a registered release through qualification to `default`.
async fn make_default(db: &Db, release: orchestrator_types::ReleaseId) -> anyhow::Result<()> {
    use orchestrator_types::{QualificationState, TransitionRequest};
    for to in [
        QualificationState::Qualifying,
        QualificationState::Qualified,
        QualificationState::Default,
    ] {
        db.transition_release(release, &TransitionRequest { to, reason: None }, DEMO_AUTHOR)
            .await
            .with_context(|| format!("making release {release} the fleet default"))?;
    }
    Ok(())
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
            tracing::warn!(error = %super::simulate::error_chain(&err), "policy sync failed; using embedded policies");
            "embedded copies (the git sync failed; see the log)".into()
        }
    }
}

/// A policy in force by name (with its commit and blob), or the embedded
/// copy as an inline policy.
async fn policy(db: &Db, name: &str) -> anyhow::Result<(String, Option<String>, Option<String>)> {
    if let Ok(in_force) = db.policies_in_force().await
        && let Some(p) = in_force.into_iter().find(|p| p.version.name == name)
    {
        return Ok((p.version.content, Some(p.version.commit_id), Some(p.version.blob_id)));
    }
    EMBEDDED_POLICIES
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, text)| ((*text).to_owned(), None, None))
        .with_context(|| format!("no policy {name:?}"))
}

async fn required_gates(db: &Db, name: &str) -> Vec<String> {
    match policy(db, name).await {
        Ok((text, _, _)) => orchestrator_engine::parse_policy(&text)
            .map(|p| p.qualification.required_gates)
            .unwrap_or_default(),
        Err(_) => Vec::new(),
    }
}

async fn start(db: &Db, release: orchestrator_types::ReleaseId, name: &str) -> anyhow::Result<ExecRollout> {
    let (source, commit, blob) = policy(db, name).await?;
    orchestrator_engine::start_rollout(
        db,
        &StartRollout {
            release_id: release,
            policy_source: source,
            policy_commit: commit,
            policy_blob: blob,
            seed: 7,
        },
        DEMO_AUTHOR,
    )
    .await
    .with_context(|| format!("starting the rollout under {name}"))
}

fn clock_label(started: DateTime<Utc>, now: DateTime<Utc>) -> String {
    let minutes = (now - started).num_minutes().max(0);
    format!("[+{:02}h{:02}m]", minutes / 60, minutes % 60)
}

/// Prints what changed, gives overdue approvals, jumps over idle time.
/// True when every chapter has ended.
async fn tell(
    world: &SimWorld,
    db: &Db,
    chapters: &mut [Chapter],
    started: DateTime<Utc>,
    approve_after: Option<StdDuration>,
) -> anyhow::Result<bool> {
    let mut all_done = true;
    let mut idle: Vec<Option<DateTime<Utc>>> = Vec::new();
    for chapter in chapters.iter_mut() {
        let rollout = db.exec_rollout(chapter.id).await?;
        let waves = db.rollout_waves(chapter.id).await?;
        let now = world.clock.now();
        let stamp = clock_label(started, now);
        if chapter.last_rollout_state != Some(rollout.state) {
            chapter.last_rollout_state = Some(rollout.state);
            let reason = rollout
                .state_reason
                .as_deref()
                .map(|r| format!(": {r}"))
                .unwrap_or_default();
            println!("{stamp} {} rollout {}{reason}", chapter.title, rollout.state);
            if matches!(rollout.state, RolloutState::Halted | RolloutState::RolledBack) {
                let release = db.release(rollout.release_id).await?;
                println!(
                    "{stamp} {} release is now {}{}",
                    chapter.title,
                    release.qualification_state.as_str(),
                    release
                        .state_reason
                        .map(|r| format!(" ({})", headline(&r)))
                        .unwrap_or_default()
                );
            }
        }
        for wave in &waves {
            if chapter.last_wave_states.get(&wave.id) == Some(&wave.state) {
                continue;
            }
            chapter.last_wave_states.insert(wave.id, wave.state);
            if wave.state == WaveState::Planned {
                continue;
            }
            let what = match wave.state {
                WaveState::Running if wave.kind == WaveKind::Rollback => "rolling the updated nodes back".into(),
                WaveState::Running => format!("flashing {} node(s)", wave.node_count),
                WaveState::Baking if wave.gates.is_empty() => format!("baking {} h", wave.bake_seconds / 3600),
                WaveState::Baking => format!(
                    "baking {} h; gates {} watch it against {} control node(s)",
                    wave.bake_seconds / 3600,
                    wave.gates.join(", "),
                    wave.control_nodes.len()
                ),
                WaveState::AwaitingApproval => {
                    chapter.waiting_since.insert(wave.id, Instant::now());
                    format!(
                        "waits for approval ({}): approve it at /rollouts/{}",
                        verdict_summary(wave.verdict.as_ref()).unwrap_or_else(|| "a manual wave follows".into()),
                        chapter.id
                    )
                }
                WaveState::Promoted => "promoted".into(),
                WaveState::Halted => format!(
                    "halted: {}",
                    wave.state_reason.clone().unwrap_or_else(|| "see the rollout".into())
                ),
                WaveState::RolledBack => "rolled back".into(),
                WaveState::Planned => continue,
            };
            println!("{stamp} {} · {}: {what}", chapter.title, wave.name);
        }
        if let Some(limit) = approve_after {
            for wave in waves.iter().filter(|w| w.state == WaveState::AwaitingApproval) {
                let since = *chapter.waiting_since.entry(wave.id).or_insert_with(Instant::now);
                if since.elapsed() < limit {
                    continue;
                }
                let have = db.wave_approvals(wave.id).await?;
                if have.iter().any(|a| a.approver == DEMO_AUTOPILOT) {
                    continue;
                }
                match db
                    .approve_wave(
                        wave.id,
                        DEMO_AUTOPILOT,
                        Some("approved by the demo after waiting for a visitor"),
                    )
                    .await
                {
                    Ok(_) => println!(
                        "{stamp} {} · {}: nobody approved for {} s; {DEMO_AUTOPILOT} approved",
                        chapter.title,
                        wave.name,
                        limit.as_secs()
                    ),
                    Err(err) => tracing::warn!(error = %err, "demo approval"),
                }
            }
        }
        let finished = matches!(
            rollout.state,
            RolloutState::Completed | RolloutState::RolledBack | RolloutState::Aborted | RolloutState::Halted
        );
        if !finished {
            all_done = false;
            let counts = db.step_counts(chapter.id, None).await?;
            let in_flight = counts.iter().any(|(s, n)| s.is_in_flight() && *n > 0);
            idle.push(if in_flight || rollout.state != RolloutState::Running {
                None
            } else {
                idle_until(&waves, false)
            });
        }
    }
    // Every unfinished rollout waits only for a window: jump to the first
    // that opens.
    if !idle.is_empty()
        && idle.iter().all(Option::is_some)
        && let Some(at) = idle.iter().flatten().min()
    {
        world.clock.skip_to(*at);
    }
    Ok(all_done)
}

/// The first part of a reason, without the evidence JSON the engine appends.
fn headline(reason: &str) -> String {
    let head = reason.split("; evidence:").next().unwrap_or(reason);
    if head.chars().count() > 240 {
        format!("{}...", head.chars().take(240).collect::<String>())
    } else {
        head.to_owned()
    }
}

fn verdict_summary(verdict: Option<&orchestrator_types::WaveVerdict>) -> Option<String> {
    let v = verdict?;
    Some(if v.summary.is_empty() {
        format!("verdict {}", v.outcome)
    } else {
        format!("verdict {}: {}", v.outcome, v.summary)
    })
}
