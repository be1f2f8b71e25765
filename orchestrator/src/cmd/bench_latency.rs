//! `waveguard bench --only latency`: how fast the cockpit's pages and the
//! API answer, over real TCP, one request at a time.
//!
//! The web server is the real one (`web::serve` on a loopback port, every
//! layer: authentication, CSRF, security headers); the client is a reqwest
//! client with keep-alive, logged in through `/login` with a session cookie
//! for the pages and a bearer token for the API. Two worlds:
//!
//! - **large**: `--latency-nodes` nodes (100,000) with nine inventory rows
//!   each and a rollout over all of them left mid-way
//!   (`orchestrator_sim::latency::seed_large_store`); measured idle, then
//!   while a writer moves the running wave's steps through the engine's
//!   states at `--latency-write-rate` node-updates per second (the stand-in
//!   for the engine: no in-process fleet of 100,000 BMCs fits this machine);
//! - **demo**: the demo's world and story at `--latency-demo-nodes` nodes
//!   (5,000): bmc-sim, the real engine and detector, the demo's workload
//!   scheduler and RMA monitor; each request is tagged with the moment of
//!   the story it ran in, read from the waves of the rollout whose page it
//!   reads (a wave flashing, a wave baking; fleet-wide pages follow the
//!   GPU rollout's), and one that straddles two moments is dropped.
//!
//! Requests go round-robin over the endpoints, so every endpoint sees the
//! same moments. One table: endpoint, moment, statuses, p50, p99, requests,
//! and the target of the issue that asks for it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration as StdDuration, Instant};

use anyhow::Context as _;
use bmc_sim::Scenario;
use orchestrator_db::Db;
use orchestrator_db::overview::NodePageQuery;
use orchestrator_sim::demo::{DEMO_SCENARIO, Story};
use orchestrator_sim::latency::{LargeStore, Moment, StepWriter, seed_large_store};
use orchestrator_sim::{SimWorld, judge_for};
use orchestrator_types::{Clock as _, Role, SystemClock, WallClock};
use tokio::net::TcpListener;

/// Sizes and rates of the latency bench.
#[derive(Debug, Clone)]
pub(super) struct Options {
    pub nodes: usize,
    pub requests: usize,
    pub write_rate: f64,
    pub demo_nodes: usize,
    pub speedup: f64,
}

const USER: &str = "bench";
const TOKEN: &str = "wg_bench_token_0123456789abcdef0123456789abcdef";
/// The evidence archive of a 100,000-step rollout is large; fewer
/// downloads keep the run short (its time is reported apart anyway).
const EVIDENCE_REQUESTS: usize = 10;
/// The demo's story is watched for at most this long.
const DEMO_TIMEOUT: StdDuration = StdDuration::from_secs(1800);
/// Seconds the demo's waves wait for an approval before its autopilot
/// gives it (the demo waits 180 for a visitor; nobody visits a bench).
const DEMO_APPROVE_AFTER: StdDuration = StdDuration::from_secs(5);

/// p99 targets: issue 23 for four endpoints at 100,000 nodes idle, issue
/// 26 for every page of the demo at 5,000.
const LARGE_TARGET_MS: f64 = 100.0;
const DEMO_TARGET_MS: f64 = 150.0;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Auth {
    Session,
    Token,
}

#[derive(Debug, Clone)]
struct Target {
    path: String,
    auth: Auth,
    /// Downloads: report time to first byte apart.
    stream: bool,
    /// The p99 target this endpoint is held to in this world, if any.
    target_ms: Option<f64>,
    max_requests: usize,
    /// The rollout whose moment a request is tagged with (the demo).
    rollout: Option<i64>,
}

impl Target {
    fn page(path: impl Into<String>) -> Target {
        Target {
            path: path.into(),
            auth: Auth::Session,
            stream: false,
            target_ms: None,
            max_requests: usize::MAX,
            rollout: None,
        }
    }
    fn api(path: impl Into<String>) -> Target {
        Target {
            auth: Auth::Token,
            ..Target::page(path)
        }
    }
}

/// One request's figures.
#[derive(Debug, Clone, Copy)]
struct Sample {
    status: u16,
    first_byte: StdDuration,
    total: StdDuration,
}

/// Samples per (endpoint index, moment).
type Samples = BTreeMap<(usize, String), Vec<Sample>>;

struct Client {
    http: reqwest::Client,
    base: String,
    cookie: String,
}

impl Client {
    /// Logs in through the form as a browser would: the login page's CSRF
    /// cookie and field, then the session cookie.
    async fn login(base: &str, password: &str) -> anyhow::Result<Client> {
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .pool_max_idle_per_host(1)
            .build()
            .context("HTTP client")?;
        let page = http.get(format!("{base}/login")).send().await.context("GET /login")?;
        let csrf = set_cookie(&page, web::auth::LOGIN_CSRF_COOKIE).context("no login CSRF cookie")?;
        let answer = http
            .post(format!("{base}/login"))
            .header("cookie", format!("{}={csrf}", web::auth::LOGIN_CSRF_COOKIE))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(
                url::form_urlencoded::Serializer::new(String::new())
                    .extend_pairs([("username", USER), ("password", password), ("csrf", csrf.as_str())])
                    .finish(),
            )
            .send()
            .await
            .context("POST /login")?;
        let session = set_cookie(&answer, web::auth::SESSION_COOKIE)
            .with_context(|| format!("login refused ({})", answer.status()))?;
        Ok(Client {
            http,
            base: base.to_owned(),
            cookie: format!("{}={session}", web::auth::SESSION_COOKIE),
        })
    }

    async fn get(&self, target: &Target) -> anyhow::Result<Sample> {
        let request = self.http.get(format!("{}{}", self.base, target.path));
        let request = match target.auth {
            Auth::Session => request.header("cookie", &self.cookie),
            Auth::Token => request.bearer_auth(TOKEN),
        };
        let started = Instant::now();
        let response = request.send().await.with_context(|| format!("GET {}", target.path))?;
        let first_byte = started.elapsed();
        let status = response.status().as_u16();
        let mut response = response;
        while response
            .chunk()
            .await
            .with_context(|| format!("reading {}", target.path))?
            .is_some()
        {}
        Ok(Sample {
            status,
            first_byte,
            total: started.elapsed(),
        })
    }
}

fn set_cookie(response: &reqwest::Response, name: &str) -> Option<String> {
    response
        .headers()
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find_map(|v| {
            let pair = v.split(';').next()?;
            let (key, value) = pair.trim().split_once('=')?;
            (key == name && !value.is_empty()).then(|| value.to_owned())
        })
}

/// A bench user with a password (for the pages) and an API token.
async fn add_bench_user(db: &Db) -> anyhow::Result<String> {
    let password = format!("bench-{}", std::process::id());
    let hash = web::auth::hash_password(&password).context("hashing the bench password")?;
    db.add_user(USER, "Latency bench", Role::Admin, Some(&hash), "bench")
        .await
        .context("bench user")?;
    db.add_api_token(USER, "bench", &web::auth::token_hash(TOKEN), "bench")
        .await
        .context("bench token")?;
    Ok(password)
}

/// The web server on a loopback port, stopped by the returned sender.
async fn serve(state: web::AppState) -> anyhow::Result<(String, tokio::sync::watch::Sender<bool>)> {
    let listener = TcpListener::bind("127.0.0.1:0").await.context("loopback listener")?;
    let base = format!("http://{}", listener.local_addr().context("listener address")?);
    let (stop, mut stopped) = tokio::sync::watch::channel(false);
    tokio::spawn(web::serve(listener, state, async move {
        let _ = stopped.wait_for(|s| *s).await;
    }));
    Ok((base, stop))
}

/// The endpoints every world measures: each page of the cockpit and each
/// API list, with one rollout, release and node to show.
fn targets(rollout: i64, release: i64, node: &str, node_pages: u64) -> Vec<Target> {
    let mut evidence = Target::api(format!("/api/v1/rollouts/{rollout}/evidence"));
    evidence.stream = true;
    evidence.max_requests = EVIDENCE_REQUESTS;
    vec![
        Target::page("/"),
        Target::page("/rollouts"),
        Target::page(format!("/rollouts/{rollout}")),
        Target::page(format!("/rollouts/{rollout}?state=succeeded")),
        Target::page("/nodes"),
        Target::page(format!("/nodes?page={}", node_pages.div_ceil(2).max(1))),
        Target::page(format!("/nodes/{node}")),
        Target::page("/releases"),
        Target::page(format!("/releases/{release}")),
        Target::page("/policies"),
        Target::page("/audit"),
        Target::page("/rma"),
        Target::page("/tokens"),
        Target::api("/api/v1/nodes?limit=100"),
        Target::api(format!("/api/v1/nodes?limit=100&offset={}", node_pages * 50)),
        Target::api("/api/v1/rollouts"),
        Target::api(format!("/api/v1/rollouts/{rollout}")),
        Target::api(format!("/api/v1/rollouts/{rollout}/steps?limit=100")),
        Target::api("/api/v1/releases"),
        Target::api(format!("/api/v1/releases/{release}")),
        Target::api("/api/v1/audit?limit=100"),
        Target::api("/api/v1/alerts"),
        Target::api("/api/v1/rma/cases"),
        Target::api("/api/v1/parts?limit=100"),
        evidence,
    ]
}

/// Round-robin over `targets` until each has its requests in every wanted
/// moment, or `done` says stop. `moment` names the moment a target's
/// request would run in now (`None`: none to measure). A request whose
/// moment changed while it ran is dropped.
async fn sweep(
    client: &Client,
    targets: &[Target],
    requests: usize,
    samples: &mut Samples,
    moment: &dyn Fn(&Target) -> Option<String>,
    wanted: &BTreeSet<String>,
    done: &dyn Fn() -> bool,
) -> anyhow::Result<()> {
    loop {
        if done() {
            return Ok(());
        }
        let full = |samples: &Samples, i: usize, m: &String| {
            samples
                .get(&(i, m.clone()))
                .is_some_and(|s| s.len() >= requests.min(targets[i].max_requests))
        };
        if (0..targets.len()).all(|i| wanted.iter().all(|m| full(samples, i, m))) {
            return Ok(());
        }
        let mut any = false;
        for (i, target) in targets.iter().enumerate() {
            let Some(now) = moment(target) else { continue };
            if full(samples, i, &now) || !wanted.contains(&now) {
                continue;
            }
            any = true;
            let sample = client.get(target).await?;
            if moment(target).as_ref() == Some(&now) {
                samples.entry((i, now)).or_default().push(sample);
            }
        }
        if !any {
            tokio::time::sleep(StdDuration::from_millis(50)).await;
        }
    }
}

fn quantile_ms(sorted: &[StdDuration], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let index = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[index.min(sorted.len() - 1)].as_secs_f64() * 1000.0
}

/// Prints the table's rows of one world.
fn print_rows(targets: &[Target], samples: &Samples) {
    for ((i, moment), list) in samples {
        let target = &targets[*i];
        let statuses: BTreeSet<u16> = list.iter().map(|s| s.status).collect();
        let statuses = statuses.iter().map(u16::to_string).collect::<Vec<_>>().join(",");
        let mut rows = vec![(target.path.clone(), list.iter().map(|s| s.total).collect::<Vec<_>>())];
        if target.stream {
            rows[0].0 = format!("{} (whole body)", target.path);
            rows.push((
                format!("{} (first byte)", target.path),
                list.iter().map(|s| s.first_byte).collect(),
            ));
        }
        for (label, mut times) in rows {
            times.sort();
            let p99 = quantile_ms(&times, 0.99);
            let verdict = match target.target_ms {
                Some(t) if target.stream => format!("(<= {t:.0}: streams)"),
                Some(t) if p99 <= t => format!("ok (<= {t:.0})"),
                Some(t) => format!("OVER {t:.0}"),
                None => String::new(),
            };
            println!(
                "{label:<52} {moment:<24} {statuses:<8} {:>8.1} {:>8.1} {:>6}  {verdict}",
                quantile_ms(&times, 0.50),
                p99,
                times.len()
            );
        }
    }
}

fn header() {
    println!(
        "{:<52} {:<24} {:<8} {:>8} {:>8} {:>6}  target p99 ms",
        "endpoint", "moment", "status", "p50 ms", "p99 ms", "reqs"
    );
}

/// Both worlds, one table each; a world sized 0 nodes is skipped (to
/// measure the other alone).
pub(super) async fn run(options: &Options) -> anyhow::Result<()> {
    if options.nodes > 0 {
        large(options).await?;
    }
    if options.demo_nodes > 0 {
        demo(options).await?;
    }
    Ok(())
}

/// Endpoints issue 23 holds to 100 ms at 100,000 nodes.
fn held_at_scale(path: &str, rollout: i64) -> bool {
    path == "/"
        || path == format!("/rollouts/{rollout}")
        || path == format!("/api/v1/rollouts/{rollout}")
        || path.starts_with("/api/v1/nodes?")
}

async fn large(options: &Options) -> anyhow::Result<()> {
    let nodes = options.nodes;
    println!("\n== latency: {nodes} nodes with inventory and a {nodes}-step rollout, SQLite, over TCP, sequential ==",);
    let dir = tempfile::tempdir().context("temp dir")?;
    let url = format!("sqlite://{}", dir.path().join("latency.db").display());
    let db = Db::connect_and_migrate(&url, Arc::new(SystemClock))
        .await
        .context("database")?;
    let store: LargeStore = seed_large_store(&db, nodes, &mut |line| println!("{line}")).await?;
    let password = add_bench_user(&db).await?;
    let (base, stop) = serve(web::AppState::new(db.clone())).await?;
    let client = Client::login(&base, &password).await?;
    let node_pages = (nodes as u64).div_ceil(100);
    let mut targets = targets(store.rollout.0, store.release.0, &store.node_name, node_pages);
    for target in &mut targets {
        if held_at_scale(&target.path, store.rollout.0) {
            target.target_ms = Some(LARGE_TARGET_MS);
        }
    }
    let mut samples = Samples::new();
    let idle = format!("idle ({nodes})");
    let started = Instant::now();
    sweep(
        &client,
        &targets,
        options.requests,
        &mut samples,
        &|_| Some(idle.clone()),
        &BTreeSet::from([idle.clone()]),
        &|| false,
    )
    .await?;
    println!("idle sweep: {:.0} s", started.elapsed().as_secs_f64());

    let loaded = format!("rollout running ({nodes})");
    let writer = StepWriter::start(
        db.clone(),
        store.fence.clone(),
        store.pending.clone(),
        options.write_rate,
    );
    let mut loaded_samples = Samples::new();
    let swept = sweep(
        &client,
        &targets,
        options.requests,
        &mut loaded_samples,
        &|_| Some(loaded.clone()),
        &BTreeSet::from([loaded.clone()]),
        &|| false,
    )
    .await;
    let (updates, seconds) = writer.stop().await.context("the step writer")?;
    swept?;
    println!(
        "loaded sweep: {seconds:.0} s; the writer finished {updates} node-updates ({:.0}/s, asked {:.0}/s; six audited \
         transitions each)",
        updates as f64 / seconds.max(f64::EPSILON),
        options.write_rate
    );
    // Idle and loaded side by side, per endpoint.
    for ((i, moment), list) in loaded_samples {
        samples.insert((i, moment), list);
    }
    println!();
    header();
    print_rows(&targets, &samples);
    let _ = stop.send(true);
    db.close().await.ok();
    Ok(())
}

async fn demo(options: &Options) -> anyhow::Result<()> {
    let nodes = options.demo_nodes;
    println!(
        "\n== latency: the demo's world at {nodes} nodes ({}x), real engine over bmc-sim, over TCP, sequential ==",
        options.speedup
    );
    let mut scenario = Scenario::from_yaml_str(DEMO_SCENARIO).context("the embedded demo scenario")?;
    scenario.fleet.nodes = nodes;
    let dir = tempfile::tempdir().context("temp dir")?;
    let db_url = format!("sqlite://{}", dir.path().join("demo.db").display());
    let started = Instant::now();
    let world = SimWorld::start(scenario, options.speedup, Some(&db_url)).await?;
    let db = world.db.clone();
    let policies = super::demo::load_policies(&db).await;
    let password = add_bench_user(&db).await?;
    let releases = orchestrator_sim::demo::register_releases(&world).await?;
    let workload = super::demo::demo_workload(&db, &dir.path().join("scheduler"), options.speedup).await?;
    let judge = judge_for(&world);
    let mut config = world.engine_config("waveguard-demo");
    config.scheduler = Some(workload);
    let engine = orchestrator_engine::Engine::start(db.clone(), config, world.connector(), judge.judge);
    let (rma_stop, mut rma_stopped) = tokio::sync::watch::channel(false);
    tokio::spawn(world.rma_monitor().run(engine.lease(), async move {
        let _ = rma_stopped.wait_for(|stop| *stop).await;
    }));
    let web_db = db.clone().with_session_clock(WallClock::system());
    let (base, stop) = serve(web::AppState::new(web_db).with_engine_nudge(engine.nudge())).await?;
    let client = Client::login(&base, &password).await?;
    let mut story = Story::start(&db, &releases).await?;
    engine.nudge().nudge();
    println!(
        "world, policies ({policies}) and story started in {:.0} s",
        started.elapsed().as_secs_f64()
    );

    let chapters: Vec<_> = story.chapters.iter().map(|c| c.id).collect();
    let gpu = *chapters.last().context("the story has no rollout")?;
    let gpu_release = db.exec_rollout(gpu).await?.release_id;
    let node = db
        .node_page(&NodePageQuery {
            offset: (nodes / 2) as u64,
            limit: 1,
            ..Default::default()
        })
        .await?
        .nodes
        .into_iter()
        .next()
        .map(|n| n.node.name)
        .context("the demo has no nodes")?;
    let node_pages = (nodes as u64).div_ceil(100);
    let mut targets = targets(gpu.0, gpu_release.0, &node, node_pages);
    // The BMC rollout is the one that flashes the whole fleet.
    if let Some(bmc) = chapters.first().filter(|b| **b != gpu) {
        let mut page = Target::page(format!("/rollouts/{}", bmc.0));
        page.rollout = Some(bmc.0);
        let mut api = Target::api(format!("/api/v1/rollouts/{}", bmc.0));
        api.rollout = Some(bmc.0);
        targets.insert(3, page);
        targets.insert(17, api);
    }
    for target in &mut targets {
        target.target_ms = Some(DEMO_TARGET_MS);
        // Pages of the BMC rollout follow its moment; every other page
        // (the GPU rollout's and the fleet's) the GPU rollout's, the
        // story's main one.
        if target.rollout.is_none() {
            target.rollout = Some(gpu.0);
        }
    }

    // The story goes on beside the measurements: narration state, autopilot
    // approvals and idle skips, as `demo` runs it; each rollout's moment is
    // published for the sampler.
    let moments: Mutex<BTreeMap<i64, Moment>> = Mutex::new(BTreeMap::new());
    let over = AtomicBool::new(false);
    let clock_start = world.clock.now();
    let teller = async {
        loop {
            let mut now = BTreeMap::new();
            for id in &chapters {
                if let Some(m) = Moment::of(&db.rollout_waves(*id).await?) {
                    now.insert(id.0, m);
                }
            }
            *moments.lock().unwrap_or_else(PoisonError::into_inner) = now;
            let ended = story
                .tell(&world, clock_start, Some(DEMO_APPROVE_AFTER), &mut |_| {})
                .await?;
            if ended || over.load(Ordering::Relaxed) {
                over.store(true, Ordering::Relaxed);
                moments.lock().unwrap_or_else(PoisonError::into_inner).clear();
                return anyhow::Ok(());
            }
            tokio::time::sleep(StdDuration::from_millis(100)).await;
        }
    };
    let wanted = BTreeSet::from([Moment::Flashing.as_str().to_owned(), Moment::Baking.as_str().to_owned()]);
    let mut samples = Samples::new();
    let deadline = Instant::now() + DEMO_TIMEOUT;
    let measured = {
        let current = |target: &Target| {
            let moments = moments.lock().unwrap_or_else(PoisonError::into_inner);
            target
                .rollout
                .and_then(|r| moments.get(&r))
                .map(|m| m.as_str().to_owned())
        };
        let done = || over.load(Ordering::Relaxed) || Instant::now() > deadline;
        let sampler = async {
            let result = sweep(
                &client,
                &targets,
                options.requests,
                &mut samples,
                &current,
                &wanted,
                &done,
            )
            .await;
            over.store(true, Ordering::Relaxed);
            result
        };
        let (told, sampled) = tokio::join!(teller, sampler);
        told.and(sampled)
    };
    println!("demo measured for {:.0} s", started.elapsed().as_secs_f64());
    println!();
    header();
    print_rows(&targets, &samples);
    let missing: Vec<&str> = wanted
        .iter()
        .filter(|m| !samples.keys().any(|(_, s)| s == *m))
        .map(String::as_str)
        .collect();
    if !missing.is_empty() {
        println!(
            "NOTE: the story ended before these moments were measured: {}",
            missing.join(", ")
        );
    }
    let _ = stop.send(true);
    let _ = rma_stop.send(true);
    engine.shutdown().await;
    world.shutdown().await;
    drop(dir);
    measured
}
