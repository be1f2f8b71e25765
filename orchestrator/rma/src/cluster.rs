//! Defect clusters (manufacturing escapes): does a group of parts sharing an attribute (part number,
//! lot, serial prefix, platform SKU) fail faster than the rest of the fleet?
//!
//! Method (details and reasons in this crate's README):
//! 1. Failures whose part's firmware changed just before are left out (they may be the firmware's).
//! 2. Failures on one node within a coincidence window are one incident; an incident touching two or
//!    more parts points at the node (baseboard, power, cooling), not at a part, and is left out of
//!    the part statistics (NVIDIA's RMA process asks to rule out such system-level causes). Each
//!    part counts at most once: the statistic is the rate of *failed parts*.
//! 3. Every level of every attribute is a group; identical groups are tested once. Each is
//!    compared with the rest of the fleet by the detector's exact conditional test of two Poisson
//!    rates (`orchestrator_detect::stats::poisson_rate_test`) against the smallest rate ratio that
//!    matters, on exposures standardised for age band and platform (indirect standardisation with the
//!    fleet's own rates per stratum: under "no defect", each count is Poisson with mean proportional
//!    to its standardised exposure, so the conditional test stays exact).
//! 4. Holm's step-down procedure over every group tested controls the family-wise error rate under
//!    any dependence (the groups overlap).
//! 5. Of rejected groups, the most specific are reported: a group containing a rejected group is a
//!    parent, not a second cluster, unless its remainder (without the rejected groups inside it) is
//!    itself significant at the Bonferroni level.

use std::collections::{BTreeMap, HashMap};

use chrono::{DateTime, TimeDelta, Utc};
use orchestrator_detect::stats::{poisson_rate_test, rate_ratio_interval};
use serde::Serialize;

/// A part attribute that groups parts. Declared from most to least specific: identical groups keep
/// the most specific name, and reports prefer it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Attribute {
    /// Manufacturing lot or date code (from the parts manifest), within a part number.
    Lot,
    /// Leading characters of the serial number (often plant and production week).
    SerialPrefix,
    /// Vendor part number.
    PartNumber,
    /// Platform SKU of the node.
    Platform,
}

/// One group: an attribute and its value.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct GroupKey {
    /// The attribute.
    pub attribute: Attribute,
    /// Its value (for a lot: `part_number/lot`).
    pub value: String,
}

impl std::fmt::Display for GroupKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?} {}", self.attribute, self.value)
    }
}

/// One part of the fleet over the period.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FleetPart {
    /// Serial number.
    pub serial: String,
    /// Node it is in.
    pub node: String,
    /// Part number.
    pub part_number: String,
    /// Lot or date code, when the manifest has one.
    pub lot: Option<String>,
    /// Platform SKU of the node.
    pub platform: String,
    /// Age in days at the start of the period (from `ProductionDate` or installation).
    pub age_days: f64,
    /// Days in service during the period.
    pub exposure_days: f64,
}

/// One failure of one part in the period.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PartFailure {
    /// Serial of the failed part.
    pub serial: String,
    /// When it began.
    pub at: DateTime<Utc>,
    /// Began right after a firmware change (left out).
    pub firmware_suspected: bool,
}

/// Parameters of the scan.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClusterConfig {
    /// Family-wise error rate over all groups of one period.
    pub alpha: f64,
    /// Smallest rate ratio worth a vendor claim; the test is of `ratio <= min_rate_ratio`. Above 1
    /// it also absorbs what the Poisson model ignores (node-to-node variation, residual age effects
    /// within a band), which would otherwise inflate false clusters in a large fleet.
    pub min_rate_ratio: f64,
    /// A group needs at least this many failed parts to be a cluster (a handful of failures cannot
    /// carry a vendor conversation; removing rejections keeps the error rate within alpha).
    pub min_failures: u64,
    /// Groups with fewer parts are not tested (decided before looking at failures).
    pub min_group_parts: usize,
    /// Characters of the serial number that form its prefix group; 0 turns the attribute off.
    pub serial_prefix_len: usize,
    /// Upper edges of the age bands in days (ascending); the last band is open.
    pub age_band_edges_days: Vec<f64>,
    /// Failures on one node closer than this are one incident.
    pub coincidence_window: TimeDelta,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        Self {
            alpha: 0.01,
            min_rate_ratio: 1.5,
            min_failures: 5,
            min_group_parts: 30,
            serial_prefix_len: 5,
            age_band_edges_days: vec![30.0, 90.0, 180.0, 365.0, 730.0],
            coincidence_window: TimeDelta::hours(1),
        }
    }
}

/// Input that cannot be scanned.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ClusterError {
    /// A parameter is out of range.
    #[error("cluster scan parameter {name} = {value} is invalid: {expected}")]
    Parameter {
        /// Which.
        name: &'static str,
        /// Value given.
        value: f64,
        /// What is accepted.
        expected: &'static str,
    },
    /// A part's exposure or age is negative or not finite.
    #[error("part {serial}: {field} = {value} must be finite and >= 0")]
    Part {
        /// Serial.
        serial: String,
        /// Which field.
        field: &'static str,
        /// Value given.
        value: f64,
    },
    /// A serial appears twice in the fleet.
    #[error("serial {serial} appears twice in the fleet")]
    DuplicateSerial {
        /// Serial.
        serial: String,
    },
}

/// The test of one group.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GroupTest {
    /// The group.
    pub group: GroupKey,
    /// Other names of the same set of parts.
    pub aliases: Vec<GroupKey>,
    /// Parts in it.
    pub parts: usize,
    /// Failed parts counted.
    pub failures: u64,
    /// Failures expected at the rest of the fleet's (standardised) rate.
    pub expected: f64,
    /// Standardised rate ratio, group over rest; None when the rest had no failures.
    pub rate_ratio: Option<f64>,
    /// Exact 95% interval of the ratio.
    pub ci95_lower: Option<f64>,
    /// Upper end; None when unbounded.
    pub ci95_upper: Option<f64>,
    /// One-sided p-value against `min_rate_ratio`.
    pub p_value: f64,
    /// Holm-adjusted p-value (compare with alpha).
    pub adjusted_p: f64,
    /// Rejected by Holm.
    pub rejected: bool,
}

/// A reported cluster.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Cluster {
    /// The test that found it (for a remainder: the remainder's test).
    pub test: GroupTest,
    /// Rejected groups inside it that were taken out before testing it (empty unless a remainder).
    pub excluding: Vec<GroupKey>,
    /// Rejected groups that contain it (flagged because of it, not separate clusters).
    pub parents: Vec<GroupKey>,
    /// Serials of its failed parts, sorted.
    pub failed_serials: Vec<String>,
}

/// The outcome of one scan.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClusterReport {
    /// Groups tested (the size of the family Holm controls).
    pub groups_tested: usize,
    /// The configuration used.
    pub config: ClusterConfig,
    /// Failed parts counted.
    pub counted_failures: u64,
    /// Failures left out as firmware-suspected.
    pub firmware_suspected_excluded: usize,
    /// Multi-part incidents left out as system-level.
    pub system_incidents: usize,
    /// Failures inside those incidents.
    pub system_incident_failures: usize,
    /// Failures whose serial is not in the fleet (ignored; the inventory is behind).
    pub unknown_serials: usize,
    /// The clusters, most significant first.
    pub clusters: Vec<Cluster>,
    /// Every group test, by p-value (the export for the vendor conversation).
    pub tests: Vec<GroupTest>,
}

struct Group {
    key: GroupKey,
    aliases: Vec<GroupKey>,
    members: Vec<u32>,
}

fn validate(config: &ClusterConfig, parts: &[FleetPart]) -> Result<(), ClusterError> {
    if !(config.alpha > 0.0 && config.alpha < 1.0) {
        return Err(ClusterError::Parameter {
            name: "alpha",
            value: config.alpha,
            expected: "0 < alpha < 1",
        });
    }
    if !(config.min_rate_ratio >= 1.0 && config.min_rate_ratio.is_finite()) {
        return Err(ClusterError::Parameter {
            name: "min_rate_ratio",
            value: config.min_rate_ratio,
            expected: "finite and >= 1",
        });
    }
    if config.age_band_edges_days.windows(2).any(|w| w[0] >= w[1]) || config.age_band_edges_days.iter().any(|e| !e.is_finite()) {
        return Err(ClusterError::Parameter {
            name: "age_band_edges_days",
            value: f64::NAN,
            expected: "finite and strictly ascending",
        });
    }
    let mut seen = std::collections::HashSet::with_capacity(parts.len());
    for p in parts {
        for (field, value) in [("exposure_days", p.exposure_days), ("age_days", p.age_days)] {
            if !(value >= 0.0 && value.is_finite()) {
                return Err(ClusterError::Part {
                    serial: p.serial.clone(),
                    field,
                    value,
                });
            }
        }
        if !seen.insert(p.serial.as_str()) {
            return Err(ClusterError::DuplicateSerial { serial: p.serial.clone() });
        }
    }
    Ok(())
}

/// Which parts count as failed, after leaving out firmware-suspected failures and multi-part
/// incidents. Returns the per-part flag and the counts left out.
fn counted_failures(
    parts: &[FleetPart],
    index: &HashMap<&str, u32>,
    failures: &[PartFailure],
    window: TimeDelta,
) -> (Vec<bool>, usize, usize, usize, usize) {
    let mut failed = vec![false; parts.len()];
    let mut fw = 0;
    let mut unknown = 0;
    let mut by_node: BTreeMap<&str, Vec<(DateTime<Utc>, u32)>> = BTreeMap::new();
    for f in failures {
        let Some(&i) = index.get(f.serial.as_str()) else {
            unknown += 1;
            continue;
        };
        if f.firmware_suspected {
            fw += 1;
            continue;
        }
        by_node.entry(parts[i as usize].node.as_str()).or_default().push((f.at, i));
    }
    let (mut incidents, mut incident_failures) = (0, 0);
    for events in by_node.values_mut() {
        events.sort();
        let mut start = 0;
        while start < events.len() {
            // Chain failures closer than the window into one incident.
            let mut end = start + 1;
            while end < events.len() && events[end].0 - events[end - 1].0 <= window {
                end += 1;
            }
            let mut distinct: Vec<u32> = events[start..end].iter().map(|e| e.1).collect();
            distinct.sort_unstable();
            distinct.dedup();
            if distinct.len() >= 2 {
                incidents += 1;
                incident_failures += end - start;
            } else {
                failed[distinct[0] as usize] = true;
            }
            start = end;
        }
    }
    (failed, fw, incidents, incident_failures, unknown)
}

fn band(edges: &[f64], age: f64) -> usize {
    edges.iter().position(|e| age < *e).unwrap_or(edges.len())
}

/// Exposure of each part weighted by the fleet's failure rate in its stratum (age band, plus
/// platform when `with_platform`), so that summing weights gives a group's expected share of
/// failures under "no defect".
fn standardized_weights(parts: &[FleetPart], failed: &[bool], edges: &[f64], with_platform: bool) -> Vec<f64> {
    fn key<'a>(p: &'a FleetPart, edges: &[f64], with_platform: bool) -> (usize, &'a str) {
        (band(edges, p.age_days), if with_platform { p.platform.as_str() } else { "" })
    }
    let mut strata: HashMap<(usize, &str), (f64, f64)> = HashMap::new();
    for (p, f) in parts.iter().zip(failed) {
        let s = strata.entry(key(p, edges, with_platform)).or_default();
        s.0 += if *f { 1.0 } else { 0.0 };
        s.1 += p.exposure_days;
    }
    parts
        .iter()
        .map(|p| {
            let (events, exposure) = strata[&key(p, edges, with_platform)];
            if exposure > 0.0 { p.exposure_days * events / exposure } else { 0.0 }
        })
        .collect()
}

fn groups(parts: &[FleetPart], config: &ClusterConfig) -> Vec<Group> {
    let mut by_key: BTreeMap<GroupKey, Vec<u32>> = BTreeMap::new();
    for (i, p) in parts.iter().enumerate() {
        let i = i as u32;
        let mut add = |attribute, value: String| by_key.entry(GroupKey { attribute, value }).or_default().push(i);
        add(Attribute::PartNumber, p.part_number.clone());
        add(Attribute::Platform, p.platform.clone());
        if let Some(lot) = &p.lot {
            add(Attribute::Lot, format!("{}/{lot}", p.part_number));
        }
        if config.serial_prefix_len > 0 && p.serial.chars().count() > config.serial_prefix_len {
            add(Attribute::SerialPrefix, p.serial.chars().take(config.serial_prefix_len).collect());
        }
    }
    // Identical member sets are one hypothesis; BTreeMap order puts the most specific name first.
    let mut by_members: BTreeMap<Vec<u32>, Group> = BTreeMap::new();
    for (key, members) in by_key {
        if members.len() < config.min_group_parts || members.len() == parts.len() {
            continue;
        }
        match by_members.get_mut(&members) {
            Some(g) => g.aliases.push(key),
            None => {
                by_members.insert(members.clone(), Group {
                    key,
                    aliases: Vec::new(),
                    members,
                });
            }
        }
    }
    let mut out: Vec<Group> = by_members.into_values().collect();
    out.sort_by(|a, b| a.key.cmp(&b.key));
    out
}

struct Totals {
    failures: u64,
    weight: f64,
}

fn make_test(group: &Group, failed: &[bool], weights: &[f64], total: &Totals, config: &ClusterConfig) -> GroupTest {
    let failures = group.members.iter().filter(|&&i| failed[i as usize]).count() as u64;
    let weight: f64 = group.members.iter().map(|&i| weights[i as usize]).sum();
    let rest_failures = total.failures.saturating_sub(failures);
    let rest_weight = (total.weight - weight).max(0.0);
    let p = poisson_rate_test(failures, weight, rest_failures, rest_weight, config.min_rate_ratio);
    let ci = rate_ratio_interval(failures, weight, rest_failures, rest_weight, 0.025, 0.025);
    let rest_rate = if rest_weight > 0.0 { rest_failures as f64 / rest_weight } else { 0.0 };
    let rate_ratio = (rest_failures > 0 && weight > 0.0)
        .then(|| (failures as f64 / weight) / rest_rate)
        .filter(|r| r.is_finite());
    GroupTest {
        group: group.key.clone(),
        aliases: group.aliases.clone(),
        parts: group.members.len(),
        failures,
        expected: weight * rest_rate,
        rate_ratio,
        ci95_lower: ci.lower,
        ci95_upper: ci.upper,
        // A group below the failure floor cannot be a cluster: its p-value is taken as 1, which
        // only removes rejections.
        p_value: if failures >= config.min_failures { p } else { 1.0 },
        adjusted_p: 1.0,
        rejected: false,
    }
}

/// Whether sorted `inner` is a proper subset of sorted `outer`.
fn proper_subset(inner: &[u32], outer: &[u32]) -> bool {
    if inner.len() >= outer.len() {
        return false;
    }
    let mut j = 0;
    for x in inner {
        while j < outer.len() && outer[j] < *x {
            j += 1;
        }
        if j == outer.len() || outer[j] != *x {
            return false;
        }
    }
    true
}

/// Scans one period of the fleet for defect clusters. Run it on fixed, non-overlapping periods:
/// each scan spends the whole alpha once (repeated scans over overlapping data would need alpha
/// spending across scans).
pub fn scan(parts: &[FleetPart], failures: &[PartFailure], config: &ClusterConfig) -> Result<ClusterReport, ClusterError> {
    validate(config, parts)?;
    let index: HashMap<&str, u32> = parts.iter().enumerate().map(|(i, p)| (p.serial.as_str(), i as u32)).collect();
    let (failed, fw, system_incidents, system_incident_failures, unknown) =
        counted_failures(parts, &index, failures, config.coincidence_window);
    let with_platform = standardized_weights(parts, &failed, &config.age_band_edges_days, true);
    let without_platform = standardized_weights(parts, &failed, &config.age_band_edges_days, false);
    let counted = failed.iter().filter(|f| **f).count() as u64;
    let totals = |w: &[f64]| Totals {
        failures: counted,
        weight: w.iter().sum(),
    };
    let (total_with, total_without) = (totals(&with_platform), totals(&without_platform));
    // Testing platform SKUs under platform stratification would compare each SKU with itself.
    let weights_for = |g: &Group| {
        if g.key.attribute == Attribute::Platform {
            (&without_platform[..], &total_without)
        } else {
            (&with_platform[..], &total_with)
        }
    };

    let groups = groups(parts, config);
    let mut tests: Vec<(usize, GroupTest)> = groups
        .iter()
        .enumerate()
        .map(|(i, g)| {
            let (w, t) = weights_for(g);
            (i, make_test(g, &failed, w, t, config))
        })
        .collect();
    let m = tests.len();
    // Holm: step down through the sorted p-values; adjusted p is the running maximum of (m-k)p.
    tests.sort_by(|a, b| a.1.p_value.total_cmp(&b.1.p_value).then(a.1.group.cmp(&b.1.group)));
    let mut running = 0.0_f64;
    let mut still_rejecting = true;
    for (k, (_, t)) in tests.iter_mut().enumerate() {
        running = running.max(((m - k) as f64 * t.p_value).min(1.0));
        t.adjusted_p = running;
        still_rejecting &= t.p_value <= config.alpha / (m - k) as f64;
        t.rejected = still_rejecting;
    }

    let rejected: Vec<usize> = tests.iter().filter(|(_, t)| t.rejected).map(|(i, _)| *i).collect();
    let failed_serials = |members: &[u32]| {
        let mut s: Vec<String> = members
            .iter()
            .filter(|&&i| failed[i as usize])
            .map(|&i| parts[i as usize].serial.clone())
            .collect();
        s.sort();
        s
    };
    let mut clusters = Vec::new();
    for (i, t) in tests.iter().filter(|(_, t)| t.rejected) {
        let g = &groups[*i];
        let children: Vec<usize> = rejected
            .iter()
            .copied()
            .filter(|&j| proper_subset(&groups[j].members, &g.members))
            .collect();
        let parents: Vec<GroupKey> = rejected
            .iter()
            .filter(|&&j| proper_subset(&g.members, &groups[j].members))
            .map(|&j| groups[j].key.clone())
            .collect();
        if children.is_empty() {
            clusters.push(Cluster {
                test: t.clone(),
                excluding: Vec::new(),
                parents,
                failed_serials: failed_serials(&g.members),
            });
            continue;
        }
        // A parent of a cluster is a cluster of its own only if what remains without the rejected
        // groups inside it still fails faster than the rest of the fleet. The remainder is an
        // extra hypothesis, tested at the Bonferroni level alpha / m.
        let mut inside = vec![false; parts.len()];
        for &j in &children {
            for &x in &groups[j].members {
                inside[x as usize] = true;
            }
        }
        let remainder: Vec<u32> = g.members.iter().copied().filter(|&x| !inside[x as usize]).collect();
        if remainder.len() < config.min_group_parts {
            continue;
        }
        // The children leave the comparison entirely: they are neither the remainder nor "the rest".
        let (w, total) = weights_for(g);
        let child_failures = inside.iter().zip(&failed).filter(|(a, b)| **a && **b).count() as u64;
        let child_weight: f64 = inside.iter().zip(w).filter(|(a, _)| **a).map(|(_, w)| *w).sum();
        let rest = Totals {
            failures: total.failures - child_failures,
            weight: total.weight - child_weight,
        };
        let sub = Group {
            key: g.key.clone(),
            aliases: g.aliases.clone(),
            members: remainder,
        };
        let mut rt = make_test(&sub, &failed, w, &rest, config);
        rt.adjusted_p = (rt.p_value * m as f64).min(1.0);
        rt.rejected = rt.p_value <= config.alpha / m as f64;
        if rt.rejected {
            clusters.push(Cluster {
                failed_serials: failed_serials(&sub.members),
                test: rt,
                excluding: children.iter().map(|&j| groups[j].key.clone()).collect(),
                parents,
            });
        }
    }
    Ok(ClusterReport {
        groups_tested: m,
        config: config.clone(),
        counted_failures: counted,
        firmware_suspected_excluded: fw,
        system_incidents,
        system_incident_failures,
        unknown_serials: unknown,
        clusters,
        tests: tests.into_iter().map(|(_, t)| t).collect(),
    })
}
