//! `waveguard fleet ...`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use orchestrator_bmc::{Bmc, DEFAULT_DISCOVERY_CONCURRENCY, HttpClients, RedfishBmc};
use orchestrator_types::NodeId;

use crate::Context;
use orchestrator_db::fleet_file;
use orchestrator_engine::bmc_access::ProfileResolver;

/// Fleet commands.
#[derive(Debug, clap::Subcommand)]
pub enum FleetCommand {
    /// Create or update nodes from a CSV or YAML file, all or nothing.
    ///
    /// CSV needs a header naming: name, bmc_url, credential_ref,
    /// platform_sku, region, cluster, rack, nvlink_domain. YAML is a list of
    /// maps with those keys (or `nodes:` holding that list). Every bad row
    /// is reported with its line; nothing is imported unless all are good.
    Import {
        /// The file to import (.csv, .yaml or .yml).
        file: PathBuf,
    },
    /// Read every node's FirmwareInventory over Redfish and record the
    /// versions; unreachable nodes are recorded with their error and the
    /// rest continue.
    Discover {
        /// Most BMCs read at once.
        #[arg(long, default_value_t = DEFAULT_DISCOVERY_CONCURRENCY)]
        concurrency: usize,
        /// Only these nodes (repeatable); default every node.
        #[arg(long = "node", value_name = "NAME")]
        nodes: Vec<String>,
        /// Give up on one BMC after this many seconds.
        #[arg(long, default_value_t = 60)]
        node_timeout_secs: u64,
    },
    /// Extend a credential profile's host binding (admin, audited). A
    /// profile with no `hosts` in the configuration is bound to the hosts of
    /// the nodes it was first imported with; a node on another host gets no
    /// password until its host is added here.
    BindHost {
        /// The credential profile (a node's credential_ref).
        #[arg(long)]
        profile: String,
        /// Host names or addresses to add (no scheme or port).
        #[arg(required = true)]
        hosts: Vec<String>,
    },
    /// List nodes.
    List {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
}

impl FleetCommand {
    /// Whether the command writes to the database (a command not listed as
    /// a read writes, so a new command is refused on a demo's database until
    /// someone says it only reads).
    pub fn writes(&self) -> bool {
        !matches!(self, Self::List { .. })
    }
}

/// Runs a fleet command.
pub async fn run(command: FleetCommand, context: &Context) -> anyhow::Result<ExitCode> {
    match command {
        FleetCommand::Import { file } => {
            let actor = context.local_admin()?;
            let nodes = fleet_file::read(&file)?;
            let db = context.db().await?;
            // The CLI holds the database credentials, so it is the local
            // admin: it may re-address nodes (audited with old and new
            // address under the CLI actor), and it checks profiles against
            // the configuration when there is one.
            let credentials = &context.config.credentials;
            let options = orchestrator_db::model::ImportOptions {
                may_change_bmc_address: true,
                known_credential_refs: (!credentials.is_empty()).then(|| credentials.keys().cloned().collect()),
            };
            let summary = db.import_nodes_with(&nodes, &actor, &options).await?;
            println!(
                "imported {} node(s) from {}: {} created, {} updated, {} unchanged",
                nodes.len(),
                file.display(),
                summary.created,
                summary.updated,
                summary.unchanged
            );
            Ok(ExitCode::SUCCESS)
        }
        FleetCommand::BindHost { profile, hosts } => {
            let actor = context.local_admin()?;
            let db = context.db().await?;
            db.extend_credential_binding(&profile, &hosts, &actor).await?;
            let bound = db.credential_host_bindings().await?;
            println!(
                "credential profile {profile:?} may be sent to: {}",
                bound.get(&profile).map(|h| h.join(", ")).unwrap_or_default()
            );
            Ok(ExitCode::SUCCESS)
        }
        FleetCommand::Discover {
            concurrency,
            nodes,
            node_timeout_secs,
        } => {
            discover(
                context,
                concurrency.max(1),
                &nodes,
                Duration::from_secs(node_timeout_secs),
            )
            .await
        }
        FleetCommand::List { json } => {
            let db = context.db().await?;
            // Every node: one page of `list_nodes` stops at its cap.
            let nodes = db.all_nodes().await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&nodes)?);
            } else {
                println!(
                    "{:<24} {:<12} {:<16} {:<10} {:<10} BMC",
                    "NAME", "STATE", "SKU", "CLUSTER", "RACK"
                );
                for node in nodes {
                    println!(
                        "{:<24} {:<12} {:<16} {:<10} {:<10} {}",
                        node.name, node.state, node.platform_sku, node.labels.cluster, node.labels.rack, node.bmc_url
                    );
                }
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// `waveguard fleet discover`.
async fn discover(
    context: &Context,
    concurrency: usize,
    only: &[String],
    deadline: Duration,
) -> anyhow::Result<ExitCode> {
    let db = context.db().await?;
    let mut nodes = db.all_nodes().await?;
    nodes.retain(|n| only.is_empty() || only.contains(&n.name));
    for name in only {
        if !nodes.iter().any(|n| &n.name == name) {
            return Err(super::BadInput(format!("no node named {name:?}")).into());
        }
    }
    let started = Instant::now();
    let clients = HttpClients::new();
    let mut resolver =
        ProfileResolver::new(&context.config.credentials).with_learned_bindings(db.credential_host_bindings().await?);
    let mut targets: Vec<(NodeId, Arc<dyn Bmc>)> = Vec::new();
    let mut failed = 0usize;
    let mut first_errors = Vec::new();
    for node in &nodes {
        let bmc = resolver.endpoint(node).map_err(|e| e.to_string()).and_then(|endpoint| {
            RedfishBmc::new(&endpoint, &clients)
                .map(|bmc| Arc::new(bmc) as Arc<dyn Bmc>)
                .map_err(|e| e.to_string())
        });
        match bmc {
            Ok(bmc) => targets.push((node.id, bmc)),
            Err(error) => {
                db.record_discovery_error(node.id, &error).await?;
                failed += 1;
                if first_errors.len() < 10 {
                    first_errors.push(format!("{}: {error}", node.name));
                }
            }
        }
    }
    let names: std::collections::HashMap<NodeId, String> = nodes.iter().map(|n| (n.id, n.name.clone())).collect();
    let mut results = orchestrator_bmc::discover_inventory_stream(targets, concurrency, deadline);
    let (mut read, mut components, mut skipped) = (0usize, 0usize, 0usize);
    while let Some(outcome) = results.next().await {
        let name = names.get(&outcome.node).cloned().unwrap_or_default();
        match outcome.result {
            Ok(inventory) => {
                let readings = orchestrator_engine::inventory_readings(inventory);
                for component in &readings.unversioned {
                    skipped += 1;
                    tracing::warn!(node = %name, component = %component.id, version = ?component.version,
                        "component without a parsable version; not recorded");
                }
                components += readings.recorded.len();
                db.record_discovered_inventory(outcome.node, &readings.recorded).await?;
                read += 1;
            }
            Err(error) => {
                let error = error.to_string();
                db.record_discovery_error(outcome.node, &error).await?;
                failed += 1;
                if first_errors.len() < 10 {
                    first_errors.push(format!("{name}: {error}"));
                }
            }
        }
    }
    println!(
        "discovered {read} of {} node(s) in {:.1}s: {components} component(s) recorded, {skipped} without a version, {failed} node(s) failed",
        nodes.len(),
        started.elapsed().as_secs_f64()
    );
    for error in &first_errors {
        println!("  {error}");
    }
    if failed > first_errors.len() {
        println!(
            "  ... and {} more (see `waveguard fleet list --json`, last_discovery_error)",
            failed - first_errors.len()
        );
    }
    Ok(ExitCode::SUCCESS)
}
