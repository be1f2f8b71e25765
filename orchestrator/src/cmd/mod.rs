//! One module per command group.

pub mod bench;
pub mod bench_ansible;
pub mod bench_latency;
pub mod bench_rma;
pub mod demo;
pub mod demo_scheduler;
pub mod fleet;
pub mod policy;
pub mod prometheus;
pub mod release;
pub mod rma;
pub mod rollout;
pub mod serve;
pub mod simulate;
pub mod user;

use std::process::ExitCode;

use crate::Context;

/// An error in what the user asked for, reported with exit status 2.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct BadInput(pub String);

/// `waveguard migrate`.
pub async fn migrate(context: &Context) -> anyhow::Result<ExitCode> {
    let db = context.db().await?;
    let applied = db.applied_migrations().await?;
    println!(
        "database is at migration {}",
        applied.last().map_or("(none)", String::as_str)
    );
    Ok(ExitCode::SUCCESS)
}
