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
}

/// Runs until SIGINT or SIGTERM, then finishes in-flight requests.
pub async fn run(args: ServeArgs, context: Context) -> anyhow::Result<ExitCode> {
    let listen = args.listen.unwrap_or(context.config.listen);
    let db = context.db().await?;
    let _policy_sync = super::policy::spawn_periodic_sync(&context, db.clone(), shutdown_signal())?;
    let listener = TcpListener::bind(listen)
        .await
        .with_context(|| format!("cannot listen on {listen}"))?;
    let local = listener.local_addr().context("listener address")?;
    tracing::info!(address = %local, database = ?db.backend(), "waveguard serving");
    println!("waveguard listening on http://{local}");
    let engine = start_engine(&db, &context);
    web::serve(listener, AppState::new(db.clone()), shutdown_signal())
        .await
        .context("HTTP server failed")?;
    tracing::info!("shutting down");
    // Finishes the current pass and gives the executor lease up, so a
    // standby replica takes over at once instead of after the lease TTL.
    engine.shutdown().await;
    db.close().await.context("closing the database")?;
    Ok(ExitCode::SUCCESS)
}

/// Starts the rollout engine. Every replica runs one; only the holder of
/// the executor lease executes.
fn start_engine(db: &orchestrator_db::Db, context: &Context) -> orchestrator_engine::Engine {
    let profiles = std::sync::Arc::new(context.config.credentials.clone());
    let resolve = std::sync::Arc::new(move |bmc_url: &str, credential_ref: &str| {
        let node = crate::bmc_access::node_for_access(bmc_url, credential_ref);
        crate::bmc_access::EndpointResolver::new(&profiles)
            .endpoint(&node)
            .map_err(|e| e.to_string())
    });
    let connector = std::sync::Arc::new(orchestrator_engine::RedfishConnector::new(
        orchestrator_bmc::HttpClients::new(),
        resolve,
    ));
    let config = orchestrator_engine::EngineConfig {
        holder: format!(
            "{}:{}",
            std::env::var("HOSTNAME").unwrap_or_else(|_| "waveguard".into()),
            std::process::id()
        ),
        ..Default::default()
    };
    orchestrator_engine::Engine::start(
        db.clone(),
        config,
        connector,
        std::sync::Arc::new(orchestrator_engine::GatelessJudge),
    )
}

/// Resolves on the first SIGINT (Ctrl-C) or SIGTERM.
async fn shutdown_signal() {
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
