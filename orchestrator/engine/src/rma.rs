//! The RMA monitor: finds failing parts continuously, whether or not a rollout is baking.
//!
//! One pass:
//! 1. **Parts.** Each node's GPUs are read over Redfish (`Bmc::gpu_parts`: serial, part number,
//!    production date) when first seen and every `rediscover_after`, and recorded by serial; a part
//!    gone from its node is marked removed.
//! 2. **Samples.** From the same sources as the rollout gates: each node's Redfish event log (XIDs,
//!    attributed to the GPU the entry's origin names) and, with Prometheus, the fleet's DCGM series
//!    in one query per signal (row-remap failure, the exporter's windowed XID counts, GPUs whose
//!    series vanished while their node still reports). Samples are stored once per source id.
//! 3. **Candidates.** The vendors' criteria in force judge every part with a sample in the
//!    lookback (`orchestrator_rma::find_candidates`, with the node's flashes so that a failure right
//!    after one is firmware-suspected); a met or awaiting-confirmation candidate opens a case (once
//!    per part and rule); the BMC's diagnostic data is collected for a new case where it offers
//!    `CollectDiagnosticData`.
//! 4. **Defect clusters.** Each completed fixed period is scanned once (`orchestrator_rma::scan`,
//!    which spends its whole alpha per scan), so repeated passes never re-test the same data.
//! 5. **Retention.** Samples older than `retention` are deleted, except those of open cases.
//!
//! Only the executor-lease holder runs passes ([`RmaMonitor::run`] checks the lease before each
//! pass and again before the candidates open cases and reach BMCs for their diagnostics), so one
//! controller reads the fleet however many replicas run; every write is idempotent in case a pass
//! outlives the lease.
//!
//! Faults: a node whose BMC cannot be read is reported in the pass and skipped; nothing is charged
//! to it. A datastore fault ends the pass (the next one starts over; every write is idempotent).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use chrono::{DateTime, TimeDelta, Utc};
use futures::StreamExt;
use orchestrator_bmc::{Bmc, DiagnosticDataType, EventCursor, GpuPart};
use orchestrator_db::parts::{DiscoveredPart, Part, PartFilter};
use orchestrator_db::rma::{AttachmentKind, RmaFilter};
use orchestrator_db::{Db, DbError};
use orchestrator_rma::{
    CandidateStatus, ClusterConfig, FleetPart, HealthFlag, Observation, ObservationKind, PartFailure, find_candidates,
};
use serde::Serialize;
use tokio::sync::Mutex;

use crate::connector::HealthBmcs;
use crate::prometheus::{NodeIndex, PrometheusClient};
use crate::runner::LeaseHolder;
use crate::watch::classify::{event_gpu, xid_code};

/// Who the monitor's writes are audited as.
pub const RMA_ACTOR: &str = "controller:rma";

/// The monitor's settings.
#[derive(Debug, Clone)]
pub struct RmaConfig {
    /// Real time between passes.
    pub pass_interval: std::time::Duration,
    /// A node's parts are read again after this (controller clock).
    pub rediscover_after: TimeDelta,
    /// Samples the rules look back over; longer than any rule's window plus its confirmation.
    pub lookback: TimeDelta,
    /// Samples older than this are deleted (those of open cases are kept).
    pub retention: TimeDelta,
    /// Length of the fixed periods the cluster scan tests.
    pub cluster_period: TimeDelta,
    /// The scan's parameters.
    pub cluster: ClusterConfig,
    /// Collect the BMC's diagnostic data for a new case.
    pub collect_diagnostics: bool,
    /// BMCs read at once.
    pub concurrency: usize,
    /// The label of the DCGM series naming the GPU's index on its node.
    pub gpu_label: String,
}

impl Default for RmaConfig {
    fn default() -> Self {
        Self {
            pass_interval: std::time::Duration::from_secs(60),
            rediscover_after: TimeDelta::hours(24),
            lookback: TimeDelta::days(16),
            retention: TimeDelta::days(30),
            cluster_period: TimeDelta::days(7),
            cluster: ClusterConfig::default(),
            collect_diagnostics: true,
            concurrency: 16,
            gpu_label: "gpu".to_owned(),
        }
    }
}

/// What one pass did.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct RmaPassReport {
    /// Nodes whose BMC was read.
    pub nodes_read: usize,
    /// Nodes that could not be read, with the reason.
    pub node_errors: BTreeMap<String, String>,
    /// Serials seen for the first time.
    pub parts_new: usize,
    /// Parts no longer in their node.
    pub parts_removed: usize,
    /// Samples stored (not seen before).
    pub observations_new: u64,
    /// Candidates found (every rule met or awaiting confirmation).
    pub candidates: usize,
    /// Cases opened by this pass.
    pub cases_opened: Vec<String>,
    /// Diagnostic archives collected.
    pub diagnostics_collected: usize,
    /// Periods scanned for defect clusters (their starts).
    pub periods_scanned: Vec<DateTime<Utc>>,
    /// Samples deleted by retention.
    pub observations_pruned: u64,
    /// Prometheus could not be read (the pass went on with Redfish).
    pub prometheus_error: Option<String>,
}

#[derive(Default)]
struct Memo {
    discovered_at: HashMap<String, DateTime<Utc>>,
    cursors: HashMap<String, EventCursor>,
    last_prune: Option<DateTime<Utc>>,
}

/// The monitor (see the module docs).
pub struct RmaMonitor {
    db: Db,
    bmcs: Arc<dyn HealthBmcs>,
    prometheus: Option<PrometheusClient>,
    config: RmaConfig,
    memo: Mutex<Memo>,
}

impl std::fmt::Debug for RmaMonitor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RmaMonitor")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// A node's GPUs in DCGM's order (the exporter's `gpu` index counts them from 0 in the order of
/// their Redfish ids' numbers), so a series maps to a serial.
fn dcgm_order(parts: &mut [&Part]) {
    let number = |slot: &str| -> Option<u64> {
        let digits: String = slot.chars().rev().take_while(char::is_ascii_digit).collect();
        digits.chars().rev().collect::<String>().parse().ok()
    };
    parts.sort_by(|a, b| number(&a.slot).cmp(&number(&b.slot)).then_with(|| a.slot.cmp(&b.slot)));
}

fn discovered(part: &GpuPart) -> Option<DiscoveredPart> {
    let serial = part.serial_number.clone()?;
    Some(DiscoveredPart {
        serial,
        // Criteria files key vendors in lower case (`nvidia`); Redfish says `NVIDIA`.
        vendor: part
            .manufacturer
            .as_deref()
            .unwrap_or("unknown")
            .split_whitespace()
            .next()
            .unwrap_or("unknown")
            .to_ascii_lowercase(),
        part_kind: "gpu".to_owned(),
        part_number: part.part_number.clone().unwrap_or_default(),
        model: part.model.clone(),
        slot: part.unit.id.clone(),
        production_date: part.production_date,
        firmware_version: part.firmware_version.clone(),
        health: part.health.clone(),
    })
}

/// The start of the fixed period holding `t`, periods aligned on the Unix epoch.
pub fn period_start(t: DateTime<Utc>, period: TimeDelta) -> DateTime<Utc> {
    let width = period.num_seconds().max(1);
    let secs = t.timestamp();
    DateTime::from_timestamp(secs - secs.rem_euclid(width), 0).unwrap_or(t)
}

struct NodeRead {
    node: String,
    parts: Option<Vec<DiscoveredPart>>,
    events: Vec<(String, Observation)>,
    cursor: Option<EventCursor>,
}

impl RmaMonitor {
    /// A monitor over `db`, reading BMCs through `bmcs` and, when given, DCGM series from
    /// `prometheus` (its configured node label names the node).
    pub fn new(db: Db, bmcs: Arc<dyn HealthBmcs>, prometheus: Option<PrometheusClient>, config: RmaConfig) -> Self {
        Self {
            db,
            bmcs,
            prometheus,
            config,
            memo: Mutex::new(Memo::default()),
        }
    }

    /// Runs a pass every `pass_interval` while `lease` is held, until `stop` resolves.
    pub async fn run(self, lease: LeaseHolder, stop: impl std::future::Future<Output = ()>) {
        tokio::pin!(stop);
        loop {
            match self.pass_if_holder(&lease).await {
                Ok(None) => {}
                Ok(Some(report)) => {
                    if !report.cases_opened.is_empty() || !report.node_errors.is_empty() {
                        tracing::info!(
                            cases_opened = report.cases_opened.len(),
                            node_errors = report.node_errors.len(),
                            "rma pass"
                        );
                    }
                }
                Err(err) => tracing::warn!(error = %orchestrator_types::error_chain(&err), "rma pass failed"),
            }
            tokio::select! {
                () = &mut stop => break,
                () = tokio::time::sleep(self.config.pass_interval) => {}
            }
        }
    }

    /// One pass (see the module docs), whoever holds the lease: for tests and the bench. A
    /// controller runs [`RmaMonitor::pass_if_holder`].
    pub async fn pass(&self) -> Result<RmaPassReport, DbError> {
        Ok(self.pass_guarded(None).await?.unwrap_or_default())
    }

    /// A pass when `lease` is held now, `None` otherwise: no BMC is read and nothing is written.
    /// The lease is read again before candidates open cases, and a pass that lost it stops there.
    pub async fn pass_if_holder(&self, lease: &LeaseHolder) -> Result<Option<RmaPassReport>, DbError> {
        self.pass_guarded(Some(lease)).await
    }

    async fn pass_guarded(&self, lease: Option<&LeaseHolder>) -> Result<Option<RmaPassReport>, DbError> {
        let held = || async {
            match lease {
                Some(lease) => lease.current().await.map(|fence| fence.is_some()),
                None => Ok(true),
            }
        };
        if !held().await? {
            return Ok(None);
        }
        let now = self.db.clock().now();
        let mut report = RmaPassReport::default();
        let nodes = self.db.all_nodes().await?;
        let mut memo = self.memo.lock().await;

        // 1 and 2 (Redfish): read every node's BMC, a bounded number at once.
        let known: HashMap<(String, String), String> = self
            .db
            .parts(&PartFilter::default())
            .await?
            .into_iter()
            .map(|p| ((p.node, p.slot), p.serial))
            .collect();
        // Collected first: a lazy `map` over borrowed nodes makes the spawned
        // future's type higher-ranked, which `tokio::spawn` cannot prove Send.
        let jobs: Vec<_> = nodes
            .iter()
            .map(|node| {
                let due = memo
                    .discovered_at
                    .get(&node.name)
                    .is_none_or(|at| now - *at >= self.config.rediscover_after);
                let cursor = memo.cursors.get(&node.name).cloned().unwrap_or_default();
                let known = &known;
                async move {
                    let bmc = self
                        .bmcs
                        .bmc(&node.bmc_url, &node.credential_ref)
                        .map_err(|e| (node.name.clone(), e.to_string()))?;
                    self.read_node(&node.name, bmc.as_ref(), due, &cursor, known)
                        .await
                        .map_err(|e| (node.name.clone(), orchestrator_types::error_chain(&e)))
                }
            })
            .collect();
        let reads: Vec<Result<NodeRead, (String, String)>> = futures::stream::iter(jobs)
            .buffer_unordered(self.config.concurrency.max(1))
            .collect()
            .await;
        let mut observed: Vec<(String, Observation)> = Vec::new();
        for read in reads {
            match read {
                Err((node, reason)) => {
                    report.node_errors.insert(node, reason);
                }
                Ok(read) => {
                    report.nodes_read += 1;
                    if let Some(parts) = &read.parts {
                        let change = self.db.record_node_parts(&read.node, parts).await?;
                        report.parts_new += change.new.len();
                        report.parts_removed += change.removed.len();
                        memo.discovered_at.insert(read.node.clone(), now);
                    }
                    observed.extend(read.events);
                    if let Some(cursor) = read.cursor {
                        memo.cursors.insert(read.node, cursor);
                    }
                }
            }
        }
        drop(memo);

        // 2 (Prometheus): one query per signal over the fleet.
        let parts = self.db.parts(&PartFilter::default()).await?;
        let recently_observed: BTreeSet<String> = self
            .db
            .observed_serials(now - self.config.lookback)
            .await?
            .into_iter()
            .collect();
        if let Some(prometheus) = &self.prometheus {
            match self
                .dcgm_observations(prometheus, &nodes, &parts, &recently_observed, now)
                .await
            {
                Ok(dcgm) => observed.extend(dcgm),
                Err(e) => report.prometheus_error = Some(e),
            }
        }
        report.observations_new = self.db.record_part_observations(&observed).await?;

        // 3: candidates and cases, only while still the lease holder (reads take a while).
        if !held().await? {
            return Ok(None);
        }
        let criteria = self.db.rma_criteria().await?;
        if !criteria.is_empty() {
            self.judge(&criteria, &parts, &nodes, now, &mut report).await?;
        }

        // 4: defect clusters, once per completed period.
        self.scan_periods(&parts, now, &mut report).await?;

        // 5: retention, daily.
        let mut memo = self.memo.lock().await;
        if memo.last_prune.is_none_or(|at| now - at >= TimeDelta::days(1)) {
            report.observations_pruned = self.db.prune_part_observations(now - self.config.retention).await?;
            memo.last_prune = Some(now);
        }
        Ok(Some(report))
    }

    async fn read_node(
        &self,
        node: &str,
        bmc: &dyn Bmc,
        discover: bool,
        cursor: &EventCursor,
        known: &HashMap<(String, String), String>,
    ) -> Result<NodeRead, orchestrator_bmc::BmcError> {
        let parts = if discover {
            Some(bmc.gpu_parts().await?.iter().filter_map(discovered).collect::<Vec<_>>())
        } else {
            None
        };
        let serial_of = |slot: &str| -> Option<String> {
            parts
                .as_ref()
                .and_then(|p| p.iter().find(|d| d.slot == slot).map(|d| d.serial.clone()))
                .or_else(|| known.get(&(node.to_owned(), slot.to_owned())).cloned())
        };
        let gpus = bmc.gpus().await?;
        let batch = bmc.read_events(cursor).await?;
        let mut events = Vec::new();
        for entry in &batch.entries {
            let Some(code) = xid_code(entry) else { continue };
            let Some(slot) = event_gpu(entry, &gpus) else { continue };
            let Some(serial) = serial_of(&slot) else { continue };
            events.push((
                serial,
                Observation {
                    at: entry.created,
                    source_id: format!("redfish:{node}:{}", entry.id),
                    kind: ObservationKind::Xid { code },
                },
            ));
        }
        Ok(NodeRead {
            node: node.to_owned(),
            parts,
            events,
            cursor: Some(batch.cursor),
        })
    }

    /// DCGM samples for the fleet: set row-remap failure flags, non-zero windowed XID counts, and
    /// the presence of each GPU's series on nodes that report (absences always; presences only for
    /// parts already under watch, which ends a run of absences).
    async fn dcgm_observations(
        &self,
        prometheus: &PrometheusClient,
        nodes: &[orchestrator_db::model::Node],
        parts: &[Part],
        watched: &BTreeSet<String>,
        now: DateTime<Utc>,
    ) -> Result<Vec<(String, Observation)>, String> {
        let index: NodeIndex = nodes.iter().map(|n| (n.id, n.name.clone())).collect();
        let mut by_node: HashMap<&str, Vec<&Part>> = HashMap::new();
        for p in parts.iter().filter(|p| p.part_kind == "gpu") {
            by_node.entry(p.node.as_str()).or_default().push(p);
        }
        for list in by_node.values_mut() {
            dcgm_order(list);
        }
        let serial = |node: &str, gpu: Option<&String>| -> Option<String> {
            let i: usize = gpu?.parse().ok()?;
            by_node.get(node)?.get(i).map(|p| p.serial.clone())
        };
        let gpu_label = &self.config.gpu_label;
        let index = &index;
        let query = |q: &'static str| async move {
            prometheus
                .node_samples(q, now, index)
                .await
                .map_err(|e| format!("{q}: {}", orchestrator_types::error_chain(&e)))
        };
        let mut out = Vec::new();
        let stamp = now.timestamp();
        for s in query("DCGM_FI_DEV_ROW_REMAP_FAILURE > 0").await?.matched {
            if let Some(serial) = serial(&s.node_name, s.labels.get(gpu_label)) {
                out.push((
                    serial,
                    Observation {
                        at: now,
                        // Once per part: the flag is sticky, its first reading is the one that matters.
                        source_id: "dcgm:row_remap_failure".to_owned(),
                        kind: ObservationKind::Flag {
                            flag: HealthFlag::RowRemapFailure,
                            set: true,
                        },
                    },
                ));
            }
        }
        for s in query("DCGM_EXP_XID_ERRORS_COUNT > 0").await?.matched {
            let (Some(serial), Some(code)) = (
                serial(&s.node_name, s.labels.get(gpu_label)),
                s.labels.get("xid").and_then(|x| x.parse::<u32>().ok()),
            ) else {
                continue;
            };
            let window_seconds = s
                .labels
                .get("window_size_in_ms")
                .and_then(|w| w.parse::<i64>().ok())
                .map_or(300, |ms| ms / 1000);
            out.push((
                serial,
                Observation {
                    at: now,
                    source_id: format!("dcgm:xid:{code}:{stamp}"),
                    kind: ObservationKind::XidWindowCount {
                        code,
                        count: s.value.max(0.0) as u64,
                        window_seconds,
                    },
                },
            ));
        }
        let present = query("DCGM_FI_DEV_GPU_TEMP").await?.matched;
        let mut reporting: HashMap<&str, BTreeSet<usize>> = HashMap::new();
        for s in &present {
            if let Some(i) = s.labels.get(gpu_label).and_then(|g| g.parse().ok()) {
                reporting.entry(s.node_name.as_str()).or_default().insert(i);
            }
        }
        for (node, seen) in &reporting {
            for (i, part) in by_node.get(node).into_iter().flatten().enumerate() {
                let present = seen.contains(&i);
                if present && !watched.contains(&part.serial) {
                    continue;
                }
                out.push((
                    part.serial.clone(),
                    Observation {
                        at: now,
                        source_id: format!("dcgm:scrape:{stamp}"),
                        kind: ObservationKind::SeriesScrape { present },
                    },
                ));
            }
        }
        Ok(out)
    }

    async fn judge(
        &self,
        criteria: &[orchestrator_rma::Criteria],
        parts: &[Part],
        nodes: &[orchestrator_db::model::Node],
        now: DateTime<Utc>,
        report: &mut RmaPassReport,
    ) -> Result<(), DbError> {
        let since = now - self.config.lookback;
        let serials = self.db.observed_serials(since).await?;
        let observations = self.db.part_observations(&serials, since).await?;
        let by_serial: HashMap<&str, &Part> = parts.iter().map(|p| (p.serial.as_str(), p)).collect();
        // The firmware history of every node with samples, read at once.
        let watched_nodes: BTreeSet<&str> = observations
            .keys()
            .filter_map(|serial| by_serial.get(serial.as_str()).map(|p| p.node.as_str()))
            .collect();
        let ids: Vec<(i64, String)> = nodes
            .iter()
            .filter(|n| watched_nodes.contains(n.name.as_str()))
            .map(|n| (n.id.0, n.name.clone()))
            .collect();
        let flashes = self.db.firmware_changes_by_node(&ids).await?;
        let none = Vec::new();
        for (serial, obs) in &observations {
            let Some(part) = by_serial.get(serial.as_str()) else {
                continue;
            };
            let firmware = flashes.get(&part.node).unwrap_or(&none);
            for candidate in find_candidates(criteria, &part.record(), obs, firmware, now) {
                if candidate.status == CandidateStatus::DiagnosticPassed {
                    continue;
                }
                report.candidates += 1;
                let (opened, new) = self.db.open_or_refresh_rma_case(&candidate, RMA_ACTOR).await?;
                if new {
                    report.cases_opened.push(opened.id.clone());
                    if self.config.collect_diagnostics {
                        report.diagnostics_collected += usize::from(self.collect_diagnostics(&opened).await);
                    }
                }
            }
        }
        Ok(())
    }

    /// Attaches the BMC's diagnostic data to `case`; false (and logged) when the BMC cannot give it.
    async fn collect_diagnostics(&self, case: &orchestrator_rma::Case) -> bool {
        let node = match self.db.node_by_name(&case.node).await {
            Ok(n) => n,
            Err(_) => return false,
        };
        let bmc = match self.bmcs.bmc(&node.bmc_url, &node.credential_ref) {
            Ok(b) => b,
            Err(e) => {
                tracing::info!(node = %case.node, reason = %e, "no BMC driver for diagnostic data");
                return false;
            }
        };
        let data = match bmc.collect_diagnostic_data(DiagnosticDataType::Manager).await {
            Ok(d) => d,
            Err(e) => {
                tracing::info!(node = %case.node, case = %case.id, reason = %orchestrator_types::error_chain(&e),
                    "diagnostic data not collected");
                return false;
            }
        };
        let entry = data
            .entry_uri
            .rsplit('/')
            .find(|s| !s.is_empty())
            .unwrap_or("entry")
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .collect::<String>();
        let name = format!("bmc-diagnostic-{entry}.bin");
        match self
            .db
            .add_rma_attachment(
                &case.id,
                &name,
                AttachmentKind::RedfishDiagnostic,
                &data.bytes,
                RMA_ACTOR,
            )
            .await
        {
            Ok(_) => true,
            Err(e) => {
                tracing::warn!(case = %case.id, error = %orchestrator_types::error_chain(&e), "diagnostic data not stored");
                false
            }
        }
    }

    /// Scans every completed period since the oldest part was seen that has no stored scan.
    async fn scan_periods(
        &self,
        parts: &[Part],
        now: DateTime<Utc>,
        report: &mut RmaPassReport,
    ) -> Result<(), DbError> {
        let period = self.config.cluster_period;
        let Some(first_seen) = parts.iter().map(|p| p.first_seen).min() else {
            return Ok(());
        };
        let done: BTreeSet<DateTime<Utc>> = self
            .db
            .cluster_scans(1000)
            .await?
            .into_iter()
            .map(|s| s.period_start)
            .collect();
        let current = period_start(now, period);
        let mut start = period_start(first_seen, period);
        let cases = self.db.rma_cases(&RmaFilter::default()).await?;
        let nodes: HashMap<String, String> = self
            .db
            .all_nodes()
            .await?
            .into_iter()
            .map(|n| (n.name, n.platform_sku))
            .collect();
        while start < current {
            let end = start + period;
            if !done.contains(&start) {
                let fleet = fleet_parts(parts, &nodes, start, end);
                let failures: Vec<PartFailure> = cases
                    .iter()
                    .filter(|c| c.candidate.began_at >= start && c.candidate.began_at < end)
                    .map(|c| PartFailure {
                        serial: c.case.serial.clone(),
                        at: c.candidate.began_at,
                        firmware_suspected: c.candidate.firmware_suspected.is_some(),
                    })
                    .collect();
                match orchestrator_rma::scan(&fleet, &dedup_failures(failures), &self.config.cluster) {
                    Ok(scan) => {
                        self.db.store_cluster_scan(start, end, &scan).await?;
                        report.periods_scanned.push(start);
                    }
                    Err(e) => tracing::warn!(period = %start, error = %e, "cluster scan refused its input"),
                }
            }
            start = end;
        }
        Ok(())
    }
}

/// One failure per part (its first): a part that met two rules failed once.
fn dedup_failures(mut failures: Vec<PartFailure>) -> Vec<PartFailure> {
    failures.sort_by(|a, b| a.serial.cmp(&b.serial).then(a.at.cmp(&b.at)));
    failures.dedup_by(|later, first| later.serial == first.serial);
    failures
}

/// The fleet's parts over `[start, end)`: exposure is the time each part was in service in the
/// period, age is from its production date (else from when it was first seen) to the period's start.
pub fn fleet_parts(
    parts: &[Part],
    platforms: &HashMap<String, String>,
    start: DateTime<Utc>,
    end: DateTime<Utc>,
) -> Vec<FleetPart> {
    let day = 86_400.0;
    parts
        .iter()
        .filter_map(|p| {
            let from = p.first_seen.max(start);
            let until = p.removed_at.unwrap_or(end).min(end);
            if until <= from {
                return None;
            }
            let born = p.production_date.unwrap_or(p.first_seen);
            Some(FleetPart {
                serial: p.serial.clone(),
                node: p.node.clone(),
                part_number: p.part_number.clone(),
                lot: p.lot.clone().or_else(|| p.date_code.clone()),
                platform: platforms.get(&p.node).cloned().unwrap_or_default(),
                age_days: ((start - born).num_seconds() as f64 / day).max(0.0),
                exposure_days: (until - from).num_seconds() as f64 / day,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn periods_are_aligned_and_contain_their_time() {
        let t = DateTime::from_timestamp(1_700_000_123, 0).unwrap();
        let p = period_start(t, TimeDelta::days(7));
        assert!(p <= t && t < p + TimeDelta::days(7));
        assert_eq!(p.timestamp() % (7 * 86_400), 0);
        assert_eq!(period_start(p, TimeDelta::days(7)), p);
    }

    #[test]
    fn a_part_failing_two_rules_counts_once() {
        let at = |s| DateTime::from_timestamp(s, 0).unwrap();
        let f = |serial: &str, t| PartFailure {
            serial: serial.into(),
            at: at(t),
            firmware_suspected: false,
        };
        let out = dedup_failures(vec![f("B", 5), f("A", 9), f("A", 3), f("B", 1)]);
        assert_eq!(out, vec![f("A", 3), f("B", 1)]);
    }

    #[test]
    fn dcgm_order_follows_the_slot_numbers() {
        let part = |slot: &str| Part {
            serial: slot.into(),
            vendor: "nvidia".into(),
            part_kind: "gpu".into(),
            part_number: String::new(),
            model: None,
            node: "n".into(),
            slot: slot.into(),
            production_date: None,
            lot: None,
            date_code: None,
            firmware_version: None,
            health: None,
            first_seen: DateTime::UNIX_EPOCH,
            last_seen: DateTime::UNIX_EPOCH,
            removed_at: None,
        };
        let parts = [part("GPU_SXM_10"), part("GPU_SXM_2"), part("GPU_SXM_1")];
        let mut refs: Vec<&Part> = parts.iter().collect();
        dcgm_order(&mut refs);
        let slots: Vec<&str> = refs.iter().map(|p| p.slot.as_str()).collect();
        assert_eq!(slots, ["GPU_SXM_1", "GPU_SXM_2", "GPU_SXM_10"]);
    }
}
