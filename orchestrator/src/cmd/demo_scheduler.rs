//! `waveguard demo-scheduler` (hidden): the workload scheduler of the demo's
//! simulated fleet, driven by the controller through the generic command
//! adapter (`orchestrator_scheduler::command`), exactly as a site's own
//! wrapper around its scheduler would be. Each node is a JSON file in
//! `--dir`; a node's job ends at a wall-clock time, so a drained node
//! drains for real while the controller waits.
//!
//! Operations: `state NODE`, `drain NODE REASON`, `resume NODE`, `list`
//! (the command adapter's protocol: exit 3 for an unknown node).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use serde::{Deserialize, Serialize};

/// Exit status for "no such node" (the command adapter's default).
const UNKNOWN_NODE: u8 = 3;

/// Options of `waveguard demo-scheduler`.
#[derive(Debug, clap::Args)]
pub struct DemoSchedulerArgs {
    /// Directory holding one `<node>.json` per node.
    #[arg(long, value_name = "DIR")]
    dir: PathBuf,
    #[command(subcommand)]
    op: Op,
}

#[derive(Debug, clap::Subcommand)]
enum Op {
    /// Print one node's state as JSON.
    State {
        /// The scheduler's node name.
        node: String,
    },
    /// Drain a node with a reason.
    Drain {
        /// The scheduler's node name.
        node: String,
        /// The drain reason (Waveguard's tag).
        reason: String,
    },
    /// Return a node to service.
    Resume {
        /// The scheduler's node name.
        node: String,
    },
    /// Print every node's state as a JSON array.
    List,
}

/// One node as stored.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct DemoNode {
    /// The drain flag.
    pub drain: bool,
    pub reason: Option<String>,
    pub reason_set_by: Option<String>,
    /// Unix seconds (wall clock) when the node's job ends, if it runs one.
    pub job_ends_at: Option<u64>,
    /// A busy node: once drained, its current job still runs this many
    /// (real) seconds; while in service it always has a job.
    pub busy_for_seconds: Option<u64>,
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn path(dir: &Path, node: &str) -> anyhow::Result<PathBuf> {
    // Names come from the controller's mapping (validated there); refuse a
    // path anyway rather than trust it.
    anyhow::ensure!(
        !node.is_empty() && node.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c)),
        "invalid node name {node:?}"
    );
    Ok(dir.join(format!("{node}.json")))
}

/// Writes one node's file (atomically: the controller may read it at once).
pub fn write_node(dir: &Path, node: &str, state: &DemoNode) -> anyhow::Result<()> {
    let target = path(dir, node)?;
    let temporary = target.with_extension("json.tmp");
    std::fs::write(&temporary, serde_json::to_vec(state)?)
        .with_context(|| format!("writing {}", temporary.display()))?;
    std::fs::rename(&temporary, &target).with_context(|| format!("writing {}", target.display()))
}

fn read_node(dir: &Path, node: &str) -> anyhow::Result<Option<DemoNode>> {
    let file = path(dir, node)?;
    match std::fs::read(&file) {
        Ok(bytes) => Ok(Some(
            serde_json::from_slice(&bytes).with_context(|| format!("reading {}", file.display()))?,
        )),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(err) => Err(err).with_context(|| format!("reading {}", file.display())),
    }
}

/// The adapter protocol's view of a node.
fn report(name: Option<&str>, node: &DemoNode) -> serde_json::Value {
    let running = match node.job_ends_at {
        Some(end) => end > now(),
        None => !node.drain && node.busy_for_seconds.is_some(),
    };
    let jobs = u32::from(running);
    let state = match (node.drain, jobs) {
        (false, _) => "in_service",
        (true, 0) => "drained",
        (true, _) => "draining",
    };
    let mut value = serde_json::json!({
        "state": state,
        "reason": node.reason,
        "reason_set_by": node.reason_set_by,
        "jobs": jobs,
    });
    if let Some(name) = name {
        value["name"] = name.into();
    }
    value
}

/// `waveguard demo-scheduler`.
pub fn run(args: DemoSchedulerArgs) -> anyhow::Result<ExitCode> {
    let dir = &args.dir;
    let known = |node: &str| -> anyhow::Result<Option<DemoNode>> { read_node(dir, node) };
    match args.op {
        Op::List => {
            let mut nodes = Vec::new();
            for entry in std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
                let entry = entry?;
                let file = entry.file_name().to_string_lossy().into_owned();
                if let Some(name) = file.strip_suffix(".json")
                    && let Some(node) = known(name)?
                {
                    nodes.push(report(Some(name), &node));
                }
            }
            println!("{}", serde_json::Value::Array(nodes));
        }
        Op::State { node } => {
            let Some(state) = known(&node)? else {
                eprintln!("no such node {node}");
                return Ok(ExitCode::from(UNKNOWN_NODE));
            };
            println!("{}", report(None, &state));
        }
        Op::Drain { node, reason } => {
            let Some(mut state) = known(&node)? else {
                eprintln!("no such node {node}");
                return Ok(ExitCode::from(UNKNOWN_NODE));
            };
            if !state.drain
                && state.job_ends_at.is_none()
                && let Some(seconds) = state.busy_for_seconds
            {
                state.job_ends_at = Some(now() + seconds);
            }
            state.drain = true;
            state.reason = Some(reason);
            state.reason_set_by = Some("waveguard".into());
            write_node(dir, &node, &state)?;
        }
        Op::Resume { node } => {
            let Some(mut state) = known(&node)? else {
                eprintln!("no such node {node}");
                return Ok(ExitCode::from(UNKNOWN_NODE));
            };
            state.drain = false;
            // Back in service, it takes new work.
            state.job_ends_at = None;
            state.reason = None;
            state.reason_set_by = None;
            write_node(dir, &node, &state)?;
        }
    }
    Ok(ExitCode::SUCCESS)
}
