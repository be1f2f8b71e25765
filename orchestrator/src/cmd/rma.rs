//! `waveguard rma ...`: the RMA cases, and the human steps of their pipeline
//! (record the vendor's answer, the replacement, the verification, or close a
//! case and return its node to rollouts). Every move goes through the pure
//! case machine (`orchestrator_rma::Case::apply`) and is audited; the CLI's
//! writer is the local admin (`local-admin:<OS user>`, role admin). Also the
//! inputs of the pipeline: the vendors' criteria (`rma criteria lint|load`),
//! the parts manifest (`rma import-manifest`), uploaded vendor diagnostics
//! (`rma attach`), and its outputs: the evidence package (`rma evidence`),
//! the submission under the vendor's quota (`rma submit`), the parts and the
//! defect-cluster scans (`rma parts`, `rma clusters`).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use orchestrator_db::parts::{PartFilter, parse_parts_manifest};
use orchestrator_db::rma::{AttachmentKind, CriteriaFile, RmaCase, RmaFilter};
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
    /// The vendors' RMA criteria (`rma/*.yaml` beside the policies).
    #[command(subcommand)]
    Criteria(CriteriaCommand),
    /// Import a parts manifest (CSV as vendors and factories ship them: serial, part number, lot,
    /// date code...) to give discovered parts the lot and date code Redfish does not carry.
    ImportManifest {
        /// The manifest file.
        file: PathBuf,
    },
    /// List the GPUs known by serial (part number, slot, lot, firmware, health).
    Parts {
        /// Only this node's parts.
        #[arg(long, value_name = "NODE")]
        node: Option<String>,
        /// Only this lot.
        #[arg(long, value_name = "LOT")]
        lot: Option<String>,
        /// Also parts that were replaced.
        #[arg(long)]
        removed: bool,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Write a case's evidence package (a deterministic tar with a manifest of hashes).
    Evidence {
        /// Case id (`RMA-...`).
        case: String,
        /// Where to write the archive.
        #[arg(long, short, value_name = "FILE")]
        output: PathBuf,
        /// Also record the evidence as collected (the case moves on, naming this package's hash).
        #[arg(long)]
        record: bool,
    },
    /// Attach a vendor diagnostic log (e.g. the field diagnostic NVIDIA support ran) to a case.
    Attach {
        /// Case id (`RMA-...`).
        case: String,
        /// The file.
        file: PathBuf,
        /// Name in the case (default: the file's name).
        #[arg(long)]
        name: Option<String>,
        /// What it is.
        #[arg(long, value_enum, default_value = "field-diagnostic")]
        kind: AttachKind,
        /// The field diagnostic's verdict on the part: `failed` confirms the claim (the criteria's
        /// `confirmed_by`), `passed` tells the vendor would refuse it.
        #[arg(long, value_enum)]
        result: Option<DiagnosticResult>,
    },
    /// Submit a case to its vendor under the vendor's quota; refused with its queue position when
    /// the quota is spent.
    Submit {
        /// Case id (`RMA-...`).
        case: String,
        /// The vendor's reference for the claim.
        #[arg(long, value_name = "REF")]
        vendor_reference: String,
    },
    /// The latest defect-cluster scans (one per completed period).
    Clusters {
        /// How many periods.
        #[arg(long, default_value_t = 4)]
        last: u64,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

impl RmaCommand {
    /// Whether the command writes to the database (a command not listed as
    /// a read writes, so a new command is refused on a demo's database until
    /// someone says it only reads).
    pub fn writes(&self) -> bool {
        !matches!(
            self,
            Self::List { .. }
                | Self::Show { .. }
                | Self::Parts { .. }
                | Self::Clusters { .. }
                | Self::Evidence { record: false, .. }
                | Self::Criteria(CriteriaCommand::Lint { .. })
        )
    }
}

/// `rma criteria` commands.
#[derive(Debug, clap::Subcommand)]
pub enum CriteriaCommand {
    /// Check criteria files; print every finding as `file:line:col: message`. Exit 1 on any error.
    Lint {
        /// Files or directories (default: `rma`).
        paths: Vec<PathBuf>,
    },
    /// Put the valid files of a directory in force (a deployment without the git sync); an
    /// invalid file keeps its previous version in force and exits 1.
    Load {
        /// Directory (or files) of criteria.
        paths: Vec<PathBuf>,
    },
}

/// A field diagnostic's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DiagnosticResult {
    /// The part passed.
    Passed,
    /// The part failed.
    Failed,
}

/// Kinds of attachment a person uploads.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum AttachKind {
    /// The vendor's field diagnostic log.
    FieldDiagnostic,
    /// Diagnostic data pulled from the BMC by hand.
    RedfishDiagnostic,
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

/// Criteria files under `paths` (directories searched one level for `*.yaml` / `*.yml`), as
/// `(path, text)` sorted by path.
pub fn criteria_files(paths: &[PathBuf]) -> anyhow::Result<Vec<(String, String)>> {
    let mut files = Vec::new();
    for path in paths {
        if path.is_dir() {
            let entries = std::fs::read_dir(path).with_context(|| format!("cannot list {}", path.display()))?;
            for entry in entries {
                let child = entry.with_context(|| format!("cannot list {}", path.display()))?.path();
                if child.extension().is_some_and(|e| e == "yaml" || e == "yml") {
                    files.push(child);
                }
            }
        } else {
            files.push(path.clone());
        }
    }
    files.sort();
    files.dedup();
    files
        .into_iter()
        .map(|f| {
            let text = std::fs::read_to_string(&f).with_context(|| format!("cannot read {}", f.display()))?;
            Ok((f.display().to_string(), text))
        })
        .collect()
}

/// Lints criteria files: the `file:line:col: message` lines and whether any file has an error.
pub fn lint_criteria(files: Vec<(String, String)>) -> (Vec<String>, bool) {
    let reports = orchestrator_rma::lint_files(files);
    let failed = reports.iter().any(|r| r.checked.criteria.is_none());
    (reports.iter().flat_map(|r| r.rendered()).collect(), failed)
}

fn local_actor(context: &Context) -> anyhow::Result<Actor> {
    Ok(Actor {
        name: context.local_admin()?,
        role: Role::Admin,
    })
}

fn default_criteria_dir(paths: Vec<PathBuf>) -> Vec<PathBuf> {
    if paths.is_empty() {
        vec![PathBuf::from("rma")]
    } else {
        paths
    }
}

fn attachment_name(file: &Path, name: Option<String>) -> anyhow::Result<String> {
    match name {
        Some(n) => Ok(n),
        None => file
            .file_name()
            .and_then(|n| n.to_str())
            .map(str::to_owned)
            .with_context(|| format!("{} has no usable file name; give --name", file.display())),
    }
}

/// Runs an RMA command.
pub async fn run(command: RmaCommand, context: &Context) -> anyhow::Result<ExitCode> {
    // Linting needs no database: it runs in a policy repository's own CI.
    if let RmaCommand::Criteria(CriteriaCommand::Lint { paths }) = &command {
        let files = criteria_files(&default_criteria_dir(paths.clone()))?;
        let count = files.len();
        let (lines, failed) = lint_criteria(files);
        for line in &lines {
            println!("{line}");
        }
        println!(
            "{count} criteria file(s) checked: {}",
            if failed { "errors found" } else { "ok" }
        );
        return Ok(if failed { ExitCode::FAILURE } else { ExitCode::SUCCESS });
    }
    let db = context.db().await?;
    match command {
        RmaCommand::Criteria(CriteriaCommand::Lint { .. }) => unreachable!("handled above"),
        RmaCommand::Criteria(CriteriaCommand::Load { paths }) => {
            let offered: Vec<orchestrator_policy_git::CriteriaCandidate> =
                criteria_files(&default_criteria_dir(paths))?
                    .into_iter()
                    .map(|(path, text)| orchestrator_policy_git::CriteriaCandidate {
                        blob_id: orchestrator_rma::evidence::sha256_hex(text.as_bytes()),
                        commit_id: "local".to_owned(),
                        content: text.into_bytes(),
                        path,
                    })
                    .collect();
            let previous: Vec<CriteriaFile> = db.rma_criteria_files().await?;
            let plan = orchestrator_policy_git::plan_criteria(&previous, &offered);
            for line in &plan.rejected {
                println!("{line}");
            }
            if plan.changed {
                db.replace_rma_criteria(&plan.in_force, &context.local_admin()?).await?;
            }
            println!(
                "{} criteria file(s) in force{}; {} refused",
                plan.in_force.len(),
                if plan.changed { " (changed)" } else { " (unchanged)" },
                plan.rejected.len()
            );
            if !plan.rejected.is_empty() {
                return Ok(ExitCode::FAILURE);
            }
        }
        RmaCommand::ImportManifest { file } => {
            let text = std::fs::read_to_string(&file).with_context(|| format!("cannot read {}", file.display()))?;
            let rows = match parse_parts_manifest(&text) {
                Ok(rows) => rows,
                Err(errors) => {
                    for e in &errors {
                        println!("{}:{}: {}", file.display(), e.line, e.message);
                    }
                    println!("{} error(s); nothing imported", errors.len());
                    return Ok(ExitCode::FAILURE);
                }
            };
            let import = db.import_parts_manifest(&rows, &context.local_admin()?).await?;
            println!(
                "{} row(s): {} part(s) updated, {} unchanged, {} not discovered yet, {} part-number mismatch(es)",
                rows.len(),
                import.updated,
                import.unchanged,
                import.unknown.len(),
                import.part_number_mismatch.len()
            );
            for serial in import.part_number_mismatch.iter().take(20) {
                println!("  part number differs from what the BMC reports: {serial}");
            }
            if !import.unknown.is_empty() {
                println!("  import again after discovery to place the unknown serials");
            }
        }
        RmaCommand::Parts {
            node,
            lot,
            removed,
            json,
        } => {
            let parts = db
                .parts(&PartFilter {
                    node,
                    lot,
                    include_removed: removed,
                })
                .await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&parts)?);
            } else {
                println!(
                    "{:<24} {:<22} {:<16} {:<8} {:<14} {:<18} HEALTH",
                    "SERIAL", "PART NUMBER", "NODE", "SLOT", "LOT", "FIRMWARE"
                );
                for p in &parts {
                    println!(
                        "{:<24} {:<22} {:<16} {:<8} {:<14} {:<18} {}",
                        p.serial,
                        p.part_number,
                        p.node,
                        p.slot,
                        p.lot.as_deref().unwrap_or("-"),
                        p.firmware_version.as_deref().unwrap_or("-"),
                        if p.removed_at.is_some() {
                            "removed"
                        } else {
                            p.health.as_deref().unwrap_or("-")
                        }
                    );
                }
                println!("{} part(s)", parts.len());
            }
        }
        RmaCommand::Evidence { case, output, record } => {
            let package = if record {
                let (next, package) = db.record_rma_evidence(&case, &local_actor(context)?).await?;
                println!("case {} is now {}", next.id, state_words(&next));
                package
            } else {
                db.rma_evidence_download(&case).await?
            };
            std::fs::write(&output, &package.archive).with_context(|| format!("cannot write {}", output.display()))?;
            println!(
                "wrote {} ({} bytes, {} files), manifest sha256 {}",
                output.display(),
                package.archive.len(),
                package.manifest.files.len(),
                package.manifest_sha256
            );
        }
        RmaCommand::Attach {
            case,
            file,
            name,
            kind,
            result,
        } => {
            if result.is_some() && !matches!(kind, AttachKind::FieldDiagnostic) {
                return Err(super::BadInput("--result is the verdict of a field diagnostic".into()).into());
            }
            let bytes = std::fs::read(&file).with_context(|| format!("cannot read {}", file.display()))?;
            let kind = match kind {
                AttachKind::FieldDiagnostic => AttachmentKind::FieldDiagnostic,
                AttachKind::RedfishDiagnostic => AttachmentKind::RedfishDiagnostic,
            };
            let name = attachment_name(&file, name)?;
            let added = db
                .add_rma_attachment(&case, &name, kind, &bytes, &context.local_admin()?)
                .await?;
            println!(
                "attached {} to {case} ({} bytes, sha256 {})",
                added.name, added.size_bytes, added.sha256
            );
            if let Some(result) = result {
                let passed = result == DiagnosticResult::Passed;
                db.record_field_diagnostic(&case, passed, &added.name, &context.local_admin()?)
                    .await?;
                println!(
                    "  recorded: field diagnostic {}",
                    if passed { "passed" } else { "failed" }
                );
            }
        }
        RmaCommand::Submit { case, vendor_reference } => {
            let vendor = db.rma_case(&case).await?.case.vendor;
            let quota = db.rma_quota(&vendor).await?;
            let next = db
                .submit_rma_case(&case, &quota, &vendor_reference, &local_actor(context)?)
                .await?;
            println!(
                "case {} is now {} ({vendor} reference {vendor_reference})",
                next.id,
                state_words(&next)
            );
        }
        RmaCommand::Clusters { last, json } => {
            let scans = db.cluster_scans(last).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&scans)?);
            } else if scans.is_empty() {
                println!("no completed period has been scanned yet");
            } else {
                for scan in &scans {
                    println!(
                        "{} .. {} (scanned {})",
                        scan.period_start, scan.period_end, scan.scanned_at
                    );
                    println!("{}", serde_json::to_string_pretty(&scan.report)?);
                }
            }
        }
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
            let next = db.apply_rma_event(&case, event.into(), &local_actor(context)?).await?;
            println!("case {} is now {}", next.id, state_words(&next));
            if !next.state.is_open() {
                println!("  {} is no longer held out of rollouts by this case", next.node);
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
