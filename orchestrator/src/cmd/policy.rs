//! `waveguard policy ...`: lint policy files, sync them from git into the
//! database, and show what is in force.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use orchestrator_db::Db;
use orchestrator_db::policies::PolicyInForce;
use orchestrator_planner::power::{self, FleetNode};
use orchestrator_policy::{FileReport, Severity, lint_files};
use orchestrator_policy_git::service::{self, SyncOutcome};
// `demo` syncs the repository's own policies through the same service.
use orchestrator_policy_git::service::{SyncSettings, sync_once};
use tokio::task::JoinHandle;

use super::BadInput;
use crate::Context;
use crate::config::PolicySourceConfig;

/// Deepest directory nesting `lint` descends into; policy repositories are
/// flat, and a bound stops symlink loops.
const MAX_LINT_DEPTH: usize = 16;

/// Who the periodic sync acts as in the audit log.
const SERVE_SYNC_ACTOR: &str = "serve:policy-sync";

/// Policy commands.
#[derive(Debug, clap::Subcommand)]
pub enum PolicyCommand {
    /// Check policy files; print every finding as `file:line:col: message`.
    ///
    /// Directories are searched for `*.yaml` / `*.yml`. Exit status 1 when
    /// any error was found, 0 otherwise (warnings alone exit 0). Needs no
    /// database; usable in the CI of a policy repository.
    ///
    /// Also warns, at the gate, when the first wave (the canary) cannot
    /// detect a gate's `must_detect` effect with 80% power (default
    /// baselines; see `policy power`; policies without a `detection` block).
    /// A `percent` canary is only checked with `--fleet`.
    ///
    /// Per policy it prints which method judges it, the soak's holdback and
    /// time, and `policy power`'s fleet-scale timing: per wave and rate gate,
    /// median / p95 hours for a healthy wave to pass and for each effect to be
    /// caught (on the `--fleet` file, else a nominal 1,000-node fleet; default
    /// base rates). With a `detection` block it warns at the gate where a
    /// healthy wave's p95 time to pass is beyond its `max_bake` (LIKELY HOLD),
    /// and at `detection.soak.min` when the soak is not longer than the
    /// plausible onset of a delayed regression (`soak.onset`, else the
    /// longest wave bake).
    Lint {
        /// Files or directories (default: the current directory).
        paths: Vec<PathBuf>,
        /// Size `percent` canaries and control cohorts by planning on this
        /// fleet file (CSV or YAML, as `fleet import` takes).
        #[arg(long, value_name = "FILE")]
        fleet: Option<PathBuf>,
        /// Also check each Prometheus rate gate's metric type against this
        /// server's metadata API (`/api/v1/metadata`): a rate gate needs a
        /// counter. Without it, the built-in table of exporter metrics
        /// decides.
        #[arg(long, value_name = "URL")]
        prometheus: Option<url::Url>,
    },
    /// For each wave and health gate, the smallest regression the wave
    /// detects with 80% power at the policy's false-alarm rate.
    ///
    /// Plans the policy on the fleet file as the planner would (wave sizes,
    /// control cohorts), assuming every targeted node needs the update, and
    /// uses the judge's own sequential plan: the policy's alpha split over
    /// the wave's gates (Bonferroni), O'Brien-Fleming spending over one look
    /// per gate interval, a Fail needing 3 canary events. Baselines come from
    /// --baseline / --sd (by gate or metric name), else (rate gates, with
    /// --history) from the database's recent control cohorts, else from
    /// documented defaults (policies/README.md, "Power"). Rate gates report the rate
    /// ratio and the canary events expected at it; level gates the shift in
    /// the metric's unit. The approximation is slightly optimistic for rates
    /// (see orchestrator/detect/README.md).
    ///
    /// --json prints one document: `policy`, `fleet`, `fleet_nodes`,
    /// `release` (or null), `alpha`, `correction` ("bonferroni"), `spending`,
    /// `target_power`, `gpus_per_node`, `ignored_selector_labels` (selector
    /// labels a fleet file cannot carry, set aside), `fleet_timing` (the fleet-scale
    /// method's time to decide, and each row's chance of a catch by its wave's end:
    /// `catch_by_end` for an effect on all nodes, `catch_by_end_concentrated` for the
    /// same average on `concentrated_share` of them, both empty in a row whose `unjudged` says why
    /// nothing judges that wave), `fleet_detection` (whether the policy's `detection`
    /// block puts that method in force in the engine), and `waves`: a list of `wave`,
    /// `canary_nodes`, `control_nodes`, `bake_seconds`, `bake`, `gates`. Each
    /// gate has `gate`, `kind` (rate|level), `metric`, `status`
    /// (ok|not_judged|no_baseline|no_control), `note`, `unit` (gpu|node),
    /// `canary_units`, `control_units`, `exposure_unit`, `canary_exposure`,
    /// `control_exposure` (rate gates, whole bake), `planned_looks`,
    /// `gate_alpha`, `per_look_alpha` (p-value threshold per look),
    /// `baseline` {`value`, `measure` (rate|sd), `source` (given|history|default)},
    /// `min_effect`, `must_detect`, `mde` {`ratio`, `expected_canary_events`,
    /// `expected_control_events`, `shift`, `limited_by`
    /// (statistics|min_events|nothing_detectable)} and `detects_must_detect`;
    /// `soak` (the holdback as the rollout's planner sizes it, with its
    /// `rate_source`), and `history` (null without --history): `days`,
    /// `min_events`, `control_totals` (`metric`, `events`, `exposure`) and
    /// `rates` (by metric, those with enough events).
    ///
    /// Exit status 2 for a bad policy, fleet file or option.
    Power(PowerArgs),
    /// Read the policies at a git ref, validate them and store the valid
    /// ones as the policies in force.
    ///
    /// A refused file is reported with every `file:line:col` finding and the
    /// last good version of that policy stays in force. Exit status 0 when
    /// the sync ran (even with refused files), 1 when the repository could
    /// not be read, 2 when no repository is configured.
    Sync(SyncArgs),
    /// Show the policy in force: its commit, blob, when it was synced, the
    /// last refused newer version, and its text.
    Show {
        /// The policy's name.
        name: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// List the policies in force with their commits.
    List {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

impl PolicyCommand {
    /// Whether the command writes to the database (a command not listed as
    /// a read writes, so a new command is refused on a demo's database until
    /// someone says it only reads).
    pub fn writes(&self) -> bool {
        !matches!(
            self,
            Self::Lint { .. } | Self::Power(_) | Self::Show { .. } | Self::List { .. }
        )
    }
}

/// Options of `policy power`.
#[derive(Debug, clap::Args)]
pub struct PowerArgs {
    /// The policy file.
    policy: PathBuf,
    /// Fleet file (CSV or YAML, as `fleet import` takes).
    #[arg(long, value_name = "FILE")]
    fleet: PathBuf,
    /// The release, for the record and a kind check (default: any version).
    #[arg(long, value_name = "KIND@VERSION")]
    release: Option<String>,
    /// Baseline event rate of a rate gate, per unit of its metric's exposure
    /// (e.g. xid_errors_per_gpu_hour=0.02); by gate or metric name. Repeatable.
    #[arg(long = "baseline", value_name = "GATE_OR_METRIC=RATE")]
    baselines: Vec<String>,
    /// Between-unit standard deviation of a level gate, in its unit (e.g.
    /// gpu_temp_c=2.5); by gate or metric name. Repeatable.
    #[arg(long = "sd", value_name = "GATE_OR_METRIC=SD")]
    sds: Vec<String>,
    /// GPUs per node, for per-GPU metrics.
    #[arg(long, default_value_t = power::DEFAULT_GPUS_PER_NODE, value_parser = clap::value_parser!(u32).range(1..=1024))]
    gpus_per_node: u32,
    /// Seed of the planner's stratified choice.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Take the base rate of each Redfish rate gate without a --baseline from the fleet's recent
    /// health history in the database (--database-url): events over exposure of the control cohorts
    /// of the last 30 days, for each metric with at least 30 such events; the rollout's planner sizes
    /// the soak's holdback the same way. Without it, or with too few events, the defaults.
    #[arg(long)]
    history: bool,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// Options of `policy sync`; each overrides the `[policy]` section of the
/// configuration file.
#[derive(Debug, clap::Args)]
pub struct SyncArgs {
    /// Repository: a local path or a URL (https://, ssh://, git@host:path, file://).
    #[arg(long, value_name = "PATH_OR_URL")]
    repo: Option<String>,
    /// Branch, tag or commit id (default `main`).
    #[arg(long = "ref", value_name = "REF")]
    git_ref: Option<String>,
    /// Directory inside the repository holding the policies (default: all of it).
    #[arg(long, value_name = "DIR")]
    path: Option<String>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// Runs a policy command.
pub async fn run(command: PolicyCommand, context: &Context) -> anyhow::Result<ExitCode> {
    match command {
        PolicyCommand::Lint {
            paths,
            fleet,
            prometheus,
        } => {
            let paths = if paths.is_empty() {
                vec![PathBuf::from(".")]
            } else {
                paths
            };
            let metadata = match &prometheus {
                Some(url) => Some(orchestrator_engine::prometheus::metric_types(url).await?),
                None => None,
            };
            let (code, output) = lint(&paths, fleet.as_deref(), metadata.as_ref())?;
            print!("{output}");
            Ok(code)
        }
        PolicyCommand::Power(args) => {
            let history = if args.history {
                let db = context.db().await?;
                let since = db.clock().now() - chrono::Duration::days(power::HISTORY_DAYS);
                Some(db.control_rate_totals(since).await?)
            } else {
                None
            };
            print!("{}", power(&args, history.as_deref())?);
            Ok(ExitCode::SUCCESS)
        }
        PolicyCommand::Sync(args) => {
            let settings = resolve_settings(
                context.config.policy.as_ref(),
                args.repo.as_deref(),
                args.git_ref.as_deref(),
                args.path.as_deref(),
            )?;
            let actor = context.local_admin()?;
            let db = context.db().await?;
            let outcome = sync_once(&db, &settings, &actor).await?;
            if args.json {
                println!("{}", serde_json::to_string_pretty(&outcome.record)?);
            } else {
                print!("{}", render_sync(&settings.label, &outcome));
            }
            Ok(ExitCode::SUCCESS)
        }
        PolicyCommand::Show { name, json } => {
            let db = context.db().await?;
            let policy = db.policy_in_force(&name).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&policy)?);
            } else {
                print!("{}", render_show(&policy));
            }
            Ok(ExitCode::SUCCESS)
        }
        PolicyCommand::List { json } => {
            let db = context.db().await?;
            let policies = db.policies_in_force().await?;
            let state = db.policy_sync_state().await?;
            if json {
                let value = serde_json::json!({ "last_sync": state, "policies": policies });
                println!("{}", serde_json::to_string_pretty(&value)?);
            } else {
                let mut out = String::new();
                match &state {
                    Some(s) => out.push_str(&format!(
                        "last sync: {} at commit {} ({})\n",
                        s.source,
                        s.commit_id,
                        s.synced_at.to_rfc3339()
                    )),
                    None => out.push_str("never synced: run `waveguard policy sync`\n"),
                }
                out.push_str(&format!(
                    "{:<32} {:<12} {:<12} {:<25} STATUS\n",
                    "NAME", "COMMIT", "BLOB", "SYNCED"
                ));
                for p in &policies {
                    let status = match &p.last_error {
                        Some(e) => format!("newer version refused at {}", short(&e.commit_id)),
                        None => "ok".to_owned(),
                    };
                    out.push_str(&format!(
                        "{:<32} {:<12} {:<12} {:<25} {status}\n",
                        p.version.name,
                        short(&p.version.commit_id),
                        short(&p.version.blob_id),
                        p.version.synced_at.to_rfc3339(),
                    ));
                }
                print!("{out}");
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Flags override the `[policy]` configuration; a repository must come
/// from one of them.
fn resolve_settings(
    config: Option<&PolicySourceConfig>,
    repo: Option<&str>,
    git_ref: Option<&str>,
    path: Option<&str>,
) -> Result<SyncSettings, BadInput> {
    let repo = repo
        .or(config.map(|c| c.repo.as_str()))
        .filter(|r| !r.trim().is_empty())
        .ok_or_else(|| {
            BadInput("no policy repository: pass --repo or set [policy] repo in the configuration file".into())
        })?;
    let git_ref = git_ref
        .or(config.map(|c| c.git_ref.as_str()))
        .unwrap_or("main")
        .to_owned();
    let subdir = path.or(config.and_then(|c| c.path.as_deref())).map(str::to_owned);
    let cache_dir = config
        .and_then(|c| c.cache_dir.clone())
        .unwrap_or_else(|| std::env::temp_dir().join("waveguard-policy-clones"));
    let settings = SyncSettings::new(repo, git_ref, subdir, cache_dir).map_err(|e| BadInput(e.to_string()))?;
    if settings.source.git_ref.trim().is_empty() {
        return Err(BadInput("--ref must not be empty".into()));
    }
    Ok(settings)
}

/// The first 12 hex digits of an object id, as `git log --oneline` would.
fn short(id: &str) -> &str {
    id.get(..12).unwrap_or(id)
}

fn render_sync(label: &str, outcome: &SyncOutcome) -> String {
    let report = &outcome.report;
    let mut out = format!("synced {label} at commit {}\n", report.commit_id);
    for name in &report.changed {
        if let Some(p) = report.in_force.get(name) {
            out.push_str(&format!("updated {name}: {} (blob {})\n", p.path, p.blob_id));
        }
    }
    for name in &report.removed {
        out.push_str(&format!(
            "removed {name}: its file is gone; running rollouts keep their version\n"
        ));
    }
    for r in &report.rejected {
        match &r.kept {
            Some(kept) => out.push_str(&format!(
                "rejected {} (blob {}): {} stays in force at commit {}\n",
                r.path, r.blob_id, kept.name, kept.commit_id
            )),
            None => out.push_str(&format!("rejected {} (blob {}): not in force\n", r.path, r.blob_id)),
        }
        for line in &r.diagnostics {
            out.push_str(&format!("  {line}\n"));
        }
    }
    for line in &report.warnings {
        out.push_str(&format!("{line}\n"));
    }
    let unchanged = report.in_force.len().saturating_sub(report.changed.len());
    out.push_str(&format!(
        "{} in force ({} updated, {unchanged} unchanged), {} removed, {} file(s) rejected\n",
        report.in_force.len(),
        report.changed.len(),
        report.removed.len(),
        report.rejected.len()
    ));
    out
}

fn render_show(p: &PolicyInForce) -> String {
    let v = &p.version;
    let mut out = format!("policy {}\n", v.name);
    out.push_str(&format!("path:      {}\n", v.path));
    out.push_str(&format!("commit:    {}\n", v.commit_id));
    out.push_str(&format!("blob:      {}\n", v.blob_id));
    out.push_str(&format!("synced at: {}\n", v.synced_at.to_rfc3339()));
    out.push_str(&format!("last sync: commit {}\n", p.last_sync_commit));
    match &p.last_error {
        Some(e) => {
            out.push_str(&format!(
                "last sync error: {} (blob {}) at commit {} was rejected; this version stays in force\n",
                e.path, e.blob_id, e.commit_id
            ));
            for line in &e.diagnostics {
                out.push_str(&format!("  {line}\n"));
            }
        }
        None => out.push_str("last sync error: none\n"),
    }
    out.push_str("---\n");
    out.push_str(&v.content);
    if !v.content.ends_with('\n') {
        out.push('\n');
    }
    out
}

/// Starts the periodic sync of `serve` when a policy repository is
/// configured: one sync at once, then one per `sync_interval`, until
/// `shutdown` resolves. Errors only for a bad `sync_interval`, before
/// anything starts.
pub fn spawn_periodic_sync(
    context: &Context,
    db: Db,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<Option<JoinHandle<()>>> {
    let Some(config) = context.config.policy.as_ref() else {
        tracing::info!("no [policy] repository configured: policies are not synced");
        return Ok(None);
    };
    let interval = service::sync_interval(&config.sync_interval)
        .map_err(|e| BadInput(format!("[policy] sync_interval {:?}: {e}", config.sync_interval)))?;
    let settings = resolve_settings(Some(config), None, None, None)?;
    tracing::info!(source = %settings.label, interval = ?interval, "syncing policies periodically");
    Ok(Some(tokio::spawn(service::periodic_sync(
        db,
        settings,
        interval,
        SERVE_SYNC_ACTOR,
        shutdown,
    ))))
}

/// Lints the given paths; returns the exit code and the text to print.
fn lint(
    paths: &[PathBuf],
    fleet: Option<&Path>,
    metadata: Option<&BTreeMap<String, String>>,
) -> anyhow::Result<(ExitCode, String)> {
    let fleet = fleet
        .map(orchestrator_db::fleet_file::read)
        .transpose()?
        .map(|n| fleet_nodes(&n));
    let mut files = Vec::new();
    for path in paths {
        collect(path, 0, &mut files)?;
    }
    files.sort();
    files.dedup();
    let mut inputs = Vec::new();
    for file in &files {
        let bytes = std::fs::read(file).with_context(|| format!("cannot read {}", file.display()))?;
        inputs.push((file.display().to_string(), bytes));
    }
    let mut reports = lint_files(inputs);
    // What `policy power` states of the fleet-scale method's timing, per policy: on the fleet file
    // when one is given, else on a nominal fleet, so a policy's CI shows what a tight `must_detect`
    // costs before anyone approves it.
    let mut power_lines: BTreeMap<String, String> = BTreeMap::new();
    for report in &mut reports {
        let Some(policy) = &report.checked.policy else {
            continue;
        };
        let timing = lint_timing(policy, fleet.as_deref());
        if let Some((timing, basis)) = &timing
            && let Some(text) = lint_power_text(policy, timing, basis)
        {
            power_lines.insert(report.file.clone(), text);
        }
        // The per-wave judge's canary power means nothing to a policy the fleet-scale method judges:
        // its canary extends to max_bake, so what can go wrong is a healthy wave holding there.
        let power = if policy.detection.enabled {
            timing.map_or_else(Vec::new, |(timing, basis)| likely_hold_findings(&timing, &basis))
        } else {
            power::lint_findings(policy, fleet.as_deref())
        };
        report.add_gate_findings(
            power
                .into_iter()
                .map(|(gate, message)| (Severity::Warning, gate, message)),
        );
        if let (Some(types), Some(policy)) = (metadata, &report.checked.policy) {
            let findings = orchestrator_policy::exporter::metadata_findings(policy, types);
            report.add_gate_findings(findings);
        }
    }
    // The soak's holdback and time per policy (issue 22), on the fleet file's eligible nodes when
    // one is given.
    let soak_lines: BTreeMap<String, String> = reports
        .iter()
        .filter_map(|report| {
            let policy = report.checked.policy.as_ref()?;
            let eligible = fleet.as_deref().and_then(|nodes| {
                power::fleet_shapes(policy, nodes, None, 0, &BTreeMap::new())
                    .ok()
                    .map(|(shapes, _)| shapes.iter().map(|s| s.canary_nodes).sum())
            });
            Some((report.file.clone(), soak_text(policy, eligible, None)?))
        })
        .collect();
    let (code, mut out) = render(&reports, &soak_lines, &power_lines);
    // A policy repository's CI runs one lint: its RMA criteria are checked with it.
    let rma_dirs: Vec<PathBuf> = paths.iter().map(|p| p.join("rma")).filter(|d| d.is_dir()).collect();
    if rma_dirs.is_empty() {
        return Ok((code, out));
    }
    let criteria = super::rma::criteria_files(&rma_dirs)?;
    let count = criteria.len();
    let (lines, failed) = super::rma::lint_criteria(criteria);
    for line in lines {
        out.push_str(&line);
        out.push('\n');
    }
    out.push_str(&format!(
        "{count} RMA criteria file(s) checked: {}\n",
        if failed { "errors found" } else { "ok" }
    ));
    Ok((if failed { ExitCode::FAILURE } else { code }, out))
}

/// Nodes per rack, racks per cluster and nodes per scale-up domain of the nominal fleet the lint
/// plans on without a fleet file: an HGX-like layout.
const NOMINAL_RACK_NODES: usize = 20;
const NOMINAL_CLUSTER_RACKS: usize = 10;
const NOMINAL_DOMAIN_NODES: usize = 4;

/// [`NOMINAL_FLEET`] nodes of the policy's first platform, so the lint can state the power of a
/// policy without a fleet file.
fn nominal_fleet(policy: &orchestrator_policy::Policy) -> Vec<FleetNode> {
    let platform = policy.target.platforms.first().cloned().unwrap_or_default();
    (0..NOMINAL_FLEET)
        .map(|i| {
            let rack = i / NOMINAL_RACK_NODES;
            FleetNode {
                name: format!("nominal-{i:05}"),
                platform: platform.clone(),
                region: "nominal".into(),
                cluster: format!("c{}", rack / NOMINAL_CLUSTER_RACKS),
                rack: format!("r{rack:03}"),
                nvlink_domain: format!("d{:04}", i / NOMINAL_DOMAIN_NODES),
            }
        })
        .collect()
}

/// `policy power`'s fleet-scale timing for the lint, at the base rates the policy states (a gate's
/// `baseline`) or else the defaults, on `fleet` or a nominal fleet, with a phrase saying which.
/// `None` when the fleet gives the policy no waves.
fn lint_timing(
    policy: &orchestrator_policy::Policy,
    fleet: Option<&[FleetNode]>,
) -> Option<(Vec<power::FleetGateTiming>, String)> {
    let nominal;
    let nodes = match fleet {
        Some(nodes) => nodes,
        None => {
            nominal = nominal_fleet(policy);
            &nominal
        }
    };
    let (shapes, _) = power::fleet_shapes(policy, nodes, None, 0, &BTreeMap::new()).ok()?;
    let timing = power::fleet_timing(policy, &shapes, &power::PowerOptions::default());
    let eligible: usize = shapes.iter().map(|s| s.canary_nodes).sum();
    let basis = match fleet {
        Some(_) => format!("on the fleet file's {eligible} eligible nodes"),
        None => format!("on a nominal {eligible} eligible nodes; --fleet FILE for yours"),
    };
    Some((timing, format!("{basis}; {}", stated_rates_phrase(policy))))
}

/// Which base rates the lint plans with: the policy's rate gates that state a `baseline` use it, the
/// others the defaults (the lint reads no database, so no history).
fn stated_rates_phrase(policy: &orchestrator_policy::Policy) -> &'static str {
    let rate_gates: Vec<_> = policy
        .health
        .gates
        .iter()
        .filter(|g| g.kind == orchestrator_policy::GateKind::Rate)
        .collect();
    let stated = rate_gates.iter().filter(|g| g.baseline.is_some()).count();
    if stated == 0 {
        "default base rates; state a gate's `baseline:` or use `policy power --baseline` for yours"
    } else if stated == rate_gates.len() {
        "base rates the policy states"
    } else {
        "base rates the policy states, defaults for gates without `baseline:`"
    }
}

/// The lint's power statement for one policy: the median and p95 hours for a healthy wave to pass
/// and for each effect to be caught, per wave and rate gate, as `policy power` prints them. `None`
/// when there is nothing to state (no judged rate gate).
fn lint_power_text(
    policy: &orchestrator_policy::Policy,
    timing: &[power::FleetGateTiming],
    basis: &str,
) -> Option<String> {
    let text = fleet_timing_text(policy, timing);
    (!text.is_empty()).then(|| format!("power ({basis}): {}", text.trim()))
}

/// A warning at the gate for each wave a healthy release would likely hold in: its p95 time to rule
/// out `must_detect` is beyond the wave's `max_bake` (`LIKELY HOLD` in `policy power`).
fn likely_hold_findings(timing: &[power::FleetGateTiming], basis: &str) -> Vec<(String, String)> {
    timing
        .iter()
        .filter(|t| t.likely_hold)
        .map(|t| {
            (
                t.gate.clone(),
                format!(
                    "gate {:?}: a healthy wave {:?} needs {:.0} h (p95) to rule out its must_detect, beyond its \
                     max_bake of {:.0} h ({basis}): more than 1 in 20 healthy rollouts would hold for a human; raise \
                     max_bake or must_detect, or enlarge the wave",
                    t.gate, t.wave, t.pass_hours.1, t.max_bake_hours
                ),
            )
        })
        .collect()
}

/// A fleet file's nodes as the power analysis plans them.
fn fleet_nodes(nodes: &[orchestrator_db::model::NewNode]) -> Vec<FleetNode> {
    nodes
        .iter()
        .map(|n| FleetNode {
            name: n.name.clone(),
            platform: n.platform_sku.clone(),
            region: n.labels.region.clone(),
            cluster: n.labels.cluster.clone(),
            rack: n.labels.rack.clone(),
            nvlink_domain: n.labels.nvlink_domain.clone(),
        })
        .collect()
}

/// `policy power`: the text (or JSON) to print. `history`: the database's control totals
/// (`(metric, events, exposure)`) when `--history` asked for them.
fn power(args: &PowerArgs, history: Option<&[(String, f64, f64)]>) -> anyhow::Result<String> {
    use orchestrator_policy::GateKind;
    use power::{Baselines, PowerOptions, effect_text, fleet_shapes, parse_baselines, power_table};
    let file = args.policy.display().to_string();
    let bytes = std::fs::read(&args.policy).map_err(|e| BadInput(format!("cannot read the policy {file}: {e}")))?;
    let report = lint_files([(file.clone(), bytes)]).remove(0);
    let Some(policy) = report.checked.policy.clone() else {
        let errors: Vec<String> = report
            .checked
            .diagnostics
            .iter()
            .filter(|d| d.is_error())
            .map(|d| d.render(&file))
            .collect();
        return Err(BadInput(format!("invalid policy:\n{}", errors.join("\n"))).into());
    };
    let release = match &args.release {
        Some(text) => {
            let (kind, version) = super::simulate::parse_release(text)?;
            if kind != policy.target.component {
                return Err(BadInput(format!(
                    "--release {text}: the policy {:?} updates {} firmware, not {}",
                    policy.name,
                    policy.target.component.as_str(),
                    kind.as_str()
                ))
                .into());
            }
            Some(version)
        }
        None => None,
    };
    let options = PowerOptions {
        baselines: Baselines {
            rates: parse_baselines(&policy, GateKind::Rate, &args.baselines).map_err(|e| BadInput(e.to_string()))?,
            sds: parse_baselines(&policy, GateKind::Level, &args.sds).map_err(|e| BadInput(e.to_string()))?,
        },
        gpus_per_node: args.gpus_per_node,
        history_rates: history.map(power::history_rates).unwrap_or_default(),
    };
    let nodes = orchestrator_db::fleet_file::read(&args.fleet)?;
    let (shapes, ignored) = fleet_shapes(
        &policy,
        &fleet_nodes(&nodes),
        release.as_ref(),
        args.seed,
        &options.history_rates,
    )
    .map_err(|e| {
        BadInput(format!(
            "{}: {}",
            args.fleet.display(),
            orchestrator_types::error_chain(&e)
        ))
    })?;
    let waves = power_table(&policy, &shapes, &options);
    let timing = power::fleet_timing(&policy, &shapes, &options);
    let eligible: usize = shapes.iter().map(|s| s.canary_nodes).sum();
    // The holdback as the rollout's planner sizes it: at the measured rates, not the command line's.
    let soak = power::soak_sizing(
        &policy,
        eligible,
        &BTreeMap::new(),
        &options.history_rates,
        power::DEFAULT_GPUS_PER_NODE,
    );
    if args.json {
        let doc = serde_json::json!({
            "policy": policy.name,
            "fleet": args.fleet.display().to_string(),
            "fleet_nodes": nodes.len(),
            "release": args.release,
            "alpha": policy.health.alpha,
            "correction": "bonferroni",
            "spending": orchestrator_detect::judging::DEFAULT_SPENDING,
            "target_power": orchestrator_detect::power::TARGET_POWER,
            "gpus_per_node": args.gpus_per_node,
            "ignored_selector_labels": ignored,
            "waves": waves,
            "fleet_timing": timing,
            "fleet_detection": policy.detection.enabled,
            "soak": soak,
            "history": history.map(|totals| serde_json::json!({
                "days": power::HISTORY_DAYS,
                "min_events": power::MIN_HISTORY_EVENTS,
                "control_totals": totals
                    .iter()
                    .map(|(metric, events, exposure)| serde_json::json!({
                        "metric": metric, "events": events, "exposure": exposure
                    }))
                    .collect::<Vec<_>>(),
                "rates": options.history_rates,
            })),
        });
        return Ok(format!("{}\n", serde_json::to_string_pretty(&doc)?));
    }
    let mut out = format!(
        "policy {:?} on {} ({} node(s)): alpha {} split over each wave's gates, O'Brien-Fleming looks, {:.0}% power\n",
        policy.name,
        args.fleet.display(),
        nodes.len(),
        policy.health.alpha,
        orchestrator_detect::power::TARGET_POWER * 100.0
    );
    if !ignored.is_empty() {
        out.push_str(&format!(
            "the fleet file has no label {}: the policy's selector on it is ignored\n",
            ignored.join(", ")
        ));
    }
    if let Some(totals) = history {
        out.push_str(&history_text(totals, &options.history_rates));
    }
    out.push_str(&format!(
        "{:<10} {:<14} {:>12} {:>12} {:>5} {:>5} {:>9} {:<26} {:<22} {:>8} {}\n",
        "WAVE", "GATE", "CANARY", "CONTROL", "BAKE", "LOOKS", "ALPHA", "BASELINE", "MDE (80%)", "MUST", "LIMITED BY"
    ));
    for wave in &waves {
        for g in &wave.gates {
            let baseline = g.baseline.as_ref().map_or_else(
                || "-".to_owned(),
                |b| {
                    let per = g.exposure_unit.map_or_else(String::new, |u| format!("/{u}"));
                    let what = if b.measure == "sd" { "sd " } else { "" };
                    let source = match b.source {
                        power::BaselineSource::Given => "given",
                        power::BaselineSource::History => "history",
                        power::BaselineSource::Policy => "policy",
                        power::BaselineSource::Default => "default",
                    };
                    format!("{what}{}{per} ({source})", b.value)
                },
            );
            let (mde, limited) = match (&g.mde, g.status) {
                (Some(m), _) => {
                    let text = match (m.ratio, m.shift, m.expected_canary_events) {
                        (Some(r), _, Some(e)) => format!("{} ({e:.1} ev)", effect_text(g.kind, r)),
                        (_, Some(s), _) => effect_text(g.kind, s),
                        _ => "none".to_owned(),
                    };
                    let flag = if g.detects_must_detect == Some(false) {
                        "  UNDERPOWERED"
                    } else {
                        ""
                    };
                    (text, format!("{}{flag}", m.limited_by))
                }
                (None, status) => (
                    serde_json::to_value(status)
                        .ok()
                        .and_then(|v| v.as_str().map(str::to_owned))
                        .unwrap_or_default(),
                    g.note.clone().unwrap_or_default(),
                ),
            };
            out.push_str(&format!(
                "{:<10} {:<14} {:>12} {:>12} {:>5} {:>5} {:>9.3e} {:<26} {:<22} {:>8} {}\n",
                wave.wave,
                g.gate,
                format!("{} {}", g.canary_units, g.unit),
                format!("{} {}", g.control_units, g.unit),
                wave.bake,
                g.planned_looks,
                g.gate_alpha,
                baseline,
                mde,
                effect_text(g.kind, g.must_detect),
                limited
            ));
            if let (Some(note), Some(_)) = (&g.note, &g.mde) {
                out.push_str(&format!("{:<10} {:<14} note: {note}\n", "", ""));
            }
        }
    }
    out.push_str(&fleet_timing_text(&policy, &timing));
    if let Some(line) = soak_text(&policy, Some(eligible), Some(&options)) {
        out.push_str(&format!("\n{line}\n"));
    }
    Ok(out)
}

/// What `--history` measured: per metric, the control cohorts' events and exposure over the last
/// [`power::HISTORY_DAYS`] days, and whether they were enough to replace the default.
fn history_text(totals: &[(String, f64, f64)], rates: &BTreeMap<String, f64>) -> String {
    let mut out = format!(
        "base rates from the database's control cohorts over the last {} days (used where a rate gate has no \
         --baseline; at least {:.0} events):",
        power::HISTORY_DAYS,
        power::MIN_HISTORY_EVENTS
    );
    let rows: Vec<String> = totals
        .iter()
        .filter(|(metric, _, _)| power::history_metric(metric))
        .map(|(metric, events, exposure)| match rates.get(metric) {
            Some(rate) => format!(" {metric} {rate:.3e} ({events:.0} events over {exposure:.0})"),
            None => format!(" {metric} too few events ({events:.0}), default used"),
        })
        .collect();
    if rows.is_empty() {
        out.push_str(" none recorded, defaults used");
    } else {
        out.push_str(&rows.join(";"));
    }
    out.push('\n');
    out
}

/// The fleet-scale method's time to decide, per wave and rate gate (issue 22): what a tight
/// `must_detect` costs in bake time, before anyone approves the policy.
fn fleet_timing_text(policy: &orchestrator_policy::Policy, timing: &[power::FleetGateTiming]) -> String {
    if timing.is_empty() {
        return String::new();
    }
    let hours = |h: f64| {
        if h.is_finite() {
            format!("{h:.0} h")
        } else {
            "never".to_owned()
        }
    };
    let in_force = if policy.detection.enabled {
        "in force: the policy's detection block has the engine judge its rollouts with it"
    } else {
        "NOT in force: the policy has no detection block, so the engine judges each wave with the per-wave method"
    };
    let mut out = format!(
        "\nfleet-scale method ({in_force}; anytime-valid, evidence pooled across waves; false rollback {}, false \
         pass {} per rollout): hours into each wave's bake, median / p95\n",
        policy.detection.false_rollback, policy.detection.false_pass
    );
    for t in timing {
        if let Some(why) = &t.unjudged {
            out.push_str(&format!(
                "{:<10} {:<14} {why} (a pass needs the earlier evidence to rule out must_detect by \
                 max_bake {})\n",
                t.wave,
                t.gate,
                hours(t.max_bake_hours)
            ));
            continue;
        }
        let catches: Vec<String> = t
            .catch_hours
            .iter()
            .map(|(r, m, p)| format!("{r}x {} / {}", hours(*m), hours(*p)))
            .collect();
        let by_end: Vec<String> = t
            .catch_by_end
            .iter()
            .map(|(r, p)| format!("{r}x {:.0}%", p * 100.0))
            .collect();
        let concentrated: Vec<String> = t
            .catch_by_end_concentrated
            .iter()
            .map(|(r, p)| format!("{r}x {:.0}%", p * 100.0))
            .collect();
        out.push_str(&format!(
            "{:<10} {:<14} pass {} / {} (bake {}, max_bake {}){}; catch {}; caught by the wave's end {}; the same \
             average on {:.0}% of nodes {}\n",
            t.wave,
            t.gate,
            hours(t.pass_hours.0),
            hours(t.pass_hours.1),
            hours(t.bake_hours),
            hours(t.max_bake_hours),
            if t.likely_hold { " LIKELY HOLD" } else { "" },
            catches.join(", "),
            by_end.join(", "),
            t.concentrated_share * 100.0,
            concentrated.join(", ")
        ));
    }
    out
}

/// Which method judges the policy's rollouts: the `detection` block is the switch (issue 22).
fn detection_method(policy: &orchestrator_policy::Policy) -> String {
    if policy.detection.enabled {
        let first_has_levels = policy.waves.first().is_some_and(|w| {
            w.gates
                .iter()
                .filter_map(|name| policy.health.gate(name))
                .any(|g| g.kind == orchestrator_policy::GateKind::Level)
        });
        let pre_period = match policy.detection.pre_period {
            Some(p) => format!(
                "; the first wave's nodes and the controls are watched {} before its first flash, so its level gates \
                 compare each node with itself",
                orchestrator_policy::format_duration(p)
            ),
            None if first_has_levels => "; no pre_period: the first wave's level gates compare nodes as they are, \
                                         persistent differences between nodes included, and may hold for want of \
                                         evidence (add detection.pre_period)"
                .to_owned(),
            None => String::new(),
        };
        format!(
            "detection: fleet-scale (controls: every eligible node not yet updated; evidence pooled across waves; \
             false rollback {}, false pass {} per rollout; a wave extends up to its max_bake, then holds{pre_period})",
            policy.detection.false_rollback, policy.detection.false_pass
        )
    } else {
        "detection: per-wave (no detection block; add one for fleet-scale detection)".to_owned()
    }
}

/// A fleet size for the soak statement when no fleet file is given.
const NOMINAL_FLEET: usize = 1000;

/// The soak's holdback and time (issue 22) as the planner sizes the holdback (at the rates measured
/// over history when `policy power --history` read them, else the base rates the policy states,
/// else the defaults, as the rollout will), and, when the command was given base rates, the soak time at those.
/// `None` when the policy has no soak.
fn soak_text(
    policy: &orchestrator_policy::Policy,
    eligible: Option<usize>,
    options: Option<&power::PowerOptions>,
) -> Option<String> {
    let n = eligible.unwrap_or(NOMINAL_FLEET);
    let none = BTreeMap::new();
    // As the rollout's planner sizes it: at the rates measured over history (`policy power
    // --history`), else the policy's stated ones, else the defaults.
    let history = options.map_or(&none, |o| &o.history_rates);
    let planned = power::soak_sizing(policy, n, &none, history, power::DEFAULT_GPUS_PER_NODE)?;
    let mut out = planned.statement();
    if eligible.is_none() {
        out.push_str(&format!(
            " (for a nominal {NOMINAL_FLEET} eligible nodes; --fleet FILE for yours)"
        ));
    }
    if let Some(options) = options.filter(|o| !o.baselines.rates.is_empty()) {
        let mut fixed = policy.clone();
        if let Some(soak) = fixed.detection.soak.as_mut() {
            soak.holdback_percent = Some(planned.holdback_percent);
        }
        if let Some(given) = power::soak_sizing(
            &fixed,
            n,
            &options.baselines.rates,
            &options.history_rates,
            options.gpus_per_node,
        ) && let (Some(gate), Some(rate), Some(hours)) = (&given.gate, given.base_per_node_hour, given.hours_needed)
        {
            out.push_str(&format!(
                "; at the given base rates ({gate} at {rate:.3}/node-hour) the same holdback needs ~{hours:.0} h"
            ));
        }
    }
    Some(out)
}

fn render(
    reports: &[FileReport],
    soak_lines: &BTreeMap<String, String>,
    power_lines: &BTreeMap<String, String>,
) -> (ExitCode, String) {
    let mut out = String::new();
    let (mut errors, mut warnings) = (0usize, 0usize);
    for report in reports {
        for d in &report.checked.diagnostics {
            match d.severity {
                Severity::Error => errors += 1,
                Severity::Warning => warnings += 1,
            }
        }
        for line in report.rendered().into_iter().chain(report.exporter_fields()) {
            out.push_str(&line);
            out.push('\n');
        }
        if let Some(policy) = report.checked.policy.as_ref().filter(|p| !p.health.gates.is_empty()) {
            out.push_str(&format!("{}: {}\n", report.file, detection_method(policy)));
            if let Some(line) = soak_lines.get(&report.file) {
                out.push_str(&format!("{}: {line}\n", report.file));
            }
            for line in power_lines.get(&report.file).into_iter().flat_map(|t| t.lines()) {
                out.push_str(&format!("{}: {line}\n", report.file));
            }
        }
    }
    out.push_str(&format!(
        "{} file(s) checked: {errors} error(s), {warnings} warning(s)\n",
        reports.len()
    ));
    let code = if errors > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    };
    (code, out)
}

fn collect(path: &Path, depth: usize, files: &mut Vec<PathBuf>) -> anyhow::Result<()> {
    let meta = std::fs::metadata(path).with_context(|| format!("cannot read {}", path.display()))?;
    if meta.is_file() {
        files.push(path.to_owned());
        return Ok(());
    }
    if depth >= MAX_LINT_DEPTH {
        anyhow::bail!("{} is nested deeper than {MAX_LINT_DEPTH} directories", path.display());
    }
    let entries = std::fs::read_dir(path).with_context(|| format!("cannot list {}", path.display()))?;
    for entry in entries {
        let entry = entry.with_context(|| format!("cannot list {}", path.display()))?;
        let child = entry.path();
        let hidden = child
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with('.'));
        // RMA criteria (`rma/*.yaml`) live beside the policies but are linted by orchestrator-rma.
        let rma = child.file_name().is_some_and(|n| n == "rma") && child.is_dir();
        if hidden || rma {
            continue;
        }
        if child.is_dir() {
            collect(&child, depth + 1, files)?;
        } else if child.extension().is_some_and(|e| e == "yaml" || e == "yml") {
            files.push(child);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn examples() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../policies")
    }

    #[test]
    fn lint_and_power_state_the_holdback_and_the_soak_time() {
        let source = std::fs::read_to_string(examples().join("hgx-gpu-firmware.yaml")).unwrap();
        assert!(
            source.contains("    holdback_percent: 5\n"),
            "the example holds back 5%"
        );
        let policy = orchestrator_policy::parse_policy(&source).unwrap();
        let line = soak_text(&policy, Some(1000), None).expect("a soak line");
        assert!(
            line.starts_with("soak: holdback 50 of 1000 eligible nodes (5%, stated)"),
            "{line}"
        );
        assert!(line.contains("power needs ~"), "{line}");
        assert!(line.contains("h of soak"), "{line}");
        // Without a fleet file the line says it is for a nominal fleet; given rates change the time.
        let nominal = soak_text(&policy, None, None).unwrap();
        assert!(nominal.contains("nominal 1000 eligible nodes"), "{nominal}");
        let mut options = power::PowerOptions::default();
        options.baselines.rates.insert("xid_errors".into(), 0.002);
        let given = soak_text(&policy, Some(1000), Some(&options)).unwrap();
        assert!(
            given.contains("at the given base rates (xid_errors at 0.016/node-hour)"),
            "{given}"
        );
        // No soak: nothing to state.
        let start = source.find("  soak:\n").unwrap();
        let end = source.find("    holdback_percent: 5\n").unwrap() + "    holdback_percent: 5\n".len();
        let plain = orchestrator_policy::parse_policy(&format!("{}{}", &source[..start], &source[end..])).unwrap();
        assert!(plain.detection.soak.is_none());
        assert!(soak_text(&plain, Some(1000), None).is_none());
    }

    #[test]
    fn lint_states_the_pre_flash_watch_or_its_absence() {
        let source = std::fs::read_to_string(examples().join("hgx-gpu-firmware.yaml")).unwrap();
        let policy = orchestrator_policy::parse_policy(&source).unwrap();
        let line = detection_method(&policy);
        assert!(line.contains("watched 6h before its first flash"), "{line}");
        let without = orchestrator_policy::parse_policy(&source.replace("  pre_period: 6h\n", "")).unwrap();
        let line = detection_method(&without);
        assert!(
            line.contains("no pre_period: the first wave's level gates compare nodes as they are"),
            "{line}"
        );
    }

    /// `policy power --history`: the holdback is sized at the rate measured over the fleet's history,
    /// as the rollout's planner sizes it, and the output says where each rate came from.
    #[test]
    fn power_with_history_sizes_the_holdback_at_the_measured_rate_and_says_so() {
        let source = std::fs::read_to_string(examples().join("hgx-gpu-firmware.yaml")).unwrap();
        // Sized from the power target, not stated; at the default rates, not the example's stated ones.
        let sized = source.replace("    holdback_percent: 5\n", "");
        let stated = soak_text(&orchestrator_policy::parse_policy(&sized).unwrap(), Some(1000), None).unwrap();
        assert!(stated.contains("stated in the policy"), "{stated}");
        let sized: String = sized
            .lines()
            .filter(|l| !l.trim_start().starts_with("baseline:"))
            .map(|l| format!("{l}\n"))
            .collect();
        let policy = orchestrator_policy::parse_policy(&sized).unwrap();
        let totals = vec![
            ("xid_errors_per_gpu_hour".to_owned(), 400.0, 200_000.0),
            ("pcie_aer_per_node_hour".to_owned(), 3.0, 10_000.0),
            ("gpu_temp_c".to_owned(), 0.0, 0.0),
        ];
        let options = power::PowerOptions {
            history_rates: power::history_rates(&totals),
            ..power::PowerOptions::default()
        };
        let measured = soak_text(&policy, Some(1000), Some(&options)).unwrap();
        let default = soak_text(&policy, Some(1000), None).unwrap();
        assert!(measured.contains("measured over the fleet's history"), "{measured}");
        assert!(measured.contains("xid_errors at 0.016/node-hour"), "{measured}");
        assert!(default.contains("default rate"), "{default}");
        // The quieter measured fleet needs a larger holdback than the default rate's.
        let holdback = |line: &str| {
            line.split("holdback ")
                .nth(1)
                .and_then(|r| r.split(' ').next()?.parse::<usize>().ok())
                .unwrap()
        };
        assert!(holdback(&measured) > holdback(&default), "{measured}\n{default}");
        let text = history_text(&totals, &options.history_rates);
        assert!(
            text.contains("xid_errors_per_gpu_hour 2.000e-3 (400 events over 200000)"),
            "{text}"
        );
        assert!(
            text.contains("pcie_aer_per_node_hour too few events (3), default used"),
            "{text}"
        );
        assert!(!text.contains("gpu_temp_c"), "{text}");
        assert!(history_text(&[], &BTreeMap::new()).contains("none recorded, defaults used"));
    }

    /// `policy lint` states `policy power`'s fleet-scale timing for each policy (issue 22): the
    /// median / p95 hours for a healthy wave to pass and for each effect to be caught, per wave,
    /// with each wave's own must_detect.
    #[test]
    fn lint_states_the_power_of_each_wave() {
        let file = examples().join("hgx-gpu-firmware.yaml");
        let (code, out) = lint(std::slice::from_ref(&file), None, None).unwrap();
        assert_eq!(code, ExitCode::SUCCESS, "{out}");
        let name = file.display().to_string();
        assert!(
            out.contains(&format!(
                "{name}: power (on a nominal 1000 eligible nodes; --fleet FILE for yours; base rates the policy \
                 states): fleet-scale method (in force:"
            )),
            "{out}"
        );
        let row = |wave: &str, gate: &str| {
            out.lines()
                .find(|l| l.starts_with(&format!("{name}: {wave:<10} {gate:<14} pass ")))
                .unwrap_or_else(|| panic!("no {wave}/{gate} row in\n{out}"))
                .to_owned()
        };
        // The canary is held to 2x, the 10% wave to its own 1.5x: the first ratio caught is must_detect.
        assert!(
            row("canary", "xid_errors").contains("(bake 12 h, max_bake 720 h); catch 2x "),
            "{out}"
        );
        assert!(
            row("early", "xid_errors").contains("(bake 8 h, max_bake 168 h); catch 1.5x "),
            "{out}"
        );
        // The last wave's bake is the soak: at least soak.min, at most soak.max.
        assert!(
            row("rest", "xid_errors").contains("(bake 24 h, max_bake 400 h); catch 1.5x "),
            "{out}"
        );
        assert!(out.contains("1 file(s) checked: 0 error(s), 0 warning(s)\n"), "{out}");
    }

    /// The lint plans with the base rate a gate states and names where its rates came from: a gate
    /// without `baseline:` falls back to the default and the line says so; a rarer stated rate makes
    /// a healthy canary slower to pass.
    #[test]
    fn lint_plans_with_the_base_rates_the_policy_states() {
        let stated = orchestrator_policy::parse_policy(
            &std::fs::read_to_string(examples().join("hgx-gpu-firmware.yaml")).unwrap(),
        )
        .unwrap();
        let mut partly = stated.clone();
        partly
            .health
            .gates
            .iter_mut()
            .find(|g| g.name == "pcie_aer")
            .unwrap()
            .baseline = None;
        let mut none = stated.clone();
        for gate in &mut none.health.gates {
            gate.baseline = None;
        }
        let phrase = |p: &orchestrator_policy::Policy| lint_timing(p, None).unwrap().1;
        assert!(
            phrase(&stated).ends_with("; base rates the policy states"),
            "{}",
            phrase(&stated)
        );
        assert!(
            phrase(&partly).ends_with("; base rates the policy states, defaults for gates without `baseline:`"),
            "{}",
            phrase(&partly)
        );
        assert!(
            phrase(&none).ends_with(
                "; default base rates; state a gate's `baseline:` or use `policy power --baseline` for yours"
            ),
            "{}",
            phrase(&none)
        );
        let canary_pass_p95 = |p: &orchestrator_policy::Policy| {
            lint_timing(p, None)
                .unwrap()
                .0
                .into_iter()
                .find(|t| t.wave == "canary" && t.gate == "xid_errors")
                .unwrap()
                .pass_hours
                .1
        };
        // 0.002 XIDs per GPU-hour stated against the default 0.01: five times fewer events an hour.
        assert!(canary_pass_p95(&stated) > 2.0 * canary_pass_p95(&none));
    }

    /// A fleet-scale policy whose healthy canary would likely hold at its max_bake is warned at the
    /// gate; the per-wave judge's canary power warning, meaningless for it, is not given.
    #[test]
    fn lint_warns_where_a_healthy_wave_would_likely_hold() {
        let source = std::fs::read_to_string(examples().join("hgx-gpu-firmware.yaml"))
            .unwrap()
            .replace("    max_bake: 720h\n", "    max_bake: 13h\n");
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("hgx-gpu-firmware.yaml");
        std::fs::write(&file, &source).unwrap();
        let (code, out) = lint(std::slice::from_ref(&file), None, None).unwrap();
        assert_eq!(code, ExitCode::SUCCESS, "warnings only: {out}");
        let line = source.lines().position(|l| l.contains("- name: xid_errors")).unwrap() + 1;
        assert!(
            out.contains(&format!(
                "{}:{line}:13: warning: gate \"xid_errors\": a healthy wave \"canary\" needs ",
                file.display()
            )),
            "{out}"
        );
        assert!(out.contains("beyond its max_bake of 13 h"), "{out}");
        assert!(out.contains("LIKELY HOLD"), "{out}");
        assert!(!out.contains("with 80% power over the"), "{out}");
    }

    #[test]
    fn examples_directory_lints_clean() {
        let (code, out) = lint(&[examples()], None, None).unwrap();
        assert_eq!(code, ExitCode::SUCCESS, "{out}");
        assert!(out.contains("6 file(s) checked: 0 error(s), 0 warning(s)\n"), "{out}");
        // The RMA criteria beside them are linted too.
        assert!(out.ends_with("2 RMA criteria file(s) checked: ok\n"), "{out}");
        // The DCGM policy's exporter fields, the ones off by default with their CSV line.
        assert!(
            out.contains(
                "hgx-dcgm.yaml: needs dcgm-exporter field DCGM_FI_DEV_ECC_DBE_VOL_TOTAL (off by default; enable it \
                 with: DCGM_FI_DEV_ECC_DBE_VOL_TOTAL, counter, Total number of double-bit volatile ECC errors.)"
            ),
            "{out}"
        );
        assert!(
            out.contains("hgx-dcgm.yaml: needs dcgm-exporter field DCGM_FI_DEV_PCIE_REPLAY_COUNTER (on by default)"),
            "{out}"
        );
    }

    #[tokio::test]
    async fn prometheus_metadata_refuses_a_rate_gate_on_a_gauge() {
        // A Prometheus that reports the PCIe replay counter as a gauge (a
        // relabelled or mis-declared exporter) and knows no NVLink field.
        let app = axum::Router::new().route(
            "/prom/api/v1/metadata",
            axum::routing::get(|| async {
                axum::Json(serde_json::json!({
                    "status": "success",
                    "data": {
                        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": [{"type": "gauge", "help": "", "unit": ""}],
                        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": [{"type": "counter", "help": "", "unit": ""}],
                        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": [{"type": "counter", "help": "", "unit": ""}],
                        "DCGM_EXP_XID_ERRORS_COUNT": [{"type": "gauge", "help": "", "unit": ""}]
                    }
                }))
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        let base = url::Url::parse(&format!("http://{addr}/prom")).unwrap();
        let types = orchestrator_engine::prometheus::metric_types(&base).await.unwrap();
        assert_eq!(types["DCGM_FI_DEV_PCIE_REPLAY_COUNTER"], "gauge");
        let file = examples().join("hgx-dcgm.yaml");
        let (code, out) = lint(std::slice::from_ref(&file), None, Some(&types)).unwrap();
        assert_eq!(code, ExitCode::FAILURE, "{out}");
        let text = std::fs::read_to_string(&file).unwrap();
        let line = text.lines().position(|l| l.contains("name: pcie_replay")).unwrap() + 1;
        assert!(
            out.contains(&format!(
                "{}:{line}:13: gate \"pcie_replay\": Prometheus reports DCGM_FI_DEV_PCIE_REPLAY_COUNTER as a gauge; a \
                 rate gate needs a counter (events are its increase)",
                file.display()
            )),
            "{out}"
        );
        assert!(
            out.contains("warning: gate \"nvlink_crc\": Prometheus has no metadata for DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"),
            "{out}"
        );
        // The windowed XID count is declared a gauge yet read by its window reads: no finding.
        assert!(!out.contains("gate \"xid_rate\""), "{out}");
    }

    #[test]
    fn broken_file_exits_1_with_file_line_col() {
        let dir = tempfile::tempdir().unwrap();
        let text = std::fs::read_to_string(examples().join("bmc-firmware.yaml"))
            .unwrap()
            .replace("bake: 6h", "bake: soon");
        let file = dir.path().join("bmc-firmware.yaml");
        std::fs::write(&file, text).unwrap();
        let (code, out) = lint(std::slice::from_ref(&file), None, None).unwrap();
        assert_eq!(code, ExitCode::FAILURE);
        let first = out.lines().next().unwrap();
        assert!(
            first.starts_with(&format!("{}:", file.display()))
                && first.contains(": wave \"canary\" bake: invalid duration"),
            "{out}"
        );
    }
}
