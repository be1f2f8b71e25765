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
    web::serve(listener, AppState::new(db.clone()), shutdown_signal())
        .await
        .context("HTTP server failed")?;
    tracing::info!("shutting down");
    db.close().await.context("closing the database")?;
    Ok(ExitCode::SUCCESS)
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
