//! `bmc-sim`: runs a simulated BMC fleet until Ctrl-C (see [`bmc_sim::cli`]).

use clap::Parser;

/// Simulated Redfish BMC fleet with fault injection.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Command {
    #[command(flatten)]
    args: bmc_sim::cli::Args,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .init();
    bmc_sim::cli::run(Command::parse().args).await
}
