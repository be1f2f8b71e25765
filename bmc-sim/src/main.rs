//! `bmc-sim`: runs a simulated BMC fleet until Ctrl-C.

use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, bail};
use bmc_sim::{Fleet, FleetOptions, Scenario, SimClock, endpoints_csv};
use clap::Parser;

/// Simulated Redfish BMC fleet with fault injection.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    /// Scenario YAML file (see bmc-sim/scenarios/).
    #[arg(long)]
    scenario: PathBuf,
    /// Override the scenario's node count.
    #[arg(long)]
    nodes: Option<usize>,
    /// Simulated seconds per real second.
    #[arg(long, default_value_t = 1.0)]
    speedup: f64,
    /// Write the endpoint list here: `.csv` (for `waveguard fleet import`) or `.json`.
    #[arg(long)]
    endpoints_out: Option<PathBuf>,
    /// Serve HTTPS with a generated self-signed CA.
    #[arg(long)]
    tls: bool,
    /// Where to write the CA certificate when --tls is set.
    #[arg(long, default_value = "bmc-sim-ca.pem")]
    ca_out: PathBuf,
    /// Loopback address to bind.
    #[arg(long, default_value = "127.0.0.1")]
    bind: IpAddr,
    /// Redfish user name.
    #[arg(long, default_value = "admin")]
    username: String,
    /// Environment variable holding the Redfish password (the password itself never goes on the command line).
    #[arg(long)]
    password_env: Option<String>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .init();
    let args = Args::parse();
    let yaml = std::fs::read_to_string(&args.scenario)
        .with_context(|| format!("reading scenario {}", args.scenario.display()))?;
    let scenario = Scenario::from_yaml_str(&yaml).with_context(|| format!("scenario {}", args.scenario.display()))?;
    if !(args.speedup.is_finite() && args.speedup > 0.0) {
        bail!("--speedup must be a positive number");
    }
    let password = match &args.password_env {
        Some(var) => std::env::var(var).with_context(|| format!("environment variable {var} (from --password-env)"))?,
        None => "admin".to_owned(),
    };
    let clock = Arc::new(SimClock::starting_now(args.speedup));
    let mut options = FleetOptions::new(clock);
    options.bind = args.bind;
    options.username = args.username.clone();
    options.password = password;
    options.tls = args.tls;
    options.nodes = args.nodes;
    let started = std::time::Instant::now();
    let fleet = Fleet::start(scenario, options).await.context("starting the fleet")?;
    tracing::info!(
        nodes = fleet.endpoints().len(),
        elapsed_ms = started.elapsed().as_millis() as u64,
        "fleet started"
    );

    if let Some(pem) = fleet.ca_pem() {
        std::fs::write(&args.ca_out, pem).with_context(|| format!("writing {}", args.ca_out.display()))?;
        println!("CA certificate: {}", args.ca_out.display());
    }
    if let Some(path) = &args.endpoints_out {
        let body = if path.extension().is_some_and(|e| e == "json") {
            serde_json::to_string_pretty(fleet.endpoints())?
        } else {
            endpoints_csv(fleet.endpoints(), "sim")
        };
        std::fs::write(path, body).with_context(|| format!("writing {}", path.display()))?;
        println!("endpoints: {}", path.display());
    } else if let Some(first) = fleet.endpoints().first() {
        println!(
            "first BMC: {}/redfish/v1 ({} BMCs)",
            first.bmc_url,
            fleet.endpoints().len()
        );
    }
    println!("control: {}", fleet.control_url());
    println!("metrics: {}/metrics", fleet.control_url());

    tokio::signal::ctrl_c().await.context("waiting for Ctrl-C")?;
    tracing::info!("shutting down");
    fleet.shutdown().await;
    Ok(())
}
