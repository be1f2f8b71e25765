//! `waveguard simulate`: one whole rollout, headless, against a simulated
//! fleet, with a JSON report of what happened.
//!
//! This module reads and checks the command's inputs and writes the report;
//! the world (clock, fleet, database, image server), the run and the report
//! model are `orchestrator-sim`'s, shared with `waveguard demo` and the
//! benchmarks.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration as StdDuration;

use anyhow::Context as _;
use bmc_sim::Scenario;
use orchestrator_policy::Policy;
use orchestrator_sim::{FleetPlacement, SimError, SimWorld, Simulation, WorldOptions};
use orchestrator_types::{ComponentKind, FirmwareVersion};

use super::BadInput;
use crate::Context;

/// Default speedup: two simulated hours per real second, so a policy with a
/// couple of days of bake runs in well under a minute even before idle time
/// is skipped.
pub const DEFAULT_SPEEDUP: f64 = 7200.0;

/// Options of `waveguard simulate`.
#[derive(Debug, clap::Args)]
pub struct SimulateArgs {
    /// bmc-sim scenario YAML: the fleet, its firmware behaviour and faults.
    #[arg(long, value_name = "FILE")]
    scenario: PathBuf,
    /// Rollout policy YAML.
    #[arg(long, value_name = "FILE")]
    policy: PathBuf,
    /// The release to roll out, as KIND@VERSION (e.g. gpu@96.00.61.00.01).
    /// Its image is generated for the scenario's platforms.
    #[arg(long, value_name = "KIND@VERSION")]
    release: String,
    /// Where to write the JSON report.
    #[arg(long, value_name = "FILE")]
    report: PathBuf,
    /// Simulated seconds per real second.
    #[arg(long, default_value_t = DEFAULT_SPEEDUP, value_name = "N")]
    speedup: f64,
    /// `auto`: give every manual approval at once, as two synthetic approvers.
    /// Without it a wave waiting for a human ends the simulation (outcome
    /// `halted`).
    #[arg(long, value_enum, value_name = "MODE")]
    approve: Option<ApproveMode>,
    /// Seed of the planner's stratified choices.
    #[arg(long, default_value_t = 1, value_name = "N")]
    seed: i64,
    /// Register the release without qualifying it (by default it is qualified
    /// with every gate the policy requires recorded as passed).
    #[arg(long)]
    unqualified: bool,
    /// Give up after this many real seconds (outcome `halted`).
    #[arg(long, default_value_t = 600, value_name = "SECONDS")]
    timeout: u64,
    /// Run the simulated BMCs in N processes of their own (this executable
    /// as bmc-sim, each serving a slice of the fleet on 127.0.0.2,
    /// 127.0.0.3, ...) instead of in this process, whose open-file limit
    /// then holds only the controller's own connections. 0: enough processes
    /// that each fits half the open-file limit it inherits from this one (at
    /// most 10,000 nodes each; 5 for 10,000 nodes under `ulimit -n 4096`).
    #[arg(long, value_name = "N")]
    fleet_processes: Option<usize>,
}

/// How manual approvals are given.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ApproveMode {
    /// Approve every wave that waits for approval, at once.
    Auto,
}

// ---------------------------------------------------------------------------
// The command.

/// Parses `KIND@VERSION`.
pub fn parse_release(text: &str) -> Result<(ComponentKind, FirmwareVersion), BadInput> {
    let (kind, version) = text.split_once('@').ok_or_else(|| {
        BadInput(format!(
            "--release {text:?}: expected KIND@VERSION, e.g. gpu@96.00.61.00.01"
        ))
    })?;
    let kind: ComponentKind = kind.trim().parse().map_err(|_| {
        BadInput(format!(
            "--release {text:?}: unknown component kind {kind:?} (bmc, gpu, nic, bios, cpld, other)"
        ))
    })?;
    let version = FirmwareVersion::parse(version.trim())
        .map_err(|e| BadInput(format!("--release {text:?}: version {version:?} does not parse: {e}")))?;
    Ok((kind, version))
}

fn read_input(path: &Path, what: &str) -> Result<String, BadInput> {
    std::fs::read_to_string(path).map_err(|e| BadInput(format!("cannot read the {what} {}: {e}", path.display())))
}

/// Everything validated before anything starts.
struct Inputs {
    scenario: Scenario,
    /// The scenario's text, which fleet processes read.
    scenario_yaml: String,
    policy_source: String,
    policy: Policy,
    kind: ComponentKind,
    version: FirmwareVersion,
}

fn validate(args: &SimulateArgs) -> Result<Inputs, BadInput> {
    if !(args.speedup.is_finite() && args.speedup >= 1.0) {
        return Err(BadInput(format!("--speedup {}: must be a number >= 1", args.speedup)));
    }
    let (kind, version) = parse_release(&args.release)?;
    let scenario_text = read_input(&args.scenario, "scenario")?;
    let scenario = Scenario::from_yaml_str(&scenario_text)
        .map_err(|e| BadInput(format!("scenario {}: {e}", args.scenario.display())))?;
    let policy_source = read_input(&args.policy, "policy")?;
    let policy = orchestrator_engine::parse_policy(&policy_source)
        .map_err(|e| BadInput(format!("policy {}: {e}", args.policy.display())))?;
    if policy.target.component != kind {
        return Err(BadInput(format!(
            "--release {}: the policy {:?} updates {} firmware, not {}",
            args.release,
            policy.name,
            policy.target.component.as_str(),
            kind.as_str()
        )));
    }
    if let Some(parent) = args.report.parent().filter(|p| !p.as_os_str().is_empty())
        && !parent.is_dir()
    {
        return Err(BadInput(format!(
            "--report {}: directory {} does not exist",
            args.report.display(),
            parent.display()
        )));
    }
    Ok(Inputs {
        scenario,
        scenario_yaml: scenario_text,
        policy_source,
        policy,
        kind,
        version,
    })
}

/// `waveguard simulate`.
pub async fn run(args: SimulateArgs, _context: &Context) -> anyhow::Result<ExitCode> {
    let inputs = validate(&args)?;
    let nodes = inputs.scenario.fleet.nodes;
    eprintln!(
        "simulating {} {} on {nodes} node(s) with policy {:?} at {}x",
        inputs.kind.as_str(),
        inputs.version.as_str(),
        inputs.policy.name,
        args.speedup
    );
    let mut options = WorldOptions::new(args.speedup);
    if let Some(processes) = args.fleet_processes {
        let processes = match processes {
            0 => bmc_sim::ProcessOptions::processes_for(nodes),
            n => n,
        };
        eprintln!("the fleet runs in {processes} bmc-sim process(es) of its own");
        options.placement = FleetPlacement::own_processes(processes).context("finding this executable")?;
        options.scenario_yaml = Some(inputs.scenario_yaml.clone());
    }
    let world = SimWorld::start_with(inputs.scenario.clone(), options).await?;
    eprintln!(
        "the controller keeps at most {} BMC connections open",
        world.connection_usage().limit
    );
    let outcome = orchestrator_sim::simulate(&world, &simulation(&inputs, &args)).await;
    world.shutdown().await;
    let report = outcome.map_err(bad_if_caller)?;
    let json = serde_json::to_string_pretty(&report).context("serialising the report")?;
    std::fs::write(&args.report, format!("{json}\n"))
        .with_context(|| format!("cannot write the report {}", args.report.display()))?;
    eprintln!(
        "{}: {} node(s) updated, {} failed, {} rolled back; detection: {}; {} simulated s in {:.1} s; report in {}",
        report.outcome,
        report.updates.succeeded,
        report.updates.failed,
        report.updates.rolled_back,
        match (&report.detection.metric, report.detection.at_s) {
            (Some(metric), Some(at)) => format!("{metric} at {at} s"),
            _ => "none".into(),
        },
        report.sim_seconds,
        report.wall_seconds,
        args.report.display()
    );
    Ok(ExitCode::SUCCESS)
}

fn simulation(inputs: &Inputs, args: &SimulateArgs) -> Simulation {
    Simulation {
        policy_source: inputs.policy_source.clone(),
        policy: inputs.policy.clone(),
        kind: inputs.kind,
        version: inputs.version.clone(),
        seed: args.seed,
        qualify: !args.unqualified,
        approve: args.approve == Some(ApproveMode::Auto),
        timeout: StdDuration::from_secs(args.timeout),
    }
}

/// Inputs the user can fix exit with status 2, the whole chain on one line.
fn bad_if_caller(err: SimError) -> anyhow::Error {
    if err.is_caller_error() {
        anyhow::Error::new(BadInput(orchestrator_types::error_chain(&err)))
    } else {
        anyhow::Error::new(err)
    }
}
