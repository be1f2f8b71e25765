//! `waveguard rollout ...`: start, inspect and command rollouts. Thin: the
//! same datastore and engine functions the API calls; a running `serve`
//! picks the change up on its next engine pass.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use orchestrator_db::Db;
use orchestrator_db::execution::{
    Approval, ExecRollout, ExecWave, RolloutState, StepState, WaveKind, WaveState, approvals_needed, counted_approvals,
};
use orchestrator_db::model::Release;
use orchestrator_engine::{EngineError, StartChecks, StartRollout, start_rollout_checked};
use orchestrator_types::{ComponentKind, FirmwareVersion, ReleaseId, Role, RolloutId};
use serde_json::json;

use super::BadInput;
use crate::Context;

/// Rollout commands.
#[derive(Debug, clap::Subcommand)]
pub enum RolloutCommand {
    /// Plan and start a rollout of a release under a policy; prints the plan summary.
    Start(StartArgs),
    /// List rollouts, newest first.
    List {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Show a rollout with its waves, progress, blockers and approvals.
    Show {
        /// Rollout id.
        id: i64,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Approve a wave (two-person rule: never by the rollout's author).
    Approve {
        /// Rollout id.
        id: i64,
        /// Wave name or position (as `show` lists it).
        #[arg(long, value_name = "NAME|N")]
        wave: String,
        /// The person whose approval this is: a release manager or admin
        /// of this database (required: the local admin running the CLI is
        /// never counted as an approver; the entry is audited as made by
        /// local-admin:<OS user> for this user).
        #[arg(long = "as", value_name = "USER")]
        as_user: Option<String>,
        /// A comment recorded with the approval.
        #[arg(long)]
        comment: Option<String>,
    },
    /// Pause: no new flash starts; in-flight flashes finish.
    Pause(CommandArgs),
    /// Resume a paused rollout.
    Resume(CommandArgs),
    /// Abort: no new flash; in-flight flashes finish; rollback is left to you.
    Abort(CommandArgs),
    /// Roll every updated node back to its recorded previous version.
    Rollback {
        /// Rollout id.
        id: i64,
        /// Why (required; recorded in the rollout and the audit log).
        #[arg(long)]
        reason: String,
    },
}

impl RolloutCommand {
    /// Whether the command writes to the database (a command not listed as
    /// a read writes, so a new command is refused on a demo's database until
    /// someone says it only reads).
    pub fn writes(&self) -> bool {
        !matches!(self, Self::List { .. } | Self::Show { .. })
    }
}

/// Options of `rollout start`.
#[derive(Debug, clap::Args)]
pub struct StartArgs {
    /// Release id, or KIND@VERSION (e.g. gpu@96.00.61.00.01).
    #[arg(long)]
    release: String,
    /// Name of a policy in force (synced from git); the rollout pins its commit and blob.
    #[arg(long, conflicts_with = "policy_file", required_unless_present = "policy_file")]
    policy: Option<String>,
    /// A policy YAML file (recorded as inline:<sha256>).
    #[arg(long, value_name = "FILE")]
    policy_file: Option<PathBuf>,
    /// Seed of the planner's stratified choices (default: from the clock).
    #[arg(long)]
    seed: Option<i64>,
    /// Print the plan summary as JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    prometheus: super::prometheus::PrometheusArgs,
    /// Start even if a Prometheus gate has no series for some node of the
    /// first wave (otherwise refused, naming the gates and nodes).
    #[arg(long, requires = "prometheus_url")]
    allow_missing_series: bool,
}

/// Options of pause, resume and abort.
#[derive(Debug, clap::Args)]
pub struct CommandArgs {
    /// Rollout id.
    id: i64,
    /// Why (recorded in the rollout and the audit log).
    #[arg(long)]
    reason: Option<String>,
}

/// Runs a rollout command.
pub async fn run(command: RolloutCommand, context: &Context) -> anyhow::Result<ExitCode> {
    // Reads need no OS user; every write asks for one (local-admin mode).
    let actor = || context.local_admin();
    match command {
        RolloutCommand::Start(args) => start(args, context, &actor()?).await,
        RolloutCommand::List { json } => {
            let rollouts = context.db().await?.exec_rollouts().await?;
            if json {
                let stripped: Vec<ExecRollout> = rollouts
                    .into_iter()
                    .map(|mut r| {
                        r.policy_source = None;
                        r
                    })
                    .collect();
                println!("{}", serde_json::to_string_pretty(&stripped)?);
            } else {
                println!(
                    "{:<6} {:<8} {:<14} {:<20} {:<20} CREATED",
                    "ID", "RELEASE", "STATE", "POLICY", "BY"
                );
                for r in rollouts {
                    println!(
                        "{:<6} {:<8} {:<14} {:<20} {:<20} {}",
                        r.id,
                        r.release_id,
                        // `as_str`: the state's Display does not pad.
                        r.state.as_str(),
                        r.policy_name,
                        r.created_by,
                        r.created_at.format("%Y-%m-%d %H:%M UTC")
                    );
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        RolloutCommand::Show { id, json } => {
            let db = context.db().await?;
            show(&db, RolloutId(id), json).await?;
            Ok(ExitCode::SUCCESS)
        }
        RolloutCommand::Approve {
            id,
            wave,
            as_user,
            comment,
        } => {
            let entered_by = actor()?;
            // An approval is a person's judgement of a verdict: the local
            // admin only enters it, so it must name that person.
            let Some(approver) = as_user
                .map(|name| name.trim().to_owned())
                .filter(|name| !name.is_empty())
            else {
                return Err(BadInput(format!(
                    "--as USER is required: an approval counts for a named person, never for {entered_by}"
                ))
                .into());
            };
            if approver.contains(':') {
                return Err(BadInput(format!(
                    "--as {approver:?}: name a person; actor prefixes such as local-admin: never count as approvers"
                ))
                .into());
            }
            let db = context.db().await?;
            approver_may_approve(&db, &approver).await?;
            let found = find_wave(&db, RolloutId(id), &wave).await?;
            if found.kind != WaveKind::Update {
                return Err(BadInput(format!(
                    "wave {:?} is a rollback wave: it needs no approval",
                    found.name
                ))
                .into());
            }
            let given = db.approve_wave(found.id, &approver, comment.as_deref()).await?;
            // The approval's own entry names the approver; this one names who
            // typed it, so a local-admin approval can be told from a UI one.
            db.record_audit(
                &entered_by,
                "wave.approval_entered",
                "wave",
                &found.id.to_string(),
                json!({
                    "mode": "local-admin",
                    "approver": approver,
                    "rollout_id": id,
                    "wave": found.name,
                }),
            )
            .await?;
            // The wave awaited approval (the datastore refuses otherwise), so
            // this is the engine's count against the engine's need.
            println!(
                "rollout {id} wave {}: approved by {approver} ({} of {} approvals)",
                found.name,
                counted_approvals(&given, found.verdict.as_ref()).len(),
                approvals_needed(found.approvals_required)
            );
            Ok(ExitCode::SUCCESS)
        }
        RolloutCommand::Pause(args) => {
            set_state(context, &actor()?, args, &[RolloutState::Running], RolloutState::Paused).await
        }
        RolloutCommand::Resume(args) => {
            set_state(context, &actor()?, args, &[RolloutState::Paused], RolloutState::Running).await
        }
        RolloutCommand::Abort(args) => {
            set_state(
                context,
                &actor()?,
                args,
                &[RolloutState::Running, RolloutState::Paused, RolloutState::Halted],
                RolloutState::Aborted,
            )
            .await
        }
        RolloutCommand::Rollback { id, reason } => {
            let reason = reason.trim();
            if reason.is_empty() {
                return Err(BadInput("--reason must say why".into()).into());
            }
            let db = context.db().await?;
            let wave = db
                .begin_rollback(None, RolloutId(id), json!({ "scope": "rollout" }), reason, &actor()?)
                .await?;
            println!("rollout {id}: rolling back (wave {})", wave.id);
            Ok(ExitCode::SUCCESS)
        }
    }
}

async fn set_state(
    context: &Context,
    actor: &str,
    args: CommandArgs,
    from: &[RolloutState],
    to: RolloutState,
) -> anyhow::Result<ExitCode> {
    let db = context.db().await?;
    let before = db.exec_rollout(RolloutId(args.id)).await?;
    let after = db
        .user_set_rollout_state(before.id, from, to, args.reason.as_deref(), actor)
        .await?;
    println!("rollout {}: {} -> {}", after.id, before.state, after.state);
    Ok(ExitCode::SUCCESS)
}

async fn start(args: StartArgs, context: &Context, actor: &str) -> anyhow::Result<ExitCode> {
    let db = context.db().await?;
    let release = find_release(&db, &args.release).await?;
    let (source, commit, blob) = match (&args.policy, &args.policy_file) {
        (Some(name), _) => {
            let in_force = db.policy_in_force(name).await.map_err(|e| match e {
                orchestrator_db::DbError::NotFound { .. } => {
                    anyhow::Error::from(BadInput(format!("no policy named {name:?} is in force")))
                }
                other => other.into(),
            })?;
            (
                in_force.version.content,
                Some(in_force.version.commit_id),
                Some(in_force.version.blob_id),
            )
        }
        (None, Some(path)) => {
            let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
            let checked = orchestrator_policy::check_source(&text);
            if checked.has_errors() {
                let file = path.display().to_string();
                let lines: Vec<String> = checked
                    .diagnostics
                    .iter()
                    .filter(|d| d.is_error())
                    .map(|d| d.render(&file))
                    .collect();
                return Err(BadInput(format!("the policy is not valid:\n{}", lines.join("\n"))).into());
            }
            (text, None, None)
        }
        (None, None) => return Err(BadInput("give --policy NAME or --policy-file FILE".into()).into()),
    };
    let seed = args
        .seed
        .unwrap_or_else(|| db.clock().now().timestamp_nanos_opt().unwrap_or_default());
    let request = StartRollout {
        release_id: release.id,
        policy_source: source,
        policy_commit: commit,
        policy_blob: blob,
        seed,
    };
    let checks = StartChecks {
        prometheus: args.prometheus.client()?,
        allow_missing_series: args.allow_missing_series,
        // The CLI runs beside the database, not necessarily where the BMCs
        // are reachable; `serve` asks them at an API or UI start.
        bmcs: None,
    };
    let (rollout, plan) = start_rollout_checked(&db, &request, actor, &checks)
        .await
        .map_err(|e| -> anyhow::Error {
            match e {
                EngineError::Db(db) => db.into(),
                other if other.is_caller_error() => BadInput(orchestrator_types::error_chain(&other)).into(),
                other => other.into(),
            }
        })?;
    let waves: Vec<serde_json::Value> = plan
        .waves
        .iter()
        .map(|w| {
            json!({
                "name": w.name,
                "nodes": w.nodes.len(),
                "control_cohort": w.control.members().len(),
                "bake_seconds": w.bake_seconds,
                "awaiting_qualification": w.blocked.is_some(),
            })
        })
        .collect();
    if args.json {
        let summary = json!({
            "rollout_id": rollout.id,
            "release": release.id,
            "policy": rollout.policy_name,
            "policy_commit": rollout.policy_commit,
            "seed": rollout.seed,
            "fleet_nodes": plan.summary.nodes,
            "planned_nodes": plan.summary.planned,
            "excluded": plan.summary.excluded,
            "waves": waves,
            "targets": plan.targets(),
            "rollback": {
                "possible": plan.rollback.possible,
                "reasons": plan.rollback.blockers.iter().map(ToString::to_string).collect::<Vec<_>>(),
            },
            "notes": plan.notes,
        });
        println!("{}", serde_json::to_string_pretty(&summary)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "started rollout {} of {}@{} under policy {} ({}), seed {}",
        rollout.id, release.component_kind, release.version, rollout.policy_name, rollout.policy_commit, rollout.seed
    );
    println!(
        "  nodes: {} in the fleet, {} planned",
        plan.summary.nodes, plan.summary.planned
    );
    for (reason, count) in &plan.summary.excluded {
        println!("  excluded: {count} ({reason})");
    }
    for w in &plan.waves {
        println!(
            "  wave {:<16} {:>6} nodes, control cohort {:>5}, bake {}{}",
            w.name,
            w.nodes.len(),
            w.control.members().len(),
            w.bake,
            if w.blocked.is_some() {
                ", awaiting qualification"
            } else {
                ""
            }
        );
    }
    for group in plan.targets() {
        println!(
            "  pushes to {} on {} node(s), e.g. {}",
            group.inventory_ids.join(", "),
            group.nodes,
            group.examples.join(", ")
        );
    }
    if plan.rollback.possible {
        println!("  rollback: possible");
    } else {
        for blocker in &plan.rollback.blockers {
            println!("  {blocker}");
        }
    }
    for note in &plan.notes {
        println!("  note: {note}");
    }
    Ok(ExitCode::SUCCESS)
}

async fn show(db: &Db, id: RolloutId, as_json: bool) -> anyhow::Result<()> {
    let rollout = db.exec_rollout(id).await?;
    let release = db.release(rollout.release_id).await?;
    let mut waves = Vec::new();
    for wave in db.rollout_waves(id).await? {
        let counts = db.step_counts(id, Some(wave.id)).await?;
        let approvals = db.wave_approvals(wave.id).await?;
        waves.push((wave, counts, approvals));
    }
    if as_json {
        let mut rollout = rollout;
        rollout.policy_source = None;
        let value = json!({
            "rollout": rollout,
            "release": release,
            "waves": waves.iter().map(|(wave, counts, approvals)| json!({
                "wave": wave,
                "progress": counts.iter().map(|(s, n)| (s.as_str(), *n)).collect::<BTreeMap<_, _>>(),
                "approvals": approvals,
                "approvals_counted": counted_approvals(approvals, wave.verdict.as_ref()).len(),
                "approvals_needed": (wave.state == WaveState::AwaitingApproval)
                    .then(|| approvals_needed(wave.approvals_required)),
                "bake_ends_at": wave.bake_started_at.map(|at| at + chrono::Duration::seconds(wave.bake_seconds)),
            })).collect::<Vec<_>>(),
        });
        println!("{}", serde_json::to_string_pretty(&value)?);
        return Ok(());
    }
    print_rollout(&rollout, &release);
    println!();
    println!(
        "  {:<20} {:<18} {:>6} {:>8} {:>8} {:>7} {:>10} {:>8}  APPROVALS",
        "WAVE", "STATE", "NODES", "UPDATED", "SKIPPED", "FAILED", "IN FLIGHT", "PENDING"
    );
    for (wave, counts, approvals) in &waves {
        let n = |state: StepState| counts.get(&state).copied().unwrap_or(0);
        let in_flight: u64 = counts.iter().filter(|(s, _)| s.is_in_flight()).map(|(_, n)| n).sum();
        println!(
            "  {:<20} {:<18} {:>6} {:>8} {:>8} {:>7} {:>10} {:>8}  {}",
            format!("{} {}", wave.position, wave.name),
            in_words(wave.state.as_str()),
            wave.node_count,
            n(StepState::Succeeded),
            n(StepState::Skipped) + n(StepState::Deferred),
            n(StepState::Failed),
            in_flight,
            n(StepState::Pending),
            approvals_in_words(wave, approvals, asks_approvals(&rollout))
        );
        if let Some(verdict) = &wave.verdict {
            println!("      verdict: {}: {}", verdict.outcome, verdict.summary);
        }
        if let Some(reason) = &wave.state_reason {
            println!("      reason: {reason}");
        }
        if let (Some(at), WaveState::Baking) = (wave.bake_started_at, wave.state) {
            println!(
                "      bake ends {}",
                (at + chrono::Duration::seconds(wave.bake_seconds)).format("%Y-%m-%d %H:%M UTC")
            );
        }
        // A closed wave waits on nothing, whatever its last blockers were.
        let open = !matches!(
            wave.state,
            WaveState::Promoted | WaveState::Halted | WaveState::RolledBack
        );
        for blocker in wave.blockers.iter().filter(|_| open && !finished(&rollout)) {
            println!("      waiting on: {}", web::describe_blocker(blocker));
        }
    }
    Ok(())
}

/// The person named by `--as` must be someone who could give the approval
/// in the web UI: a user of this database, enabled, release manager or
/// admin. A typo or a made-up name is never counted as an approver.
async fn approver_may_approve(db: &Db, approver: &str) -> anyhow::Result<()> {
    let user = match db.user(approver).await {
        Ok(user) => user,
        Err(orchestrator_db::DbError::NotFound { .. }) => {
            return Err(BadInput(format!(
                "--as {approver:?}: no such user; an approval counts only for a user of this database \
                 (`waveguard user list`)"
            ))
            .into());
        }
        Err(other) => return Err(other.into()),
    };
    if user.disabled {
        return Err(BadInput(format!("--as {approver:?}: the user is disabled and cannot approve")).into());
    }
    if user.role < Role::ReleaseManager {
        return Err(BadInput(format!(
            "--as {approver:?}: a {} cannot approve; approving needs release_manager or admin",
            user.role
        ))
        .into());
    }
    Ok(())
}

/// A rollout that has ended waits on nothing ("waiting on: bake ends" on a
/// rolled-back rollout would be a stale blocker, not news).
fn finished(rollout: &ExecRollout) -> bool {
    matches!(
        rollout.state,
        RolloutState::Completed | RolloutState::RolledBack | RolloutState::Aborted
    )
}

/// Whether the rollout can still move forward, so its waves may ask for
/// approvals.
fn asks_approvals(rollout: &ExecRollout) -> bool {
    matches!(
        rollout.state,
        RolloutState::Running | RolloutState::Paused | RolloutState::Halted
    )
}

/// A state name as words (`awaiting_approval` -> `awaiting approval`).
fn in_words(state: &str) -> String {
    state.replace('_', " ")
}

/// A wave's approvals as a person reads them, counted by the engine's own
/// rule ([`counted_approvals`]), so the CLI never says more than the engine
/// sees and never "2 of 1".
fn approvals_in_words(wave: &ExecWave, approvals: &[Approval], rollout_asks: bool) -> String {
    // A finished or rolling-back rollout asks nobody for anything; its
    // promoted waves still say who approved them.
    if wave.kind != WaveKind::Update || (!rollout_asks && wave.state != WaveState::Promoted) {
        return "-".into();
    }
    let counted = counted_approvals(approvals, wave.verdict.as_ref());
    let names = counted
        .iter()
        .map(|a| a.approver.as_str())
        .collect::<Vec<_>>()
        .join(", ");
    match wave.state {
        WaveState::AwaitingApproval => {
            let need = approvals_needed(wave.approvals_required);
            let have = u32::try_from(counted.len()).unwrap_or(u32::MAX);
            // The datastore takes no approval past the need, so `have`
            // exceeds it only for rows older than that rule.
            if counted.is_empty() {
                format!("0 of {need}")
            } else {
                format!("{} of {need} ({names})", have.min(need))
            }
        }
        WaveState::Promoted if !counted.is_empty() => format!("approved by {names}"),
        WaveState::Planned | WaveState::Running | WaveState::Baking if wave.approvals_required > 0 => {
            format!("{} needed after its verdict", wave.approvals_required)
        }
        _ => "-".into(),
    }
}

fn print_rollout(rollout: &ExecRollout, release: &Release) {
    println!(
        "rollout {}: {}@{} ({})",
        rollout.id, release.component_kind, release.version, release.qualification_state
    );
    println!("  state:   {}", in_words(rollout.state.as_str()));
    if let Some(reason) = &rollout.state_reason {
        println!("  reason:  {reason}");
    }
    println!(
        "  policy:  {} at {} (blob {})",
        rollout.policy_name, rollout.policy_commit, rollout.policy_blob
    );
    println!(
        "  by:      {} at {}",
        rollout.created_by,
        rollout.created_at.format("%Y-%m-%d %H:%M UTC")
    );
    if let Some(reasons) = rollout.rollback_impossible() {
        println!("  rollback impossible: {}", reasons.join("; "));
    } else if rollout.rollback_assessment.is_some() {
        println!("  rollback: possible");
    }
    for blocker in rollout.blockers.iter().filter(|_| !finished(rollout)) {
        println!("  waiting on: {}", web::describe_blocker(blocker));
    }
}

/// A wave of the rollout by name, or by position when `key` is a number.
async fn find_wave(db: &Db, rollout: RolloutId, key: &str) -> anyhow::Result<ExecWave> {
    let waves = db.rollout_waves(rollout).await?;
    if waves.is_empty() {
        // Distinguishes "no such rollout" (a NotFound from the datastore).
        db.exec_rollout(rollout).await?;
    }
    let by_position = key.parse::<i32>().ok();
    waves
        .iter()
        .find(|w| w.name == key)
        .or_else(|| by_position.and_then(|n| waves.iter().find(|w| w.position == n)))
        .cloned()
        .ok_or_else(|| BadInput(format!("rollout {rollout} has no wave {key:?}")).into())
}

/// A release by id or by `KIND@VERSION`.
async fn find_release(db: &Db, key: &str) -> anyhow::Result<Release> {
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
