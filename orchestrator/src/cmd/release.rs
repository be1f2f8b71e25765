//! `waveguard release ...`.

use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use orchestrator_db::Db;
use orchestrator_db::model::{NewGateResult, NewRelease, Release, ReleaseRollback};
use orchestrator_types::{ComponentKind, FirmwareVersion, QualificationState, ReleaseId, TransitionRequest};
use sha2::{Digest, Sha256};

use super::BadInput;
use crate::Context;

/// Release commands.
#[derive(Debug, clap::Subcommand)]
pub enum ReleaseCommand {
    /// Register a firmware release (state `registered`).
    Add(Box<AddArgs>),
    /// List releases, newest first.
    List {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Show one release with its qualification results.
    Show {
        /// Release id, or KIND@VERSION (e.g. gpu@96.00.61.00.01).
        release: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Move a release through qualification:
    /// registered -> qualifying -> qualified -> fleet-proven -> default -> deprecated;
    /// fleet-proven is reached only when a rollout's soak passes (never by hand), and a
    /// qualified release may be made the default without one;
    /// any -> blocked (reason required); blocked -> qualifying|qualified
    /// (unblock, reason required).
    Transition {
        /// Release id, or KIND@VERSION.
        release: String,
        /// The state to move to.
        #[arg(long, value_name = "STATE")]
        to: String,
        /// Why; required to block and unblock.
        #[arg(long)]
        reason: Option<String>,
    },
    /// Record a qualification gate result.
    Gate {
        /// Release id, or KIND@VERSION.
        release: String,
        /// Gate name, as policies name it (e.g. burn-in).
        #[arg(long)]
        gate: String,
        /// The gate passed.
        #[arg(long, conflicts_with = "fail", required_unless_present = "fail")]
        pass: bool,
        /// The gate failed.
        #[arg(long)]
        fail: bool,
        /// Evidence: a link or a short text.
        #[arg(long, default_value = "")]
        evidence: String,
    },
}

impl ReleaseCommand {
    /// Whether the command writes to the database (a command not listed as
    /// a read writes, so a new command is refused on a demo's database until
    /// someone says it only reads).
    pub fn writes(&self) -> bool {
        !matches!(self, Self::List { .. } | Self::Show { .. })
    }
}

/// Options of `release add`.
#[derive(Debug, clap::Args)]
pub struct AddArgs {
    /// Component kind: bmc, gpu, nic, bios, cpld or other.
    #[arg(long)]
    kind: ComponentKind,
    /// Vendor version string, e.g. 96.00.61.00.01.
    #[arg(long = "version", id = "firmware_version", value_name = "VERSION")]
    firmware_version: FirmwareVersion,
    /// Where BMCs fetch the image from (http or https).
    #[arg(long, value_name = "URI")]
    image_uri: String,
    /// The image file, to compute sha256 and size from (instead of --sha256 and --size).
    #[arg(long, value_name = "FILE", conflicts_with_all = ["sha256", "size"])]
    image_file: Option<PathBuf>,
    /// Hex sha256 of the image.
    #[arg(long, required_unless_present = "image_file")]
    sha256: Option<String>,
    /// Image size in bytes.
    #[arg(long, required_unless_present = "image_file")]
    size: Option<u64>,
    /// Platform SKU the image applies to; repeat for several.
    #[arg(long = "platform", required = true, value_name = "SKU")]
    platforms: Vec<String>,
    /// Release notes.
    #[arg(long, default_value = "")]
    notes: String,
    /// The image forbids downgrades once installed (e.g. it burns an anti-rollback fuse); the vendor's
    /// reason. Rollouts of this release are then planned as impossible to roll back.
    #[arg(long, value_name = "REASON")]
    downgrade_forbidden: Option<String>,
    /// The oldest version a component accepts once this image runs: nodes updating from below it cannot
    /// be rolled back.
    #[arg(long, value_name = "VERSION")]
    rollback_floor: Option<FirmwareVersion>,
}

/// Runs a release command.
pub async fn run(command: ReleaseCommand, context: &Context) -> anyhow::Result<ExitCode> {
    // Reads need no OS user; every write asks for one (local-admin mode).
    let actor = || context.local_admin();
    match command {
        ReleaseCommand::Add(args) => {
            let args = *args;
            let (sha256, size_bytes) = match (&args.image_file, args.sha256, args.size) {
                (Some(path), _, _) => digest_file(path)?,
                (None, Some(sha256), Some(size)) => (sha256, size),
                _ => return Err(BadInput("give --image-file, or both --sha256 and --size".into()).into()),
            };
            let new = NewRelease {
                component_kind: args.kind,
                version: args.firmware_version,
                image_uri: args.image_uri,
                sha256,
                size_bytes,
                platforms: args.platforms,
                release_notes: args.notes,
            };
            let rollback = ReleaseRollback {
                downgrade_forbidden: args.downgrade_forbidden,
                rollback_floor: args.rollback_floor,
            };
            let db = context.db().await?;
            let release = db.add_release_with(&new, &rollback, &actor()?).await?;
            println!(
                "registered release {} ({}@{})",
                release.id, release.component_kind, release.version
            );
            Ok(ExitCode::SUCCESS)
        }
        ReleaseCommand::List { json } => {
            let releases = context.db().await?.list_releases().await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&releases)?);
            } else {
                println!("{:<6} {:<6} {:<20} {:<12} PLATFORMS", "ID", "KIND", "VERSION", "STATE");
                for r in releases {
                    println!(
                        "{:<6} {:<6} {:<20} {:<12} {}",
                        r.id,
                        r.component_kind,
                        r.version,
                        r.qualification_state,
                        r.platforms.join(",")
                    );
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        ReleaseCommand::Show { release, json } => {
            let db = context.db().await?;
            let release = find(&db, &release).await?;
            let gates = db.gate_results(release.id).await?;
            if json {
                let value = serde_json::json!({ "release": release, "gate_results": gates });
                println!("{}", serde_json::to_string_pretty(&value)?);
            } else {
                println!("release {}: {}@{}", release.id, release.component_kind, release.version);
                println!("  state:     {}", release.qualification_state);
                if let Some(reason) = &release.state_reason {
                    println!("  reason:    {reason}");
                }
                if let Some(rollout) = release.fleet_proven_by {
                    println!("  fleet-proven by rollout {rollout} (its soak against the holdback passed)");
                }
                println!(
                    "  image:     {} ({} bytes, sha256 {})",
                    release.image_uri, release.size_bytes, release.sha256
                );
                println!("  platforms: {}", release.platforms.join(", "));
                if let Some(reason) = &release.downgrade_forbidden {
                    println!("  downgrade forbidden: {reason}");
                }
                if let Some(floor) = &release.rollback_floor {
                    println!("  rollback floor: {floor}");
                }
                println!("  by:        {} at {}", release.created_by, release.created_at);
                for gate in gates {
                    let outcome = if gate.passed { "pass" } else { "FAIL" };
                    println!(
                        "  gate {:<20} {outcome}  {} ({} at {})",
                        gate.gate, gate.evidence, gate.recorded_by, gate.recorded_at
                    );
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        ReleaseCommand::Transition { release, to, reason } => {
            let to: QualificationState = to
                .parse()
                .map_err(|e: orchestrator_types::ParseEnumError| BadInput(e.to_string()))?;
            let db = context.db().await?;
            let found = find(&db, &release).await?;
            let updated = db
                .transition_release(found.id, &TransitionRequest { to, reason }, &actor()?)
                .await?;
            println!(
                "release {} ({}@{}): {} -> {}",
                updated.id,
                updated.component_kind,
                updated.version,
                found.qualification_state,
                updated.qualification_state
            );
            Ok(ExitCode::SUCCESS)
        }
        ReleaseCommand::Gate {
            release,
            gate,
            pass,
            fail: _,
            evidence,
        } => {
            let db = context.db().await?;
            let found = find(&db, &release).await?;
            let result = db
                .record_gate_result(
                    found.id,
                    &NewGateResult {
                        gate,
                        passed: pass,
                        evidence,
                    },
                    &actor()?,
                )
                .await?;
            println!(
                "release {}: gate {} {}",
                found.id,
                result.gate,
                if result.passed { "passed" } else { "failed" }
            );
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Finds a release by id or by `KIND@VERSION`.
async fn find(db: &Db, key: &str) -> anyhow::Result<Release> {
    if let Ok(id) = key.parse::<i64>() {
        return Ok(db.release(ReleaseId(id)).await?);
    }
    let (kind, version) = key
        .split_once('@')
        .ok_or_else(|| BadInput(format!("{key:?} is neither a release id nor KIND@VERSION")))?;
    let kind: ComponentKind = kind
        .parse()
        .map_err(|e: orchestrator_types::ParseEnumError| BadInput(e.to_string()))?;
    let version: FirmwareVersion = version
        .parse()
        .map_err(|e: orchestrator_types::VersionError| BadInput(e.to_string()))?;
    Ok(db.release_by_version(kind, &version).await?)
}

/// sha256 and size of a file, streamed so a large image is not loaded whole.
fn digest_file(path: &std::path::Path) -> anyhow::Result<(String, u64)> {
    let mut file = std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let mut hasher = Sha256::new();
    let mut buffer = vec![0u8; 1 << 16];
    let mut size = 0u64;
    loop {
        let read = file
            .read(&mut buffer)
            .with_context(|| format!("cannot read {}", path.display()))?;
        if read == 0 {
            break;
        }
        hasher.update(&buffer[..read]);
        size += read as u64;
    }
    Ok((hex::encode(hasher.finalize()), size))
}
