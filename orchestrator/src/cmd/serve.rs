//! `waveguard serve`: the long-running controller.

use std::net::SocketAddr;
use std::process::ExitCode;

use anyhow::Context as _;
use tokio::net::TcpListener;
use web::AppState;

use crate::Context;

/// Options of `waveguard serve`.
#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// Address to listen on for the API, metrics and UI (default 127.0.0.1:8080).
    #[arg(long, env = "WAVEGUARD_LISTEN", value_name = "ADDR")]
    listen: Option<SocketAddr>,
    /// How long the executor lease lasts without renewal, in seconds of the
    /// controller's clock; a standby replica takes over this long after the
    /// leader dies. Pushes and resets are only sent while half of it is
    /// left and are cut off when a quarter is left (retries included), so a
    /// deposed leader's last request ends before a successor can exist.
    #[arg(long, env = "WAVEGUARD_LEASE_TTL", value_name = "SECONDS", default_value_t = 60)]
    lease_ttl: u32,
    /// Real milliseconds between engine passes when nothing wakes it.
    #[arg(
        long,
        env = "WAVEGUARD_ENGINE_INTERVAL_MS",
        value_name = "MS",
        default_value_t = 2000
    )]
    engine_interval_ms: u64,
    /// Simulations and tests only: run the controller's clock this many
    /// times faster than real time, counted from --clock-epoch, to share
    /// simulated time with a bmc-sim fleet started at that instant with the
    /// same --speedup. Bake times, windows, backoff, timeouts and the lease
    /// TTL are all read on this clock.
    #[arg(long, value_name = "FACTOR", requires = "clock_epoch")]
    clock_speedup: Option<f64>,
    /// The wall-clock instant (RFC 3339) at which simulated time equals real
    /// time; see --clock-speedup.
    #[arg(long, value_name = "RFC3339", requires = "clock_speedup")]
    clock_epoch: Option<chrono::DateTime<chrono::Utc>>,
    /// Environment variable holding the bearer token Alertmanager's webhook
    /// sends (overrides `[alertmanager] token_env`); without one, the
    /// webhook refuses every alert.
    #[arg(long, env = "WAVEGUARD_ALERTMANAGER_TOKEN_ENV", value_name = "VAR")]
    alertmanager_token_env: Option<String>,
    #[command(flatten)]
    prometheus: super::prometheus::PrometheusArgs,
    /// Let API and UI rollouts use an inline policy (`policy_yaml`) instead
    /// of a reviewed one from git. Off by default: an inline policy can have
    /// one wave, no gates and no approval.
    #[arg(long, env = "WAVEGUARD_ALLOW_INLINE_POLICIES")]
    allow_inline_policies: bool,
    /// A user who may move releases to `qualified` (repeat for several);
    /// without any, every release manager may.
    #[arg(long = "qualifier", value_name = "USER")]
    qualifiers: Vec<String>,
    /// Let the user who registered a release qualify it too (by default a
    /// second person must).
    #[arg(long)]
    single_person_qualification: bool,
    /// At most this many BMC connections open at once, fleet-wide (the
    /// engine, the health collector and the RMA monitor share them);
    /// overrides `[bmc] max_connections`. By default the soft open-file
    /// limit less a reserve (`[bmc] file_reserve`), at most 4,096.
    #[arg(long, env = "WAVEGUARD_BMC_MAX_CONNECTIONS", value_name = "N")]
    bmc_max_connections: Option<usize>,
}

/// The separation-of-duties rules `serve` enforces: strict unless the
/// admin who starts it relaxes them.
fn duties(args: &ServeArgs) -> web::Duties {
    let mut duties = web::Duties::strict();
    duties.allow_inline_policies = args.allow_inline_policies;
    duties.second_person_qualifies = !args.single_person_qualification;
    if !args.qualifiers.is_empty() {
        duties.qualifiers = Some(args.qualifiers.iter().cloned().collect());
    }
    if duties.allow_inline_policies {
        tracing::warn!("inline policies enabled: rollouts may bypass the reviewed policies in git");
    }
    duties
}

/// The Alertmanager receiver's settings from flags and file, with the token
/// read from its environment variable. Errors never contain the token.
fn alert_receiver(
    args: &ServeArgs,
    config: &crate::config::Config,
) -> anyhow::Result<Option<web::AlertReceiverConfig>> {
    let section = config.alertmanager.clone();
    let Some(var) = args
        .alertmanager_token_env
        .clone()
        .or_else(|| section.as_ref().and_then(|s| s.token_env.clone()))
    else {
        tracing::info!("no Alertmanager token configured: the alert webhook refuses every alert");
        return Ok(None);
    };
    let token = std::env::var(&var)
        .ok()
        .filter(|t| !t.trim().is_empty())
        .ok_or_else(|| super::BadInput(format!("the Alertmanager token variable {var} is not set or empty")))?;
    let mut receiver =
        web::AlertReceiverConfig::new(token.trim()).map_err(|e| super::BadInput(format!("{var}: {e}")))?;
    if let Some(label) = section.as_ref().and_then(|s| s.node_label.as_deref()) {
        receiver = receiver
            .with_node_label(label)
            .map_err(|e| super::BadInput(format!("[alertmanager] node_label: {e}")))?;
    }
    if let Some(recent) = section.as_ref().and_then(|s| s.recent.as_deref()) {
        let window = orchestrator_policy::parse_duration(recent)
            .map_err(|e| super::BadInput(format!("[alertmanager] recent: {e}")))?;
        receiver = receiver
            .with_recent_window(window)
            .map_err(|e| super::BadInput(format!("[alertmanager] recent: {e}")))?;
    }
    tracing::info!(token_env = %var, node_label = receiver.node_label(), "Alertmanager webhook enabled");
    Ok(Some(receiver))
}

/// Shortest limit on a PostgreSQL session idling in a transaction: below
/// it a loaded host could lose healthy transactions.
const MIN_PG_IDLE_IN_TRANSACTION: std::time::Duration = std::time::Duration::from_millis(500);

/// How often expired browser sessions are deleted: they already refuse
/// to authenticate, so this only bounds the table's growth.
const SESSION_SWEEP_EVERY: std::time::Duration = std::time::Duration::from_secs(15 * 60);

/// Runs until SIGINT or SIGTERM, then finishes in-flight requests.
pub async fn run(args: ServeArgs, context: Context) -> anyhow::Result<ExitCode> {
    let listen = args.listen.unwrap_or(context.config.listen);
    let alert_receiver = alert_receiver(&args, &context.config)?;
    let prometheus = args.prometheus.client()?;
    let clock: std::sync::Arc<dyn orchestrator_types::Clock> = match (args.clock_speedup, args.clock_epoch) {
        (Some(speedup), Some(epoch)) => {
            if !(speedup.is_finite() && speedup > 0.0) {
                return Err(super::BadInput("--clock-speedup must be a positive number".into()).into());
            }
            tracing::warn!(speedup, %epoch, "running on an accelerated clock (simulation only)");
            // Anchored to the wall clock rather than to process start, so a
            // restarted controller (and a simulator started at `epoch`) agree on now.
            std::sync::Arc::new(orchestrator_types::AcceleratedClock::from_wall_epoch(epoch, speedup))
        }
        _ => std::sync::Arc::new(orchestrator_types::SystemClock),
    };
    // A replica frozen inside a fenced write holds the lease row's lock; the
    // server must end that transaction well within a lease TTL, or a standby
    // could never take over from a frozen leader.
    let lease_ttl_real = clock.real_time(lease_ttl(&args));
    let tuning = orchestrator_db::ConnectTuning {
        pg_idle_in_transaction: (lease_ttl_real / 2)
            .min(orchestrator_db::DEFAULT_PG_IDLE_IN_TRANSACTION)
            .max(MIN_PG_IDLE_IN_TRANSACTION),
    };
    let db = orchestrator_db::Db::connect_and_migrate_tuned(&context.config.database_url, clock, tuning)
        .await
        .context("cannot open the database")?;
    // A second controller on a demo's database would act on the real clock
    // among the demo's accelerated times.
    crate::refuse_accelerated_clock(&db).await?;
    let _policy_sync = super::policy::spawn_periodic_sync(&context, db.clone(), shutdown_signal())?;
    let listener = TcpListener::bind(listen)
        .await
        .with_context(|| format!("cannot listen on {listen}"))?;
    let local = listener.local_addr().context("listener address")?;
    tracing::info!(address = %local, database = ?db.backend(), "waveguard serving");
    println!("waveguard listening on http://{local}");
    // Read before the engine starts, so no BMC is reached with a profile
    // whose learned binding is not loaded yet.
    let bindings = db
        .credential_host_bindings()
        .await
        .context("reading credential host bindings")?;
    let scheduler = match &context.config.scheduler {
        Some(settings) => {
            let scheduler = settings.build().context("the [scheduler] section")?;
            tracing::info!(
                kind = scheduler.kind(),
                "nodes are drained through their workload scheduler before a flash"
            );
            Some(orchestrator_engine::WorkloadScheduler {
                scheduler,
                names: settings.names.clone(),
            })
        }
        None => None,
    };
    let rma = crate::config::RmaSection::monitor_config(context.config.rma.as_ref())
        .map_err(|e| super::BadInput(e.to_string()))?;
    let retention = crate::config::RetentionSection::job_config(context.config.retention.as_ref())
        .map_err(|e| super::BadInput(e.to_string()))?;
    let connections =
        crate::config::BmcSection::connection_limit(context.config.bmc.as_ref(), args.bmc_max_connections)
            .map_err(|e| super::BadInput(format!("{e:#}")))?;
    tracing::info!(
        max_connections = connections.connections(),
        "BMC connections are bounded fleet-wide"
    );
    let clients = orchestrator_bmc::HttpClients::with_connection_limit(connections);
    let (engine, bmcs) = start_engine(&db, &context, &args, prometheus.clone(), bindings, scheduler, clients);
    match rma {
        Some(config) => {
            let health: std::sync::Arc<dyn orchestrator_engine::watch::HealthBmcs> = bmcs.clone();
            let monitor = orchestrator_engine::rma::RmaMonitor::new(db.clone(), health, prometheus.clone(), config);
            // Every replica runs the task; only the executor-lease holder's passes act.
            tokio::spawn(monitor.run(engine.lease(), shutdown_signal()));
        }
        None => tracing::info!("the RMA monitor is disabled ([rma] enabled = false)"),
    }
    // Health-sample retention, on the executor-lease holder too.
    let retention = orchestrator_engine::retention::RetentionJob::new(db.clone(), retention);
    tokio::spawn(retention.run(engine.lease(), shutdown_signal()));
    // API commands (approve, pause, ...) wake the engine at once.
    let state = AppState::new(db.clone())
        .with_engine_nudge(engine.nudge())
        .with_duties(duties(&args))
        .with_bmcs(bmcs);
    let state = match prometheus {
        Some(client) => state.with_prometheus(client),
        None => state,
    };
    // With profiles configured, an API import naming an unknown one is refused.
    let state = if context.config.credentials.is_empty() {
        state
    } else {
        state.with_credential_profiles(context.config.credentials.keys().cloned().collect())
    };
    let _session_sweeper = web::auth::spawn_session_sweeper(db.clone(), SESSION_SWEEP_EVERY);
    let state = match alert_receiver {
        Some(receiver) => state.with_alert_receiver(receiver),
        None => state,
    };
    web::serve(listener, state, shutdown_signal())
        .await
        .context("HTTP server failed")?;
    tracing::info!("shutting down");
    // Finishes the current pass and gives the executor lease up, so a
    // standby replica takes over at once instead of after the lease TTL.
    engine.shutdown().await;
    db.close().await.context("closing the database")?;
    Ok(ExitCode::SUCCESS)
}

fn lease_ttl(args: &ServeArgs) -> chrono::Duration {
    chrono::Duration::seconds(i64::from(args.lease_ttl.max(1)))
}

/// How often `serve` re-reads the credential host bindings learned on
/// import: an admin's extension reaches the engine within this time.
const BINDING_REFRESH: std::time::Duration = std::time::Duration::from_secs(5);

/// Keeps `learned` in step with the database's credential host bindings.
/// A profile first imported while `serve` runs is unbound in the engine
/// until the next read (at most this interval); SECURITY.md lists it.
fn refresh_bindings(
    db: orchestrator_db::Db,
    learned: std::sync::Arc<std::sync::RwLock<std::collections::BTreeMap<String, Vec<String>>>>,
) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(BINDING_REFRESH);
        loop {
            tick.tick().await;
            match db.credential_host_bindings().await {
                Ok(map) => *learned.write().unwrap_or_else(|p| p.into_inner()) = map,
                Err(err) => tracing::warn!(error = %err, "cannot read credential host bindings; keeping the last"),
            }
        }
    });
}

/// Starts the rollout engine. Every replica runs one; only the holder of
/// the executor lease executes. Also returns its BMC drivers, which the API
/// shares (one session per BMC).
fn start_engine(
    db: &orchestrator_db::Db,
    context: &Context,
    args: &ServeArgs,
    prometheus: Option<orchestrator_engine::prometheus::PrometheusClient>,
    bindings: std::collections::BTreeMap<String, Vec<String>>,
    scheduler: Option<orchestrator_engine::WorkloadScheduler>,
    clients: orchestrator_bmc::HttpClients,
) -> (
    orchestrator_engine::Engine,
    std::sync::Arc<orchestrator_engine::RedfishConnector>,
) {
    let profiles = std::sync::Arc::new(context.config.credentials.clone());
    let learned = std::sync::Arc::new(std::sync::RwLock::new(bindings));
    refresh_bindings(db.clone(), learned.clone());
    let resolve = std::sync::Arc::new(move |bmc_url: &str, credential_ref: &str| {
        let learned = learned.read().unwrap_or_else(|p| p.into_inner()).clone();
        orchestrator_engine::bmc_access::ProfileResolver::new(&profiles)
            .with_learned_bindings(learned)
            .endpoint_for(bmc_url, credential_ref)
            .map_err(orchestrator_engine::ResolveError::from)
    });
    let connector = std::sync::Arc::new(orchestrator_engine::RedfishConnector::new(clients, resolve));
    // Waves are judged against their control cohorts from Redfish health;
    // gates this judge cannot evaluate hold the wave for a human.
    // The same drivers as the engine's: one session per BMC for flashing and watching.
    let mut judge = orchestrator_engine::watch::DetectorJudge::new(db.clone(), connector.clone());
    if let Some(client) = prometheus {
        judge = judge.with_prometheus(client);
    }
    let judge = std::sync::Arc::new(judge);
    let config = orchestrator_engine::EngineConfig {
        holder: format!(
            "{}:{}",
            std::env::var("HOSTNAME").unwrap_or_else(|_| "waveguard".into()),
            std::process::id()
        ),
        lease_ttl: lease_ttl(args),
        pass_interval: std::time::Duration::from_millis(args.engine_interval_ms.max(10)),
        scheduler,
        ..Default::default()
    };
    let engine = orchestrator_engine::Engine::start(db.clone(), config, connector.clone(), judge);
    (engine, connector)
}

/// Resolves on the first SIGINT (Ctrl-C) or SIGTERM: `kill`, systemd and container runtimes stop
/// with SIGTERM, and every command that cleans up on the way out must hear both.
pub(crate) async fn shutdown_signal() {
    let interrupt = async {
        if let Err(err) = tokio::signal::ctrl_c().await {
            tracing::error!(error = %err, "cannot listen for Ctrl-C");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(err) => {
                tracing::error!(error = %err, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = interrupt => {}
        () = terminate => {}
    }
}
