//! The policy sync service: read the repository, decide against what is in
//! force ([`crate::plan_sync`]) and store the outcome, once (`policy sync`,
//! `demo`) or periodically (`serve`).
//!
//! It lives here rather than in the binary because it is the whole of "how
//! policies get from git into force"; it is the one part of this crate that
//! is async and knows the datastore, so this crate depends on
//! `orchestrator-db` and tokio.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

use orchestrator_db::policies::{PolicySync, RecordedSync, RejectedPolicyFile, SyncedPolicy};
use orchestrator_db::{Db, DbError};
use orchestrator_policy::{DurationError, parse_duration};

use crate::{
    CriteriaPlan, GitPolicySource, GitSourceError, InForce, RepoLocation, SyncReport, plan_criteria, plan_sync,
    redact_url,
};

/// Shortest period between two syncs in `serve`: each one reads (or, for a
/// URL, clones) the whole repository.
pub const MIN_SYNC_INTERVAL: Duration = Duration::from_secs(1);

/// Where a sync reads from.
#[derive(Debug, Clone)]
pub struct SyncSettings {
    /// The repository to read.
    pub source: GitPolicySource,
    /// Repository (password redacted), ref and directory, for messages and
    /// the audit log.
    pub label: String,
}

/// Why sync settings were refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SettingsError {
    /// The repository URL carries a password.
    #[error("the policy repository URL must not contain a password: use a git credential helper or an SSH key")]
    PasswordInUrl,
}

impl SyncSettings {
    /// Settings for `repo` at `git_ref`, reading `subdir` (all of the
    /// repository when `None` or `/`), cloning URLs under `cache_dir`.
    pub fn new(
        repo: &str,
        git_ref: String,
        subdir: Option<String>,
        cache_dir: PathBuf,
    ) -> Result<SyncSettings, SettingsError> {
        if redact_url(repo) != repo {
            // gix may repeat the URL in its errors, and the label goes to the
            // audit log: a password in it would leak. Git's credential
            // helpers (or an SSH key) keep it out of both.
            return Err(SettingsError::PasswordInUrl);
        }
        let subdir = subdir.filter(|p| !p.trim_matches('/').is_empty());
        let mut label = format!("{}@{git_ref}", redact_url(repo));
        if let Some(dir) = &subdir {
            label.push_str(&format!(":{dir}"));
        }
        Ok(SyncSettings {
            source: GitPolicySource {
                location: RepoLocation::parse(repo),
                git_ref,
                subdir,
                cache_dir,
            },
            label,
        })
    }
}

/// Why a sync did not run to the end.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    /// The repository could not be read; nothing was stored.
    #[error("cannot read policies from {label}")]
    Read {
        /// Repository, ref and directory.
        label: String,
        /// What git said.
        #[source]
        source: GitSourceError,
    },
    /// The blocking git reader panicked or was cancelled.
    #[error("the git reader for {label} stopped before finishing")]
    Reader {
        /// Repository, ref and directory.
        label: String,
        /// Why it stopped.
        #[source]
        source: tokio::task::JoinError,
    },
    /// The database refused the outcome or could not be reached.
    #[error("cannot store the policy sync of {label}")]
    Store {
        /// Repository, ref and directory.
        label: String,
        /// The datastore error.
        #[source]
        source: DbError,
    },
}

/// What one sync decided and stored.
#[derive(Debug, Clone)]
pub struct SyncOutcome {
    /// The decision, with the full diagnostics.
    pub report: SyncReport,
    /// What was handed to the database.
    pub record: PolicySync,
    /// Whether the database audited it (an idle sync is not).
    pub recorded: RecordedSync,
    /// The RMA criteria in force after the sync, and the files refused.
    pub criteria: CriteriaPlan,
}

/// Reads the policies at the configured ref, decides against what is in
/// force now, and stores the outcome. A refused file is part of a
/// successful sync; only an unreadable repository or a database failure is
/// an error.
pub async fn sync_once(db: &Db, settings: &SyncSettings, actor: &str) -> Result<SyncOutcome, SyncError> {
    let store_err = |source| SyncError::Store {
        label: settings.label.clone(),
        source,
    };
    let previous: BTreeMap<String, InForce> = db
        .policies_in_force()
        .await
        .map_err(store_err)?
        .into_iter()
        .map(|p| {
            let v = p.version;
            let entry = InForce {
                name: v.name.clone(),
                path: v.path,
                commit_id: v.commit_id,
                blob_id: v.blob_id,
                source: v.content,
            };
            (v.name, entry)
        })
        .collect();
    // gix is blocking; keep it off the async workers.
    let source = settings.source.clone();
    let snapshot = tokio::task::spawn_blocking(move || source.read())
        .await
        .map_err(|source| SyncError::Reader {
            label: settings.label.clone(),
            source,
        })?
        .map_err(|source| SyncError::Read {
            label: settings.label.clone(),
            source,
        })?;
    let report = plan_sync(&previous, &snapshot);
    let record = to_record(&settings.label, &report);
    let recorded = db.record_policy_sync(&record, actor).await.map_err(store_err)?;
    let offered = snapshot.criteria_candidates();
    let criteria = plan_criteria(&db.rma_criteria_files().await.map_err(store_err)?, &offered);
    if criteria.changed {
        db.replace_rma_criteria(&criteria.in_force, actor)
            .await
            .map_err(store_err)?;
    }
    Ok(SyncOutcome {
        report,
        record,
        recorded,
        criteria,
    })
}

fn to_record(label: &str, report: &SyncReport) -> PolicySync {
    PolicySync {
        source: label.to_owned(),
        commit_id: report.commit_id.clone(),
        in_force: report
            .in_force
            .values()
            .map(|p| SyncedPolicy {
                name: p.name.clone(),
                path: p.path.clone(),
                commit_id: p.commit_id.clone(),
                blob_id: p.blob_id.clone(),
                content: p.source.clone(),
            })
            .collect(),
        changed: report.changed.clone(),
        removed: report.removed.clone(),
        rejected: report
            .rejected
            .iter()
            .map(|r| RejectedPolicyFile {
                path: r.path.clone(),
                blob_id: r.blob_id.clone(),
                diagnostics: r.diagnostics.clone(),
                kept: r.kept.as_ref().map(|k| k.name.clone()),
            })
            .collect(),
        warnings: report.warnings.clone(),
    }
}

/// Why a sync interval was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IntervalError {
    /// Not a duration.
    #[error(transparent)]
    Parse(#[from] DurationError),
    /// Negative, or beyond what a timer can wait.
    #[error("{0}")]
    OutOfRange(String),
    /// Shorter than [`MIN_SYNC_INTERVAL`].
    #[error("must be at least {}s", MIN_SYNC_INTERVAL.as_secs())]
    TooShort,
}

/// The period of a periodic sync, from its text (`30s`, `5m`).
pub fn sync_interval(text: &str) -> Result<Duration, IntervalError> {
    let interval = parse_duration(text)?
        .to_std()
        .map_err(|e| IntervalError::OutOfRange(e.to_string()))?;
    if interval < MIN_SYNC_INTERVAL {
        return Err(IntervalError::TooShort);
    }
    Ok(interval)
}

/// Syncs once at once, then once per `interval`, until `shutdown` resolves,
/// acting as `actor` in the audit log. A failed sync is logged and retried
/// at the next interval; it never stops the caller.
pub async fn periodic_sync(
    db: Db,
    settings: SyncSettings,
    interval: Duration,
    actor: &str,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    tokio::pin!(shutdown);
    let mut ticker = tokio::time::interval(interval);
    // A slow clone must not be followed by a burst of catch-up syncs.
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            _ = ticker.tick() => {}
        }
        // Dropping a sync half-way on shutdown is safe: its transaction
        // rolls back and the next start syncs again.
        let outcome = tokio::select! {
            () = &mut shutdown => break,
            outcome = sync_once(&db, &settings, actor) => outcome,
        };
        match outcome {
            Ok(outcome) => log_outcome(&outcome),
            Err(err) => {
                tracing::error!(
                    error = orchestrator_types::error_chain(&err),
                    "policy sync failed; retrying at the next interval"
                );
            }
        }
    }
    tracing::info!("policy sync stopped");
}

fn log_outcome(outcome: &SyncOutcome) {
    let report = &outcome.report;
    if !outcome.recorded.audited {
        // Same commit as last time: its refusals were logged then.
        tracing::debug!(commit = %report.commit_id, "policies unchanged");
        return;
    }
    for r in &report.rejected {
        tracing::warn!(
            commit = %report.commit_id,
            path = %r.path,
            kept = r.kept.as_ref().map(|k| k.commit_id.as_str()),
            diagnostics = %r.diagnostics.join("\n"),
            "policy file rejected; the last good version stays in force"
        );
    }
    tracing::info!(
        commit = %report.commit_id,
        changed = ?report.changed,
        removed = ?report.removed,
        rejected = report.rejected.len(),
        "policies synced"
    );
}
