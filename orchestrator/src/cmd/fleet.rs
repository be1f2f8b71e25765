//! `waveguard fleet ...`.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::{Context, fleet_file};

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
    /// List nodes.
    List {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
}

/// Runs a fleet command.
pub async fn run(command: FleetCommand, context: &Context) -> anyhow::Result<ExitCode> {
    match command {
        FleetCommand::Import { file } => {
            let nodes = fleet_file::read(&file)?;
            let db = context.db().await?;
            let summary = db.import_nodes(&nodes, &context.cli_actor()).await?;
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
        FleetCommand::List { json } => {
            let db = context.db().await?;
            let nodes = db.list_nodes(&Default::default()).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&nodes)?);
            } else {
                println!(
                    "{:<24} {:<12} {:<16} {:<10} {:<10} {}",
                    "NAME", "STATE", "SKU", "CLUSTER", "RACK", "BMC"
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
