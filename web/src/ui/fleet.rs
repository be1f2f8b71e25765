//! Fleet pages: the dashboard at `/` (compliance of every SKU against its
//! baseline, active rollouts and what they wait on, the qualification of
//! every release, failure rates per firmware version, the replacement
//! pipeline) and the node pages (`/nodes`, paged and filtered by the
//! database; `/nodes/{name}` with its workload scheduler drains and its RMA
//! cases).
//!
//! Every figure comes from an aggregate query or a bounded page, so the
//! pages cost the same on 300 nodes and on 5,000 — except the replacement
//! pipeline, which reads every RMA case: the datastore has no aggregate of
//! cases yet, and they number in the hundreds where nodes are thousands.

use std::collections::{BTreeMap, HashMap};

use axum::Extension;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use chrono::NaiveDate;
use minijinja::{Value, context};
use orchestrator_db::execution::{ExecRollout, ExecWave, StepFilter, StepPurpose, WaveKind, WaveState};
use orchestrator_db::model::Release;
use orchestrator_db::overview::{MAX_NODE_PAGE_ROWS, NodePageQuery, VersionDailyOutcomes};
use orchestrator_db::{AuditFilter, Db};
use orchestrator_types::{FirmwareVersion, NodeState, QualificationState, RolloutId};
use serde::Deserialize;

use super::pages::Flash;
use super::reasons;
use super::rma;
use super::rollout::describe_blocker;
use super::{UiError, base, charts, render, scheduler, v};
use crate::AppState;
use crate::auth::Principal;

/// Nodes per page of `/nodes`.
const NODES_PER_PAGE: u64 = 100;
/// Problem nodes listed on the dashboard; the counts stay exact.
const PROBLEM_NODES_SHOWN: u64 = 20;
/// Days of update outcomes in the failure-rate trends.
const TREND_DAYS: i64 = 14;
/// Steps of one node shown on its page, newest first.
const NODE_STEPS_SHOWN: usize = 100;

/// Where a firmware version stands against its SKU's baseline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Compliance {
    Below,
    At,
    Above,
    /// No baseline for this SKU and component, or a version that does not parse.
    Unknown,
}

impl Compliance {
    fn as_str(self) -> &'static str {
        match self {
            Compliance::Below => "below",
            Compliance::At => "at",
            Compliance::Above => "above",
            Compliance::Unknown => "unknown",
        }
    }
}

/// `version` against `baseline`: equivalent spellings of the baseline are
/// at it (the ordering alone would call `1.2` and `1.2.0` different).
pub(crate) fn compliance(version: &str, baseline: Option<&FirmwareVersion>) -> Compliance {
    let (Some(baseline), Ok(version)) = (baseline, FirmwareVersion::parse(version)) else {
        return Compliance::Unknown;
    };
    if version.is_equivalent(baseline) {
        Compliance::At
    } else if version < *baseline {
        Compliance::Below
    } else {
        Compliance::Above
    }
}

/// The baseline of each (platform SKU, component kind): the release in the
/// `default` qualification state for it. Two defaults for one pair would be
/// an operator's mistake; the newest version wins so the page still answers.
fn baselines(releases: &[Release]) -> HashMap<(String, String), FirmwareVersion> {
    let mut out: HashMap<(String, String), FirmwareVersion> = HashMap::new();
    for release in releases
        .iter()
        .filter(|r| r.qualification_state == QualificationState::Default)
    {
        for sku in &release.platforms {
            let key = (sku.clone(), release.component_kind.as_str().to_owned());
            match out.get(&key) {
                Some(existing) if *existing >= release.version => {}
                _ => {
                    out.insert(key, release.version.clone());
                }
            }
        }
    }
    out
}

/// The wave a rollout is on: the first update wave not promoted, or, once
/// it rolls back, its rollback wave.
pub(crate) fn current_wave(waves: &[ExecWave]) -> Option<&ExecWave> {
    waves.iter().rev().find(|w| w.kind == WaveKind::Rollback).or_else(|| {
        waves
            .iter()
            .find(|w| w.kind == WaveKind::Update && w.state != WaveState::Promoted)
    })
}

/// What a rollout waits on, in words: its own blockers, then its current
/// wave's; nothing once the rollout is no longer active.
pub(crate) fn waiting_on(rollout: &ExecRollout, wave: Option<&ExecWave>) -> Vec<String> {
    // A finished or stopped rollout waits on nothing: blockers stored while
    // it ran ("bake ends ...") are history, not a wait.
    if !rollout.state.is_active() {
        return Vec::new();
    }
    let wave = wave.filter(|w| !w.state.is_closed());
    let mut out: Vec<String> = rollout.blockers.iter().map(describe_blocker).collect();
    if let Some(wave) = wave {
        for blocker in &wave.blockers {
            let text = describe_blocker(blocker);
            if !out.contains(&text) {
                out.push(text);
            }
        }
    }
    out
}

pub(crate) async fn overview(
    State(state): State<AppState>,
    Extension(me): Extension<Principal>,
    Query(flash): Query<Flash>,
) -> Result<Response, UiError> {
    let db = &state.db;
    let now = db.clock().now();
    let counts = db.node_counts().await?;
    let quarantined = db
        .node_page(&NodePageQuery {
            state: Some(NodeState::Quarantined),
            limit: PROBLEM_NODES_SHOWN,
            ..Default::default()
        })
        .await?;
    let unhealthy = db.nodes_with_discovery_errors(PROBLEM_NODES_SHOWN).await?;
    let releases = db.list_releases().await?;
    let baselines = baselines(&releases);

    let mut groups: BTreeMap<(String, String), Vec<(String, u64)>> = BTreeMap::new();
    for row in db.version_distribution().await? {
        groups
            .entry((row.platform_sku, row.kind))
            .or_default()
            .push((row.version, row.nodes));
    }
    let compliance_rows: Vec<Value> = groups
        .into_iter()
        .map(|((sku, kind), mut versions)| {
            let baseline = baselines.get(&(sku.clone(), kind.clone()));
            // Newest first, by the firmware ordering rather than the text.
            versions.sort_by(
                |a, b| match (FirmwareVersion::parse(&a.0), FirmwareVersion::parse(&b.0)) {
                    (Ok(x), Ok(y)) => y.cmp(&x),
                    _ => b.0.cmp(&a.0),
                },
            );
            let total: u64 = versions.iter().map(|(_, n)| n).sum::<u64>().max(1);
            let mut by_status: BTreeMap<&str, u64> = BTreeMap::new();
            let versions: Vec<Value> = versions
                .into_iter()
                .map(|(version, nodes)| {
                    let status = compliance(&version, baseline);
                    *by_status.entry(status.as_str()).or_default() += nodes;
                    let link = format!(
                        "/nodes?platform={}&version={}",
                        crate::url::urlencode(&sku),
                        crate::url::urlencode(&version)
                    );
                    context! { version, nodes, percent => nodes * 100 / total, status => status.as_str(), link }
                })
                .collect();
            let at = by_status.get("at").copied().unwrap_or(0);
            context! {
                platform_sku => sku, kind, versions,
                baseline => baseline.map(|b| b.to_string()),
                at, below => by_status.get("below").copied().unwrap_or(0),
                above => by_status.get("above").copied().unwrap_or(0),
                compliant_percent => at * 100 / total,
            }
        })
        .collect();

    let release_names: HashMap<_, _> = releases
        .iter()
        .map(|r| (r.id, format!("{} {}", r.component_kind, r.version)))
        .collect();
    let mut active = Vec::new();
    for rollout in db.unfinished_rollouts().await? {
        let waves = db.rollout_waves(rollout.id).await?;
        let wave = current_wave(&waves);
        active.push(context! {
            id => rollout.id.0, state => rollout.state.as_str(),
            release => release_names.get(&rollout.release_id).cloned().unwrap_or_default(),
            wave => wave.map(|w| w.name.clone()), wave_state => wave.map(|w| w.state.as_str()),
            waiting_on => waiting_on(&rollout, wave),
            reason => rollout.state_reason.as_deref().map(reasons::plain),
        });
    }

    let qualification: Vec<Value> = releases
        .iter()
        .rev()
        .map(|r| {
            context! {
                id => r.id.0, kind => r.component_kind.as_str(), version => r.version.to_string(),
                platforms => r.platforms.clone(), state => r.qualification_state.as_str(),
                reason => r.state_reason.as_deref().map(reasons::plain),
            }
        })
        .collect();

    let since = (now - chrono::Duration::days(TREND_DAYS - 1)).date_naive();
    let since_at = since.and_hms_opt(0, 0, 0).map_or(now, |d| d.and_utc());
    let outcomes = db.daily_step_outcomes(since_at).await?;
    let trend_svg = charts::failure_trend(&outcomes, since, TREND_DAYS);
    let by_version = version_trends(&db.daily_outcomes_by_version(since_at).await?, since, TREND_DAYS);
    let rma = rma::pipeline(db).await?;
    let days: Vec<String> = (0..TREND_DAYS)
        .map(|i| (since + chrono::Duration::days(i)).format("%m-%d").to_string())
        .collect();

    Ok(render(
        "overview.html",
        context! {
            counts => v(&counts),
            quarantined => v(&quarantined.nodes), quarantined_total => quarantined.total,
            unhealthy => v(&unhealthy),
            compliance => compliance_rows, active, qualification, trend_svg, by_version, days, rma,
            flash => flash.msg, alerts => scheduler::banners(&state),
            ..base(&me, "overview", "Fleet overview")
        },
    ))
}

/// One row per target version: each day's failed share of finished updates
/// (`None` on a day without any), and the totals.
fn version_trends(outcomes: &[VersionDailyOutcomes], since: NaiveDate, days: i64) -> Vec<Value> {
    let mut by_version: BTreeMap<&str, BTreeMap<NaiveDate, (u64, u64)>> = BTreeMap::new();
    for o in outcomes {
        by_version
            .entry(o.version.as_str())
            .or_default()
            .insert(o.day, (o.succeeded, o.failed));
    }
    by_version
        .into_iter()
        .map(|(version, cells)| {
            let (ok, failed) = cells.values().fold((0, 0), |(a, b), (s, f)| (a + s, b + f));
            let daily: Vec<Value> = (0..days)
                .map(|i| {
                    let day = since + chrono::Duration::days(i);
                    match cells.get(&day) {
                        Some((s, f)) if s + f > 0 => context! {
                            finished => s + f, failed => f, percent => f * 100 / (s + f),
                        },
                        _ => context! { finished => 0 },
                    }
                })
                .collect();
            context! {
                version, finished => ok + failed, failed,
                percent => format!("{:.1}", (failed as f64) * 100.0 / ((ok + failed).max(1) as f64)),
                daily,
            }
        })
        .collect()
}

/// The node list's filters, as query parameters.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct NodesQuery {
    name: Option<String>,
    platform: Option<String>,
    state: Option<String>,
    version: Option<String>,
    page: Option<u64>,
    msg: Option<String>,
}

fn non_empty(value: &Option<String>) -> Option<String> {
    value
        .as_deref()
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .map(str::to_owned)
}

pub(crate) async fn nodes(
    State(state): State<AppState>,
    Extension(me): Extension<Principal>,
    Query(query): Query<NodesQuery>,
) -> Result<Response, UiError> {
    let node_state = match non_empty(&query.state) {
        Some(s) => Some(
            s.parse::<NodeState>()
                .map_err(|e| UiError::new(StatusCode::BAD_REQUEST, e.to_string()))?,
        ),
        None => None,
    };
    let page = query.page.unwrap_or(1).max(1);
    let offset = (page - 1).saturating_mul(NODES_PER_PAGE);
    let filter = NodePageQuery {
        name_contains: non_empty(&query.name),
        platform_sku: non_empty(&query.platform),
        state: node_state,
        version: non_empty(&query.version),
        offset,
        limit: NODES_PER_PAGE.min(MAX_NODE_PAGE_ROWS),
    };
    let result = state.db.node_page(&filter).await?;
    let pages = result.total.div_ceil(NODES_PER_PAGE).max(1);
    // The filters again, for the paging links.
    let mut filter_query = String::new();
    for (key, value) in [
        ("name", &filter.name_contains),
        ("platform", &filter.platform_sku),
        ("state", &node_state.map(|s| s.as_str().to_owned())),
        ("version", &filter.version),
    ] {
        if let Some(value) = value {
            filter_query.push_str(&format!("{key}={}&", crate::url::urlencode(value)));
        }
    }
    let first = if result.total == 0 { 0 } else { offset + 1 };
    let last = offset + result.nodes.len() as u64;
    let states: Vec<&str> = NodeState::ALL.iter().map(|s| s.as_str()).collect();
    Ok(render(
        "nodes.html",
        context! {
            nodes => v(&result.nodes), total => result.total, page, pages, first, last,
            prev => (page > 1).then(|| page - 1), next => (page < pages).then(|| page + 1),
            filter_query, states,
            filter => context! {
                name => filter.name_contains, platform => filter.platform_sku,
                state => node_state.map(|s| s.as_str()), version => filter.version,
            },
            flash => query.msg,
            ..base(&me, "nodes", "Nodes")
        },
    ))
}

pub(crate) async fn node(
    State(state): State<AppState>,
    Extension(me): Extension<Principal>,
    Path(name): Path<String>,
) -> Result<Response, UiError> {
    let db = &state.db;
    let node = db.node_by_name(&name).await?;
    let components = db.node_components(node.id).await?;
    let history = node_history(db, node.id).await?;
    let drains = scheduler::node_rows(db, node.id).await?;
    let (rma_cases, rma_holds) = rma::node_cases(db, &node.name).await?;
    let parts = rma::node_parts(db, &node.name).await?;
    let audit = db
        .audit_entries(&AuditFilter {
            subject_type: Some("node".into()),
            subject_id: Some(node.name.clone()),
            limit: Some(50),
            ..Default::default()
        })
        .await?;
    let audit: Vec<Value> = reasons::audit_rows(db, &audit).await?;
    let unhealthy_components = components
        .iter()
        .filter(|c| c.reading.health.as_deref().is_some_and(|h| h != "OK"))
        .count();
    let title = format!("Node {}", node.name);
    Ok(render(
        "node.html",
        context! {
            node => v(&node), components => v(&components), unhealthy_components, history, audit, drains,
            rma_cases, rma_holds, parts,
            alerts => scheduler::banners(&state),
            ..base(&me, "nodes", &title)
        },
    ))
}

/// A node's update and rollback steps, newest first, with their rollouts.
async fn node_history(db: &Db, id: orchestrator_types::NodeId) -> Result<Vec<Value>, UiError> {
    let mut steps = db
        .steps(&StepFilter {
            node_id: Some(id),
            ..Default::default()
        })
        .await?;
    steps.reverse();
    steps.truncate(NODE_STEPS_SHOWN);
    let mut wave_names: HashMap<RolloutId, HashMap<i64, String>> = HashMap::new();
    let mut rows = Vec::new();
    for step in steps {
        if let std::collections::hash_map::Entry::Vacant(slot) = wave_names.entry(step.rollout_id) {
            let waves = db.rollout_waves(step.rollout_id).await?;
            slot.insert(waves.into_iter().map(|w| (w.id.0, w.name)).collect());
        }
        let wave = wave_names
            .get(&step.rollout_id)
            .and_then(|w| w.get(&step.wave_id.0))
            .cloned()
            .unwrap_or_default();
        rows.push(context! {
            rollout => step.rollout_id.0, wave,
            purpose => step.purpose.as_str(), rollback => step.purpose == StepPurpose::Rollback,
            inventory_id => step.inventory_id, from => step.expected_from_version, to => step.target_version,
            previous => step.previous_version, state => step.state.as_str(), attempts => step.attempts,
            error => step.error, started => step.started_at.map(|t| t.to_rfc3339()),
            finished => step.finished_at.map(|t| t.to_rfc3339()),
        });
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fv(text: &str) -> FirmwareVersion {
        FirmwareVersion::parse(text).unwrap()
    }

    #[test]
    fn compliance_against_the_baseline() {
        let baseline = fv("96.00.5E.00.01");
        let cases = [
            ("96.00.5E.00.01", Compliance::At),
            ("96.00.5D.00.09", Compliance::Below),
            ("96.00.61.00.01", Compliance::Above),
        ];
        for (version, expected) in cases {
            assert_eq!(compliance(version, Some(&baseline)), expected, "{version}");
        }
        assert_eq!(compliance("96.00.5E.00.01", None), Compliance::Unknown);
    }

    #[test]
    fn version_trend_rates() {
        let since = NaiveDate::from_ymd_opt(2026, 12, 1).unwrap();
        let rows = version_trends(
            &[VersionDailyOutcomes {
                version: "2".into(),
                day: since,
                succeeded: 3,
                failed: 1,
            }],
            since,
            2,
        );
        assert_eq!(rows.len(), 1);
        let row = &rows[0];
        assert_eq!(row.get_attr("finished").unwrap(), Value::from(4));
        assert_eq!(row.get_attr("percent").unwrap().to_string(), "25.0");
        let daily = row.get_attr("daily").unwrap();
        assert_eq!(daily.len(), Some(2));
    }
}
