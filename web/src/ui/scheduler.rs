//! The workload scheduler on the pages: each drain Waveguard made (and each
//! step the scheduler kept out of a wave) in words, the capacity the next
//! wave takes out of service, and the banners for drains no record explains
//! and for a scheduler that cannot be read.
//!
//! Everything here reads what the engine stored (`orchestrator_db::drains`,
//! the steps, the controller's status); nothing asks the scheduler, so a
//! page costs the same whether the scheduler answers or not. A stored
//! scheduler reading that does not parse reads as no reading at all, never
//! as raw JSON and never as an error page.

use std::collections::{BTreeMap, HashMap, HashSet};

use chrono::{DateTime, Utc};
use minijinja::{Value, context};
use orchestrator_db::drains::DrainRow;
use orchestrator_db::execution::{ExecStep, ExecWave, StepFilter, StepState, WaveKind, WaveState};
use orchestrator_db::{Db, DbError};
use orchestrator_engine::ControllerStatus;
use orchestrator_types::{DrainPhase, NodeId, RolloutId, WaveId};
use serde::Deserialize;

use crate::AppState;

/// Rows of the rollout page's scheduler table; a rollout over a whole
/// fleet would otherwise re-render thousands of rows on every live update.
const ROLLOUT_ROWS_SHOWN: usize = 500;
/// Drains listed on a node's page, newest first.
const NODE_ROWS_SHOWN: usize = 100;
/// Orphaned drains named in the banner; the count stays exact.
const ORPHANS_NAMED: usize = 20;
/// Clusters named in the capacity line of a wave.
const CLUSTERS_NAMED: usize = 5;

/// The part of a stored scheduler reading (`orchestrator_scheduler`'s
/// `NodeState`, serialized) that the pages use. Every field is optional so
/// that a reading written by another version still shows what it can.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct Seen {
    base: Option<String>,
    drain: Option<bool>,
    responding: Option<bool>,
    completing: Option<bool>,
    alloc_cpus: Option<u64>,
    reason: Option<SeenReason>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct SeenReason {
    text: Option<String>,
    set_by: Option<String>,
}

fn seen(row: &DrainRow) -> Option<Seen> {
    // serde would read a struct from an array too; only an object is a
    // reading.
    row.last_seen
        .as_ref()
        .filter(|value| value.is_object())
        .and_then(|value| serde_json::from_value(value.clone()).ok())
}

/// A drain's state in words: `kind` names the CSS class, `short` is the
/// phase (node page, next to the close reason), `full` adds why (rollout
/// page).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DrainWords {
    pub kind: &'static str,
    pub short: String,
    pub full: String,
}

impl DrainWords {
    fn new(kind: &'static str, short: impl Into<String>, detail: Option<String>) -> Self {
        let short = short.into();
        let full = match &detail {
            Some(d) if !d.is_empty() => format!("{short}: {d}"),
            _ => short.clone(),
        };
        Self { kind, short, full }
    }

    fn plain(kind: &'static str, text: impl Into<String>) -> Self {
        let text = text.into();
        Self {
            kind,
            short: text.clone(),
            full: text,
        }
    }
}

/// Waiting for a held node to empty, as its last reading says.
fn before_flash(seen: Option<&Seen>) -> DrainWords {
    let unknown = || DrainWords::plain("draining", "draining (no scheduler reading yet)");
    let Some(seen) = seen else {
        return unknown();
    };
    if seen.responding == Some(false) {
        return DrainWords::plain("draining", "drained, but its node daemon does not respond");
    }
    let Some(drain) = seen.drain else {
        return unknown();
    };
    if seen.base.as_deref() == Some("down") {
        return DrainWords::plain("draining", "down in the workload scheduler");
    }
    if !drain {
        return DrainWords::plain("draining", "no longer drained in the workload scheduler");
    }
    let cpus = seen.alloc_cpus.unwrap_or(0);
    if cpus > 0 {
        let unit = if cpus == 1 { "CPU" } else { "CPUs" };
        return DrainWords::plain("draining", format!("draining ({cpus} {unit} still allocated)"));
    }
    if seen.completing == Some(true) {
        return DrainWords::plain("draining", "draining (jobs completing)");
    }
    if matches!(seen.base.as_deref(), Some("allocated" | "mixed")) {
        return DrainWords::plain("draining", "draining (jobs still running)");
    }
    DrainWords::plain("drained", "drained, waiting to flash")
}

/// Words for one of Waveguard's drains, from its phase, its last reading
/// and its step's state (`None` when not read: only the phases before the
/// resume need it).
pub(crate) fn drain_words(row: &DrainRow, step: Option<StepState>) -> DrainWords {
    match row.phase {
        DrainPhase::DrainIntended => DrainWords::plain("draining", "drain requested, not yet confirmed"),
        DrainPhase::Held => match step {
            Some(state) if state.is_in_flight() => {
                if state == StepState::Flashing {
                    DrainWords::plain("flashing", "flashing")
                } else {
                    DrainWords::plain("flashing", format!("flashing ({state})"))
                }
            }
            Some(state) if state.is_terminal() => DrainWords::plain("resuming", "resuming"),
            _ => before_flash(seen(row).as_ref()),
        },
        DrainPhase::ResumeIntended => match row.close_reason.as_deref() {
            Some("drain_timeout") => DrainWords::plain("resuming", "resuming (did not empty in time)"),
            _ => DrainWords::plain("resuming", "resuming"),
        },
        DrainPhase::Quarantined => DrainWords::new(
            "quarantined",
            "quarantined",
            Some(row.close_reason.clone().unwrap_or_else(|| "no reason recorded".into())),
        ),
        DrainPhase::Closed => match row.close_reason.as_deref() {
            Some("resumed") => DrainWords::plain("in_service", "in service again (resumed)"),
            Some(reason) => {
                let why = reason.strip_prefix("taken_over: ").unwrap_or(reason);
                DrainWords::new("left_alone", "left alone", Some(why.to_owned()))
            }
            None => DrainWords::plain("left_alone", "closed"),
        },
    }
}

/// Words for a step the scheduler kept out of its wave without a drain of
/// Waveguard's behind it (someone else's drain, a node the scheduler does
/// not know): its reason is the step's error.
pub(crate) fn deferred_words(error: Option<&str>) -> DrainWords {
    DrainWords::new(
        "left_alone",
        "left alone",
        Some(error.unwrap_or("no reason recorded").to_owned()),
    )
}

/// Who drained the node, as far as the records tell: Waveguard, and the
/// scheduler user it ran as when the reading shows Waveguard's tag.
fn drained_by(row: &DrainRow) -> String {
    let set_by = seen(row).and_then(|s| s.reason).and_then(|r| {
        let ours = r.text.as_deref().is_some_and(|t| t.trim() == row.reason_text.trim());
        r.set_by.filter(|_| ours)
    });
    match set_by {
        Some(user) => format!("Waveguard (as {user} in {})", row.scheduler_kind),
        None => "Waveguard".to_owned(),
    }
}

/// When the drain entered its current phase.
fn since(row: &DrainRow) -> DateTime<Utc> {
    match row.phase {
        DrainPhase::DrainIntended => row.drain_started_at,
        DrainPhase::Held => row.held_at.unwrap_or(row.drain_started_at),
        DrainPhase::ResumeIntended => row.resume_intended_at.unwrap_or(row.updated_at),
        DrainPhase::Quarantined => row.updated_at,
        DrainPhase::Closed => row.closed_at.unwrap_or(row.updated_at),
    }
}

/// The state of each step a drain's words depend on (before the resume).
async fn step_states(db: &Db, rows: &[DrainRow]) -> Result<HashMap<i64, StepState>, DbError> {
    let mut out = HashMap::new();
    for row in rows
        .iter()
        .filter(|r| matches!(r.phase, DrainPhase::DrainIntended | DrainPhase::Held))
    {
        match db.step(row.step_id).await {
            Ok(step) => {
                out.insert(row.step_id.0, step.state);
            }
            // A record whose step is gone still shows, from its own phase.
            Err(DbError::NotFound { .. }) => {}
            Err(err) => return Err(err),
        }
    }
    Ok(out)
}

/// The rollout page's scheduler table: every node the rollout drained or
/// left out because of its scheduler, those still owed something first,
/// and whether rows were left off.
pub(crate) async fn rollout_rows(
    db: &Db,
    rollout: RolloutId,
    waves: &[ExecWave],
) -> Result<(Vec<Value>, bool), DbError> {
    let drains = db.rollout_drains(rollout).await?;
    let deferred = db
        .steps(&StepFilter {
            rollout_id: Some(rollout),
            state: Some(StepState::Deferred),
            ..Default::default()
        })
        .await?;
    if drains.is_empty() && deferred.is_empty() {
        return Ok((Vec::new(), false));
    }
    let wave_names: HashMap<WaveId, &str> = waves.iter().map(|w| (w.id, w.name.as_str())).collect();
    let deferred_by_step: HashMap<i64, &ExecStep> = deferred.iter().map(|s| (s.id.0, s)).collect();
    let drained_steps: HashSet<i64> = drains.iter().map(|d| d.step_id.0).collect();
    let states = step_states(db, &drains).await?;
    let mut ids: Vec<NodeId> = drains.iter().map(|d| d.node_id).collect();
    ids.extend(deferred.iter().map(|s| s.node_id));
    ids.sort_unstable();
    ids.dedup();
    let names = db.node_names(&ids).await?;
    let name_of = |id: NodeId| names.get(&id).cloned().unwrap_or_else(|| id.to_string());

    // Keyed (group, order): drains still owed something, then closed
    // ones, then steps left out without a drain of ours.
    let mut rows: Vec<((u8, i64), Value)> = Vec::new();
    for row in &drains {
        let words = drain_words(row, states.get(&row.step_id.0).copied());
        // The step's own reason, unless the words already say it.
        let deferred = deferred_by_step
            .get(&row.step_id.0)
            .and_then(|s| s.error.clone())
            .filter(|e| !words.full.contains(e.as_str()));
        let group = u8::from(row.phase == DrainPhase::Closed);
        rows.push((
            (group, row.id),
            context! {
                node => name_of(row.node_id), scheduler_node => row.scheduler_node.clone(),
                wave => wave_names.get(&row.wave_id).copied().unwrap_or(""),
                kind => words.kind, state => words.full,
                by => drained_by(row), tag => row.reason_text.clone(), deferred,
                since => since(row).to_rfc3339(),
            },
        ));
    }
    for step in deferred.iter().filter(|s| !drained_steps.contains(&s.id.0)) {
        let words = deferred_words(step.error.as_deref());
        rows.push((
            (2, step.id.0),
            context! {
                node => name_of(step.node_id), scheduler_node => (),
                wave => wave_names.get(&step.wave_id).copied().unwrap_or(""),
                kind => words.kind, state => words.full,
                by => "not drained by Waveguard", tag => (), deferred => (),
                since => step.finished_at.unwrap_or(step.updated_at).to_rfc3339(),
            },
        ));
    }
    rows.sort_by_key(|(key, _)| *key);
    let truncated = rows.len() > ROLLOUT_ROWS_SHOWN;
    Ok((
        rows.into_iter().take(ROLLOUT_ROWS_SHOWN).map(|(_, v)| v).collect(),
        truncated,
    ))
}

/// A node's drain history for its page, newest first.
pub(crate) async fn node_rows(db: &Db, node: NodeId) -> Result<Vec<Value>, DbError> {
    let mut drains = db.node_drains(node).await?;
    drains.truncate(NODE_ROWS_SHOWN);
    let states = step_states(db, &drains).await?;
    Ok(drains
        .iter()
        .map(|row| {
            let words = drain_words(row, states.get(&row.step_id.0).copied());
            let (back_at, back_label) = match (row.closed_at, row.resume_intended_at) {
                (Some(at), _) if row.close_reason.as_deref() == Some("resumed") => (Some(at), "resumed"),
                (Some(at), _) => (Some(at), "closed"),
                (None, Some(at)) => (Some(at), "resume started"),
                (None, None) => (None, ""),
            };
            context! {
                rollout => row.rollout_id.0, scheduler_node => row.scheduler_node.clone(),
                scheduler_kind => row.scheduler_kind.clone(),
                kind => words.kind, state => words.short, by => drained_by(row), tag => row.reason_text.clone(),
                drained_at => row.drain_started_at.to_rfc3339(), held_at => row.held_at.map(|t| t.to_rfc3339()),
                back_at => back_at.map(|t| t.to_rfc3339()), back_label,
                close_reason => row.close_reason.clone(),
            }
        })
        .collect())
}

/// The banners about the controller's own condition for the pages that
/// show them: flashing paused by a fault of the controller's own, drains
/// carrying Waveguard's tag without a record, and a scheduler that cannot
/// be read. Empty when this process runs no engine.
pub(crate) fn banners(state: &AppState) -> Vec<String> {
    state
        .engine_nudge
        .as_ref()
        .map(|nudge| banner_lines(&nudge.controller_status()))
        .unwrap_or_default()
}

fn banner_lines(status: &ControllerStatus) -> Vec<String> {
    let mut out = Vec::new();
    if status.degraded {
        // The reason is an error kind or OS label, never a secret.
        out.push(format!(
            "The controller is degraded ({}): new flashes are paused until it recovers; no node is charged for it",
            status.reason.as_deref().unwrap_or("a fault of its own")
        ));
    }
    if !status.orphaned_drains.is_empty() {
        let n = status.orphaned_drains.len();
        let mut names = status
            .orphaned_drains
            .iter()
            .take(ORPHANS_NAMED)
            .map(String::as_str)
            .collect::<Vec<_>>()
            .join(", ");
        if n > ORPHANS_NAMED {
            names.push_str(&format!(" and {} more", n - ORPHANS_NAMED));
        }
        out.push(format!(
            "{n} node(s) are drained with a Waveguard reason but Waveguard has no record of draining them: \
             {names}; Waveguard will not resume them"
        ));
    }
    if let Some(error) = &status.scheduler_error {
        out.push(format!(
            "The workload scheduler cannot be read: {}; nothing is drained or resumed",
            redact(error)
        ));
    }
    out
}

/// Parts of a token whose value is a credential (`--password=x`,
/// `access_token=x`, `Authorization: Bearer x`).
const SECRET_KEYS: &[&str] = &[
    "pass",
    "pwd",
    "secret",
    "token",
    "apikey",
    "api_key",
    "api-key",
    "auth",
    "credential",
    "session",
    "cookie",
    "private",
];

fn is_secret_key(key: &str) -> bool {
    let key = key
        .trim_matches(|c: char| !c.is_ascii_alphanumeric() && c != '_' && c != '-')
        .to_ascii_lowercase();
    !key.is_empty() && SECRET_KEYS.iter().any(|s| key.contains(s))
}

/// One whitespace-free token with URL credentials and secret-named values
/// blanked.
fn redact_token(token: &str) -> String {
    if token.starts_with(crate::auth::API_TOKEN_PREFIX) && token.len() > 8 {
        return "<redacted>".into();
    }
    let mut out = String::new();
    let mut rest = token;
    if let Some(i) = rest.find("://") {
        let authority = &rest[i + 3..];
        let end = authority.find(['/', '?', '#']).unwrap_or(authority.len());
        if let Some(at) = authority[..end].rfind('@') {
            out.push_str(&rest[..i + 3]);
            out.push_str("<redacted>");
            rest = &authority[at..];
        }
    }
    // `a=1&token=x;b=2`: each segment on its own.
    let mut segment_start = 0;
    for (i, c) in rest.char_indices().chain(std::iter::once((rest.len(), '&'))) {
        if !matches!(c, '?' | '&' | ';' | ',') {
            continue;
        }
        let segment = &rest[segment_start..i];
        match segment.split_once(['=', ':']) {
            Some((key, _)) if !segment.contains("://") && is_secret_key(key) => {
                out.push_str(&segment[..key.len() + 1]);
                out.push_str("<redacted>");
            }
            _ => out.push_str(segment),
        }
        if i < rest.len() {
            out.push(c);
        }
        segment_start = i + c.len_utf8();
    }
    out
}

/// A scheduler's error text (it quotes a command's standard error) with
/// anything that looks like a credential blanked, for the pages: a
/// command adapter's wrapper may well print the URL or token it used.
/// Whitespace is collapsed to single spaces.
pub(crate) fn redact(text: &str) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut redact_next = false;
    for token in text.split_whitespace() {
        let lower = token.to_ascii_lowercase();
        let scheme = matches!(lower.as_str(), "bearer" | "basic" | "token");
        if redact_next {
            out.push("<redacted>".into());
            redact_next = scheme;
            continue;
        }
        if scheme {
            out.push(token.to_owned());
            redact_next = true;
            continue;
        }
        if (token.ends_with(':') || token.ends_with('=')) && is_secret_key(&token[..token.len() - 1]) {
            out.push(token.to_owned());
            redact_next = true;
            continue;
        }
        out.push(redact_token(token));
    }
    out.join(" ")
}

/// The most GPUs of one cluster a wave can hold out of service at once:
/// no more than its `at_once` largest nodes there, and no more than the
/// cap allows — except that one node may always go when nothing else is
/// out (the engine's rule, so a cap smaller than a node does not stall).
///
/// Exact when the nodes are alike (the usual case); with nodes of
/// different sizes it is the cap itself, an upper bound.
pub(crate) fn capacity_bound(node_gpus: &[u64], at_once: usize, cap_percent: f64, total: u64) -> u64 {
    let at_once = at_once.max(1);
    // Hundredths of a percent, rounded down, as the engine counts.
    let cap_centi = (cap_percent.clamp(0.0, 100.0) * 100.0).floor() as u128;
    let cap = u64::try_from(cap_centi * u128::from(total) / 10_000).unwrap_or(u64::MAX);
    if let Some(&size) = node_gpus.first()
        && size > 0
        && node_gpus.iter().all(|&g| g == size)
    {
        let fit = usize::try_from(cap / size).unwrap_or(usize::MAX).max(1);
        let nodes = fit.min(at_once).min(node_gpus.len());
        return size.saturating_mul(u64::try_from(nodes).unwrap_or(u64::MAX));
    }
    let mut sorted = node_gpus.to_vec();
    sorted.sort_unstable_by(|a, b| b.cmp(a));
    let by_count = sorted.iter().take(at_once).fold(0u64, |a, b| a.saturating_add(*b));
    let largest = sorted.first().copied().unwrap_or(0);
    by_count.min(cap.max(largest))
}

/// For each update wave whose approval starts another one, what that next
/// wave takes out of service at once, when the rollout's policy caps the
/// capacity out of service (`concurrency.max_out_of_service_percent`).
/// Empty otherwise, and when the policy text no longer parses.
pub(crate) async fn next_wave_capacity(
    db: &Db,
    rollout: RolloutId,
    waves: &[ExecWave],
) -> Result<HashMap<WaveId, String>, DbError> {
    let mut out = HashMap::new();
    let source = db.exec_rollout(rollout).await?.policy_source.unwrap_or_default();
    let Ok(policy) = orchestrator_policy::parse_policy(&source) else {
        return Ok(out);
    };
    let Some(cap) = policy.concurrency.max_out_of_service_percent else {
        return Ok(out);
    };
    let mut updates: Vec<&ExecWave> = waves.iter().filter(|w| w.kind == WaveKind::Update).collect();
    updates.sort_by_key(|w| w.position);
    let pairs: Vec<(&ExecWave, &ExecWave)> = updates
        .windows(2)
        .filter_map(|pair| match pair {
            // Only a wave that can still be approved has a box to show
            // it in; the others would cost a read of the whole fleet.
            [this, next]
                if this.approvals_required > 0
                    && !matches!(
                        this.state,
                        WaveState::Promoted | WaveState::Halted | WaveState::RolledBack
                    ) =>
            {
                Some((*this, *next))
            }
            _ => None,
        })
        .collect();
    if pairs.is_empty() {
        return Ok(out);
    }
    let gpus = db.gpu_weights().await?;
    let clusters = db.node_clusters().await?;
    let mut cluster_gpus: HashMap<&str, u64> = HashMap::new();
    let mut cluster_nodes: HashMap<&str, u64> = HashMap::new();
    for (node, cluster) in &clusters {
        *cluster_gpus.entry(cluster.as_str()).or_default() += gpus.get(node).copied().unwrap_or(1);
        *cluster_nodes.entry(cluster.as_str()).or_default() += 1;
    }
    for (this, next) in pairs {
        let steps = db
            .steps(&StepFilter {
                rollout_id: Some(rollout),
                wave_id: Some(next.id),
                ..Default::default()
            })
            .await?;
        let nodes: HashSet<i64> = steps.iter().map(|s| s.node_id.0).collect();
        let mut by_cluster: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
        for node in &nodes {
            let cluster = clusters.get(node).map_or("", String::as_str);
            by_cluster
                .entry(cluster)
                .or_default()
                .push(gpus.get(node).copied().unwrap_or(1));
        }
        let wave_cap = usize::try_from(next.max_in_flight.max(1)).unwrap_or(1);
        let at_once = wave_cap.min(usize::try_from(policy.concurrency.max_in_flight.max(1)).unwrap_or(usize::MAX));
        let mut parts = Vec::new();
        for (cluster, node_gpus) in by_cluster.iter().take(CLUSTERS_NAMED) {
            let total = cluster_gpus.get(cluster).copied().unwrap_or(0);
            let mut here = at_once;
            if let Some(percent) = policy.concurrency.per_cluster_percent {
                let size = cluster_nodes.get(cluster).copied().unwrap_or(0) as f64;
                here = here.min(((size * percent / 100.0).floor() as usize).max(1));
            }
            let bound = capacity_bound(node_gpus, here, cap, total);
            let share = bound.saturating_mul(100).checked_div(total).unwrap_or(0);
            let unit = if total == 1 { "GPU" } else { "GPUs" };
            parts.push(format!(
                "at most {bound} of {total} {unit} ({share}%) in cluster {}",
                if cluster.is_empty() { "(none)" } else { cluster }
            ));
        }
        if by_cluster.len() > CLUSTERS_NAMED {
            parts.push(format!("and {} more clusters", by_cluster.len() - CLUSTERS_NAMED));
        }
        let text = format!(
            "Approving starts wave {}: {} node(s), at most {at_once} at a time. Out of service at once \
             (drained, draining or flashing), under the policy's cap of {cap}% of a cluster's GPUs: {}.",
            next.name,
            nodes.len(),
            parts.join("; ")
        );
        out.insert(this.id, text);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;
    use proptest::prelude::*;
    use serde_json::json;

    fn row(phase: DrainPhase, last_seen: Option<serde_json::Value>, close: Option<&str>) -> DrainRow {
        let at = Utc.with_ymd_and_hms(2026, 12, 2, 12, 0, 0).unwrap();
        DrainRow {
            id: 1,
            rollout_id: RolloutId(7),
            wave_id: WaveId(1),
            step_id: orchestrator_types::StepId(1),
            node_id: NodeId(1),
            scheduler_kind: "slurm".into(),
            scheduler_node: "n1".into(),
            phase,
            reason_text: "waveguard rollout=7 firmware maintenance".into(),
            observed_before: None,
            last_seen,
            drain_started_at: at,
            held_at: None,
            resume_intended_at: None,
            closed_at: None,
            close_reason: close.map(str::to_owned),
            updated_at: at,
        }
    }

    fn reading(base: &str, drain: bool, alloc_cpus: u64) -> serde_json::Value {
        json!({
            "name": "n1", "base": base, "drain": drain, "responding": true, "completing": false,
            "reboot_pending": false, "alloc_cpus": alloc_cpus,
            "reason": { "text": "waveguard rollout=7 firmware maintenance", "set_by": "root", "set_at": 1 },
            "boot_time": 1,
        })
    }

    #[test]
    fn each_phase_reads_as_words() {
        let pending = Some(StepState::Pending);
        let cases = [
            (
                row(DrainPhase::Held, Some(reading("mixed", true, 16)), None),
                pending,
                "draining (16 CPUs still allocated)",
            ),
            (
                row(DrainPhase::Held, Some(reading("idle", true, 0)), None),
                pending,
                "drained, waiting to flash",
            ),
            (
                row(DrainPhase::Held, Some(reading("idle", true, 0)), None),
                Some(StepState::Flashing),
                "flashing",
            ),
            (
                row(DrainPhase::Held, Some(reading("idle", true, 0)), None),
                Some(StepState::Verifying),
                "flashing (verifying)",
            ),
            (row(DrainPhase::ResumeIntended, None, None), None, "resuming"),
            (
                row(DrainPhase::Closed, None, Some("resumed")),
                None,
                "in service again (resumed)",
            ),
            (
                row(DrainPhase::Quarantined, None, Some("GPU 3 missing")),
                None,
                "quarantined: GPU 3 missing",
            ),
            (
                row(
                    DrainPhase::Closed,
                    None,
                    Some("taken_over: drained by someone else in the workload scheduler: \"hw\""),
                ),
                None,
                "left alone: drained by someone else in the workload scheduler: \"hw\"",
            ),
            // A reading that is not what this version wrote still shows.
            (
                row(DrainPhase::Held, Some(json!(["garbage"])), None),
                pending,
                "draining (no scheduler reading yet)",
            ),
            (
                row(DrainPhase::Held, Some(json!({ "responding": false })), None),
                pending,
                "drained, but its node daemon does not respond",
            ),
        ];
        for (row, step, want) in cases {
            assert_eq!(drain_words(&row, step).full, want, "{row:?}");
        }
        assert_eq!(
            deferred_words(Some("down in the workload scheduler: \"psu\"")).full,
            "left alone: down in the workload scheduler: \"psu\""
        );
    }

    #[test]
    fn who_drained_comes_from_the_reading_only_when_it_carries_our_tag() {
        let ours = row(DrainPhase::Held, Some(reading("idle", true, 0)), None);
        assert_eq!(drained_by(&ours), "Waveguard (as root in slurm)");
        let mut other = reading("idle", true, 0);
        other["reason"]["text"] = json!("someone else's");
        assert_eq!(drained_by(&row(DrainPhase::Held, Some(other), None)), "Waveguard");
    }

    #[test]
    fn credentials_in_scheduler_errors_are_blanked() {
        let cases = [
            (
                "curl https://bot:hunter2@hooks.example/drain?token=abc123&node=n1 failed",
                "curl https://<redacted>@hooks.example/drain?token=<redacted>&node=n1 failed",
            ),
            (
                "wrapper --password=hunter2 exited",
                "wrapper --password=<redacted> exited",
            ),
            (
                "Authorization: Bearer abc.def exit 1",
                "Authorization: <redacted> <redacted> exit 1",
            ),
            ("api_key: s3cr3t then", "api_key: <redacted> then"),
            ("used wg_0123456789abcdef", "used <redacted>"),
            (
                "scontrol update exited with exit status: 1: slurm_update error: Invalid node name",
                "scontrol update exited with exit status: 1: slurm_update error: Invalid node name",
            ),
        ];
        for (input, want) in cases {
            assert_eq!(redact(input), want, "{input}");
        }
    }

    proptest! {
        #[test]
        fn redaction_never_panics_and_never_shows_a_url_password(text in "\\PC{0,80}", secret in "[a-z0-9]{6,12}") {
            let _ = redact(&text);
            let url = format!("{text} https://u:{secret}@h/p");
            let shown = format!(":{}@", secret);
            prop_assert!(!redact(&url).contains(&shown));
        }
    }

    #[test]
    fn capacity_is_bounded_by_the_cap_and_by_the_nodes_at_once() {
        // 8 nodes of 8 GPUs in a 64-GPU cluster, 2 at once, cap 25%: 16.
        assert_eq!(capacity_bound(&[8; 8], 2, 25.0, 64), 16);
        // Cap 10% of 64 is 6 GPUs, less than a node: one node may still go.
        assert_eq!(capacity_bound(&[8; 8], 4, 10.0, 64), 8);
        // The cap binds before the count does.
        assert_eq!(capacity_bound(&[8; 8], 8, 25.0, 64), 16);
        // Whole nodes: 20% of 80 is 20 GPUs, two 8-GPU nodes.
        assert_eq!(capacity_bound(&[8; 3], 3, 20.0, 80), 16);
        // Mixed sizes: the cap (16) bounds the 4 + 8 + 8 the count allows.
        assert_eq!(capacity_bound(&[4, 8, 8], 3, 25.0, 64), 16);
        assert_eq!(capacity_bound(&[], 2, 25.0, 0), 0);
        assert_eq!(capacity_bound(&[1, 1, 1], 5, f64::NAN, 3), 1);
    }

    #[test]
    fn banners_name_orphaned_drains_and_an_unreadable_scheduler_without_secrets() {
        assert!(banner_lines(&ControllerStatus::default()).is_empty());
        let status = ControllerStatus {
            orphaned_drains: vec!["gpu17".into(), "gpu18".into()],
            scheduler_error: Some(
                "/usr/local/bin/wg-sched list exited with exit status: 2: curl https://ops:hunter2@sched.example/ failed"
                    .into(),
            ),
            ..Default::default()
        };
        let lines = banner_lines(&status);
        assert_eq!(
            lines,
            vec![
                "2 node(s) are drained with a Waveguard reason but Waveguard has no record of draining them: \
                 gpu17, gpu18; Waveguard will not resume them"
                    .to_owned(),
                "The workload scheduler cannot be read: /usr/local/bin/wg-sched list exited with exit status: 2: \
                 curl https://<redacted>@sched.example/ failed; nothing is drained or resumed"
                    .to_owned(),
            ]
        );
        let degraded = ControllerStatus {
            degraded: true,
            reason: Some("controller_resource".into()),
            ..Default::default()
        };
        assert_eq!(
            banner_lines(&degraded),
            vec![
                "The controller is degraded (controller_resource): new flashes are paused until it recovers; \
                 no node is charged for it"
                    .to_owned()
            ]
        );
        let many = ControllerStatus {
            orphaned_drains: (0..25).map(|i| format!("n{i}")).collect(),
            ..Default::default()
        };
        assert!(
            banner_lines(&many)[0].contains("n19 and 5 more;"),
            "{:?}",
            banner_lines(&many)
        );
        // The pages show them in the layout, escaped.
        let html = crate::html::render_string(
            "base.html",
            context! { alerts => vec!["<b>1</b> node(s) are drained".to_owned()], me => () },
        )
        .unwrap();
        assert!(
            html.contains("scheduler-alert") && html.contains("&lt;b&gt;1&lt;") && !html.contains("<b>1"),
            "{html}"
        );
    }

    #[test]
    fn an_unavailable_scheduler_blocker_shows_no_credentials() {
        let text = super::super::rollout::describe_blocker(&orchestrator_types::Blocker::SchedulerUnavailable {
            error: "hook https://x:pw@h/ said no".into(),
        });
        assert_eq!(
            text,
            "the workload scheduler to answer (hook https://<redacted>@h/ said no)"
        );
    }
}
