//! The `bmc-sim` command line: a fleet in this process until Ctrl-C, or (`--processes N`) in N
//! processes of this program, each serving a slice of the fleet on its own loopback address.
//!
//! Here rather than in `main.rs` so that `waveguard` can run the same command (hidden
//! `waveguard bmc-sim`): `simulate` and `bench` start their fleet processes from their own executable,
//! which is always there, instead of looking for a second binary. Command-line code, hence `anyhow`.

use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use chrono::{DateTime, Utc};

use crate::{Endpoint, Fleet, FleetOptions, FleetProcesses, ProcessOptions, Scenario, SimClock, endpoints_csv};

/// Simulated Redfish BMC fleet with fault injection.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
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
    /// Serve only nodes START..END of the fleet (names, labels and random draws stay the whole
    /// fleet's), e.g. `20000..40000`.
    #[arg(long, value_name = "START..END", value_parser = parse_slice, conflicts_with = "processes")]
    slice: Option<std::ops::Range<usize>>,
    /// Run the fleet in N processes of this program, each serving a slice on its own address
    /// (--first-address, then the next ones); --endpoints-out gets the whole fleet.
    #[arg(long, value_name = "N", conflicts_with = "tls")]
    processes: Option<usize>,
    /// The first process's address with --processes.
    #[arg(long, default_value = "127.0.0.2", value_name = "ADDR")]
    first_address: Ipv4Addr,
    /// Count simulated time from this wall-clock instant (RFC 3339), at which it equals real time,
    /// so several processes (and a controller) agree on now; allows skips over the control API.
    #[arg(long, value_name = "RFC3339")]
    clock_epoch: Option<DateTime<Utc>>,
    /// Answer every request with `Connection: close` (no HTTP keep-alive).
    #[arg(long)]
    no_keep_alive: bool,
    /// How long a "timeout" fault hangs a request, in milliseconds.
    #[arg(long, default_value_t = 60_000, value_name = "MS")]
    hang_for_ms: u64,
    /// Arguments before these ones that start this program as bmc-sim again (`bmc-sim` for
    /// `waveguard bmc-sim`); set by the program, not the user.
    #[arg(skip)]
    pub leading_args: Vec<String>,
}

fn parse_slice(text: &str) -> Result<std::ops::Range<usize>, String> {
    let (start, end) = text
        .split_once("..")
        .ok_or_else(|| format!("{text:?}: expected START..END"))?;
    let number = |t: &str| t.trim().parse::<usize>().map_err(|e| format!("{text:?}: {t:?}: {e}"));
    let (start, end) = (number(start)?, number(end)?);
    if start >= end {
        return Err(format!("{text:?}: START must be below END"));
    }
    Ok(start..end)
}

/// Runs the fleet as `args` say until Ctrl-C (or until killed).
pub async fn run(args: Args) -> anyhow::Result<()> {
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
    if let Some(processes) = args.processes {
        return run_processes(&args, yaml, &scenario, processes, password).await;
    }
    let clock = Arc::new(match args.clock_epoch {
        Some(epoch) => SimClock::from_wall_epoch(epoch, args.speedup),
        None => SimClock::starting_now(args.speedup),
    });
    let mut options = FleetOptions::new(clock.clone());
    options.bind = args.bind;
    options.username = args.username.clone();
    options.password = password;
    options.tls = args.tls;
    options.nodes = args.nodes;
    options.slice = args.slice.clone();
    options.keep_alive = !args.no_keep_alive;
    options.hang_for = Duration::from_millis(args.hang_for_ms);
    if args.clock_epoch.is_some() {
        options.skips = Some(clock);
    }
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
        write_endpoints(path, fleet.endpoints())?;
    } else if let Some(first) = fleet.endpoints().first() {
        println!(
            "first BMC: {}/redfish/v1 ({} BMCs)",
            first.bmc_url,
            fleet.endpoints().len()
        );
    }
    println!("metrics: {}/metrics", fleet.control_url());
    // Last: a parent starting this process reads up to this line to know every port is bound.
    println!("control: {}", fleet.control_url());

    tokio::signal::ctrl_c().await.context("waiting for Ctrl-C")?;
    tracing::info!("shutting down");
    fleet.shutdown().await;
    Ok(())
}

/// Writes the endpoint list: `.json`, or the CSV `waveguard fleet import` reads.
fn write_endpoints(path: &std::path::Path, endpoints: &[Endpoint]) -> anyhow::Result<()> {
    let body = if path.extension().is_some_and(|e| e == "json") {
        serde_json::to_string_pretty(endpoints)?
    } else {
        endpoints_csv(endpoints, "sim")
    };
    std::fs::write(path, body).with_context(|| format!("writing {}", path.display()))?;
    println!("endpoints: {}", path.display());
    Ok(())
}

/// `--processes N`: this program N times, each on a slice and an address of its own, until Ctrl-C.
async fn run_processes(
    args: &Args,
    yaml: String,
    scenario: &Scenario,
    processes: usize,
    password: String,
) -> anyhow::Result<()> {
    let options = ProcessOptions {
        program: std::env::current_exe().context("finding this program to start it again")?,
        leading_args: args.leading_args.clone(),
        scenario_yaml: yaml,
        nodes: args.nodes.unwrap_or(scenario.fleet.nodes),
        processes,
        first_address: args.first_address,
        clock_epoch: args.clock_epoch.unwrap_or_else(Utc::now),
        speedup: args.speedup,
        keep_alive: !args.no_keep_alive,
        hang_for: Duration::from_millis(args.hang_for_ms),
        username: args.username.clone(),
        password,
    };
    let started = std::time::Instant::now();
    let fleet = FleetProcesses::start(&options)
        .await
        .context("starting the processes")?;
    tracing::info!(
        nodes = fleet.endpoints().len(),
        processes,
        elapsed_ms = started.elapsed().as_millis() as u64,
        "fleet started"
    );
    if let Some(path) = &args.endpoints_out {
        write_endpoints(path, fleet.endpoints())?;
    }
    println!("clock epoch: {}", options.clock_epoch.to_rfc3339());
    for url in fleet.control_urls() {
        println!("control: {url}");
    }
    tokio::signal::ctrl_c().await.context("waiting for Ctrl-C")?;
    fleet.shutdown().await;
    Ok(())
}
