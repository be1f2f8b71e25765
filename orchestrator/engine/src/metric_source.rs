//! The health-source seam: one trait, [`MetricSource`], with the Redfish
//! collector's stored samples and Prometheus behind it, both answering the
//! same question for a look of a gate: per watched node and time bin, how
//! many events, over how much exposure, was the node present, and (for
//! level gates) what value per unit. A judge that reads a [`SourceLook`]
//! never asks where the data came from, and the stratified, node-level
//! tests of the detector get node bins from either.
//!
//! The arithmetic that makes Prometheus rate gates right lives here as pure
//! functions, each tested on synthetic series:
//! - a counter ([`counter_window`]): events are the sum of the increases
//!   between consecutive raw samples from the node's first sample at or
//!   after its exposure start; a drop is a reset (driver reload, exporter or
//!   node restart) after which the new value is all new events, as in
//!   PromQL's `increase()` but without its extrapolation to the window's
//!   edges. Exposure is the time between those same samples, so events and
//!   exposure cover exactly the same interval; a gap longer than the
//!   staleness bound adds no exposure (the series was not present) though
//!   the counter still carries what happened in it.
//! - DCGM's windowed XID count ([`windowed_count_events`]):
//!   `DCGM_EXP_XID_ERRORS_COUNT` is the number of XIDs in the exporter's
//!   last `W` (its `window_size_in_ms` label). Read at instants exactly `W`
//!   apart, ending at the look, every event lies in exactly one read's
//!   window, so the sum of the reads counts each event once; the partial
//!   window at the exposure start is prorated. Prometheus evaluates those
//!   instants itself (a range query with `step = W`), staleness included,
//!   so one query per look serves canary and control. `increase()` on the
//!   same series reads every slide of the window as a counter reset and
//!   overcounts; the test below shows both on a 12-hour bake. A node's
//!   events are its XID episodes, the unit the Redfish path counts: per
//!   read, the largest of its GPUs' counts
//!   ([`xid_episodes_in_read`]).
//! - gauges and last-value states never feed a rate (the policy lint
//!   refuses such gates; [`SourceError::NotACount`] if one gets here).

use std::collections::{BTreeMap, BTreeSet};

use async_trait::async_trait;
use chrono::{DateTime, TimeDelta, Utc};
use orchestrator_db::health::Cohort;
use orchestrator_policy::exporter::{self, SeriesSemantics};
use orchestrator_policy::{GateKind, GateSource, HealthGate};
use orchestrator_types::NodeId;

use crate::prometheus::{NodeIndex, NodeSeries, PrometheusClient, PrometheusError, QueryData};

/// Width of the time bins a look is reported in; the same hourly windows
/// the Redfish collector stores.
pub const BIN_WIDTH: TimeDelta = TimeDelta::hours(1);

pub use crate::prometheus::STALENESS;

/// A node being compared, with the instant its exposure starts (its
/// activation for a canary node, the bake start for a control node).
#[derive(Debug, Clone, PartialEq)]
pub struct WatchedNode {
    /// The node.
    pub node: NodeId,
    /// Its name, as the configured node label carries it.
    pub name: String,
    /// Canary or control.
    pub cohort: Cohort,
    /// Events and exposure count from here.
    pub from: DateTime<Utc>,
}

/// One node's data in one time bin.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct NodeBin {
    /// Events counted (rate gates).
    pub events: u64,
    /// Unit-hours of exposure (GPU-hours for DCGM's per-GPU series).
    pub exposure_hours: f64,
    /// Per unit (GPU): events for a rate gate, the mean value for a level.
    pub units: BTreeMap<String, f64>,
}

/// What a source reports for one look of one gate.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SourceLook {
    /// Per node, per bin start.
    pub bins: BTreeMap<NodeId, BTreeMap<DateTime<Utc>, NodeBin>>,
    /// Nodes with data in the look.
    pub present: BTreeSet<NodeId>,
    /// Canary nodes whose series vanished or went stale before the look:
    /// never a pass (a GPU that fell off the bus stops reporting).
    pub vanished: Vec<String>,
    /// Control nodes without data at the look, excluded from the control.
    pub control_gaps: Vec<String>,
    /// Counter resets seen (restarts of the driver, exporter or node).
    pub resets: u64,
    /// Series that named no watched node (logged, never silently used).
    pub unmatched_series: usize,
}

impl SourceLook {
    /// Events and exposure of a cohort, summed over nodes and bins.
    pub fn totals(&self, nodes: &[WatchedNode], cohort: Cohort) -> (u64, f64) {
        nodes
            .iter()
            .filter(|n| n.cohort == cohort && self.present.contains(&n.node))
            .filter_map(|n| self.bins.get(&n.node))
            .flat_map(|bins| bins.values())
            .fold((0, 0.0), |(e, x), b| (e + b.events, x + b.exposure_hours))
    }

    /// The look as a gate may use it: an error naming every watched node
    /// whose series vanished.
    pub fn require_watched(self) -> Result<Self, SourceError> {
        if self.vanished.is_empty() {
            Ok(self)
        } else {
            Err(SourceError::SeriesVanished { nodes: self.vanished })
        }
    }
}

/// Why a source could not answer.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// The gate reads another source.
    #[error("gate {gate:?} does not read {source_name}")]
    WrongSource {
        /// The gate.
        gate: String,
        /// This source.
        source_name: &'static str,
    },
    /// A rate gate on something that does not count events.
    #[error("gate {gate:?}: {metric} is a {semantics}, which has no events to count")]
    NotACount {
        /// The gate.
        gate: String,
        /// The metric.
        metric: String,
        /// What it is.
        semantics: &'static str,
    },
    /// The rate gate's query is not a plain selector.
    #[error("gate {gate:?}: the query cannot be read as a rate")]
    Query {
        /// The gate.
        gate: String,
        /// Why.
        #[source]
        source: exporter::SelectorError,
    },
    /// Watched nodes stopped reporting.
    #[error("the series of watched node(s) {} vanished or went stale", .nodes.join(", "))]
    SeriesVanished {
        /// Their names.
        nodes: Vec<String>,
    },
    /// Prometheus failed.
    #[error("Prometheus query for gate {gate:?} failed")]
    Prometheus {
        /// The gate.
        gate: String,
        /// The client's error.
        #[source]
        source: PrometheusError,
    },
    /// The datastore failed.
    #[error("reading stored health samples failed")]
    Db(#[source] orchestrator_db::DbError),
}

/// A health source: everything a judge needs for one look of one gate.
#[async_trait]
pub trait MetricSource: Send + Sync {
    /// Short name for logs and errors.
    fn name(&self) -> &'static str;

    /// The gate's data for `nodes` from each node's `from` until `until`.
    async fn look(
        &self,
        gate: &HealthGate,
        nodes: &[WatchedNode],
        until: DateTime<Utc>,
    ) -> Result<SourceLook, SourceError>;
}

/// The start of the bin holding `t`, bins aligned on the Unix epoch (as the
/// stored hourly windows are).
pub fn bin_start(t: DateTime<Utc>) -> DateTime<Utc> {
    let width = BIN_WIDTH.num_milliseconds();
    let ms = t.timestamp_millis();
    DateTime::from_timestamp_millis(ms - ms.rem_euclid(width)).unwrap_or(t)
}

/// A counter's events and exposure over one window of raw samples.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct CounterWindow {
    /// Events per bin (bin of the later sample of each pair).
    pub events: BTreeMap<DateTime<Utc>, u64>,
    /// Exposure per bin, in hours.
    pub exposure_hours: BTreeMap<DateTime<Utc>, f64>,
    /// Drops read as resets.
    pub resets: u64,
    /// The last sample's time, if any.
    pub last_seen: Option<DateTime<Utc>>,
}

impl CounterWindow {
    /// All events.
    pub fn total_events(&self) -> u64 {
        self.events.values().sum()
    }

    /// All exposure, in hours.
    pub fn total_exposure_hours(&self) -> f64 {
        self.exposure_hours.values().sum()
    }
}

/// Events and exposure of one counter series between `from` and `until`:
/// see the module docs. Samples must be in time order (Prometheus returns
/// them so); NaN samples (staleness markers never reach a range vector, but
/// a broken exporter may write NaN) are skipped.
pub fn counter_window(
    points: &[(DateTime<Utc>, f64)],
    from: DateTime<Utc>,
    until: DateTime<Utc>,
    staleness: TimeDelta,
) -> CounterWindow {
    let mut out = CounterWindow::default();
    let mut prev: Option<(DateTime<Utc>, f64)> = None;
    for &(t, v) in points
        .iter()
        .filter(|(t, v)| *t >= from && *t <= until && v.is_finite())
    {
        out.last_seen = Some(t);
        let Some((pt, pv)) = prev.replace((t, v)) else {
            continue;
        };
        let increase = if v >= pv {
            v - pv
        } else {
            out.resets += 1;
            v
        };
        let bin = bin_start(t);
        // Counters count whole events; a fractional value (an energy
        // counter, say) is rounded, never truncated to zero repeatedly.
        *out.events.entry(bin).or_default() += increase.round().max(0.0) as u64;
        let gap = t - pt;
        if gap <= staleness {
            *out.exposure_hours.entry(bin).or_default() += gap.num_milliseconds() as f64 / 3_600_000.0;
        }
    }
    out
}

/// Events of a windowed count read at instants exactly `window` apart: see
/// the module docs. `reads` are (instant, value) in time order, the first
/// at or before `from`'s window, each `window` after the previous; a
/// missing read (the series absent at that instant) is `None` and counts
/// nothing. The first read's window reaches before `from`, so only the
/// part after `from` is counted, prorated.
pub fn windowed_count_events(reads: &[(DateTime<Utc>, Option<f64>)], from: DateTime<Utc>, window: TimeDelta) -> f64 {
    let w = window.num_milliseconds() as f64;
    if w <= 0.0 {
        return 0.0;
    }
    reads
        .iter()
        .filter_map(|&(t, v)| v.filter(|v| v.is_finite() && *v > 0.0).map(|v| (t, v)))
        .filter(|(t, _)| *t > from)
        .map(|(t, v)| {
            let inside = (t - from).num_milliseconds() as f64;
            if inside >= w { v } else { v * inside / w }
        })
        .sum()
}

/// The read instants for a windowed count: `until`, `until - window`, ...,
/// back to the first one at or before `from`; oldest first.
pub fn read_instants(from: DateTime<Utc>, until: DateTime<Utc>, window: TimeDelta) -> Vec<DateTime<Utc>> {
    let mut out = Vec::new();
    if window <= TimeDelta::zero() || until < from {
        return out;
    }
    let mut t = until;
    loop {
        out.push(t);
        if t <= from {
            break;
        }
        t -= window;
    }
    out.reverse();
    out
}

/// The unit a series stands for within its node: the GPU for DCGM (its
/// `gpu` label), else every label but the name and the node label.
fn unit_of(labels: &BTreeMap<String, String>, node_label: &str) -> String {
    if let Some(gpu) = labels.get("gpu") {
        return gpu.clone();
    }
    labels
        .iter()
        .filter(|(k, _)| k.as_str() != "__name__" && k.as_str() != node_label)
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// Folds counter series (one per unit) into a look.
pub fn counter_look(
    series: &[NodeSeries],
    nodes: &[WatchedNode],
    until: DateTime<Utc>,
    staleness: TimeDelta,
    node_label: &str,
    unmatched: usize,
) -> SourceLook {
    let mut look = SourceLook {
        unmatched_series: unmatched,
        ..SourceLook::default()
    };
    let by_node: BTreeMap<NodeId, &WatchedNode> = nodes.iter().map(|n| (n.node, n)).collect();
    let mut last_seen: BTreeMap<NodeId, DateTime<Utc>> = BTreeMap::new();
    for s in series {
        let Some(watched) = by_node.get(&s.node) else {
            look.unmatched_series += 1;
            continue;
        };
        let window = counter_window(&s.points, watched.from, until, staleness);
        look.resets += window.resets;
        if let Some(t) = window.last_seen {
            let seen = last_seen.entry(s.node).or_insert(t);
            *seen = (*seen).max(t);
        }
        let unit = unit_of(&s.labels, node_label);
        let bins = look.bins.entry(s.node).or_default();
        for (bin, events) in &window.events {
            let b = bins.entry(*bin).or_default();
            b.events += events;
            *b.units.entry(unit.clone()).or_default() += *events as f64;
        }
        for (bin, hours) in &window.exposure_hours {
            bins.entry(*bin).or_default().exposure_hours += hours;
        }
    }
    classify_presence(&mut look, nodes, |node| {
        last_seen.get(&node).is_some_and(|t| until - *t <= staleness)
    });
    look
}

/// Marks nodes present, vanished (canary) or gapped (control).
fn classify_presence(look: &mut SourceLook, nodes: &[WatchedNode], present_at_end: impl Fn(NodeId) -> bool) {
    for n in nodes {
        if present_at_end(n.node) {
            look.present.insert(n.node);
            continue;
        }
        match n.cohort {
            Cohort::Canary => look.vanished.push(n.name.clone()),
            Cohort::Control => look.control_gaps.push(n.name.clone()),
        }
    }
}

/// Folds windowed-count reads (one series per unit, read every `window`)
/// into a look. The windowed count is DCGM's XID count, so a node's events
/// are its XID episodes, as the Redfish collector counts them: per read,
/// the largest of its GPUs' counts ([`xid_episodes_in_read`]), because a
/// cascade over the node's GPUs is one fault. Each unit still shows its own
/// XIDs.
pub fn windowed_look(
    series: &[NodeSeries],
    nodes: &[WatchedNode],
    until: DateTime<Utc>,
    window: TimeDelta,
    node_label: &str,
    unmatched: usize,
) -> SourceLook {
    let mut look = SourceLook {
        unmatched_series: unmatched,
        ..SourceLook::default()
    };
    let by_node: BTreeMap<NodeId, &WatchedNode> = nodes.iter().map(|n| (n.node, n)).collect();
    let mut at_end: BTreeSet<NodeId> = BTreeSet::new();
    // Per node and read instant: its bin and each unit's XIDs in the read.
    type Read = (DateTime<Utc>, Vec<f64>);
    let mut reads: BTreeMap<(NodeId, DateTime<Utc>), Read> = BTreeMap::new();
    for s in series {
        let Some(watched) = by_node.get(&s.node) else {
            look.unmatched_series += 1;
            continue;
        };
        // Prometheus timestamps have millisecond resolution.
        if s.points
            .iter()
            .any(|(t, v)| (*t - until).num_milliseconds().abs() <= 1 && v.is_finite())
        {
            at_end.insert(s.node);
        }
        let unit = unit_of(&s.labels, node_label);
        let bins = look.bins.entry(s.node).or_default();
        for &(t, v) in &s.points {
            if t <= watched.from || !v.is_finite() {
                continue;
            }
            let events = windowed_count_events(&[(t, Some(v))], watched.from, window);
            // A read covers the window before it: its events and exposure
            // belong to the bin of the window's middle.
            let inside = (t - watched.from).min(window);
            let bin = bin_start(t - inside / 2);
            reads
                .entry((s.node, t))
                .or_insert_with(|| (bin, Vec::new()))
                .1
                .push(events);
            let b = bins.entry(bin).or_default();
            b.exposure_hours += inside.num_milliseconds() as f64 / 3_600_000.0;
            *b.units.entry(unit.clone()).or_default() += events;
        }
    }
    // Episodes summed per (node, bin) before rounding, so prorated partial
    // windows are not rounded away one by one.
    let mut frac: BTreeMap<(NodeId, DateTime<Utc>), f64> = BTreeMap::new();
    for ((node, _), (bin, per_unit)) in reads {
        *frac.entry((node, bin)).or_default() += xid_episodes_in_read(per_unit);
    }
    for ((node, bin), events) in frac {
        if let Some(b) = look.bins.get_mut(&node).and_then(|bins| bins.get_mut(&bin)) {
            b.events += events.round() as u64;
        }
    }
    classify_presence(&mut look, nodes, |node| at_end.contains(&node));
    look
}

/// The window of a DCGM windowed count, from its `window_size_in_ms` label.
pub fn window_of(series: &[NodeSeries]) -> Option<TimeDelta> {
    series
        .iter()
        .filter_map(|s| s.labels.get("window_size_in_ms"))
        .filter_map(|w| w.parse::<i64>().ok())
        .find(|ms| *ms > 0)
        .map(TimeDelta::milliseconds)
}

/// A regex matching exactly the watched nodes' names, for the node label.
fn node_regex(nodes: &[WatchedNode]) -> String {
    let names: Vec<String> = nodes.iter().map(|n| regex_escape(&n.name)).collect();
    names.join("|")
}

fn regex_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if "\\.+*?()|[]{}^$".contains(c) {
            out.push_str("\\\\");
        } else if c == '"' {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Adds `node_label=~"a|b|..."` to a selector's matchers, so canary and
/// control come back in one query.
fn scoped_selector(sel: &exporter::Selector, node_label: &str, nodes: &[WatchedNode]) -> String {
    let inner = sel.matchers.trim().trim_start_matches('{').trim_end_matches('}').trim();
    let scope = format!("{node_label}=~\"{}\"", node_regex(nodes));
    if inner.is_empty() {
        format!("{}{{{scope}}}", sel.metric)
    } else {
        format!("{}{{{inner},{scope}}}", sel.metric)
    }
}

/// Prometheus behind the seam.
#[derive(Debug, Clone)]
pub struct PrometheusSource {
    client: PrometheusClient,
    staleness: TimeDelta,
}

impl PrometheusSource {
    /// A source over this client (its node label maps series to nodes, its
    /// staleness bound says when a series is gone).
    pub fn new(client: PrometheusClient) -> Self {
        let staleness = client.config().staleness;
        Self { client, staleness }
    }

    /// How long a counter series may go without a sample before its node
    /// counts as gone ([`STALENESS`] by default, Prometheus' lookback;
    /// a few scrape intervals suit a fast-scraping test).
    pub fn with_staleness(mut self, staleness: TimeDelta) -> Self {
        self.staleness = staleness;
        self
    }
}

impl PrometheusSource {
    /// Which of `nodes` have no series for `gate` at `at`: for a rate gate, no sample of its counter
    /// within the staleness bound; for a level gate, no sample of its query's result. Checked before a
    /// rollout's first flash, so a policy that needs an exporter field the fleet has not enabled is
    /// refused with the field's name, not discovered as a held wave hours later.
    pub async fn missing_series(
        &self,
        gate: &HealthGate,
        nodes: &[WatchedNode],
        at: DateTime<Utc>,
    ) -> Result<Vec<String>, SourceError> {
        let GateSource::Prometheus { query } = &gate.source else {
            return Err(SourceError::WrongSource {
                gate: gate.name.clone(),
                source_name: "prometheus",
            });
        };
        let node_label = self.client.config().node_label.clone();
        let promql = if gate.kind == GateKind::Rate {
            let sel = exporter::parse_selector(query).map_err(|source| SourceError::Query {
                gate: gate.name.clone(),
                source,
            })?;
            let secs = self.staleness.num_seconds().max(1);
            format!("last_over_time({}[{secs}s])", scoped_selector(&sel, &node_label, nodes))
        } else {
            query.clone()
        };
        let data = self
            .client
            .query(&promql, at)
            .await
            .map_err(|source| SourceError::Prometheus {
                gate: gate.name.clone(),
                source,
            })?;
        let present: BTreeSet<String> = match data {
            QueryData::Vector(samples) => samples
                .into_iter()
                .filter_map(|s| s.labels.get(&node_label).cloned())
                .collect(),
            _ => BTreeSet::new(),
        };
        Ok(nodes
            .iter()
            .filter(|n| !present.contains(&n.name))
            .map(|n| n.name.clone())
            .collect())
    }
}

/// The default DCGM XID count window (`--xid-count-window-size`, 5 min),
/// used only when the series carry no `window_size_in_ms` label.
pub const DEFAULT_XID_WINDOW: TimeDelta = TimeDelta::minutes(5);

#[async_trait]
impl MetricSource for PrometheusSource {
    fn name(&self) -> &'static str {
        "prometheus"
    }

    async fn look(
        &self,
        gate: &HealthGate,
        nodes: &[WatchedNode],
        until: DateTime<Utc>,
    ) -> Result<SourceLook, SourceError> {
        let GateSource::Prometheus { query } = &gate.source else {
            return Err(SourceError::WrongSource {
                gate: gate.name.clone(),
                source_name: "prometheus",
            });
        };
        if gate.kind != GateKind::Rate {
            // Level gates keep their instant-query path in the collector.
            return Err(SourceError::NotACount {
                gate: gate.name.clone(),
                metric: query.clone(),
                semantics: "level query",
            });
        }
        let sel = exporter::parse_selector(query).map_err(|source| SourceError::Query {
            gate: gate.name.clone(),
            source,
        })?;
        let semantics = exporter::lookup(&sel.metric).map_or(SeriesSemantics::Counter, |m| m.semantics);
        if !semantics.feeds_rate() {
            return Err(SourceError::NotACount {
                gate: gate.name.clone(),
                metric: sel.metric.clone(),
                semantics: semantics.as_str(),
            });
        }
        // Prometheus answers in milliseconds; reading at a whole millisecond
        // keeps the window reads' instants and the look's end identical.
        let until = DateTime::from_timestamp_millis(until.timestamp_millis()).unwrap_or(until);
        let node_label = self.client.config().node_label.clone();
        let index: NodeIndex = nodes.iter().map(|n| (n.node, n.name.clone())).collect();
        let earliest = nodes.iter().map(|n| n.from).min().unwrap_or(until);
        let selector = scoped_selector(&sel, &node_label, nodes);
        let prom = |source| SourceError::Prometheus {
            gate: gate.name.clone(),
            source,
        };
        match semantics {
            SeriesSemantics::WindowedCount => {
                // The window comes from the series' own label; one instant
                // read first to learn it.
                let probe = self.client.query(&selector, until).await.map_err(prom)?;
                let window = match probe {
                    QueryData::Vector(samples) => samples
                        .iter()
                        .filter_map(|s| s.labels.get("window_size_in_ms"))
                        .filter_map(|w| w.parse::<i64>().ok())
                        .find(|ms| *ms > 0)
                        .map(TimeDelta::milliseconds),
                    _ => None,
                }
                .unwrap_or(DEFAULT_XID_WINDOW);
                let instants = read_instants(earliest, until, window);
                let start = instants.first().copied().unwrap_or(until);
                // Summed over XID codes per unit: one series per GPU, read
                // by Prometheus at exactly the window boundaries.
                let promql = format!("sum without (xid, window_size_in_ms) ({selector})");
                let step = window.to_std().unwrap_or(std::time::Duration::from_secs(300));
                let mapped = self
                    .client
                    .node_series(&promql, start, until, step, &index)
                    .await
                    .map_err(prom)?;
                Ok(windowed_look(
                    &mapped.matched,
                    nodes,
                    until,
                    window,
                    &node_label,
                    mapped.unmatched.len(),
                ))
            }
            _ => {
                // Raw samples with Prometheus' own timestamps: a range
                // selector evaluated at the look, from the earliest start.
                let secs = (until - earliest).num_seconds().max(1) + self.staleness.num_seconds();
                let promql = format!("{selector}[{secs}s]");
                let data = self.client.query(&promql, until).await.map_err(prom)?;
                let series = match data {
                    QueryData::Matrix(series) => series,
                    QueryData::Vector(v) if v.is_empty() => Vec::new(),
                    other => {
                        return Err(prom(PrometheusError::ResultType {
                            expected: "matrix",
                            got: match other {
                                QueryData::Vector(_) => "vector",
                                QueryData::Scalar { .. } => "scalar",
                                QueryData::String { .. } => "string",
                                QueryData::Matrix(_) => "matrix",
                            },
                            query: promql,
                        }));
                    }
                };
                let mapped = self.client.map_series(series, &index);
                Ok(counter_look(
                    &mapped.matched,
                    nodes,
                    until,
                    self.staleness,
                    &node_label,
                    mapped.unmatched.len(),
                ))
            }
        }
    }
}

/// The Redfish collector's stored samples behind the seam.
#[derive(Clone)]
pub struct RedfishSource {
    db: orchestrator_db::Db,
    wave: orchestrator_types::WaveId,
}

impl std::fmt::Debug for RedfishSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedfishSource").field("wave", &self.wave).finish()
    }
}

impl RedfishSource {
    /// The samples the collector stored for one wave.
    pub fn new(db: orchestrator_db::Db, wave: orchestrator_types::WaveId) -> Self {
        Self { db, wave }
    }
}

#[async_trait]
impl MetricSource for RedfishSource {
    fn name(&self) -> &'static str {
        "redfish"
    }

    async fn look(
        &self,
        gate: &HealthGate,
        nodes: &[WatchedNode],
        until: DateTime<Utc>,
    ) -> Result<SourceLook, SourceError> {
        let GateSource::Redfish { metric } = &gate.source else {
            return Err(SourceError::WrongSource {
                gate: gate.name.clone(),
                source_name: "redfish",
            });
        };
        let watched: BTreeSet<NodeId> = nodes.iter().map(|n| n.node).collect();
        let mut look = SourceLook::default();
        let scope = orchestrator_db::health::SampleScope::Wave(self.wave);
        self.db
            .each_health_sample(scope, Some(metric.as_str()), |s| {
                if !watched.contains(&s.node_id) || s.window_start > until {
                    return;
                }
                let b = look
                    .bins
                    .entry(s.node_id)
                    .or_default()
                    .entry(s.window_start)
                    .or_default();
                b.events += s.events;
                b.exposure_hours += s.exposure;
                for (unit, agg) in s.units {
                    if let Some(mean) = agg.mean() {
                        b.units.insert(unit, mean);
                    }
                }
            })
            .await
            .map_err(SourceError::Db)?;
        // A BMC that was unreachable still has its events in its log, so a
        // Redfish node is present once it has any sample.
        let with_data: BTreeSet<NodeId> = look.bins.keys().copied().collect();
        classify_presence(&mut look, nodes, |n| with_data.contains(&n));
        Ok(look)
    }
}

/// One node's XID episodes in one read of a source that sees XIDs only as counts per GPU over a window
/// far longer than the event log's episode (`watch::classify::XID_EPISODE`, 5 s) (dcgm-exporter's windowed count: 5 min by default, read once per
/// window): the largest GPU's count.
///
/// Why: the episode rule needs each XID's time, and such a read has none finer than its window. A
/// cascade puts its XIDs on several GPUs at once, so the GPUs' counts overlap; the largest count is the
/// fewest episodes the read can hold with each GPU erring once per episode. It is the count the event
/// log gives whenever a node has at most one episode per window: at 0.02 episodes per node-hour, two
/// in one 5-minute window happen about once in a million windows. It counts more than the log only
/// when one GPU logs several XIDs within 5 s (several codes of one fault), and fewer only when
/// separate faults share a window, which at rates that high understates a rise (never a false
/// rollback).
pub fn xid_episodes_in_read(per_gpu: impl IntoIterator<Item = f64>) -> f64 {
    per_gpu.into_iter().filter(|v| v.is_finite()).fold(0.0, f64::max)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t0() -> DateTime<Utc> {
        DateTime::from_timestamp(1_767_225_600, 0).expect("valid") // 2026-01-01T00:00:00Z
    }

    fn at(secs: i64) -> DateTime<Utc> {
        t0() + TimeDelta::seconds(secs)
    }

    #[test]
    fn counter_increase_handles_resets_and_gaps() {
        // Scrapes every 30 s; an exporter restart at 120 s (value drops to
        // 1: one event after the restart); a 10-minute gap (no exposure,
        // events still counted); a value before `from` ignored.
        let points = vec![
            (at(-30), 100.0),
            (at(0), 100.0),
            (at(30), 102.0),
            (at(60), 102.0),
            (at(90), 103.0),
            (at(120), 1.0),
            (at(150), 1.0),
            (at(750), 4.0),
            (at(780), 4.0),
        ];
        let w = counter_window(&points, at(0), at(780), STALENESS);
        assert_eq!(w.total_events(), 2 + 1 + 1 + 3);
        assert_eq!(w.resets, 1);
        let exposure_secs = w.total_exposure_hours() * 3600.0;
        assert!((exposure_secs - (780.0 - 600.0)).abs() < 1e-6, "{exposure_secs}");
        assert_eq!(w.last_seen, Some(at(780)));
    }

    #[test]
    fn counter_without_samples_has_no_exposure() {
        let w = counter_window(&[], at(0), at(600), STALENESS);
        assert_eq!(
            (w.total_events(), w.total_exposure_hours(), w.last_seen),
            (0, 0.0, None)
        );
    }

    #[test]
    fn read_instants_are_window_aligned_on_the_look() {
        let r = read_instants(at(0), at(1000), TimeDelta::seconds(300));
        assert_eq!(r, vec![at(-200), at(100), at(400), at(700), at(1000)]);
        assert!(read_instants(at(10), at(0), TimeDelta::seconds(300)).is_empty());
    }

    /// A small deterministic generator (splitmix64), so the test needs no
    /// dependency and gives the same series every run.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> f64 {
            self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
        }
    }

    /// What dcgm-exporter reports at `t`: events in (t - window, t].
    fn exporter_value(events: &[i64], t: i64, window: i64) -> f64 {
        events.iter().filter(|&&e| e > t - window && e <= t).count() as f64
    }

    /// PromQL `increase()` without extrapolation over raw samples: every
    /// drop is taken for a counter reset.
    fn naive_increase(samples: &[(i64, f64)]) -> f64 {
        samples
            .windows(2)
            .map(|p| if p[1].1 >= p[0].1 { p[1].1 - p[0].1 } else { p[1].1 })
            .sum()
    }

    #[test]
    fn windowed_xid_count_over_a_12h_bake_is_within_2_percent() {
        // 8 GPUs, XIDs at 12 per GPU-hour (about one per 5-minute window,
        // so windows often hold several and slide over each other),
        // 12-hour bake, exporter window 5 minutes, scrapes every 30 s with
        // up to 3 s of jitter, Prometheus reading the summed series at the
        // window boundaries with its last sample at or before each instant.
        let window = 300i64;
        let bake = 12 * 3600i64;
        let mut rng = Rng(7);
        let (mut truth, mut ours, mut naive) = (0usize, 0.0f64, 0.0f64);
        for _gpu in 0..8 {
            // Poisson arrivals from an hour before the bake (a window's
            // worth of earlier events must not be counted).
            let mut events = Vec::new();
            let mut t = -3600.0f64;
            loop {
                t += -(1.0 - rng.next()).ln() * 3600.0 / 12.0;
                if t > bake as f64 {
                    break;
                }
                events.push(t.floor() as i64);
            }
            truth += events.iter().filter(|&&e| e > 0 && e <= bake).count();
            let scrapes: Vec<(i64, f64)> = (-20..=bake / 30)
                .map(|k| {
                    let ts = k * 30 + (rng.next() * 3.0) as i64;
                    (ts, exporter_value(&events, ts, window))
                })
                .collect();
            let reads: Vec<(DateTime<Utc>, Option<f64>)> = read_instants(at(0), at(bake), TimeDelta::seconds(window))
                .into_iter()
                .map(|instant| {
                    let secs = (instant - t0()).num_seconds();
                    let v = scrapes.iter().rev().find(|(ts, _)| *ts <= secs).map(|(_, v)| *v);
                    (instant, v)
                })
                .collect();
            ours += windowed_count_events(&reads, at(0), TimeDelta::seconds(window));
            let in_bake: Vec<(i64, f64)> = scrapes.iter().copied().filter(|(ts, _)| *ts >= 0).collect();
            naive += naive_increase(&in_bake);
        }
        let truth = truth as f64;
        let err = (ours - truth).abs() / truth;
        let naive_err = (naive - truth).abs() / truth;
        println!(
            "12h bake, 8 GPUs: true {truth}, window reads {ours:.1} ({:.2}% off), increase() {naive} ({:.1}% off)",
            err * 100.0,
            naive_err * 100.0
        );
        assert!(truth > 1000.0, "{truth}");
        assert!(
            err < 0.02,
            "window reads {ours} vs true {truth}: {:.2}% off",
            err * 100.0
        );
        assert!(
            naive_err > 0.10,
            "increase() {naive} vs true {truth}: only {:.2}% off",
            naive_err * 100.0
        );
    }

    fn node(id: i64, name: &str, cohort: Cohort, from: DateTime<Utc>) -> WatchedNode {
        WatchedNode {
            node: NodeId(id),
            name: name.to_owned(),
            cohort,
            from,
        }
    }

    fn series(id: i64, name: &str, gpu: &str, points: Vec<(DateTime<Utc>, f64)>) -> NodeSeries {
        NodeSeries {
            node: NodeId(id),
            node_name: name.to_owned(),
            labels: [("Hostname", name), ("gpu", gpu)]
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect(),
            points,
        }
    }

    #[test]
    fn vanished_canary_is_an_error_and_control_gaps_are_counted() {
        let nodes = vec![
            node(1, "c1", Cohort::Canary, at(0)),
            node(2, "c2", Cohort::Canary, at(0)),
            node(3, "k1", Cohort::Control, at(0)),
            node(4, "k2", Cohort::Control, at(0)),
        ];
        let steady = |until: i64| (0..=until / 30).map(|k| (at(k * 30), 5.0)).collect::<Vec<_>>();
        let data = vec![
            series(1, "c1", "0", steady(3600)),
            // c2 stopped reporting 20 minutes before the look.
            series(2, "c2", "0", steady(2400)),
            series(3, "k1", "0", steady(3600)),
            // k2 never reported.
        ];
        let look = counter_look(&data, &nodes, at(3600), STALENESS, "Hostname", 0);
        assert_eq!(look.vanished, vec!["c2".to_owned()]);
        assert_eq!(look.control_gaps, vec!["k2".to_owned()]);
        assert_eq!(look.present.len(), 2);
        let err = look.require_watched().expect_err("vanished canary");
        assert!(err.to_string().contains("c2"), "{err}");
    }

    #[test]
    fn exposure_comes_from_the_series_present() {
        // Two GPUs on one node, one of which reports only half the hour:
        // exposure is 1.5 GPU-hours, not 2.
        let nodes = vec![node(1, "c1", Cohort::Canary, at(0))];
        let full = (0..=120).map(|k| (at(k * 30), k as f64)).collect::<Vec<_>>();
        let half = (60..=120).map(|k| (at(k * 30), 0.0)).collect::<Vec<_>>();
        let look = counter_look(
            &[series(1, "c1", "0", full), series(1, "c1", "1", half)],
            &nodes,
            at(3600),
            STALENESS,
            "Hostname",
            0,
        );
        let (events, exposure) = look.totals(&nodes, Cohort::Canary);
        assert_eq!(events, 120);
        assert!((exposure - 1.5).abs() < 1e-9, "{exposure}");
        let units: BTreeMap<String, f64> =
            look.bins[&NodeId(1)]
                .values()
                .flat_map(|b| b.units.clone())
                .fold(BTreeMap::new(), |mut acc, (u, v)| {
                    *acc.entry(u).or_default() += v;
                    acc
                });
        assert_eq!(units.get("0"), Some(&120.0));
    }

    #[test]
    fn scoped_selector_adds_the_node_matcher() {
        let nodes = vec![
            node(1, "gpu-r1.n1", Cohort::Canary, at(0)),
            node(2, "k", Cohort::Control, at(0)),
        ];
        let sel = exporter::parse_selector("X{job=\"dcgm\"}").expect("selector");
        assert_eq!(
            scoped_selector(&sel, "Hostname", &nodes),
            "X{job=\"dcgm\",Hostname=~\"gpu-r1\\\\.n1|k\"}"
        );
        let bare = exporter::parse_selector("X").expect("selector");
        assert_eq!(scoped_selector(&bare, "node", &nodes[1..]), "X{node=~\"k\"}");
    }
}
