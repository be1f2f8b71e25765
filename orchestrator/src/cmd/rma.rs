//! `waveguard rma ...`: the RMA cases, and the human steps of their pipeline
//! (record the vendor's answer, the replacement, the verification, or close a
//! case and return its node to rollouts). Every move goes through the pure
//! case machine (`orchestrator_rma::Case::apply`) and is audited; the CLI's
//! writer is the local admin (`local-admin:<OS user>`, role admin).

use std::process::ExitCode;

use orchestrator_db::rma::{RmaCase, RmaFilter};
use orchestrator_rma::{Actor, CaseEvent};
use orchestrator_types::Role;

use crate::Context;

/// RMA commands.
#[derive(Debug, clap::Subcommand)]
pub enum RmaCommand {
    /// List cases, oldest first.
    List {
        /// Only cases not yet verified or closed (they hold their nodes out of rollouts).
        #[arg(long)]
        open: bool,
        /// Only this node's cases.
        #[arg(long, value_name = "NODE")]
        node: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show one case: its part, the rule it met, the samples and its history.
    Show {
        /// Case id (`RMA-...`).
        case: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Record a step of the case's pipeline.
    Record {
        /// Case id (`RMA-...`).
        case: String,
        #[command(subcommand)]
        event: RecordEvent,
    },
}

/// A pipeline step a human records.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum RecordEvent {
    /// The evidence package was built (its manifest's sha256).
    EvidenceCollected {
        /// sha256 of the evidence package's manifest.
        #[arg(long, value_name = "SHA256")]
        manifest_sha256: String,
    },
    /// The vendor accepted the claim.
    Accepted,
    /// The vendor rejected the claim; their reason, verbatim.
    Rejected {
        /// The vendor's reason, verbatim.
        #[arg(long)]
        reason: String,
    },
    /// The part was swapped (the new part's serial).
    Replaced {
        /// Serial number of the part put in.
        #[arg(long, value_name = "SERIAL")]
        new_serial: String,
    },
    /// The node runs well with the new part: ends the case and its hold.
    Verified,
    /// End the case without a replacement and return the node to rollouts.
    Close {
        /// Why the case ends without a replacement.
        #[arg(long)]
        reason: String,
    },
}

impl From<RecordEvent> for CaseEvent {
    fn from(event: RecordEvent) -> Self {
        match event {
            RecordEvent::EvidenceCollected { manifest_sha256 } => CaseEvent::CollectEvidence { manifest_sha256 },
            RecordEvent::Accepted => CaseEvent::VendorAccepted,
            RecordEvent::Rejected { reason } => CaseEvent::VendorRejected { reason },
            RecordEvent::Replaced { new_serial } => CaseEvent::Replaced { new_serial },
            RecordEvent::Verified => CaseEvent::Verified,
            RecordEvent::Close { reason } => CaseEvent::Close { reason },
        }
    }
}

fn state_words(case: &orchestrator_rma::Case) -> String {
    serde_json::to_value(case.state)
        .ok()
        .and_then(|v| v.as_str().map(|s| s.replace('_', " ")))
        .unwrap_or_default()
}

fn print_case(found: &RmaCase) {
    let case = &found.case;
    println!(
        "case {}: GPU {} on {} ({})",
        case.id, case.serial, case.node, case.vendor
    );
    println!("  state:    {}", state_words(case));
    println!(
        "  rule:     {} ({}), severity {:?}",
        case.rule, case.failure_mode, case.severity
    );
    println!(
        "  found:    {} (first sample {})",
        case.opened_at, found.candidate.began_at
    );
    if let Some(suspicion) = &found.candidate.firmware_suspected {
        println!(
            "  firmware-suspected: {}",
            serde_json::to_string(suspicion).unwrap_or_default()
        );
    }
    if let Some(reason) = &case.rejection_reason {
        println!("  vendor's rejection: {reason}");
    }
    if let Some(reference) = &case.vendor_reference {
        println!("  vendor reference: {reference}");
    }
    if let Some(serial) = &case.replacement_serial {
        println!("  replaced by: {serial}");
    }
    println!("  samples:  {}", found.candidate.samples.len());
    for t in &case.history {
        println!(
            "  {}  {:<18} -> {:<18} by {}{}",
            t.at,
            format!("{:?}", t.from),
            format!("{:?}", t.to),
            t.actor,
            t.detail.as_deref().map(|d| format!(": {d}")).unwrap_or_default()
        );
    }
}

/// Runs an RMA command.
pub async fn run(command: RmaCommand, context: &Context) -> anyhow::Result<ExitCode> {
    let db = context.db().await?;
    match command {
        RmaCommand::List { open, node, json } => {
            let cases = db
                .rma_cases(&RmaFilter {
                    open_only: open,
                    node,
                    ..Default::default()
                })
                .await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&cases)?);
            } else {
                println!("{:<40} {:<20} {:<16} {:<20} RULE", "CASE", "STATE", "NODE", "SERIAL");
                for c in &cases {
                    println!(
                        "{:<40} {:<20} {:<16} {:<20} {}",
                        c.case.id,
                        state_words(&c.case),
                        c.case.node,
                        c.case.serial,
                        c.case.rule
                    );
                }
            }
        }
        RmaCommand::Show { case, json } => {
            let found = db.rma_case(&case).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&found)?);
            } else {
                print_case(&found);
            }
        }
        RmaCommand::Record { case, event } => {
            let actor = Actor {
                name: context.local_admin()?,
                role: Role::Admin,
            };
            let next = db.apply_rma_event(&case, event.into(), &actor).await?;
            println!("case {} is now {}", next.id, state_words(&next));
            if !next.state.is_open() {
                println!("  {} is no longer held out of rollouts by this case", next.node);
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
